-- What the client sent, for telling a retry from a different job under one
-- Idempotency-Key (services/submission/schemas.py, request_fingerprint): the sha256 of the
-- request as validated, before the server lowered, resolved or defaulted anything in it. A
-- job stored before this column, or without a key, reads NULL: its replay compares the
-- stored spec, as it always did.
ALTER TABLE jobs ADD COLUMN request_fingerprint text
    CHECK (request_fingerprint ~ '^[0-9a-f]{64}$');

-- POST /v1/tokens under an Idempotency-Key (services/submission/identity.py, create_token):
-- the key a token was created under and the sha256 of the request that created it
-- (identity_schemas.token_request_fingerprint), so a retry after a lost answer finds the
-- token it made instead of making a second live one, and a different request under the
-- key is refused. Never the token itself: a replay answers without it. A token made
-- without a key, or before this file, reads NULL in both.
ALTER TABLE tokens ADD COLUMN idempotency_key text
    CHECK (length(idempotency_key) BETWEEN 1 AND 200);
ALTER TABLE tokens ADD COLUMN request_fingerprint text
    CHECK (request_fingerprint ~ '^[0-9a-f]{64}$');
ALTER TABLE tokens ADD CONSTRAINT tokens_key_has_fingerprint
    CHECK ((idempotency_key IS NULL) = (request_fingerprint IS NULL));
CREATE UNIQUE INDEX tokens_idempotency_key ON tokens (user_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;

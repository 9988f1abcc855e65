-- POST /v1/tokens/rotate under an Idempotency-Key (services/submission/identity.py,
-- replay_rotation): the token a rotation made names the token it replaced, so that a
-- retry after a lost answer, presenting the token that rotation revoked with the same key,
-- is recognised (and nothing else presenting a revoked token is). A token made by
-- POST /v1/tokens, or before this file, reads NULL.
ALTER TABLE tokens ADD COLUMN replaces bigint REFERENCES tokens (id);
CREATE UNIQUE INDEX tokens_replaces ON tokens (replaces) WHERE replaces IS NOT NULL;

-- Issuing a token counts the live (unrevoked, unexpired) tokens of its user and team
-- (identity_repository.live_tokens): an index of the unrevoked ones alone, so the count
-- does not read every token a team ever rotated away.
-- Forward-only: earlier files are never edited.
CREATE INDEX tokens_unrevoked ON tokens (user_id, expires_at) WHERE revoked_at IS NULL;

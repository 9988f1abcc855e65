-- Roles (viewer < member < admin of a team; operator of the platform) and the life of a
-- token: each has an id users can name, a label, an expiry, and who issued it. A disabled
-- user's tokens stop working at once.
ALTER TABLE users DROP CONSTRAINT users_role_check;
ALTER TABLE users ADD CONSTRAINT users_role_check
    CHECK (role IN ('viewer', 'member', 'admin', 'operator'));
ALTER TABLE users ADD COLUMN disabled_at timestamptz;

ALTER TABLE tokens ADD COLUMN id bigint GENERATED ALWAYS AS IDENTITY UNIQUE;
ALTER TABLE tokens ADD COLUMN name text NOT NULL DEFAULT 'default'
    CHECK (name ~ '^[A-Za-z0-9._ -]{1,100}$');
ALTER TABLE tokens ADD COLUMN expires_at timestamptz;
ALTER TABLE tokens ADD COLUMN created_by bigint REFERENCES users (id);
CREATE INDEX tokens_user ON tokens (user_id, id);

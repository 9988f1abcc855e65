-- Every service's append-only audit log: who (user, team, role, token id) did which write,
-- when, to what. Rows are written in the same transaction as the change they describe; a
-- trigger refuses UPDATE and DELETE, so not even the service's own code can rewrite history.
CREATE TABLE audit_log (
    id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at        timestamptz NOT NULL DEFAULT now(),
    actor     text NOT NULL,
    team      text,
    role      text NOT NULL,
    token_id  bigint,
    action    text NOT NULL,
    target    text NOT NULL,
    detail    jsonb NOT NULL DEFAULT '{}'::jsonb
);
CREATE INDEX audit_log_at ON audit_log (at DESC, id DESC);

CREATE FUNCTION audit_log_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit_log is append-only (% refused)', TG_OP;
END $$;
CREATE TRIGGER audit_log_append_only BEFORE UPDATE OR DELETE OR TRUNCATE ON audit_log
    FOR EACH STATEMENT EXECUTE FUNCTION audit_log_append_only();

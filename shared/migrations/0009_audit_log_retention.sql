-- Audit-log retention (shared/retention.py): entries older than the installation's
-- TRAINYARD_AUDIT_RETENTION_DAYS may be deleted, and nothing else. UPDATE and TRUNCATE stay
-- refused for the whole statement; DELETE is checked row by row: a row goes only when the
-- deleting transaction named a cutoff (SET LOCAL trainyard.audit_prune_before) and the row
-- is older than both that cutoff and 30 days, so no code, whatever cutoff it names, can
-- delete an entry of the last 30 days (the least retention the setting takes).
DROP TRIGGER audit_log_append_only ON audit_log;
CREATE TRIGGER audit_log_append_only BEFORE UPDATE OR TRUNCATE ON audit_log
    FOR EACH STATEMENT EXECUTE FUNCTION audit_log_append_only();

CREATE FUNCTION audit_log_prune_only() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    cutoff timestamptz := NULLIF(current_setting('trainyard.audit_prune_before', true), '');
BEGIN
    IF cutoff IS NULL OR OLD.at >= cutoff OR OLD.at >= now() - interval '30 days' THEN
        RAISE EXCEPTION 'audit_log is append-only (DELETE of entry % refused: only '
            'retention deletes, and only entries older than its cutoff and 30 days)', OLD.id;
    END IF;
    RETURN OLD;
END $$;
CREATE TRIGGER audit_log_prune_only BEFORE DELETE ON audit_log
    FOR EACH ROW EXECUTE FUNCTION audit_log_prune_only();

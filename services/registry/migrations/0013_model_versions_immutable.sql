-- A model version is immutable once registered (docs/models.md, "Immutability"): the
-- database itself refuses to change or remove one, as it does for dataset versions (0007)
-- and alias moves (0004), so no statement made with the registry's credentials can change
-- what a version's artifact, metrics, lineage, tags or description were when it was
-- published. The one change is its deletion: deleted_at and deleted_by set once, every
-- other column as it was (the tombstone keeps its number and its lineage).
CREATE FUNCTION model_versions_immutable() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND OLD.deleted_at IS NULL AND NEW.deleted_at IS NOT NULL
       AND to_jsonb(NEW) - 'deleted_at' - 'deleted_by'
           = to_jsonb(OLD) - 'deleted_at' - 'deleted_by' THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'model versions are immutable (% refused; a version can only be deleted, once)',
        TG_OP;
END;
$$;
CREATE TRIGGER model_versions_immutable
    BEFORE UPDATE OR DELETE ON model_versions
    FOR EACH ROW EXECUTE FUNCTION model_versions_immutable();

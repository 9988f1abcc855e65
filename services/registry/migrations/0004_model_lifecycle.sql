-- Models with a lifecycle: versions registered explicitly or on a job's success, each an
-- immutable copy the registry owns; aliases moved atomically with an append-only record of
-- every move; versions deleted (their objects freed) while their row stays as a tombstone,
-- so a version number is never reused and later lineage edges can still name it by id.

-- The project of the job that made the model's first version ('default' when none).
ALTER TABLE models ADD COLUMN project text NOT NULL DEFAULT 'default' CHECK (project <> '');

ALTER TABLE model_versions
    -- job_success: registered when the job succeeded; explicit: POST .../versions.
    ADD COLUMN origin text NOT NULL DEFAULT 'job_success'
        CHECK (origin IN ('job_success', 'explicit')),
    -- The committed checkpoint the artifact was copied from. NULL for versions registered
    -- before copies existed: their artifact_uri is the job's checkpoint itself.
    ADD COLUMN source_uri text,
    -- The key of the registry's own copy in the object store (under 'registry/'), NULL for
    -- those older versions: only an owned artifact is served or deleted by the registry.
    ADD COLUMN artifact_key text CHECK (artifact_key IS NULL OR artifact_key LIKE 'registry/%'),
    ADD COLUMN tags text[] NOT NULL DEFAULT '{}',
    ADD COLUMN description text NOT NULL DEFAULT '' CHECK (length(description) <= 10000),
    ADD COLUMN created_by text NOT NULL DEFAULT 'registry',
    ADD COLUMN deleted_at timestamptz,
    ADD COLUMN deleted_by text,
    ADD CONSTRAINT model_versions_deleted_by CHECK ((deleted_at IS NULL) = (deleted_by IS NULL));

-- A succeeded job still registers at most one version automatically; explicit registrations
-- may name any committed checkpoint of a job, as often as asked.
ALTER TABLE model_versions DROP CONSTRAINT model_versions_job_id_key;
CREATE UNIQUE INDEX model_versions_one_per_succeeded_job ON model_versions (job_id)
    WHERE origin = 'job_success';
CREATE INDEX model_versions_by_job ON model_versions (job_id);
CREATE INDEX models_by_team ON models (team, name);

-- Where each alias of a model points now. Moves lock the model's row (services/registry/
-- models.py), so a move, a deletion of the version and another move take turns.
CREATE TABLE model_aliases (
    model_id  bigint NOT NULL REFERENCES models (id),
    alias     text NOT NULL CHECK (alias ~ '^[a-z][a-z0-9_-]{0,62}$'),
    version   integer NOT NULL,
    moved_at  timestamptz NOT NULL,
    moved_by  text NOT NULL,
    PRIMARY KEY (model_id, alias),
    FOREIGN KEY (model_id, version) REFERENCES model_versions (model_id, version)
);
CREATE INDEX model_aliases_by_version ON model_aliases (model_id, version);

-- Every move of an alias, in order: from_version NULL is its creation, to_version NULL its
-- deletion. Append-only, like the audit log.
CREATE TABLE model_alias_moves (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    model_id      bigint NOT NULL REFERENCES models (id),
    alias         text NOT NULL,
    from_version  integer,
    to_version    integer,
    actor         text NOT NULL,
    at            timestamptz NOT NULL,
    CHECK (from_version IS NOT NULL OR to_version IS NOT NULL)
);
CREATE INDEX model_alias_moves_by_alias ON model_alias_moves (model_id, alias, id);

CREATE FUNCTION model_alias_moves_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'model_alias_moves is append-only (% refused)', TG_OP;
END $$;
CREATE TRIGGER model_alias_moves_append_only
    BEFORE UPDATE OR DELETE OR TRUNCATE ON model_alias_moves
    FOR EACH STATEMENT EXECUTE FUNCTION model_alias_moves_append_only();

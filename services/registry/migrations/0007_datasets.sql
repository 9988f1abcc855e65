-- Datasets per team with immutable versions, grants to other teams, the access audit (every
-- dataset version each job was given) and the parent model version each job fine-tuned from.

-- latest_version is the version counter, bumped in the transaction that adds a version (the
-- row lock orders concurrent registrations, as models' does).
CREATE TABLE datasets (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    team            text NOT NULL CHECK (team <> ''),
    name            text NOT NULL CHECK (name <> ''),
    latest_version  integer NOT NULL DEFAULT 0 CHECK (latest_version >= 0),
    created_at      timestamptz NOT NULL,
    created_by      text NOT NULL,
    UNIQUE (team, name)
);

CREATE TABLE dataset_versions (
    id                uuid PRIMARY KEY,
    dataset_id        bigint NOT NULL REFERENCES datasets (id),
    version           integer NOT NULL CHECK (version >= 1),
    uri               text NOT NULL CHECK (uri <> '' AND length(uri) <= 2000),
    sha256            text NOT NULL CHECK (sha256 ~ '^[0-9a-f]{64}$'),
    size_bytes        bigint NOT NULL CHECK (size_bytes >= 0),
    schema            jsonb NOT NULL,
    feature_version   text NOT NULL DEFAULT '',
    producing_job_id  text,
    created_at        timestamptz NOT NULL,
    created_by        text NOT NULL,
    UNIQUE (dataset_id, version)
);
CREATE INDEX dataset_versions_by_producer ON dataset_versions (producing_job_id)
    WHERE producing_job_id IS NOT NULL;

-- A version is immutable: the database itself refuses to change or remove one.
CREATE FUNCTION dataset_versions_immutable() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'dataset versions are immutable (% refused)', TG_OP;
END;
$$;
CREATE TRIGGER dataset_versions_immutable
    BEFORE UPDATE OR DELETE ON dataset_versions
    FOR EACH ROW EXECUTE FUNCTION dataset_versions_immutable();

CREATE TABLE dataset_grants (
    dataset_id    bigint NOT NULL REFERENCES datasets (id),
    grantee_team  text NOT NULL CHECK (grantee_team <> ''),
    granted_by    text NOT NULL,
    granted_at    timestamptz NOT NULL,
    PRIMARY KEY (dataset_id, grantee_team)
);

-- The access audit: written when the job's first job.started arrives, once per version.
CREATE TABLE dataset_access (
    job_id              text NOT NULL,
    dataset_version_id  uuid NOT NULL REFERENCES dataset_versions (id),
    team                text NOT NULL,
    allocation_id       text NOT NULL,
    recorded_at         timestamptz NOT NULL,
    PRIMARY KEY (job_id, dataset_version_id)
);
CREATE INDEX dataset_access_by_version ON dataset_access (dataset_version_id);

CREATE TABLE job_parents (
    job_id             text PRIMARY KEY,
    parent_version_id  uuid NOT NULL REFERENCES model_versions (id),
    recorded_at        timestamptz NOT NULL
);
CREATE INDEX job_parents_by_parent ON job_parents (parent_version_id);

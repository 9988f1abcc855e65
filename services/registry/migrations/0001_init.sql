-- Registry: what each run was (as it started), the checkpoints it reported, and the
-- models and model versions made from succeeded jobs, each with its full lineage.

-- One row per allocation that started (job.started): the reproducibility record.
CREATE TABLE runs (
    allocation_id  text PRIMARY KEY,
    job_id         text NOT NULL,
    attempt        integer NOT NULL CHECK (attempt >= 0),
    epoch          integer NOT NULL,
    node_id        text NOT NULL,
    started_at     timestamptz NOT NULL,
    spec           jsonb NOT NULL,
    code_version   text NOT NULL CHECK (code_version <> ''),
    environment    jsonb NOT NULL,
    resumed_from   text,
    recorded_at    timestamptz NOT NULL
);
CREATE INDEX runs_by_job ON runs (job_id, started_at);

-- Complete checkpoints (checkpoint.saved); a checkpoint object is recorded once per job.
CREATE TABLE checkpoints (
    job_id         text NOT NULL,
    uri            text NOT NULL,
    allocation_id  text NOT NULL,
    epoch          integer NOT NULL,
    step           bigint NOT NULL CHECK (step >= 0),
    manifest_uri   text NOT NULL,
    size_bytes     bigint NOT NULL CHECK (size_bytes >= 0),
    sha256         text NOT NULL CHECK (sha256 ~ '^[0-9a-f]{64}$'),
    saved_at       timestamptz NOT NULL,
    PRIMARY KEY (job_id, uri)
);
CREATE INDEX checkpoints_latest ON checkpoints (job_id, step DESC, saved_at DESC);

-- A model is a job name within a team; latest_version is its version counter, bumped in
-- the transaction that registers the version (the row lock orders concurrent registrations).
CREATE TABLE models (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    team            text NOT NULL CHECK (team <> ''),
    name            text NOT NULL CHECK (name <> ''),
    latest_version  integer NOT NULL DEFAULT 0 CHECK (latest_version >= 0),
    created_at      timestamptz NOT NULL,
    UNIQUE (team, name)
);

CREATE TABLE model_versions (
    id                     uuid PRIMARY KEY,
    model_id               bigint NOT NULL REFERENCES models (id),
    version                integer NOT NULL CHECK (version >= 1),
    -- A job registers at most one version, however often its success is redelivered.
    job_id                 text NOT NULL UNIQUE,
    allocation_id          text NOT NULL REFERENCES runs (allocation_id),
    artifact_uri           text NOT NULL,
    artifact_manifest_uri  text NOT NULL,
    artifact_step          bigint NOT NULL CHECK (artifact_step >= 0),
    artifact_size_bytes    bigint NOT NULL CHECK (artifact_size_bytes >= 0),
    artifact_sha256        text NOT NULL CHECK (artifact_sha256 ~ '^[0-9a-f]{64}$'),
    metrics                jsonb NOT NULL,
    -- The shared Lineage model; code version and dataset also as columns, to query by.
    lineage                jsonb NOT NULL,
    code_version           text NOT NULL,
    dataset                text,
    registered_at          timestamptz NOT NULL,
    UNIQUE (model_id, version)
);
CREATE INDEX model_versions_by_dataset ON model_versions (dataset) WHERE dataset IS NOT NULL;

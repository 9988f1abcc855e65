-- Submission: teams, users, tokens, jobs as submitted, and the job view users read.

CREATE TABLE teams (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name        text NOT NULL UNIQUE CHECK (name ~ '^[A-Za-z0-9._-]{1,100}$'),
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE users (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    team_id     bigint NOT NULL REFERENCES teams (id),
    name        text NOT NULL CHECK (name ~ '^[A-Za-z0-9._-]{1,100}$'),
    role        text NOT NULL CHECK (role IN ('admin', 'member')),
    created_at  timestamptz NOT NULL DEFAULT now(),
    UNIQUE (team_id, name),
    -- Target of jobs' composite key: a job's user always belongs to the job's team.
    UNIQUE (id, team_id)
);

-- Only the SHA-256 of a token is stored; the token itself is shown once.
CREATE TABLE tokens (
    token_hash  text PRIMARY KEY CHECK (token_hash ~ '^[0-9a-f]{64}$'),
    user_id     bigint NOT NULL REFERENCES users (id),
    created_at  timestamptz NOT NULL DEFAULT now(),
    revoked_at  timestamptz
);

CREATE TABLE jobs (
    id                   text PRIMARY KEY,
    team_id              bigint NOT NULL,
    user_id              bigint NOT NULL,
    name                 text NOT NULL,
    spec                 jsonb NOT NULL,
    status               text NOT NULL CHECK (status IN (
                             'QUEUED', 'PENDING', 'SCHEDULED', 'RUNNING',
                             'SUCCEEDED', 'FAILED', 'PREEMPTED', 'CANCELLED')),
    idempotency_key      text CHECK (length(idempotency_key) BETWEEN 1 AND 200),
    submitted_at         timestamptz NOT NULL,
    updated_at           timestamptz NOT NULL,
    cancel_requested_at  timestamptz,
    pending_reason       text,
    pending_position     integer,
    estimated_start      timestamptz,
    allocation_id        text,
    node_id              text,
    gpu_indices          integer[],
    attempt              integer,
    started_at           timestamptz,
    finished_at          timestamptz,
    metrics              jsonb NOT NULL DEFAULT '{}'::jsonb,
    metrics_step         bigint,
    metrics_at           timestamptz,
    failure              jsonb,
    FOREIGN KEY (user_id, team_id) REFERENCES users (id, team_id),
    -- The same Idempotency-Key from the same user names one job.
    UNIQUE (user_id, idempotency_key),
    -- A job has finished exactly when it is in a terminal status.
    CHECK ((status IN ('SUCCEEDED', 'FAILED', 'CANCELLED')) = (finished_at IS NOT NULL)),
    -- Placed jobs have an allocation; running jobs have started.
    CHECK (status NOT IN ('SCHEDULED', 'RUNNING') OR allocation_id IS NOT NULL),
    CHECK (status <> 'RUNNING' OR started_at IS NOT NULL)
);
CREATE INDEX jobs_team_newest ON jobs (team_id, submitted_at DESC, id);

-- Every status a job has been in, oldest first.
CREATE TABLE job_history (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id      text NOT NULL REFERENCES jobs (id),
    status      text NOT NULL,
    at          timestamptz NOT NULL,
    reason      text
);
CREATE INDEX job_history_job ON job_history (job_id, id);

-- Every GPU lease the scheduler granted the job (billing bills each one when it ends).
CREATE TABLE job_allocations (
    allocation_id  text PRIMARY KEY,
    job_id         text NOT NULL REFERENCES jobs (id),
    node_id        text NOT NULL,
    gpu_indices    integer[] NOT NULL,
    attempt        integer NOT NULL,
    epoch          bigint NOT NULL,
    granted_at     timestamptz NOT NULL
);
CREATE INDEX job_allocations_job ON job_allocations (job_id);

CREATE TABLE job_checkpoints (
    job_id         text NOT NULL REFERENCES jobs (id),
    uri            text NOT NULL,
    manifest_uri   text NOT NULL,
    step           bigint NOT NULL CHECK (step >= 0),
    size_bytes     bigint NOT NULL CHECK (size_bytes >= 0),
    sha256         text NOT NULL,
    allocation_id  text NOT NULL,
    saved_at       timestamptz NOT NULL,
    PRIMARY KEY (job_id, uri)
);

CREATE TABLE job_models (
    model_version_id  text PRIMARY KEY,
    job_id            text NOT NULL REFERENCES jobs (id),
    model_name        text NOT NULL,
    version           integer NOT NULL,
    artifact_uri      text NOT NULL,
    artifact_sha256   text NOT NULL,
    metrics           jsonb NOT NULL,
    lineage           jsonb NOT NULL,
    registered_at     timestamptz NOT NULL
);
CREATE INDEX job_models_job ON job_models (job_id, registered_at);

-- One row per billed allocation; a corrected record replaces the earlier one.
CREATE TABLE job_costs (
    allocation_id       text PRIMARY KEY,
    job_id              text NOT NULL REFERENCES jobs (id),
    gpu_flavor          text NOT NULL,
    gpus                integer NOT NULL CHECK (gpus >= 0),
    started_at          timestamptz NOT NULL,
    ended_at            timestamptz NOT NULL,
    gpu_seconds         double precision NOT NULL CHECK (gpu_seconds >= 0),
    price_per_gpu_hour  double precision NOT NULL CHECK (price_per_gpu_hour >= 0),
    cost                double precision NOT NULL CHECK (cost >= 0),
    currency            text NOT NULL
);
CREATE INDEX job_costs_job ON job_costs (job_id);

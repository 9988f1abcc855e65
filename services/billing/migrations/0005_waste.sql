-- The facts billing keeps to measure waste and the job success rate (docs/billing.md,
-- "Waste"). Each table is written from the events billing consumes, idempotently (a
-- redelivered event changes nothing); the figures are computed from them when asked.

-- Jobs as submitted (job.submitted): who owns them, what they ask for, when they started
-- waiting.
CREATE TABLE waste_jobs (
    job_id        text PRIMARY KEY,
    team          text NOT NULL,
    project       text NOT NULL,
    user_name     text NOT NULL,
    gpu_flavor    text NOT NULL,
    gpus          integer NOT NULL CHECK (gpus >= 0),
    priority      text NOT NULL,
    submitted_at  timestamptz NOT NULL,
    recorded_at   timestamptz NOT NULL
);
CREATE INDEX waste_jobs_by_flavor ON waste_jobs (gpu_flavor, submitted_at);

-- The priority class of each granted allocation (allocation.granted's spec), beside what
-- announced_allocations keeps of the grant.
CREATE TABLE waste_grants (
    allocation_id  text PRIMARY KEY,
    job_id         text NOT NULL,
    priority       text NOT NULL,
    recorded_at    timestamptz NOT NULL
);

-- Checkpoints saved (checkpoint.saved): the work before the latest one is not lost when
-- the allocation then fails or is preempted.
CREATE TABLE waste_checkpoints (
    job_id         text NOT NULL,
    allocation_id  text NOT NULL,
    saved_at       timestamptz NOT NULL,
    PRIMARY KEY (job_id, saved_at, allocation_id)
);

-- What the runner measured of an allocation, from the metrics of its end report
-- (job.succeeded): mean GPU utilisation (%) and mean share of time waiting for data. Null:
-- not reported (no NVML on the node; the job did not read its data through the SDK).
CREATE TABLE waste_run_reports (
    allocation_id            text PRIMARY KEY,
    job_id                   text NOT NULL,
    gpu_utilization_mean     numeric,
    data_wait_fraction_mean  numeric,
    finished_at              timestamptz NOT NULL,
    recorded_at              timestamptz NOT NULL
);

-- How each job ended (job.succeeded from a runner or the scheduler, the scheduler's final
-- job.failed, job.cancelled): one row per job; a success replaces any other end (a late
-- success after a lost node).
CREATE TABLE waste_job_ends (
    job_id       text PRIMARY KEY,
    outcome      text NOT NULL CHECK (outcome IN ('succeeded', 'failed', 'cancelled')),
    ended_at     timestamptz NOT NULL,
    recorded_at  timestamptz NOT NULL
);
CREATE INDEX waste_job_ends_by_time ON waste_job_ends (ended_at);

-- The latest heartbeat of each node (runner.heartbeat), and the intervals between two
-- heartbeats of a node during which some of its GPUs were unallocated while a job of its
-- flavor waited.
CREATE TABLE waste_nodes (
    node_id     text PRIMARY KEY,
    gpu_flavor  text NOT NULL,
    gpu_count   integer NOT NULL,
    sent_at     timestamptz NOT NULL
);
CREATE TABLE waste_unallocated (
    node_id     text NOT NULL,
    gpu_flavor  text NOT NULL,
    free_gpus   integer NOT NULL CHECK (free_gpus > 0),
    started_at  timestamptz NOT NULL,
    ended_at    timestamptz NOT NULL,
    PRIMARY KEY (node_id, started_at),
    CHECK (ended_at > started_at)
);
CREATE INDEX waste_unallocated_by_time ON waste_unallocated (ended_at);

-- Allocations by job (a job's waits) and by team (the running allocations a budget counts).
CREATE INDEX IF NOT EXISTS announced_allocations_by_job ON announced_allocations (job_id);
CREATE INDEX IF NOT EXISTS announced_allocations_by_team
    ON announced_allocations (team, granted_at);

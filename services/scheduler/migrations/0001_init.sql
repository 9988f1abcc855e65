-- The scheduler's state: GPU nodes, the jobs it must place, allocations and per-GPU leases.
-- Constraints make wrong states impossible; above all, no GPU is ever leased twice at once.

-- GPU inventory, from runner heartbeats.
CREATE TABLE nodes (
    node_id         text PRIMARY KEY,
    hostname        text NOT NULL,
    gpu_flavor      text NOT NULL,
    gpu_count       integer NOT NULL CHECK (gpu_count >= 0),
    status          text NOT NULL CHECK (status IN ('READY', 'LOST')),
    last_heartbeat  timestamptz NOT NULL,
    registered_at   timestamptz NOT NULL,
    lost_at         timestamptz,
    CHECK ((status = 'LOST') = (lost_at IS NOT NULL))
);

-- Jobs as the scheduler sees them. ``seq`` is the arrival order (tie-break of submit time).
CREATE TABLE jobs (
    job_id            text PRIMARY KEY,
    seq               bigserial NOT NULL UNIQUE,
    team              text NOT NULL,
    user_name         text NOT NULL,
    gpu_flavor        text NOT NULL,
    gpus              integer NOT NULL CHECK (gpus >= 1),
    max_restarts      integer NOT NULL CHECK (max_restarts >= 0),
    spec              jsonb NOT NULL,
    status            text NOT NULL CHECK (status IN
                        ('QUEUED', 'ALLOCATED', 'RUNNING', 'CANCELLING',
                         'SUCCEEDED', 'FAILED', 'CANCELLED')),
    attempt           integer NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    restarts          integer NOT NULL DEFAULT 0 CHECK (restarts >= 0),
    submitted_at      timestamptz NOT NULL,
    updated_at        timestamptz NOT NULL,
    status_reason     text,
    -- The last JobPending published, so an unchanged reason/position is not re-published.
    pending_reason    text,
    pending_position  integer CHECK (pending_position >= 1),
    CHECK ((pending_reason IS NULL) = (pending_position IS NULL)),
    CHECK (pending_reason IS NULL OR status = 'QUEUED')
);
CREATE INDEX jobs_queue ON jobs (submitted_at, seq) WHERE status = 'QUEUED';

-- Fencing numbers: every allocation takes the next one, so a job's epochs only grow.
CREATE SEQUENCE allocation_epoch AS bigint;

CREATE TABLE allocations (
    allocation_id  uuid PRIMARY KEY,
    job_id         text NOT NULL REFERENCES jobs (job_id),
    node_id        text NOT NULL REFERENCES nodes (node_id),
    epoch          bigint NOT NULL UNIQUE,
    attempt        integer NOT NULL CHECK (attempt >= 0),
    gpu_indices    integer[] NOT NULL CHECK (cardinality(gpu_indices) >= 1),
    status         text NOT NULL CHECK (status IN ('GRANTED', 'RUNNING', 'RELEASED')),
    granted_at     timestamptz NOT NULL,
    started_at     timestamptz,
    released_at    timestamptz,
    outcome        text CHECK (outcome IN ('succeeded', 'failed', 'cancelled', 'preempted', 'lost')),
    CHECK ((status = 'RELEASED') = (released_at IS NOT NULL)),
    CHECK ((released_at IS NULL) = (outcome IS NULL)),
    CHECK (released_at IS NULL OR released_at >= granted_at)
);
-- A job holds at most one live allocation.
CREATE UNIQUE INDEX allocations_one_live_per_job ON allocations (job_id) WHERE released_at IS NULL;
CREATE INDEX allocations_live_by_node ON allocations (node_id) WHERE released_at IS NULL;

-- One row per leased GPU. The partial unique index is THE guarantee against double
-- allocation: two live leases on one GPU cannot both commit, whatever the code does.
-- (That gpu_index < the node's gpu_count is checked by the placement code.)
CREATE TABLE gpu_leases (
    allocation_id  uuid NOT NULL REFERENCES allocations (allocation_id),
    node_id        text NOT NULL REFERENCES nodes (node_id),
    gpu_index      integer NOT NULL CHECK (gpu_index >= 0),
    released_at    timestamptz,
    PRIMARY KEY (allocation_id, gpu_index)
);
CREATE UNIQUE INDEX gpu_leases_one_live_per_gpu ON gpu_leases (node_id, gpu_index)
    WHERE released_at IS NULL;

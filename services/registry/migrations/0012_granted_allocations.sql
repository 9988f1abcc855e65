-- The scheduler's grants, as the registry heard them (allocation.granted). A runner may
-- publish job.* events for any job id, so a job.started is believed only as its grant says
-- (job, node, attempt, epoch and the spec's digest: handlers.on_started), and a checkpoint
-- or a success only of a run so started. One row per allocation, as runs has.
CREATE TABLE granted_allocations (
    allocation_id  text PRIMARY KEY,
    job_id         text NOT NULL,
    node_id        text NOT NULL,
    attempt        integer NOT NULL CHECK (attempt >= 0),
    epoch          bigint NOT NULL,
    spec_sha256    text NOT NULL CHECK (spec_sha256 ~ '^[0-9a-f]{64}$'),
    recorded_at    timestamptz NOT NULL
);

-- Reproducibility: how each job ended (the outcome a reproduction is compared against) and
-- the verdict on each reproduction (services/registry/reproduction.py).

-- One row per job, from its end: job.succeeded (its final metrics and final committed
-- checkpoint), the scheduler's job.failed, or job.cancelled. Non-finite metrics are stored
-- as the strings "NaN", "Infinity" and "-Infinity" (jsonb holds no NaN).
CREATE TABLE job_outcomes (
    job_id             text PRIMARY KEY,
    status             text NOT NULL CHECK (status IN ('succeeded', 'failed', 'cancelled')),
    metrics            jsonb NOT NULL,
    checkpoint_uri     text,
    checkpoint_sha256  text CHECK (checkpoint_sha256 ~ '^[0-9a-f]{64}$'),
    ended_at           timestamptz NOT NULL
);

-- One verdict per reproduction (the job whose spec names the original in reproduces),
-- decided once, when the reproduction ends.
CREATE TABLE reproductions (
    job_id              text PRIMARY KEY,
    original_job_id     text NOT NULL,
    team                text NOT NULL,
    verdict             text NOT NULL
                        CHECK (verdict IN ('identical', 'within_tolerance', 'different')),
    differences         jsonb NOT NULL,
    metrics             jsonb NOT NULL,
    weights             jsonb NOT NULL,
    relative_tolerance  double precision NOT NULL CHECK (relative_tolerance >= 0),
    decided_at          timestamptz NOT NULL
);
CREATE INDEX reproductions_by_original ON reproductions (original_job_id);

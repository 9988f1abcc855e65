-- Billing: what a GPU-hour costs, and what each ended allocation cost.

-- Prices per GPU-hour by flavor; upserted from the service settings at every start.
CREATE TABLE price_book (
    flavor              text PRIMARY KEY,
    price_per_gpu_hour  numeric NOT NULL CHECK (price_per_gpu_hour >= 0),
    currency            text NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    updated_at          timestamptz NOT NULL
);

-- One row per ended allocation: the primary key is what makes a redelivered or repeated
-- AllocationReleased bill nothing twice. Amounts are exact decimals, never floats.
CREATE TABLE usage_ledger (
    allocation_id       text PRIMARY KEY,
    job_id              text NOT NULL,
    team                text NOT NULL,
    user_name           text NOT NULL,
    node_id             text NOT NULL,
    gpu_flavor          text NOT NULL,
    gpus                integer NOT NULL CHECK (gpus >= 0),
    started_at          timestamptz NOT NULL,
    ended_at            timestamptz NOT NULL,
    outcome             text NOT NULL
                          CHECK (outcome IN ('succeeded', 'failed', 'cancelled', 'preempted', 'lost')),
    gpu_seconds         numeric NOT NULL CHECK (gpu_seconds >= 0),
    price_per_gpu_hour  numeric NOT NULL CHECK (price_per_gpu_hour >= 0),
    currency            text NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    cost                numeric(24, 6) NOT NULL CHECK (cost >= 0),
    event_id            text NOT NULL,
    recorded_at         timestamptz NOT NULL,
    CHECK (ended_at >= started_at)
);
CREATE INDEX usage_ledger_by_team ON usage_ledger (team, user_name, job_id);
CREATE INDEX usage_ledger_by_job ON usage_ledger (job_id);

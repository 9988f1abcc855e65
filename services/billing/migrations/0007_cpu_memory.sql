-- CPU and memory: dated prices per flavor, metered beside the GPUs of each allocation
-- (docs/billing.md, "CPU and memory").

-- What the grant said the allocation holds besides its GPUs: its GPUs x the job spec's
-- cpus_per_gpu and memory_gib_per_gpu. 0 for grants announced before this migration, and
-- for jobs that declare none.
ALTER TABLE announced_allocations
    ADD COLUMN cpus       integer NOT NULL DEFAULT 0 CHECK (cpus >= 0),
    ADD COLUMN memory_gib integer NOT NULL DEFAULT 0 CHECK (memory_gib >= 0);

-- Prices per CPU-hour ('cpu') and per GiB-hour of memory ('memory') by flavor, each from its
-- effective date until the next one of the same flavor and resource; the same rule as the
-- GPU prices of `prices` (a row of the same key replaces only a price not in force yet).
CREATE TABLE resource_prices (
    flavor               text NOT NULL,
    resource             text NOT NULL CHECK (resource IN ('cpu', 'memory')),
    effective_from       timestamptz NOT NULL,
    price_per_unit_hour  numeric NOT NULL CHECK (price_per_unit_hour >= 0),
    currency             text NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    set_by               text NOT NULL,
    recorded_at          timestamptz NOT NULL,
    PRIMARY KEY (flavor, resource, effective_from)
);

-- The current bill keeps what it metered besides GPUs (an amendment reprices them too);
-- its cost is the whole bill: GPUs, CPUs and memory.
ALTER TABLE usage_ledger
    ADD COLUMN cpus       integer NOT NULL DEFAULT 0 CHECK (cpus >= 0),
    ADD COLUMN memory_gib integer NOT NULL DEFAULT 0 CHECK (memory_gib >= 0);

-- Each entry's lines besides its GPUs: CPU-seconds and GiB-seconds of memory, the price each
-- was charged at (NULL: the flavor had no price for it, charged 0) and its cost. An entry's
-- `cost` is the sum of its GPU, CPU and memory costs. ADD COLUMN is no UPDATE: the
-- append-only trigger stays as it is, and earlier entries read 0.
ALTER TABLE ledger_entries
    ADD COLUMN cpus                       integer NOT NULL DEFAULT 0 CHECK (cpus >= 0),
    ADD COLUMN memory_gib                 integer NOT NULL DEFAULT 0 CHECK (memory_gib >= 0),
    ADD COLUMN cpu_seconds                numeric NOT NULL DEFAULT 0,
    ADD COLUMN price_per_cpu_hour         numeric CHECK (price_per_cpu_hour >= 0),
    ADD COLUMN cpu_cost                   numeric(24, 6) NOT NULL DEFAULT 0,
    ADD COLUMN memory_gib_seconds         numeric NOT NULL DEFAULT 0,
    ADD COLUMN price_per_memory_gib_hour  numeric CHECK (price_per_memory_gib_hour >= 0),
    ADD COLUMN memory_cost                numeric(24, 6) NOT NULL DEFAULT 0;

-- The rollups keep the same lines (their `cost` stays the total), and the CPU and memory time
-- charged 0 for want of a price, so a report can say so.
ALTER TABLE cost_rollups
    ADD COLUMN cpu_seconds                  numeric NOT NULL DEFAULT 0,
    ADD COLUMN cpu_cost                     numeric(24, 6) NOT NULL DEFAULT 0,
    ADD COLUMN unpriced_cpu_seconds         numeric NOT NULL DEFAULT 0,
    ADD COLUMN memory_gib_seconds           numeric NOT NULL DEFAULT 0,
    ADD COLUMN memory_cost                  numeric(24, 6) NOT NULL DEFAULT 0,
    ADD COLUMN unpriced_memory_gib_seconds  numeric NOT NULL DEFAULT 0;

-- Billing's append-only ledger, its attribution dimensions, and the rollups kept from it
-- (docs/billing.md).

-- What a grant says about its job beyond what its release repeats: the job's project (from
-- its spec), the scheduler's queue (NULL when the grant did not say), the attempt and epoch.
-- NULL for allocations announced before this migration.
ALTER TABLE announced_allocations
    ADD COLUMN project text,
    ADD COLUMN queue   text,
    ADD COLUMN attempt integer,
    ADD COLUMN epoch   bigint;

-- usage_ledger stays the one current bill per allocation (its primary key is what makes a
-- repeated release bill nothing twice); ledger_entries below is the record of every
-- change to money, and nothing in it is ever changed or removed.
COMMENT ON TABLE usage_ledger IS
    'The current bill of each allocation (one row each); the money record is ledger_entries';

-- One row per change to what an allocation is billed: a 'charge' when its first release is
-- billed, and, when a bill is amended (a lost allocation's late success), a 'reversal' that
-- cancels the previous charge exactly (same interval, negated amounts) and a new 'charge'
-- of the next revision. The sum of an allocation's entries is its current bill.
CREATE TABLE ledger_entries (
    entry_id            bigserial PRIMARY KEY,
    allocation_id       text NOT NULL,
    revision            integer NOT NULL CHECK (revision >= 0),
    kind                text NOT NULL CHECK (kind IN ('charge', 'reversal')),
    job_id              text NOT NULL,
    team                text NOT NULL,
    project             text,
    user_name           text NOT NULL,
    queue               text,
    gpu_flavor          text NOT NULL,
    node_id             text NOT NULL,
    attempt             integer,
    epoch               bigint,
    gpus                integer NOT NULL CHECK (gpus >= 0),
    started_at          timestamptz NOT NULL,
    ended_at            timestamptz NOT NULL,
    outcome             text NOT NULL
                          CHECK (outcome IN ('succeeded', 'failed', 'cancelled', 'preempted', 'lost')),
    gpu_seconds         numeric NOT NULL,
    price_per_gpu_hour  numeric NOT NULL CHECK (price_per_gpu_hour >= 0),
    currency            text NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    cost                numeric(24, 6) NOT NULL,
    event_id            text NOT NULL,
    recorded_at         timestamptz NOT NULL,
    UNIQUE (allocation_id, revision, kind),
    CHECK (ended_at >= started_at),
    CHECK ((kind = 'charge' AND gpu_seconds >= 0 AND cost >= 0)
           OR (kind = 'reversal' AND gpu_seconds <= 0 AND cost <= 0))
);
CREATE INDEX ledger_entries_by_job ON ledger_entries (job_id);
CREATE INDEX ledger_entries_by_time ON ledger_entries (ended_at, started_at);
CREATE INDEX ledger_entries_by_team_time ON ledger_entries (team, ended_at);

-- Append-only, enforced by the database: corrections are new entries, never edits.
CREATE FUNCTION ledger_entries_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'ledger_entries is append-only (% refused): correct with a new entry', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END $$;
CREATE TRIGGER ledger_entries_append_only BEFORE UPDATE OR DELETE OR TRUNCATE ON ledger_entries
    FOR EACH STATEMENT EXECUTE FUNCTION ledger_entries_append_only();

-- Sums of the ledger per UTC hour, day and month and per team, project, user, queue, flavor
-- and currency, kept in the transaction that appends the entries. Each entry is split at the
-- hour boundaries it straddles (services/billing/buckets.py); a day or month holds exactly
-- the sum of its hours. Derived data: rebuilt from ledger_entries by
-- services.billing.ledger_repository.rebuild_rollups.
CREATE TABLE cost_rollups (
    granularity  text NOT NULL CHECK (granularity IN ('hour', 'day', 'month')),
    bucket       timestamptz NOT NULL,
    team         text NOT NULL,
    project      text,
    user_name    text NOT NULL,
    queue        text,
    gpu_flavor   text NOT NULL,
    currency     text NOT NULL,
    gpu_seconds  numeric NOT NULL,
    cost         numeric(24, 6) NOT NULL,
    UNIQUE NULLS NOT DISTINCT
        (granularity, bucket, team, project, user_name, queue, gpu_flavor, currency)
);
CREATE INDEX cost_rollups_by_team ON cost_rollups (granularity, team, bucket);

-- Bills recorded before this migration become revision 0 charges; rollups for them are
-- built at the service's next start (rebuild_rollups, when rollups are empty).
INSERT INTO ledger_entries (allocation_id, revision, kind, job_id, team, project, user_name,
                            queue, gpu_flavor, node_id, gpus, started_at, ended_at, outcome,
                            gpu_seconds, price_per_gpu_hour, currency, cost, event_id,
                            recorded_at)
SELECT u.allocation_id, 0, 'charge', u.job_id, u.team, NULL, u.user_name, NULL, u.gpu_flavor,
       u.node_id, u.gpus, u.started_at, u.ended_at, u.outcome, u.gpu_seconds,
       u.price_per_gpu_hour, u.currency, u.cost, u.event_id, u.recorded_at
FROM usage_ledger u ORDER BY u.recorded_at, u.allocation_id;

-- Billing's replica of the scheduler's flavor catalogue, the price book with effective
-- dates, budgets and their threshold crossings (docs/billing.md).

-- The flavor catalogue as the scheduler said it (flavor.declared / flavor.retired): the
-- latest revision of each flavor wins; a retired flavor keeps its row (retired = true), so
-- an older declaration delivered late cannot bring it back.
CREATE TABLE flavors (
    name         text PRIMARY KEY,
    description  text NOT NULL DEFAULT '',
    revision     bigint NOT NULL,
    retired      boolean NOT NULL DEFAULT false,
    changed_at   timestamptz NOT NULL
);

-- Prices per GPU-hour by flavor, each from its effective date until the next one's. Rows
-- are never changed: a new price is a new row (a row of the same flavor and date replaces
-- only a price whose date has not come yet, see services/billing/prices.py).
CREATE TABLE prices (
    flavor              text NOT NULL,
    effective_from      timestamptz NOT NULL,
    price_per_gpu_hour  numeric NOT NULL CHECK (price_per_gpu_hour >= 0),
    currency            text NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    set_by              text NOT NULL,
    recorded_at         timestamptz NOT NULL,
    PRIMARY KEY (flavor, effective_from)
);
-- The prices in force before this migration apply from the beginning.
INSERT INTO prices (flavor, effective_from, price_per_gpu_hour, currency, set_by, recorded_at)
SELECT flavor, '1970-01-01T00:00:00Z', price_per_gpu_hour, currency, 'price_book', updated_at
FROM price_book;
DROP TABLE price_book;

-- A bill that straddles a price change is charged in one ledger entry per price: the
-- entries of one charge are its segments, numbered from 0 in time order.
ALTER TABLE ledger_entries ADD COLUMN segment integer NOT NULL DEFAULT 0 CHECK (segment >= 0);
ALTER TABLE ledger_entries DROP CONSTRAINT ledger_entries_allocation_id_revision_kind_key;
ALTER TABLE ledger_entries ADD CONSTRAINT ledger_entries_one_per_segment
    UNIQUE (allocation_id, revision, kind, segment);

-- Budgets per team (project '') or per team and project, per UTC month, in money.
CREATE SEQUENCE budget_revisions;
CREATE TABLE budgets (
    team        text NOT NULL,
    project     text NOT NULL DEFAULT '',
    amount      numeric(24, 6) NOT NULL CHECK (amount > 0),
    currency    text NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    thresholds  integer[] NOT NULL,
    policy      text NOT NULL CHECK (policy IN ('refuse', 'deprioritize', 'warn')),
    revision    bigint NOT NULL,
    updated_by  text NOT NULL,
    updated_at  timestamptz NOT NULL,
    PRIMARY KEY (team, project)
);

-- Each threshold of a budget is crossed at most once per month: the primary key is what
-- makes budget.threshold_crossed said once, whatever is redelivered.
CREATE TABLE budget_crossings (
    team               text NOT NULL,
    project            text NOT NULL,
    month              date NOT NULL,
    threshold_percent  integer NOT NULL,
    spent              numeric(24, 6) NOT NULL,
    crossed_at         timestamptz NOT NULL,
    PRIMARY KEY (team, project, month, threshold_percent)
);

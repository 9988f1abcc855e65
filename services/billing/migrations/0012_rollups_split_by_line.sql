-- The rollups' hourly cost is now the sum of the hour's GPU, CPU and memory costs, each
-- split on its own (docs/billing.md, "Rollups"), where it was split apart from them: a
-- rollup made before could hold an hour whose GPU cost (the cost less the CPU and memory
-- costs) is a micro-unit below 0, and a reversal split the new way would not cancel its
-- charge split the old way hour by hour. A row here marks the rollups stale: the service
-- rebuilds them from the ledger when it starts (under the rollups' lock, the old rollups
-- answering reports meanwhile) and deletes the row in the same transaction.
-- Forward-only: earlier files are never edited.
CREATE TABLE cost_rollups_stale (
    reason    text PRIMARY KEY,
    marked_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO cost_rollups_stale (reason)
    VALUES ('0012: the hourly cost is the sum of its lines, split each on its own');

-- Attempts that failed through the platform are charged to the platform, not the team
-- (docs/billing.md, "What is billed, and when").

-- The runner's failure_kind of a failed attempt (job.failed); NULL for a success, a
-- preemption, and reports recorded before this migration.
ALTER TABLE waste_run_reports ADD COLUMN failure_kind text;

-- Whom an allocation's bill is charged to: the team (every bill before this migration), or
-- the platform, when its runner said the attempt failed through the platform. A platform's
-- bill has no charge in ledger_entries (or its team's charge reversed): only the team's
-- money is in the ledger, its rollups and budgets.
ALTER TABLE usage_ledger
    ADD COLUMN charged_to text NOT NULL DEFAULT 'team' CHECK (charged_to IN ('team', 'platform'));

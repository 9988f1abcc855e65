-- What billing last said of each budget's state (budget.updated, which submission's
-- admission acts on): the month it was about and whether it was exhausted. A bill or the
-- check of running allocations says the state again whenever the month's spending makes
-- it differ, not only when a threshold is crossed (docs/billing.md, "Budgets"). Null for
-- a budget not said since this migration: said again once it is exhausted.
ALTER TABLE budgets ADD COLUMN said_month date, ADD COLUMN said_exhausted boolean;

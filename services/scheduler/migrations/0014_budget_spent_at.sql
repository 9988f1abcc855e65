-- When billing measured a budget's spent (budget.updated's spent_at) and which running
-- allocations' accrued cost that spent counts (accruing, a JSON array of allocation ids):
-- a running job among them is reserved only what it can cost after spent_at, not its whole
-- worst case again (budget_holds.py, "Reservations"). Null: a state said without them
-- (before they existed, or too many running allocations): each running job is reserved
-- whole.
-- Forward-only: earlier files are never edited.
ALTER TABLE budget_states ADD COLUMN spent_at timestamptz, ADD COLUMN accruing jsonb;

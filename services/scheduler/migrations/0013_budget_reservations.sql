-- What billing reserves a job of each flavor at (budget.updated's rates: the highest GPU,
-- CPU and memory prices per hour from the state's moment on), kept with the budget's state.
-- Null: a state without rates (said before they existed, or of a budget that reserves
-- nothing): the budget holds jobs only once spent (budget_holds.py, "Reservations").
-- Forward-only: earlier files are never edited.
ALTER TABLE budget_states ADD COLUMN rates jsonb;

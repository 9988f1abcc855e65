-- What a spent budget does with its running jobs (said in budget.updated; the scheduler
-- acts on it): 'finish' lets them run (every budget set before this column), 'stop' stops
-- them with a checkpoint, as a preemption (docs/billing.md, "Budgets").
-- Forward-only: earlier files are never edited.
ALTER TABLE budgets
    ADD COLUMN on_exhausted text NOT NULL DEFAULT 'finish'
        CHECK (on_exhausted IN ('finish', 'stop'));

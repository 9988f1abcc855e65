-- The priority class a job asked for when a spent budget (policy deprioritize) had submission
-- admit it at low instead (job.submitted's lowered_from); NULL for a job admitted at the class
-- it asked for, and for jobs queued before this column. Only such a job's explanation names
-- the budget (budget_holds.lowered_by). Forward-only: earlier files are never edited.
ALTER TABLE jobs ADD COLUMN lowered_from text;

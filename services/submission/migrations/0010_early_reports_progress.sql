-- Kept progress reports are counted apart from the other kept reports of a job, so a
-- runner's progress (one a second while a grant waits) never takes the room of the job's
-- start, checkpoints and end (services/submission/early_reports.py).
ALTER TABLE early_reports ADD COLUMN progress boolean NOT NULL DEFAULT false;

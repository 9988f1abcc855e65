-- The scheduler now says, for a pending job, who or what holds what it needs and what would
-- let it start now (job.pending's ``blocking`` and ``suggestion``); the job view shows both.
ALTER TABLE jobs ADD COLUMN pending_blocking text;
ALTER TABLE jobs ADD COLUMN pending_suggestion text;

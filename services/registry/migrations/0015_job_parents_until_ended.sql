-- A parent version is kept while a job that fine-tunes from it has not ended, from its
-- admission on (docs/models.md, "Deleting a version"): job_parents is written when the
-- registry hears of the job (job.submitted, else its grant or start), and ended_at is set
-- when the job ends (succeeded, failed for good, cancelled). A version's deletion is
-- refused while a row naming it has no ended_at. Rows of jobs that ended before this are
-- ended now, from tracking's view of them.
ALTER TABLE job_parents ADD COLUMN ended_at timestamptz;

UPDATE job_parents p SET ended_at = coalesce(t.ended_at, p.recorded_at)
FROM tracked_jobs t
WHERE t.job_id = p.job_id AND t.status <> 'running';

CREATE INDEX job_parents_in_use ON job_parents (parent_version_id) WHERE ended_at IS NULL;

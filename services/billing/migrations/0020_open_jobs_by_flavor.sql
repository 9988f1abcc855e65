-- Whether a job of a flavor was waiting (``waste_repository._WAITING_AT``: read at every
-- heartbeat of a node with GPUs free, and again for each unallocated interval a grant, a
-- job's end or a refusal may take back) is found from the flavor's open jobs and those
-- ended after the instant, never by walking every job the flavor ever had: with ``0005``'s
-- index by flavor and submission alone each look read the flavor's whole history, ended
-- jobs first, which only grows. ``ended`` is set when the job's end is recorded
-- (``waste_repository.record_end``, or ``record_job`` when the end came first); it only
-- narrows the search: the query still checks the job's end, so a row whose end a replica
-- from before this file recorded (left false) counts right.
-- Forward-only: earlier files are never edited.
ALTER TABLE waste_jobs ADD COLUMN ended boolean NOT NULL DEFAULT false;
UPDATE waste_jobs j SET ended = true
WHERE EXISTS (SELECT 1 FROM waste_job_ends e WHERE e.job_id = j.job_id);
CREATE INDEX IF NOT EXISTS waste_jobs_open_by_flavor
    ON waste_jobs (gpu_flavor, submitted_at) WHERE NOT ended;

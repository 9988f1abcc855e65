-- Jobs the scheduler refused on arrival (its ``job.failed`` with ``failure_kind``
-- ``rejected``): they never waited for GPUs. Kept so that a ``job.submitted`` handled after
-- the refusal (another subject, another publisher: any order) does not record the job
-- (``waste_repository.record_job``). Before, a refusal handled first deleted nothing, the
-- submission then recorded the job, and it waited for ever: in queueing until now, and as a
-- job waiting for the unallocated GPUs of its flavor.
-- Forward-only: earlier files are never edited.
CREATE TABLE waste_refused_jobs (
    job_id       text PRIMARY KEY,
    recorded_at  timestamptz NOT NULL
);

-- A runner's report that came before what it follows: a job.started, job.succeeded,
-- job.failed or job.preempted about an allocation whose grant this view has not recorded,
-- or a job.succeeded of an allocation that has not started. The stream does not always keep
-- that order: after NATS lost its store, the scheduler's replayed grants and the runners'
-- reports reach the new stream in whatever order they come, and the same report said again
-- later is dropped by JetStream as a duplicate. So the report is kept here, whole, and judged
-- right after its allocation's grant or start is; a job's rows go when the job ends
-- (services/submission/early_reports.py).
CREATE TABLE early_reports (
    seq            bigserial PRIMARY KEY,
    allocation_id  text NOT NULL,
    job_id         text NOT NULL REFERENCES jobs (id),
    event          bytea NOT NULL,
    kept_at        timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX early_reports_allocation ON early_reports (allocation_id, seq);
CREATE INDEX early_reports_job ON early_reports (job_id);

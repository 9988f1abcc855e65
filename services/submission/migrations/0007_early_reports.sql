-- Reports that came before the grant they answer (a job.started, job.succeeded, job.failed
-- or job.preempted about an allocation this view has not heard of yet). The stream does not
-- always keep a grant ahead of its reports: after NATS lost its store, the scheduler's replay
-- and a runner's reports reach the new stream in whatever order they come, and the same
-- report said again later is dropped by JetStream as a duplicate. So a report is kept here,
-- whole, and applied right after its allocation's grant is; its job's rows go when the job
-- ends (services/submission/early_reports.py).
CREATE TABLE early_reports (
    seq            bigserial PRIMARY KEY,
    allocation_id  text NOT NULL,
    job_id         text NOT NULL REFERENCES jobs (id),
    event          bytea NOT NULL,
    kept_at        timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX early_reports_allocation ON early_reports (allocation_id, seq);
CREATE INDEX early_reports_job ON early_reports (job_id);

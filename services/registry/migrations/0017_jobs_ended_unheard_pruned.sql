-- A kept end (0016) matters only while an event naming the job's parent can still be
-- delivered: the event stream keeps an event for TRAINYARD_NATS_RETENTION_HOURS, and the
-- registry's retention deletes a row once it was kept longer than that
-- (services/registry/retention.py). The row's age is of when the registry kept it, not the
-- job's end (a runner's clock says when a job finished). Rows kept before this count from
-- now.
ALTER TABLE jobs_ended_unheard ADD COLUMN kept_at timestamptz NOT NULL DEFAULT now();
CREATE INDEX jobs_ended_unheard_kept_at ON jobs_ended_unheard (kept_at);

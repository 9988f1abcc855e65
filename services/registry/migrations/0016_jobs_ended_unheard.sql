-- A job can end before the registry hears of its parent: its job.cancelled (or job.failed,
-- job.succeeded) handled before its job.submitted, grant or start, which a redelivery or
-- two publishers' relays can reorder. Its end is kept here, so that the parent recorded
-- later is recorded ended and keeps no version from deletion (job_inputs.ended,
-- job_inputs.record_parent). One row per job that ended with no job_parents row and
-- none of its starts handled (a start records the parent): mostly jobs that never ran.
CREATE TABLE jobs_ended_unheard (
    job_id    text PRIMARY KEY,
    ended_at  timestamptz NOT NULL
);

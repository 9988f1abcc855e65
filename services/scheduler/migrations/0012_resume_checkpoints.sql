-- The checkpoint each job's next attempt resumes from (allocation.granted's resume): the
-- newest by step that the job's own allocations reported committed (checkpoint.saved, which
-- the scheduler believes only from the node of the job's live allocation at its epoch),
-- with the size and sha256 they committed. The runner restores exactly this one, never a
-- newer folder it finds in the store (any node can write any key there). No row: the job
-- starts from nothing (as does a job that saved before this table; its later saves fill it).
-- Forward-only: earlier files are never edited.
CREATE TABLE resume_checkpoints (
    job_id        text PRIMARY KEY REFERENCES jobs (job_id) ON DELETE CASCADE,
    uri           text NOT NULL,
    manifest_uri  text NOT NULL,
    step          bigint NOT NULL,
    size_bytes    bigint NOT NULL,
    sha256        text NOT NULL,
    saved_at      timestamptz NOT NULL
);

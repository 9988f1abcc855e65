-- Allocations the scheduler announced (allocation.granted), as billing saw them. A release is
-- metered only for one of these and only when it agrees with its grant: a release of an
-- allocation never announced, or one that differs from its grant, is rejected to the
-- dead-letter stream (docs/security.md, "Bus").
CREATE TABLE announced_allocations (
    allocation_id  text PRIMARY KEY,
    job_id         text NOT NULL,
    node_id        text NOT NULL,
    team           text NOT NULL,
    user_name      text NOT NULL,
    gpu_flavor     text NOT NULL,
    gpus           integer NOT NULL CHECK (gpus >= 0),
    granted_at     timestamptz NOT NULL,
    event_id       text NOT NULL,
    recorded_at    timestamptz NOT NULL
);

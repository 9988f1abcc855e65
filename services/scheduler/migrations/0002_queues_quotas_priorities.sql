-- Fair, explainable scheduling: flavors, cohorts, team queues with quotas per flavor,
-- priority classes, decayed fair-share usage, topology, gang allocations, preemption notices
-- and checkpoint times. Forward-only: 0001 is never edited.

-- GPU flavors. Registered automatically by the first heartbeat of a node of the flavor, or
-- ahead of any node by an operator (so quotas can name it).
CREATE TABLE flavors (
    name         text PRIMARY KEY CHECK (length(name) BETWEEN 1 AND 100),
    description  text NOT NULL DEFAULT '',
    created_at   timestamptz NOT NULL DEFAULT now()
);
INSERT INTO flavors (name) SELECT DISTINCT gpu_flavor FROM nodes ON CONFLICT DO NOTHING;

-- Groups of queues that lend each other unused nominal quota.
CREATE TABLE cohorts (
    name         text PRIMARY KEY,
    description  text NOT NULL DEFAULT '',
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now()
);

-- One queue per team. An *implicit* queue ('default:<team>', made on the team's first
-- submission when no operator defined one) has no quota rows and may use every ready GPU;
-- it is replaced when an operator defines a queue for the team.
CREATE TABLE queues (
    name         text PRIMARY KEY,
    team         text NOT NULL UNIQUE,
    cohort       text REFERENCES cohorts (name),
    weight       double precision NOT NULL DEFAULT 1 CHECK (weight > 0),
    implicit     boolean NOT NULL DEFAULT false,
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    CHECK (NOT implicit OR cohort IS NULL),
    CHECK (implicit = (name LIKE 'default:%')),
    UNIQUE (name, implicit)
);

-- Quota of a queue per flavor (Kueue's ClusterQueue resource groups). Only explicit queues
-- have quotas: the (queue, queue_implicit) foreign key with queue_implicit = false says so.
CREATE TABLE quotas (
    queue            text NOT NULL,
    queue_implicit   boolean NOT NULL DEFAULT false CHECK (NOT queue_implicit),
    flavor           text NOT NULL REFERENCES flavors (name),
    nominal          integer NOT NULL CHECK (nominal >= 0),
    borrowing_limit  integer CHECK (borrowing_limit >= 0),
    lending_limit    integer CHECK (lending_limit >= 0 AND lending_limit <= nominal),
    PRIMARY KEY (queue, flavor),
    FOREIGN KEY (queue, queue_implicit) REFERENCES queues (name, implicit) ON DELETE CASCADE
);

-- Priority classes: a higher value runs first and may preempt lower values within a queue;
-- preemptibility is separate from priority; a job runs at least min_runtime_seconds before
-- it may be preempted.
CREATE TABLE priority_classes (
    name                 text PRIMARY KEY,
    value                integer NOT NULL,
    preemptible          boolean NOT NULL,
    min_runtime_seconds  double precision NOT NULL DEFAULT 0 CHECK (min_runtime_seconds >= 0),
    description          text NOT NULL DEFAULT '',
    created_at           timestamptz NOT NULL DEFAULT now(),
    updated_at           timestamptz NOT NULL DEFAULT now()
);
INSERT INTO priority_classes (name, value, preemptible, description) VALUES
    ('low', 0, true, 'experiments that may wait and be preempted'),
    ('normal', 100, true, 'the default class of a job'),
    ('high', 1000, false, 'deadlines: preempts lower classes, is never preempted');

-- Fair-share usage per team: GPU-seconds of ended allocations, decayed with the configured
-- half-life; ``gpu_seconds`` is the value at ``as_of``.
CREATE TABLE usage (
    team         text PRIMARY KEY,
    gpu_seconds  double precision NOT NULL CHECK (gpu_seconds >= 0),
    as_of        timestamptz NOT NULL
);

-- Topology domain of a node (NVLink domain, rack) for multi-node gangs.
ALTER TABLE nodes ADD COLUMN topology text NOT NULL DEFAULT 'default';

-- Jobs: their priority class (unknown names wait, see the docs), their team's queue, their
-- declared runtime (for backfill and estimates), and the rest of the last JobPending.
ALTER TABLE jobs ADD COLUMN priority_class text NOT NULL DEFAULT 'normal';
ALTER TABLE jobs ADD COLUMN max_runtime_seconds integer NOT NULL DEFAULT 3600
    CHECK (max_runtime_seconds >= 1);
UPDATE jobs SET max_runtime_seconds = GREATEST(1, (spec ->> 'max_runtime_seconds')::integer)
    WHERE spec ? 'max_runtime_seconds';
UPDATE jobs SET priority_class = spec ->> 'priority' WHERE spec ? 'priority';
ALTER TABLE jobs ADD COLUMN queue text;
INSERT INTO queues (name, team, implicit)
    SELECT DISTINCT 'default:' || team, team, true FROM jobs ON CONFLICT DO NOTHING;
UPDATE jobs SET queue = 'default:' || team;
ALTER TABLE jobs ALTER COLUMN queue SET NOT NULL;
-- ON UPDATE CASCADE: an implicit queue becomes the team's real one by renaming it.
ALTER TABLE jobs ADD FOREIGN KEY (queue) REFERENCES queues (name) ON UPDATE CASCADE;
-- The trace context of the job's submission: events a pass says about the job (grants,
-- notices, pending notes) join the job's trace, whatever else triggered the pass.
ALTER TABLE jobs ADD COLUMN trace_context jsonb;
ALTER TABLE jobs ADD COLUMN pending_blocking text;
ALTER TABLE jobs ADD COLUMN pending_suggestion text;
ALTER TABLE jobs ADD COLUMN pending_estimated_start timestamptz;
ALTER TABLE jobs ADD CHECK (
    pending_reason IS NOT NULL
    OR (pending_blocking IS NULL AND pending_suggestion IS NULL
        AND pending_estimated_start IS NULL));
CREATE INDEX jobs_queued_by_queue ON jobs (queue, submitted_at, seq) WHERE status = 'QUEUED';

-- Allocations. A gang (a job on several nodes) is one allocation per node, all with the same
-- gang_id; every GPU still has exactly one live lease at most (gpu_leases, unchanged).
ALTER TABLE allocations ADD COLUMN gang_id uuid;
UPDATE allocations SET gang_id = allocation_id;
ALTER TABLE allocations ALTER COLUMN gang_id SET NOT NULL;
ALTER TABLE allocations ADD COLUMN gang_size integer NOT NULL DEFAULT 1 CHECK (gang_size >= 1);
ALTER TABLE allocations ADD COLUMN borrowed boolean NOT NULL DEFAULT false;
-- Time of the job's latest complete checkpoint in this allocation (from checkpoint.saved):
-- victims are chosen to lose the least work.
ALTER TABLE allocations ADD COLUMN last_checkpoint_at timestamptz;
-- A preemption notice: the runner was told to checkpoint and stop; past notice_at + grace
-- the scheduler revokes the GPUs by force.
ALTER TABLE allocations ADD COLUMN notice_at timestamptz;
ALTER TABLE allocations ADD COLUMN notice_reason text;
ALTER TABLE allocations ADD CHECK ((notice_at IS NULL) = (notice_reason IS NULL));
-- A job holds at most one live allocation per node (several nodes: one gang).
DROP INDEX allocations_one_live_per_job;
CREATE UNIQUE INDEX allocations_one_live_per_job_node ON allocations (job_id, node_id)
    WHERE released_at IS NULL;
CREATE INDEX allocations_live_by_job ON allocations (job_id) WHERE released_at IS NULL;
CREATE INDEX allocations_notices ON allocations (notice_at)
    WHERE released_at IS NULL AND notice_at IS NOT NULL;

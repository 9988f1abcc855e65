-- A runner's report is believed only as its allocation's own: about the allocation's job,
-- from the node it was granted on, at its epoch (docs/billing.md, "Waste"). Reports and
-- checkpoints are kept with what they claim and matched with the grant when read, so one
-- that claims another allocation (or comes before its grant) changes no figure and cannot
-- keep the allocation's own report out.

-- The node and epoch each end report claims. Reports recorded before this migration take
-- their grant's when they named its job (as they were read until now); the others match no
-- grant ('' and -1).
ALTER TABLE waste_run_reports
    ADD COLUMN node_id text,
    ADD COLUMN epoch bigint,
    -- which end report it was: a success that came before its grant ends its job when the
    -- grant comes (null for reports recorded before this migration)
    ADD COLUMN outcome text CHECK (outcome IN ('succeeded', 'failed', 'preempted'));
UPDATE waste_run_reports r SET node_id = a.node_id, epoch = coalesce(a.epoch, -1)
FROM announced_allocations a
WHERE a.allocation_id = r.allocation_id AND a.job_id = r.job_id;
UPDATE waste_run_reports SET node_id = coalesce(node_id, ''), epoch = coalesce(epoch, -1)
WHERE node_id IS NULL OR epoch IS NULL;
ALTER TABLE waste_run_reports
    ALTER COLUMN node_id SET NOT NULL,
    ALTER COLUMN epoch SET NOT NULL,
    DROP CONSTRAINT waste_run_reports_pkey,
    ADD PRIMARY KEY (allocation_id, job_id, node_id, epoch);

-- The epoch each checkpoint claims, the same way.
ALTER TABLE waste_checkpoints ADD COLUMN epoch bigint;
UPDATE waste_checkpoints c SET epoch = coalesce(a.epoch, -1)
FROM announced_allocations a
WHERE a.allocation_id = c.allocation_id AND a.job_id = c.job_id;
UPDATE waste_checkpoints SET epoch = -1 WHERE epoch IS NULL;
ALTER TABLE waste_checkpoints
    ALTER COLUMN epoch SET NOT NULL,
    DROP CONSTRAINT waste_checkpoints_pkey,
    ADD PRIMARY KEY (job_id, saved_at, allocation_id, epoch);

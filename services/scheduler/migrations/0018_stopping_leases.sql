-- A GPU stays leased while the runner may still be stopping the job that held it: when the
-- scheduler ends an allocation without its runner's word that the job's processes are gone
-- (a gang member fenced, a preemption's grace run out, a job a late success ended, a lost
-- node's gang on its other nodes), the allocation is released (billed, the job moved on) but
-- its GPU leases stay live, ``stopping_since`` saying since when. The unique live lease per
-- GPU (``gpu_leases_one_live_per_gpu``) then refuses any new lease on those GPUs until the
-- runner reports that allocation's end, a heartbeat it sent later no longer lists it, or its
-- node is declared lost (``allocation_repository``: ``free_stopped``, ``free_unlisted``,
-- ``free_stopping_on``); it keeps ``stopping_since`` once freed. NULL: the lease of a live
-- allocation, or one freed with its allocation.
-- Forward-only: earlier files are never edited.
ALTER TABLE gpu_leases ADD COLUMN stopping_since timestamptz;
CREATE INDEX gpu_leases_stopping ON gpu_leases (node_id)
    WHERE released_at IS NULL AND stopping_since IS NOT NULL;

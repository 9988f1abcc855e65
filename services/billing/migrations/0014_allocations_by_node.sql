-- Which of a node's GPUs are held is now billing's own record of the node's allocations
-- (``waste_repository._HELD``: those granted on it and not released), not the allocations
-- its heartbeat names: a node that left its running allocations out of its heartbeats had
-- their GPUs counted unallocated. Each heartbeat looks up the node's allocations by node.
-- Forward-only: earlier files are never edited.
CREATE INDEX IF NOT EXISTS announced_allocations_by_node
    ON announced_allocations (node_id, granted_at);

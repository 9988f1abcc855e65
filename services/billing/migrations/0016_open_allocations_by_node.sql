-- Which of a node's GPUs are held (``waste_repository._HELD``, read at every heartbeat) is
-- found from the node's open allocations and those released lately, never by walking every
-- allocation the node ever had: with ``0014``'s index alone each heartbeat read the node's
-- whole history, which only grows. ``released`` is set when an allocation's bill is recorded
-- (``repository.insert_usage``); it only narrows the search: the query still checks the
-- ledger, so a row billed by a replica from before this file (left false) counts right.
-- Forward-only: earlier files are never edited.
ALTER TABLE announced_allocations ADD COLUMN released boolean NOT NULL DEFAULT false;
UPDATE announced_allocations a SET released = true
WHERE EXISTS (SELECT 1 FROM usage_ledger u WHERE u.allocation_id = a.allocation_id);
CREATE INDEX IF NOT EXISTS announced_allocations_open_by_node
    ON announced_allocations (node_id) WHERE NOT released;
CREATE INDEX IF NOT EXISTS usage_ledger_by_node_end ON usage_ledger (node_id, ended_at);
DROP INDEX IF EXISTS announced_allocations_by_node;

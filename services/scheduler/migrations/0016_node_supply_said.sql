-- Every node is judged again at its next heartbeat (``repository.touch_node`` matches only a
-- node judged under the current mode), so the scheduler says each node's supply
-- (``node.supplied``), which billing counts a node's GPUs from, without waiting for a node's
-- claim or declaration to change. Forward-only: earlier files are never edited.
UPDATE nodes SET inventory_mode = NULL;

-- What the scheduler places on each node (``node.supplied``: the node's heartbeat claim
-- capped by the operators' node inventory), the latest by ``judged_at``. A node's unallocated
-- GPUs are counted from it, no more than its heartbeat says (``waste_repository.
-- record_heartbeat``): a node's own word, its heartbeat, was counted before, so a node
-- claiming more GPUs than it has inflated the platform's unallocated GPUs.
-- An empty gpu_flavor: the node has none (undeclared while the inventory is required).
CREATE TABLE waste_node_supply (
    node_id     text PRIMARY KEY,
    gpu_flavor  text NOT NULL,
    gpu_count   integer NOT NULL CHECK (gpu_count >= 0),
    judged_at   timestamptz NOT NULL
);

-- The node inventory: what operators declare each node has (PUT /v1/admin/node-inventory/
-- {node_id}). A heartbeat's claim is capped by it (``inventory.cap``): a node gets no more
-- GPUs than declared, none when it claims another flavor, and, with
-- TRAINYARD_SCHEDULER_NODE_INVENTORY=required, none while undeclared. ``revision`` changes
-- with every write of a declaration (from node_inventory_revisions), so a node whose supply
-- was judged by an older one is judged again at its next heartbeat.
CREATE SEQUENCE node_inventory_revisions;

CREATE TABLE node_inventory (
    node_id     text PRIMARY KEY,
    gpu_flavor  text NOT NULL REFERENCES flavors (name),
    gpu_count   integer NOT NULL CHECK (gpu_count >= 0),
    topology    text,
    description text NOT NULL DEFAULT '',
    revision    bigint NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX node_inventory_by_flavor ON node_inventory (gpu_flavor);

-- A node's gpu_flavor, gpu_count and topology are now its supply (what placement uses);
-- reported_* are what its latest heartbeat claimed, capped lists what the inventory did not
-- grant (undeclared, gpu_flavor, gpu_count, topology), and inventory_mode and
-- inventory_revision what the supply was judged by (NULL revision: no declaration; NULL
-- mode: not judged yet, as every node before this file).
-- Forward-only: earlier files are never edited.
ALTER TABLE nodes
    ADD COLUMN reported_flavor text,
    ADD COLUMN reported_gpu_count integer CHECK (reported_gpu_count >= 0),
    ADD COLUMN reported_topology text,
    ADD COLUMN capped text[] NOT NULL DEFAULT '{}',
    ADD COLUMN inventory_mode text,
    ADD COLUMN inventory_revision bigint;
UPDATE nodes SET reported_flavor = gpu_flavor, reported_gpu_count = gpu_count,
    reported_topology = topology;
ALTER TABLE nodes
    ALTER COLUMN reported_flavor SET NOT NULL,
    ALTER COLUMN reported_gpu_count SET NOT NULL,
    ALTER COLUMN reported_topology SET NOT NULL;

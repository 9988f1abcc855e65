-- What a node's latest heartbeat said it runs (``running_allocations``), kept so that the
-- interval up to its next heartbeat counts the GPUs of every allocation either heartbeat
-- names as held (``waste_repository.record_heartbeat``): a job still stopping after the
-- scheduler released it (a lost node back after a short network cut, a revoke by force, a
-- gang member fenced) holds its GPUs until it exits, and they were counted unallocated.
-- The node's word only ever counts fewer GPUs free: billing's own records (grants and
-- releases) still hold what a node leaves out.
-- Forward-only: earlier files are never edited.
ALTER TABLE waste_nodes ADD COLUMN running_allocations text[] NOT NULL DEFAULT '{}';

-- The allocations each unallocated interval counted held (``waste_repository._HELD``), so
-- that an allocation billing learns held GPUs in it only later (a grant handled after
-- heartbeats of its node, a bill amended to a later end by its runner's late success) is
-- taken out of it then, once (``waste_repository.hold``): GPUs billed to a job are never
-- counted free at the same time. Before, such an interval kept counting them free.
-- NULL: an interval recorded before this file (what it counted is not known), left as it is.
-- Forward-only: earlier files are never edited.
ALTER TABLE waste_unallocated ADD COLUMN held text[];

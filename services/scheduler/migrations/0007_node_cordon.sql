-- A node can be cordoned: no new allocation is placed on it, its running jobs go on. By an
-- operator (until uncordoned: cordoned_until NULL) or by the scheduler after repeated
-- platform failures of its allocations (until cordoned_until). platform_failures counts the
-- node's allocations that ended in platform_error since its last success.
-- Forward-only: earlier files are never edited.
ALTER TABLE nodes
    ADD COLUMN cordoned_at timestamptz,
    ADD COLUMN cordon_reason text,
    ADD COLUMN cordoned_by text,
    ADD COLUMN cordoned_until timestamptz,
    ADD COLUMN platform_failures integer NOT NULL DEFAULT 0 CHECK (platform_failures >= 0),
    ADD CONSTRAINT nodes_cordon_whole CHECK (
        (cordoned_at IS NULL) = (cordon_reason IS NULL)
        AND (cordoned_at IS NULL) = (cordoned_by IS NULL)
        AND (cordoned_until IS NULL OR cordoned_at IS NOT NULL));

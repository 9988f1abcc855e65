-- node.supplied is ordered by a version of each node's supply, not the scheduler's clock
-- (``node_supply``): ``supply_version`` goes up by one whenever a judgement changes the
-- node's supply (its flavor or GPU count; ``repository.upsert_node``), under the node's row
-- lock, so two leaders, or a clock stepped back, cannot order an older supply after a newer
-- one. ``supply_said_version`` and ``supply_said_at`` are the version last said and when
-- (NULL: never said since this file): a supply is said when its version is not the one
-- last said, a change the node's own claim made at most once per ``SAY_MIN_INTERVAL``, and
-- every ready node's again at each leader's start and then hourly (``SupplyHerald``), so a
-- billing that missed one hears it. Every kept node starts at version 1, unsaid.
-- Forward-only: earlier files are never edited.
ALTER TABLE nodes
    ADD COLUMN supply_version bigint NOT NULL DEFAULT 1 CHECK (supply_version >= 1),
    ADD COLUMN supply_said_version bigint,
    ADD COLUMN supply_said_at timestamptz;

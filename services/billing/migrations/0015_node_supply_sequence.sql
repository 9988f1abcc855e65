-- A node's judgements are ordered by their ``sequence`` (``node.supplied``: the version of
-- the node's supply in the scheduler's database), not by the scheduler's clock
-- (``judged_at``), which two leaders or a clock step could run backwards, keeping an older
-- judgement (``waste_repository.record_supply``). NULL: said by a scheduler from before it,
-- ordered by judged_at among those, and older than any with a sequence.
-- Forward-only: earlier files are never edited.
ALTER TABLE waste_node_supply ADD COLUMN sequence bigint;

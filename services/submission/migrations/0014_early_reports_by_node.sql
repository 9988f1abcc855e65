-- Kept reports are counted per job and per node that sent them (the node a runner's report
-- names is the node whose NATS user published it), so a node that reports allocations of
-- another team's job that will never be granted fills only its own share of that job's
-- room, never the room of the node the job is granted on (services/submission/early_reports.py).
-- Forward-only: earlier files are never edited.
ALTER TABLE early_reports ADD COLUMN node_id text;
-- A kept event whose JSON holds a \u0000 escape (a string field is free text to a hostile
-- node) cannot be read as jsonb, and one such row would stop this migration, and the
-- service's start, for good: such rows keep no node and count with the reports naming none.
UPDATE early_reports SET node_id = convert_from(event, 'UTF8')::jsonb -> 'data' ->> 'node_id'
WHERE position('\x5c7530303030'::bytea IN event) = 0;

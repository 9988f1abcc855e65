-- Kept reports are counted per job and per node that sent them (the node a runner's report
-- names is the node whose NATS user published it), so a node that reports allocations of
-- another team's job that will never be granted fills only its own share of that job's
-- room, never the room of the node the job is granted on (services/submission/early_reports.py).
-- Forward-only: earlier files are never edited.
ALTER TABLE early_reports ADD COLUMN node_id text;
UPDATE early_reports SET node_id = convert_from(event, 'UTF8')::jsonb -> 'data' ->> 'node_id';

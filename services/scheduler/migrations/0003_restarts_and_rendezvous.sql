-- Restarts after failures and multi-node rendezvous. Forward-only: 0001 and 0002 are never
-- edited.

-- Where other nodes reach this node's job processes (its latest heartbeat's ``address``);
-- every grant of a multi-node gang lists its members' addresses.
ALTER TABLE nodes ADD COLUMN address text NOT NULL DEFAULT '127.0.0.1';

-- A job requeued after a failure backs off: it stays QUEUED but no pass places it before
-- eligible_at. NULL (or a past time): placeable now. Cleared when the job leaves QUEUED.
ALTER TABLE jobs ADD COLUMN eligible_at timestamptz;
ALTER TABLE jobs ADD CHECK (eligible_at IS NULL OR status = 'QUEUED');
CREATE INDEX jobs_backing_off ON jobs (eligible_at) WHERE eligible_at IS NOT NULL;

-- The outbox relay claims the rows it publishes instead of locking them in a transaction
-- held open while it waits for NATS (shared/outbox.py): a claim names its relay and ends at
-- ``claimed_until``, so the rows of a relay that never comes back are published by another
-- once it ran out. Claimed rows are unpublished ones, found through outbox_unpublished.
ALTER TABLE outbox ADD COLUMN claimed_by text, ADD COLUMN claimed_until timestamptz;

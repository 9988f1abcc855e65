-- A node taken out for good is retired by an operator (DELETE /v1/admin/nodes/{node_id}):
-- its row stays, since the allocations and GPU leases of its past reference it, but nothing
-- that reads live nodes counts it any more (placement, the node and GPU gauges the alerts
-- read, a flavor's nodes, the node list). Only a lost node that holds nothing live is
-- retired, so a retired node is always LOST; its next heartbeat makes it an ordinary ready
-- node again (retired_at back to NULL).
-- Forward-only: earlier files are never edited.
ALTER TABLE nodes
    ADD COLUMN retired_at timestamptz,
    ADD CONSTRAINT nodes_retired_lost CHECK (retired_at IS NULL OR status = 'LOST');

-- What an allocation's release charged to its team's fair-share usage while its runner had
-- not reported its end (a gang's members other than the one that reported, a lost node's
-- allocations, a preemption's grace run out): ``unreported_charge`` GPU-seconds, added to
-- the usage at ``unreported_charge_at``. The first end report its own runner sends later
-- (its node and epoch as granted) settles it, once: a ``platform_error`` takes that charge
-- back from the usage (decayed as the usage was), anything else leaves it; either clears
-- both columns, so a redelivered or second report finds nothing to take back
-- (``leases.refund_late_platform_failure``). NULL: nothing is open (the release followed the
-- allocation's own report, charged nothing, or was settled).
-- Forward-only: earlier files are never edited.
ALTER TABLE allocations
    ADD COLUMN unreported_charge double precision CHECK (unreported_charge >= 0),
    ADD COLUMN unreported_charge_at timestamptz,
    ADD CHECK ((unreported_charge IS NULL) = (unreported_charge_at IS NULL));

-- The latest end of an announced allocation's bill (``shared.worst_case.billed_until``: its
-- grant plus its job's ``max_runtime_seconds`` and the kill grace), which the scheduler
-- never releases it past: a running allocation accrues to its budgets up to it, no further
-- (``budgets_repository._accrual``). Before, one held past it (a long preparation, the
-- wait for its last checkpoint's upload) accrued on to now, more than its bill would ever
-- be, and could say its budget exhausted (stopping its team's jobs, refusing new ones)
-- though no bill would reach it. NULL: announced before this file; it accrues up to now.
-- Forward-only: earlier files are never edited.
ALTER TABLE announced_allocations ADD COLUMN billed_until timestamptz;

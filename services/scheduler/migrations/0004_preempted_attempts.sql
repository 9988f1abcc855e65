-- Anti-thrash: each pass counts the earlier attempts of every running job that ended by
-- preemption (its protection grows with that count); this keeps the count an index lookup.
CREATE INDEX allocations_preempted_by_job ON allocations (job_id, attempt) WHERE outcome = 'preempted';

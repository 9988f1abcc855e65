-- The trace a job's events travel in (W3C trace id, 32 lower-case hex digits): the trace of
-- the request that submitted it, so the job view can point an operator at it (Jaeger, or
-- `trainyard trace JOB`). NULL for jobs submitted before this column, or with tracing off.
ALTER TABLE jobs ADD COLUMN trace_id text CHECK (trace_id ~ '^[0-9a-f]{32}$');

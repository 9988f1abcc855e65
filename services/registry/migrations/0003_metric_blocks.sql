-- The extremes of every block of 64 steps of every metric series (services/registry/metrics.py,
-- Extremes): its first and last point (by step, then time), its min and max (NaN aside) and
-- its first NaN. Kept with the points at ingest, so that a long curve is downsampled from
-- these rows (1 per 64 steps) rather than from every point.
CREATE TABLE metric_blocks (
    series_id    bigint NOT NULL,
    block        bigint NOT NULL,
    count        bigint NOT NULL CHECK (count >= 1),
    first_step   bigint NOT NULL,
    first_at     timestamptz NOT NULL,
    first_value  double precision NOT NULL,
    last_step    bigint NOT NULL,
    last_at      timestamptz NOT NULL,
    last_value   double precision NOT NULL,
    low_step     bigint,
    low_at       timestamptz,
    low_value    double precision,
    high_step    bigint,
    high_at      timestamptz,
    high_value   double precision,
    nan_step     bigint,
    nan_at       timestamptz,
    PRIMARY KEY (series_id, block)
);

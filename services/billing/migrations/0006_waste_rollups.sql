-- Waste rollups (docs/billing.md, "Waste rollups"): the figures of each released allocation
-- (idle and unmeasured GPUs, input-bound and unmeasured time, failed attempts, lost work),
-- split at UTC hours and at its flavor's price changes, kept in the consumer's transaction
-- with the fact that changed them (a release, a run report, a checkpoint) and rebuilt by
-- ``python -m trainyard_platform.services.billing.waste_rollups``.

-- What each allocation contributes, per hour, figure and price (NULL: the flavor had no
-- price): GPU-microseconds (times the figure's share, exact), wall microseconds, and whether
-- the figure's interval starts in this hour (starts) or covers the hour's start (continues).
CREATE TABLE waste_allocation_parts (
    allocation_id       text NOT NULL,
    hour                timestamptz NOT NULL,
    figure              text NOT NULL,
    price_per_gpu_hour  numeric,
    gpu_micros          numeric NOT NULL,
    wall_micros         bigint NOT NULL,
    starts              integer NOT NULL,
    continues           integer NOT NULL,
    UNIQUE NULLS NOT DISTINCT (allocation_id, hour, figure, price_per_gpu_hour)
);

-- Their sum per hour, figure, attribution (as announced) and price: always the sum of the
-- parts (same transaction), recomputable from them.
CREATE TABLE waste_rollups_hourly (
    hour                timestamptz NOT NULL,
    figure              text NOT NULL,
    team                text,
    project             text,
    user_name           text,
    queue               text,
    gpu_flavor          text,
    price_per_gpu_hour  numeric,
    gpu_micros          numeric NOT NULL,
    wall_micros         bigint NOT NULL,
    starts              integer NOT NULL,
    continues           integer NOT NULL,
    UNIQUE NULLS NOT DISTINCT
        (hour, figure, team, project, user_name, queue, gpu_flavor, price_per_gpu_hour)
);
CREATE INDEX waste_rollups_hourly_by_team ON waste_rollups_hourly (team, hour);

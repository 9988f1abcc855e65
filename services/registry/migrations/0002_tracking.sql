-- Experiment tracking: experiments (a named group of runs in a team and project), the jobs
-- in them as far as the registry hears (job.started, job.succeeded, job.failed,
-- job.cancelled), their tags and notes, and every metric point every job reported
-- (job.metrics), with one summary row per (job, metric key).

CREATE TABLE experiments (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    team        text NOT NULL CHECK (team <> ''),
    project     text NOT NULL CHECK (project <> ''),
    name        text NOT NULL CHECK (name <> ''),
    created_at  timestamptz NOT NULL,
    UNIQUE (team, project, name)
);

-- One row per job, made by its first job.started; spec is the latest started attempt's.
CREATE TABLE tracked_jobs (
    job_id         text PRIMARY KEY,
    experiment_id  bigint NOT NULL REFERENCES experiments (id),
    team           text NOT NULL,
    name           text NOT NULL,
    user_name      text NOT NULL,
    spec           jsonb NOT NULL,
    status         text NOT NULL
                   CHECK (status IN ('running', 'succeeded', 'failed', 'cancelled')),
    started_at     timestamptz NOT NULL,
    ended_at       timestamptz,
    note           text NOT NULL DEFAULT '' CHECK (length(note) <= 10000),
    CHECK ((status = 'running') = (ended_at IS NULL))
);
CREATE INDEX tracked_jobs_by_experiment ON tracked_jobs (experiment_id, started_at DESC);

CREATE TABLE job_tags (
    job_id    text NOT NULL REFERENCES tracked_jobs (job_id),
    tag       text NOT NULL CHECK (tag ~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$'),
    added_at  timestamptz NOT NULL,
    PRIMARY KEY (job_id, tag)
);

-- The summary of one metric of one job. min/max/best are over the values that are not NaN
-- (NULL while every value was NaN); last_* is the point reported last, NaN included.
-- goal says which way is better (services/registry/metrics.py, metric_goal).
CREATE TABLE metric_series (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id      text NOT NULL,
    key         text NOT NULL CHECK (key <> ''),
    goal        text NOT NULL CHECK (goal IN ('min', 'max')),
    count       bigint NOT NULL CHECK (count >= 1),
    first_step  bigint NOT NULL,
    last_step   bigint NOT NULL,
    last_time   timestamptz NOT NULL,
    last_value  double precision NOT NULL,
    min_value   double precision,
    max_value   double precision,
    best_value  double precision,
    best_step   bigint,
    UNIQUE (job_id, key)
);
-- Runs filtered and sorted by a metric's final or best value.
CREATE INDEX metric_series_by_last ON metric_series (key, last_value);
CREATE INDEX metric_series_by_best ON metric_series (key, best_value);

-- Every point, in bulk (COPY). No foreign key: each row would cost a lookup at ingest, and
-- points are written only in the transaction that upserts their series.
CREATE TABLE metric_points (
    series_id  bigint NOT NULL,
    step       bigint NOT NULL,
    at         timestamptz NOT NULL,
    value      double precision NOT NULL
);
CREATE INDEX metric_points_by_step ON metric_points (series_id, step) INCLUDE (at, value);

-- Cost per model: what billing charged for each allocation, from its cost.recorded events
-- (one row per allocation; an amended bill replaces the row), and grants on models (another
-- team may read a model only with one; the same shape as dataset_grants).

CREATE TABLE allocation_costs (
    allocation_id  text PRIMARY KEY,
    job_id         text NOT NULL,
    team           text NOT NULL,
    gpu_flavor     text NOT NULL,
    gpus           integer NOT NULL CHECK (gpus >= 0),
    started_at     timestamptz NOT NULL,
    ended_at       timestamptz NOT NULL,
    gpu_seconds    numeric(24, 6) NOT NULL CHECK (gpu_seconds >= 0),
    cost           numeric(24, 6) NOT NULL CHECK (cost >= 0),
    currency       text NOT NULL CHECK (currency <> ''),
    event_id       text NOT NULL,
    recorded_at    timestamptz NOT NULL
);
CREATE INDEX allocation_costs_by_job ON allocation_costs (job_id);

CREATE TABLE model_grants (
    model_id      bigint NOT NULL REFERENCES models (id),
    grantee_team  text NOT NULL CHECK (grantee_team <> ''),
    granted_by    text NOT NULL,
    granted_at    timestamptz NOT NULL,
    PRIMARY KEY (model_id, grantee_team)
);
CREATE INDEX model_grants_by_grantee ON model_grants (grantee_team);

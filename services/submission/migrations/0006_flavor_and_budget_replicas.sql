-- Replicas of what other services decide and submission enforces: the scheduler's flavor
-- catalogue (flavor.declared / flavor.retired) and billing's budget states (budget.updated).
-- The latest revision of each wins; an older event delivered late changes nothing.

CREATE TABLE flavor_replica (
    name         text PRIMARY KEY,
    description  text NOT NULL DEFAULT '',
    revision     bigint NOT NULL,
    retired      boolean NOT NULL DEFAULT false,
    changed_at   timestamptz NOT NULL
);

-- project '' is the team's budget.
CREATE TABLE budget_replica (
    team       text NOT NULL,
    project    text NOT NULL,
    month      text NOT NULL,
    amount     text NOT NULL,
    spent      text NOT NULL,
    currency   text NOT NULL,
    policy     text NOT NULL,
    exhausted  boolean NOT NULL,
    deleted    boolean NOT NULL,
    revision   bigint NOT NULL,
    PRIMARY KEY (team, project)
);

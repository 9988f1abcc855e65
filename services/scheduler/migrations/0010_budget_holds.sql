-- Budgets as billing last said them (budget.updated), kept per team and project (project ''
-- for the team's own budget) with the highest revision seen, so redelivery and reordering
-- never bring back an older state. A pass holds the queued jobs of a budget that is
-- exhausted in the current UTC month and whose policy holds them (budget_holds.py).
-- Forward-only: earlier files are never edited.
CREATE TABLE budget_states (
    team          text NOT NULL,
    project       text NOT NULL,
    month         text NOT NULL,
    amount        text NOT NULL,
    spent         text NOT NULL,
    currency      text NOT NULL,
    policy        text NOT NULL,
    on_exhausted  text NOT NULL DEFAULT 'finish',
    exhausted     boolean NOT NULL,
    deleted       boolean NOT NULL,
    revision      bigint NOT NULL,
    PRIMARY KEY (team, project)
);

-- What admission needs to refuse a job no budget of its team (or project) could ever start:
-- budget.updated's on_exhausted (with the policy, whether a spent budget holds queued jobs)
-- and its rates (what the scheduler reserves a job of each flavor at). Rows kept before
-- this file say finish and no rates until billing next says their state: until then such a
-- budget refuses nothing at admission (governance.py, "whole budget").
-- Forward-only: earlier files are never edited.
ALTER TABLE budget_replica
    ADD COLUMN on_exhausted text NOT NULL DEFAULT 'finish',
    ADD COLUMN rates jsonb;

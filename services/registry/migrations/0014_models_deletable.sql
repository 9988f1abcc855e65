-- A model can be deleted (docs/models.md, "Deleting a model"), once none of its versions is
-- live: its row stays, with deleted_at and deleted_by set, because its versions' tombstones
-- and the lineage edges to them (job_parents) reference it by id; its aliases and grants are
-- removed. Its name is freed: the team may make a new model of that name (a new row, a new
-- id), so the names are unique only among the models that are not deleted, regardless of
-- case as before (0010).
ALTER TABLE models ADD COLUMN deleted_at timestamptz;
ALTER TABLE models ADD COLUMN deleted_by text;
ALTER TABLE models ADD CONSTRAINT models_deleted_by_whom
    CHECK ((deleted_at IS NULL) = (deleted_by IS NULL));

ALTER TABLE models DROP CONSTRAINT models_team_name_key;
CREATE UNIQUE INDEX models_live_name ON models (team, name) WHERE deleted_at IS NULL;

DROP INDEX models_name_any_case;
CREATE UNIQUE INDEX models_name_any_case ON models (team, lower(name), case_twin)
    WHERE deleted_at IS NULL;

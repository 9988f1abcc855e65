-- Model and dataset names are unique within a team, and experiment names within a team's
-- project, regardless of case (docs/models.md, docs/datasets.md, docs/tracking.md):
-- 'ResNet' beside 'resnet' reads as one model in every listing. The stored spelling stays
-- as given; the unique indexes are on lower(name) (names are ASCII, so lower() does not
-- depend on the database's locale).
--
-- Pairs made before this rule are kept, not refused: renaming would break every reference
-- to them (jobs' model and dataset references, lineage, artifact keys), and failing the
-- upgrade would keep the registry down until someone did. The oldest row of each group
-- keeps case_twin = ''; each later one gets its own name there, so the group passes the
-- unique index, while any new name differing only by case from an existing one meets the
-- oldest row's '' and is refused. `SELECT team, name FROM models WHERE case_twin <> ''`
-- (and datasets' and experiments' likewise) lists them (docs/operations.md, Upgrade).
ALTER TABLE models ADD COLUMN case_twin text NOT NULL DEFAULT '';
ALTER TABLE datasets ADD COLUMN case_twin text NOT NULL DEFAULT '';
ALTER TABLE experiments ADD COLUMN case_twin text NOT NULL DEFAULT '';

UPDATE models SET case_twin = name
WHERE id IN (
    SELECT id FROM (
        SELECT id, row_number() OVER (PARTITION BY team, lower(name) ORDER BY id) AS nth
        FROM models
    ) ranked WHERE nth > 1);
UPDATE datasets SET case_twin = name
WHERE id IN (
    SELECT id FROM (
        SELECT id, row_number() OVER (PARTITION BY team, lower(name) ORDER BY id) AS nth
        FROM datasets
    ) ranked WHERE nth > 1);
UPDATE experiments SET case_twin = name
WHERE id IN (
    SELECT id FROM (
        SELECT id,
               row_number() OVER (PARTITION BY team, project, lower(name) ORDER BY id) AS nth
        FROM experiments
    ) ranked WHERE nth > 1);

CREATE UNIQUE INDEX models_name_any_case ON models (team, lower(name), case_twin);
CREATE UNIQUE INDEX datasets_name_any_case ON datasets (team, lower(name), case_twin);
CREATE UNIQUE INDEX experiments_name_any_case
    ON experiments (team, project, lower(name), case_twin);

-- Team names, and user names within a team, are unique regardless of case (docs/security.md):
-- 'Alice' beside 'alice' reads as one person in audit logs, cost reports and tables. The
-- stored spelling stays as given; the unique indexes are on lower(name) (names are ASCII,
-- so lower() does not depend on the database's locale).
--
-- Pairs made before this rule are kept, not refused: renaming a team or user would break
-- every record that names it (jobs, audit, costs), and failing the upgrade would keep the
-- platform down until someone did. The oldest row of each group keeps case_twin = ''; each
-- later one gets its own name there, so the group passes the unique index, while any new
-- name differing only by case from an existing one meets the oldest row's '' and is
-- refused. `SELECT name FROM teams WHERE case_twin <> ''` (and users' likewise) lists them
-- (docs/operations.md, Upgrade).
ALTER TABLE teams ADD COLUMN case_twin text NOT NULL DEFAULT '';
ALTER TABLE users ADD COLUMN case_twin text NOT NULL DEFAULT '';

UPDATE teams SET case_twin = name
WHERE id IN (
    SELECT id FROM (
        SELECT id, row_number() OVER (PARTITION BY lower(name) ORDER BY id) AS nth FROM teams
    ) ranked WHERE nth > 1);
UPDATE users SET case_twin = name
WHERE id IN (
    SELECT id FROM (
        SELECT id, row_number() OVER (PARTITION BY team_id, lower(name) ORDER BY id) AS nth
        FROM users
    ) ranked WHERE nth > 1);

CREATE UNIQUE INDEX teams_name_any_case ON teams (lower(name), case_twin);
CREATE UNIQUE INDEX users_name_any_case ON users (team_id, lower(name), case_twin);

-- GET /v1/jobs pages through a team's jobs newest first with a keyset cursor
-- (submitted_at, id): both indexes are in exactly that order, so a page is one index range
-- whether or not it filters by status (a rare status no longer scans the team's whole list).
DROP INDEX jobs_team_newest;
CREATE INDEX jobs_team_newest ON jobs (team_id, submitted_at DESC, id DESC);
CREATE INDEX jobs_team_status_newest ON jobs (team_id, status, submitted_at DESC, id DESC);

-- GET /v1/jobs?all_teams=true (operators) pages through every team's jobs newest first
-- with the same keyset cursor (submitted_at, id) as one team's list: these indexes are in
-- that order without the team, so an operator's page is one index range whether or not
-- it filters by status, as a team's is with jobs_team_newest and jobs_team_status_newest.
CREATE INDEX jobs_newest ON jobs (submitted_at DESC, id DESC);
CREATE INDEX jobs_status_newest ON jobs (status, submitted_at DESC, id DESC);

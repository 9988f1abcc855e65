-- A team's waiting jobs, counted on every arrival (TRAINYARD_SCHEDULER_MAX_WAITING_JOBS_PER_TEAM):
-- an index of the queued jobs by team, so the count reads that team's entries alone.
CREATE INDEX jobs_team_queued ON jobs (team) WHERE status = 'QUEUED';

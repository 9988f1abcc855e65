-- Retries after platform failures (platform_error: a node's full disk, the package index or
-- the object store away). Counted apart from restarts, which are the job's own budget
-- (max_restarts, for its code failing); bounded by the scheduler's platform_retries setting.
-- Forward-only: earlier files are never edited.
ALTER TABLE jobs ADD COLUMN platform_retries integer NOT NULL DEFAULT 0 CHECK (platform_retries >= 0);

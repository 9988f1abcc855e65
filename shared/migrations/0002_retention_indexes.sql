-- Old inbox and published outbox rows are deleted by age (shared/retention.py); these
-- indexes let it find them without reading the tables.
CREATE INDEX inbox_applied_at ON inbox (applied_at);
CREATE INDEX outbox_published_at ON outbox (published_at) WHERE published_at IS NOT NULL;

-- The revision of billing's cost.recorded (docs/models.md, "Cost per model"): an allocation's
-- row is replaced only by an event of a higher revision (billing's correction: an amended
-- bill, or the bill made the platform's), or of the same revision and no earlier end (the
-- events of a billing from before revisions all read 0), never by an older one arriving
-- late or again. Rows kept so far read 0, as the events they came from.
ALTER TABLE allocation_costs ADD COLUMN revision integer NOT NULL DEFAULT 0 CHECK (revision >= 0);

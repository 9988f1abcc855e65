-- A parked outbox row can never be published (larger than the bus accepts, or refused by the
-- bus for good, e.g. a permissions violation): the relay records why and skips it from then
-- on, so one bad row never stops the others. Parked rows stay until an operator deals with
-- them (retention deletes published rows only).
ALTER TABLE outbox ADD COLUMN parked_reason text, ADD COLUMN parked_at timestamptz;
DROP INDEX outbox_unpublished;
CREATE INDEX outbox_unpublished ON outbox (seq) WHERE published_at IS NULL AND parked_at IS NULL;
CREATE INDEX outbox_parked ON outbox (seq) WHERE parked_at IS NOT NULL;

-- An event is one per source and id (CloudEvents): the inbox records both, so an id that
-- one publisher chose (billing's "budget:<team>::<revision>", which anyone can foresee)
-- cannot be taken first by another publisher's event and keep the real one out of a
-- consumer that reads both (shared/inbox.py). Rows recorded before have source '': they
-- still count for an event of that id from any source, until retention deletes them.
ALTER TABLE inbox ADD COLUMN source text NOT NULL DEFAULT '';
ALTER TABLE inbox DROP CONSTRAINT inbox_pkey;
ALTER TABLE inbox ADD PRIMARY KEY (consumer, event_id, source);

-- Places for work in flight that every replica of a service counts together (shared/slots.py):
-- one row per place held, (kind, scope, slot) with slot in 0..most-1, so at most ``most``
-- rows of a scope can be live. A holder renews ``expires_at`` while its work runs and deletes
-- the row when it ends; a row whose lease ran out (its replica died) may be taken over.
CREATE TABLE held_slots (
    kind        text NOT NULL,
    scope       text NOT NULL,
    slot        integer NOT NULL CHECK (slot >= 0),
    holder      text NOT NULL,
    expires_at  timestamptz NOT NULL,
    PRIMARY KEY (kind, scope, slot)
);
CREATE INDEX held_slots_holder ON held_slots (kind, holder);

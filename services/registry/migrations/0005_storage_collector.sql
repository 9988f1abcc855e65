-- The storage collector's marks: an object it found deletable, and when it first did. An
-- object is deleted only once it has stayed deletable for the whole grace period, so one
-- written a moment ago (its checkpoint.saved or its version row not recorded yet) is never
-- taken; a mark is dropped as soon as the object is referenced again or gone.
CREATE TABLE storage_marks (
    key            text PRIMARY KEY CHECK (key LIKE 'jobs/%' OR key LIKE 'registry/%'),
    reason         text NOT NULL CHECK (reason IN ('beyond retention', 'unreferenced')),
    first_seen_at  timestamptz NOT NULL
);

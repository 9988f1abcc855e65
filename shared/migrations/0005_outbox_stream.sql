-- The event stream this outbox last published to, by its identity (JetStream's ``created``
-- time of the stream). A stream found with another identity was lost and made again (NATS
-- lost its store): the relay then marks every retained published row unpublished, so the
-- events are published again in order with their ids (shared/outbox.py, "lost stream").
CREATE TABLE outbox_stream (
    stream      text PRIMARY KEY,
    created     timestamptz NOT NULL,
    changed_at  timestamptz NOT NULL DEFAULT now(),
    replays     integer NOT NULL DEFAULT 0 CHECK (replays >= 0)
);

-- The transactional outbox: events written in the same transaction as the change they
-- announce; a relay publishes them to NATS and marks them published.
CREATE TABLE outbox (
    seq          bigserial PRIMARY KEY,
    event_id     text NOT NULL UNIQUE,
    subject      text NOT NULL,
    body         bytea NOT NULL,
    headers      jsonb NOT NULL DEFAULT '{}'::jsonb,
    created_at   timestamptz NOT NULL DEFAULT now(),
    published_at timestamptz
);
CREATE INDEX outbox_unpublished ON outbox (seq) WHERE published_at IS NULL;

-- The inbox: which events each consumer has applied, recorded in the same transaction
-- as the effect, so a redelivered event is applied at most once.
CREATE TABLE inbox (
    consumer    text NOT NULL,
    event_id    text NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, event_id)
);

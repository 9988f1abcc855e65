-- The storage collector's marks of incomplete multipart uploads, by upload id: like
-- storage_marks, the grace period is measured from when the collector first saw one (S3
-- clones do not all report a true initiation time).
CREATE TABLE storage_upload_marks (
    upload_id      text PRIMARY KEY,
    key            text NOT NULL,
    first_seen_at  timestamptz NOT NULL
);

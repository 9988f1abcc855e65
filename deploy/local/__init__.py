"""The embedded local stack: NATS, PostgreSQL, an S3 endpoint and the services as processes."""

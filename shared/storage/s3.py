"""``S3Store`` and its helpers, under the platform's name: defined in ``trainyard.storage.s3``."""

from trainyard.storage.s3 import S3Store, client_from_settings, ensure_bucket

__all__ = ["S3Store", "client_from_settings", "ensure_bucket"]

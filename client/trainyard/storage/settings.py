"""Where objects live and how to reach S3: ``TRAINYARD_STORAGE_*`` from the environment.

The one definition for the services (``shared.settings`` names it) and for a job's SDK.
"""

from __future__ import annotations

from pydantic import SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class StorageSettings(BaseSettings):
    """Object store for checkpoints, artifacts and logs, chosen by URI scheme."""

    model_config = SettingsConfigDict(env_prefix="TRAINYARD_STORAGE_")

    uri: str = "file://./.trainyard/objects"
    """``file:///path`` or ``s3://bucket/prefix``."""
    s3_endpoint: str = "127.0.0.1:9000"
    """host:port of the S3 API (MinIO in deployment)."""
    s3_access_key: str = "minioadmin"
    """S3 access key id."""
    s3_secret_key: SecretStr = SecretStr("minioadmin")
    """S3 secret key."""
    s3_secure: bool = False
    """Use HTTPS to the S3 endpoint."""
    s3_region: str = "us-east-1"
    """Region sent to the S3 endpoint (avoids a bucket-location lookup)."""

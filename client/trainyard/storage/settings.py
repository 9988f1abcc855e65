"""Where objects live and how to reach S3: ``TRAINYARD_STORAGE_*`` from the environment.

The one definition for the services (``shared.settings`` names it) and for a job's SDK.
"""

from __future__ import annotations

from pydantic import Field, SecretStr
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
    s3_connect_timeout_seconds: float = Field(default=5.0, gt=0, allow_inf_nan=False)
    """Longest opening a connection to the S3 endpoint may take."""
    s3_read_timeout_seconds: float = Field(default=30.0, gt=0, allow_inf_nan=False)
    """Longest the S3 endpoint may leave a request without a byte of answer (or a body
    being sent without taking any of it). An endpoint that takes connections and never
    answers held a request (an upload of a checkpoint, a download of a bundle, a readiness
    check) for MinIO's client's 5 minutes, tried 6 times (``s3.client_from_settings``)."""

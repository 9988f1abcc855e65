"""Settings of the registry service (environment prefix ``TRAINYARD_REGISTRY_``)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from shared.settings import GuardedServiceSettings


class Settings(GuardedServiceSettings):
    """The registry: runs, checkpoints, models, versions and their lineage."""

    model_config = SettingsConfigDict(env_prefix="TRAINYARD_REGISTRY_")

    port: int = 8083
    """Port of the HTTP server (health, readiness, ``GET /v1/models/...``)."""
    download_url_seconds: int = Field(default=300, ge=1, le=7 * 24 * 3600)
    """How long a presigned download URL of a model version stays valid (S3 allows at most
    seven days)."""

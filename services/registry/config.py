"""Settings of the registry service (environment prefix ``TRAINYARD_REGISTRY_``)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from trainyard_platform.shared.settings import GuardedServiceSettings, Port


class Settings(GuardedServiceSettings):
    """The registry: runs, checkpoints, models, versions and their lineage."""

    model_config = SettingsConfigDict(env_prefix="TRAINYARD_REGISTRY_")

    port: Port = 8083
    """Port of the HTTP server (health, readiness, ``GET /v1/models/...``)."""
    download_url_seconds: int = Field(default=300, ge=1, le=7 * 24 * 3600)
    """How long a presigned download URL of a model version stays valid (S3 allows at most
    seven days)."""
    collector_interval_seconds: float = Field(default=3600.0, ge=0)
    """How often the storage collector runs a pass (``services.registry.collector``); 0
    turns the periodic pass off (``python -m trainyard_platform.services.registry.collector`` still runs one)."""
    collector_grace_seconds: float = Field(default=24 * 3600.0, ge=0)
    """How long an object must stay deletable (unreferenced, or a checkpoint beyond its
    job's retention) before the collector deletes it."""
    collector_keep_checkpoints: int = Field(default=3, ge=1)
    """How many of each job's newest committed checkpoints the collector keeps (job specs
    carry no retention of their own yet; the runner's ``checkpoints_keep`` is 3 too)."""

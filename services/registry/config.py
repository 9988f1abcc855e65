"""Settings of the registry service (environment prefix ``TRAINYARD_REGISTRY_``)."""

from __future__ import annotations

from pydantic_settings import SettingsConfigDict

from shared.settings import GuardedServiceSettings


class Settings(GuardedServiceSettings):
    """The registry: runs, checkpoints, models, versions and their lineage."""

    model_config = SettingsConfigDict(env_prefix="TRAINYARD_REGISTRY_")

    port: int = 8083
    """Port of the HTTP server (health, readiness, ``GET /v1/models/...``)."""

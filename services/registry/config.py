"""Settings of the registry service (environment prefix ``TRAINYARD_REGISTRY_``)."""

from __future__ import annotations

from pydantic import Field, SecretStr
from pydantic_settings import SettingsConfigDict

from shared.settings import ServiceSettings


class Settings(ServiceSettings):
    """The registry: runs, checkpoints, models, versions and their lineage."""

    model_config = SettingsConfigDict(env_prefix="TRAINYARD_REGISTRY_")

    port: int = 8083
    """Port of the HTTP server (health, readiness, ``GET /v1/models/...``)."""
    admin_token: SecretStr = Field(min_length=1)
    """Required (the service refuses to start without it): every route but ``/healthz`` and
    ``/readyz`` requires ``Authorization: Bearer <admin_token>``. The model endpoints do not
    check the caller's team yet, so the token is for operators only."""

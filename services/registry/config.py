"""Settings of the registry service (environment prefix ``TRAINYARD_REGISTRY_``)."""

from __future__ import annotations

from pydantic import SecretStr
from pydantic_settings import SettingsConfigDict

from shared.settings import ServiceSettings


class Settings(ServiceSettings):
    """The registry: runs, checkpoints, models, versions and their lineage."""

    model_config = SettingsConfigDict(env_prefix="TRAINYARD_REGISTRY_")

    port: int = 8083
    """Port of the HTTP server (health, readiness, ``GET /v1/models/...``)."""
    admin_token: SecretStr | None = None
    """When set, the model endpoints require ``Authorization: Bearer <admin_token>``. They
    do not check the caller's team yet: never expose them publicly."""

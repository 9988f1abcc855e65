"""Settings of the registry service (environment prefix ``TRAINYARD_REGISTRY_``)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from trainyard_platform.services.registry.transfers import (
    DEFAULT_MAX_TRANSFERS,
    DEFAULT_MAX_TRANSFERS_PER_TEAM,
)
from trainyard_platform.shared.settings import GuardedServiceSettings, Port


class Settings(GuardedServiceSettings):
    """The registry: runs, checkpoints, models, versions and their lineage."""

    model_config = SettingsConfigDict(env_prefix="TRAINYARD_REGISTRY_")

    port: Port = 8083
    """Port of the HTTP server (health, readiness, ``GET /v1/models/...``)."""
    download_url_seconds: int = Field(default=300, ge=1, le=7 * 24 * 3600)
    """How long a presigned download URL of a model version stays valid (S3 allows at most
    seven days)."""
    max_transfers: int = Field(default=DEFAULT_MAX_TRANSFERS, ge=1, le=256)
    """Artifact transfers (a registration's copy, a ``download``'s or ``content``'s read:
    each the whole artifact through the registry's disk) run at once on one replica, on
    threads of their own; one more answers 503 with ``Retry-After``."""
    max_transfers_per_team: int = Field(default=DEFAULT_MAX_TRANSFERS_PER_TEAM, ge=1, le=256)
    """Of them, those of one team (the caller's), across every replica; one more answers
    429 with ``Retry-After``, so one team cannot take them all."""
    collector_interval_seconds: float = Field(default=3600.0, ge=0)
    """How often the storage collector runs a pass (``services.registry.collector``); 0
    turns the periodic pass off (``python -m trainyard_platform.services.registry.collector`` still runs one)."""
    collector_grace_seconds: float = Field(default=24 * 3600.0, ge=0)
    """How long an object must stay deletable (unreferenced, or a checkpoint beyond its
    job's retention) before the collector deletes it."""
    collector_keep_checkpoints: int = Field(default=3, ge=1)
    """How many of each job's newest committed checkpoints the collector keeps (job specs
    carry no retention of their own yet; the runner's ``checkpoints_keep`` is 3 too)."""

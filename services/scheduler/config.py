"""Settings of the scheduler service (environment prefix ``TRAINYARD_SCHEDULER_``)."""

from __future__ import annotations

from pydantic import Field, SecretStr
from pydantic_settings import SettingsConfigDict

from shared.settings import ServiceSettings


class Settings(ServiceSettings):
    """The scheduler: GPU inventory, queue and leases."""

    model_config = SettingsConfigDict(env_prefix="TRAINYARD_SCHEDULER_")

    port: int = 8081
    """Port of the HTTP server (health, readiness, ``GET /v1/queue``)."""
    node_check_interval_seconds: float = Field(default=2.0, gt=0)
    """How often nodes are checked for missed heartbeats."""
    node_timeout_seconds: float = Field(default=15.0, gt=0)
    """A node whose last heartbeat is older than this is LOST: its leases are released and
    its jobs requeued. No node is declared lost before the scheduler itself has been up this
    long, so a restarted scheduler does not mistake its own downtime for dead nodes."""
    revoke_grace_seconds: float = Field(default=30.0, ge=0)
    """Time a runner gets to checkpoint and stop a job whose allocation is revoked (cancel)."""
    admin_token: SecretStr | None = None
    """When set, ``GET /v1/queue`` requires ``Authorization: Bearer <admin_token>``. The queue
    view is an operator endpoint (job ids, team names, node names): never expose it publicly."""

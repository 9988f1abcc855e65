"""Settings of the submission service (env prefix ``TRAINYARD_SUBMISSION_``)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from shared.settings import ServiceSettings

DEFAULT_FLAVORS = ["cpu", "t4", "a100", "h100", "h200"]


class Settings(ServiceSettings):
    """What the submission service is configured with."""

    model_config = SettingsConfigDict(env_prefix="TRAINYARD_SUBMISSION_")

    port: int = 8080
    """Port of the public HTTP API (and ``/healthz``, ``/readyz``)."""
    flavors: list[str] = Field(default_factory=lambda: list(DEFAULT_FLAVORS))
    """GPU flavors a job may ask for (JSON list in the environment, e.g. ``["cpu","h200"]``)."""

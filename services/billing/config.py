"""Settings of the billing service (environment prefix ``TRAINYARD_BILLING_``)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from trainyard_platform.services.billing.governance_schemas import MAX_PRICE
from trainyard_platform.shared.events.payloads import MAX_PRICED_FLAVORS
from trainyard_platform.shared.settings import GuardedServiceSettings, Port

DEFAULT_PRICES: dict[str, float] = {
    "cpu": 0.10,
    "t4": 0.35,
    "a100": 2.50,
    "h100": 4.00,
    "h200": 5.50,
}


PricedFlavor = Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9-]{0,39}$")]
"""A GPU flavor's name, as the price routes take it."""
PerGpuHour = Annotated[float, Field(ge=0, le=float(MAX_PRICE))]
"""A price per GPU-hour, bounded as the price routes bound it (finite: see ``Settings``)."""


class Settings(GuardedServiceSettings):
    """Billing: price book and usage ledger."""

    model_config = SettingsConfigDict(env_prefix="TRAINYARD_BILLING_")

    port: Port = 8084
    """Port of the HTTP server (health, readiness, ``GET /v1/usage``)."""
    prices: dict[PricedFlavor, PerGpuHour] = Field(
        default_factory=lambda: dict(DEFAULT_PRICES), max_length=MAX_PRICED_FLAVORS
    )
    """The bootstrap of the price book: price per GPU-hour by GPU flavor, given at start,
    from the beginning (1970), to each listed flavor that has no price yet; a flavor priced
    already keeps its prices. Operators change prices with ``PUT /v1/prices/{flavor}`` (a
    price from a date on; usage before it keeps its price). From the environment as JSON,
    which replaces the whole default: ``TRAINYARD_BILLING_PRICES='{"cpu": 0.1}'``. At most
    ``MAX_PRICED_FLAVORS`` flavors, and billing refuses to start when those it would price
    take the book past them (``service.seed_prices``)."""
    currency: str = Field(default="USD", pattern=r"^[A-Z]{3}$")
    """ISO 4217 currency of the price book (prices set through the API too) and budgets."""

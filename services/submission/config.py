"""Settings of the submission service (env prefix ``TRAINYARD_SUBMISSION_``)."""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from trainyard_platform.shared.settings import Port, ServiceSettings, optional_http_url

DEFAULT_FLAVORS = ["cpu", "t4", "a100", "h100", "h200"]
DEFAULT_BUNDLE_MAX_BYTES = 100 * 1024 * 1024


class Settings(ServiceSettings):
    """What the submission service is configured with."""

    model_config = SettingsConfigDict(env_prefix="TRAINYARD_SUBMISSION_")

    port: Port = 8080
    """Port of the public HTTP API (and ``/healthz``, ``/readyz``)."""
    flavors: list[str] = Field(default_factory=lambda: list(DEFAULT_FLAVORS))
    """The starting list of GPU flavors a job may ask for (JSON list in the environment, e.g.
    ``["cpu","h200"]``); flavors declared in the scheduler's catalogue are added and retired
    ones removed as submission learns them from its events (``governance``)."""
    bundle_max_bytes: int = Field(default=DEFAULT_BUNDLE_MAX_BYTES, ge=1)
    """Largest code bundle ``PUT /v1/bundles/{sha256}`` accepts (bytes, compressed)."""
    bundle_uploads_per_team: int = Field(default=4, ge=1, le=10_000)
    """Bundle uploads a team may have under way at once, across every replica (each takes
    up to ``bundle_max_bytes`` of the service's disk while it streams in); one more answers
    429 with ``Retry-After`` before its body is read."""
    log_page_max_bytes: int = Field(default=4 * 1024 * 1024, ge=1)
    """A page of ``GET /v1/jobs/{id}/logs`` stops adding chunks past this many bytes (it
    always holds at least one)."""
    token_ttl_days: int | None = Field(default=90, ge=1, le=3660)
    """Lifetime of a new token in days, 1 to 3660 (first tokens of users included), unless
    its request says otherwise. Every token so expires: the environment cannot turn expiry
    off (``null``, an empty value, ``None`` and ``0`` are refused, and the service does not
    start); only a ``Settings`` built in code with ``None`` gives tokens no expiry."""
    live_tokens_per_user: int = Field(default=100, ge=1, le=100_000)
    """Unrevoked, unexpired tokens one user may hold (1 to 100,000); one more answers 409
    naming the limit (``POST /v1/tokens``; rotating, one for one, is never refused)."""
    live_tokens_per_team: int = Field(default=1000, ge=1, le=10_000_000)
    """Unrevoked, unexpired tokens one team's users may hold together (1 to 10,000,000, at
    least ``live_tokens_per_user``), first tokens of new users included: an admin creating
    users does not multiply the team's tokens past it; one more answers 409 naming the
    limit (``POST /v1/tokens``, ``POST /v1/admin/users``)."""
    failed_auth_rate_per_s: float = Field(default=10.0, gt=0, le=1_000_000)
    """Requests with a missing, malformed or wrong token one client address (an IPv6 one: its
    /64 network, ``shared.ratelimit.client_key``) may make per second, in each process,
    sustained; past the burst its requests answer 429 with ``Retry-After`` before
    any token lookup, but for tokens seen valid lately (``failed_auth``)."""
    failed_auth_burst: int = Field(default=0, ge=0, le=1_000_000)
    """Refused authentications one client address may have at once before
    ``failed_auth_rate_per_s`` applies; 0 (the default): no such bound. Off by default
    because the address is the one uvicorn gives: where many users reach this service
    from one address (a proxy or the other services not in ``FORWARDED_ALLOW_IPS``), one
    client's wrong tokens would hold back every user of that address whose token was not
    seen valid lately, where without the bound they cost only a lookup each."""
    scheduler_public_url: str | None = None
    """The scheduler's API as browsers reach it (``http://host:port``), for the web
    dashboard's queue and node pages (``GET /ui/config.json``); unset: those pages say the
    server does not offer them. The scheduler must list this service's public origin in
    ``TRAINYARD_CORS_ORIGINS``."""
    registry_url: str | None = None
    """The registry's API as this service reaches it (``http://registry:8083``): a job naming
    ``datasets`` or a ``parent_model`` is admitted only after the registry says the
    submitting user may read them (``data_admission``); unset: such jobs are refused (422).
    Jobs naming neither never need it."""
    registry_public_url: str | None = None
    """The registry's API as browsers reach it, for the dashboard's models, experiments and
    metric charts (see ``scheduler_public_url``)."""
    outbox_busy_round_s: float = Field(default=0.04, ge=0, le=1)
    """How long a busy outbox relay gathers commits into one round (``shared.outbox``,
    ``busy_round_s``): after a round that published something, the next starts no sooner
    than this after it began. Each round has a fixed cost (a pool round, a transaction of
    two statements, a wait on the acknowledgements: about 1 ms of this service's CPU),
    so at a thousand submissions a second 40 ms rounds of 40 events cost a quarter of the
    10 ms ones. A ``job.submitted`` leaves at most this much later, and only while the
    relay is busy (an idle relay woken by a commit starts at once, a full batch is
    followed at once)."""
    billing_public_url: str | None = None
    """Billing's API as browsers reach it, for the dashboard's costs page (see
    ``scheduler_public_url``)."""

    @model_validator(mode="after")
    def _team_holds_a_user(self) -> Settings:
        # A team bound below a user's makes the user's unreachable: a setting mistaken.
        if self.live_tokens_per_team < self.live_tokens_per_user:
            raise ValueError(
                "live_tokens_per_team: must be at least live_tokens_per_user "
                f"({self.live_tokens_per_team} < {self.live_tokens_per_user})"
            )
        return self

    @field_validator(
        "registry_url", "scheduler_public_url", "registry_public_url", "billing_public_url"
    )
    @classmethod
    def _usable_url(cls, value: str | None) -> str | None:
        # One no HTTP client can ask is refused at start, not failed on every request.
        return optional_http_url(value)

"""Typed settings, read once from the environment at process start.

Infrastructure settings are shared by every service and read with their own prefix
(``TRAINYARD_NATS_``, ``TRAINYARD_DATABASE_``, ``TRAINYARD_STORAGE_``,
``TRAINYARD_TELEMETRY_``); a service's own settings subclass ``ServiceSettings`` with
the prefix ``TRAINYARD_<SERVICE>_``. Nothing outside this module's subclasses reads
``os.environ`` for configuration.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from typing import Annotated, Literal, TypeVar

from pydantic import (
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict, SettingsError

# Jobs read it too (the SDK opens its checkpoint store), so the client distribution owns it.
from trainyard.storage.settings import StorageSettings as StorageSettings
from trainyard_platform.shared.auth import MAX_TOKEN_LENGTH, is_token68
from trainyard_platform.shared.url_checks import http_url_problem, nats_url_problem, redact_password

Port = Annotated[int, Field(ge=0, le=65535)]
"""A TCP port (0: any free one), for every service's ``port`` setting."""

_ORIGIN = re.compile(r"https?://[A-Za-z0-9.\-\[\]:]+")
"""A web origin: scheme, host and optional port; no path, no wildcard."""


def usable(value: str, problem: Callable[[str], str | None]) -> str:
    """``value`` if ``problem`` finds none in it, else ``ValueError`` with the reason (a
    settings validator's way to refuse it)."""
    reason = problem(value)
    if reason is not None:
        raise ValueError(reason)
    return value


def optional_http_url(value: str | None) -> str | None:
    """An optional HTTP URL setting: unset or empty, or a URL an HTTP client can ask
    (``url_checks.http_url_problem``); else ``ValueError`` with the reason."""
    return value if not value else usable(value, http_url_problem)


class PlatformSettings(BaseSettings):
    """The base of every settings class of the platform: a number must be finite.

    pydantic takes ``inf`` and ``nan`` for a float by default, and a bound such as ``gt=0``
    lets ``inf`` through: ``TRAINYARD_SCHEDULER_AGEING_SECONDS=inf`` would have started a
    scheduler whose jobs never age. Subclasses' ``model_config`` is merged with this one."""

    model_config = SettingsConfigDict(allow_inf_nan=False)


JETSTREAM_MAX_SECONDS = (2**63 - 1) // 10**9
"""The longest duration JetStream holds, in whole seconds (9,223,372,036: about 292 years):
it takes each (a consumer's ``ack_wait``, a redelivery delay, a stream's ``max_age`` and
duplicate window, a message's ``Nats-TTL``) in nanoseconds, in a signed 64-bit integer. A
longer one overflowed it, long after start: the server refused the stream or the consumer,
or could not read a redelivery's delay."""


_Number = TypeVar("_Number", int, float)


def jetstream_duration(value: _Number, unit_seconds: int = 1) -> _Number:
    """``value`` (in units of ``unit_seconds``: 1 for seconds, 3600 for hours) if JetStream
    can hold it (``JETSTREAM_MAX_SECONDS``), else ``ValueError`` naming the most it may be,
    a settings validator's way to refuse it."""
    if value * unit_seconds > JETSTREAM_MAX_SECONDS:
        most = JETSTREAM_MAX_SECONDS // unit_seconds
        raise ValueError(
            f"must be at most {most} (about 292 years: JetStream holds a duration in "
            "nanoseconds, in 64 bits)"
        )
    return value


MIN_AUDIT_DAYS = 30
"""The least audit-log retention taken, in days (``ServiceSettings.audit_retention_days``):
the table refuses to delete a younger entry (``shared/migrations/0009_audit_log_retention.sql``
says the same number)."""


RETRY_DELAY_MAX_BOUND = 86_400.0
"""The largest ``retry_delay_max_seconds`` taken: a day (a redelivery delay of more only
holds a failed event back from its consumer's operators)."""


_JETSTREAM_UNITS = {
    "ack_wait_seconds": 1,
    "duplicate_window_seconds": 1,
    "retention_hours": 3600,
    "deadletter_max_age_days": 86_400,
}
"""The settings JetStream receives as durations, with the seconds in each one's unit (the
redelivery delays are bounded apart: ``retry_delay_max_seconds``)."""


class NatsSettings(PlatformSettings):
    """How to reach NATS JetStream and how consumers retry."""

    model_config = SettingsConfigDict(env_prefix="TRAINYARD_NATS_")

    url: str = "nats://127.0.0.1:4222"
    """NATS server URL (better without credentials in it: they belong in ``user`` and
    ``password``). One that names no usable host or port is refused at start
    (``shared.url_checks``); a well-formed one is waited for, however long."""
    user: str | None = None
    """The service's NATS user; it may publish and subscribe only its own subjects
    (docs/security.md, "Bus"). Its replies come to ``_INBOX.<user>.>``."""
    password: SecretStr | None = None
    """The NATS user's password (never logged). It also keys the ``Nats-Msg-Id`` of the
    service's events (``bus.dedup_key``): without one (nor one in ``url``) the bus refuses
    to connect unless ``unkeyed_msg_ids``."""
    unkeyed_msg_ids: bool = False
    """Development only: let a connection without a password (a NATS server that lets
    anyone in) publish each event under its bare event id as ``Nats-Msg-Id``, which any
    other publisher can foresee and send first, so that the server drops the real event
    as a duplicate. Off: such a service refuses to start (exit 2, one line)."""
    stream: str = "TRAINYARD"
    """JetStream stream that holds every ``trainyard.>`` event."""
    deadletter_stream: str = "TRAINYARD_DEADLETTER"
    """Stream for ``deadletter.>``: messages that can never be handled (unparseable, forged,
    rejected) or kept failing; operators list, redrive and discard them
    (``shared.deadletters``)."""
    attempts_stream: str = "TRAINYARD_ATTEMPTS"
    """Stream for ``attempts.>``: what became of each redelivered message's earlier
    deliveries to each consumer (``bus.Tally``: real failures, ``NotYet``s, hand-backs),
    which decides when it is dead-lettered; kept ``retention_hours``."""
    deadletter_max_age_days: float = Field(default=14.0, gt=0)
    """How long the dead-letter stream keeps a dead letter (its ``max_age``)."""
    deadletter_max_messages: int = Field(default=100_000, ge=1)
    """Most dead letters kept; beyond it the oldest go first."""
    max_deliver: int = Field(default=5, ge=1)
    """Real failures of one message's handler (an error of its own: not an infrastructure
    outage, which is waited out, nor a hand-back, ``bus.NotNow``, nor a redelivery after a
    stop or a crash) at which it is dead-lettered; an event that follows one not applied yet
    (``bus.NotYet``) is counted apart and gets two more, ``ack_wait_seconds`` apart."""
    max_unfinished_deliveries: int = Field(default=20, ge=2)
    """Deliveries of one message that each ended without any recorded outcome (the consumer
    died while handling it) before it is dead-lettered instead of handled again."""
    ack_wait_seconds: float = Field(default=30.0, gt=0)
    """Seconds a delivered message may stay unacknowledged before redelivery (a consumer
    tells JetStream every third of it that the messages in hand are still in progress)."""
    retry_delay_seconds: float = Field(default=0.5, ge=0)
    """Base delay before a failed message is redelivered (doubled per real failure, up to
    ``retry_delay_max_seconds``)."""
    retry_delay_max_seconds: float = Field(default=600.0, gt=0, le=RETRY_DELAY_MAX_BOUND)
    """Longest delay before a failed message is redelivered, however many failures it had
    (the doubling would otherwise run to days with a large ``max_deliver``, and past what
    JetStream's delay in nanoseconds holds)."""
    outage_retry_initial_seconds: float = Field(default=0.5, gt=0)
    """First pause before a handler that failed for an infrastructure fault (PostgreSQL,
    NATS or the object store unreachable) is tried again; it doubles per failure."""
    outage_retry_max_seconds: float = Field(default=30.0, gt=0)
    """Longest pause between tries while an outage lasts (there is no limit on the tries)."""
    duplicate_window_seconds: float = Field(default=120.0, gt=0)
    """Window in which JetStream drops a re-published ``Nats-Msg-Id``."""
    retention_hours: float = Field(default=168.0, gt=0)
    """How long the event stream keeps an event (its ``max_age``), and so how long services
    keep inbox and published outbox rows (``shared.retention``). A consumer that stays away
    longer misses the events that aged out."""
    publish_timeout_seconds: float = Field(default=10.0, gt=0)
    """How long a publish waits for JetStream to acknowledge that the event is stored."""

    @field_validator("url")
    @classmethod
    def _usable_url(cls, value: str) -> str:
        return usable(value, nats_url_problem)

    @field_validator(*_JETSTREAM_UNITS)
    @classmethod
    def _held_by_jetstream(cls, value: float, info: ValidationInfo) -> float:
        return jetstream_duration(value, _JETSTREAM_UNITS[str(info.field_name)])

    @model_validator(mode="after")
    def _window_within_ages(self) -> NatsSettings:
        # Every stream takes the one duplicate window, and JetStream refuses a stream whose
        # window is longer than its max_age: refused here, at start, not when making it.
        for name, age in (
            ("retention_hours", self.retention_hours * 3600),
            ("deadletter_max_age_days", self.deadletter_max_age_days * 86_400),
        ):
            if self.duplicate_window_seconds > age:
                raise ValueError(
                    f"duplicate_window_seconds: must not exceed {name} "
                    f"({self.duplicate_window_seconds:g} s > {age:g} s): JetStream refuses a "
                    "stream whose duplicate window is longer than its max age"
                )
        return self


class DatabaseSettings(PlatformSettings):
    """PostgreSQL connection; each service works in its own schema of this database."""

    model_config = SettingsConfigDict(env_prefix="TRAINYARD_DATABASE_")

    url: str = "postgresql://postgres@127.0.0.1:5432/trainyard"
    """asyncpg DSN (a Unix socket works: ``postgresql://user@/db?host=/run/dir``)."""
    pool_min_size: int = Field(default=1, ge=0)
    """Connections opened at start."""
    pool_max_size: int = Field(default=10, ge=1)
    """Most connections held at once (at least ``pool_min_size``)."""
    query_timeout_seconds: float = Field(default=10.0, gt=0)
    """Longest one statement may wait for PostgreSQL's answer (asyncpg's ``command_timeout``);
    past it the statement is cancelled and its transaction rolled back. A PostgreSQL that
    accepts connections but never answers (a paused server, a stalled network path) would
    otherwise hold a request or an event for ever (``shared.db``)."""
    acquire_timeout_seconds: float = Field(default=5.0, gt=0)
    """Longest a request or a loop waits for a connection of the pool (every one in use,
    or none can be opened), and for its connection to be handed back."""
    connect_timeout_seconds: float = Field(default=5.0, gt=0)
    """Longest opening one connection may take (asyncpg's ``timeout``)."""

    @model_validator(mode="after")
    def _pool_bounds(self) -> DatabaseSettings:
        if self.pool_min_size > self.pool_max_size:
            raise ValueError(
                "pool_min_size: must not exceed pool_max_size "
                f"({self.pool_min_size} > {self.pool_max_size})"
            )
        return self


class TelemetrySettings(PlatformSettings):
    """OpenTelemetry: OTLP export is on when OTEL_EXPORTER_OTLP_ENDPOINT is set."""

    model_config = SettingsConfigDict(env_prefix="TRAINYARD_TELEMETRY_")

    otlp_endpoint: str | None = Field(default=None, validation_alias="OTEL_EXPORTER_OTLP_ENDPOINT")
    """OTLP/HTTP collector (Jaeger), e.g. ``http://jaeger:4318``."""
    span_file: str | None = None
    """Append finished spans as JSON lines to this file (tests and local debugging)."""


class LogFormatSettings(PlatformSettings):
    """The format of a service's log lines, alone: read first, so that even a refusal of
    the other settings is written in it (``runtime.service_settings_or_exit``)."""

    log_format: Literal["json", "text"] = Field(
        default="text", validation_alias="TRAINYARD_LOG_FORMAT"
    )
    """``json``: one object per line with trace, span and job ids, for a log pipeline (what
    deploy/ sets); ``text``: one readable line each, for a terminal (``shared.logs``). Shared
    by every service (no service prefix)."""


class ServiceSettings(LogFormatSettings):
    """What every service process has: a listen address, the infrastructure, a drain time."""

    host: str = "127.0.0.1"
    """Address of the service's HTTP server (health, readiness, API)."""
    port: Port = 8000
    """Port of the service's HTTP server (0: any free port)."""
    shutdown_grace_seconds: float = Field(default=20.0, ge=0)
    """On SIGTERM, how long in-flight work may take to finish before the process exits."""
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    """Lowest level of log lines the process writes (DEBUG adds e.g. one line per pass)."""
    write_rate_per_s: float = Field(default=10.0, gt=0)
    """Writes (``POST``, ``PUT``, ``PATCH``, ``DELETE``) each user may make to this service
    per second, sustained (``shared.ratelimit``); past the burst the API answers 429 with
    ``Retry-After``. A request that stores nothing (a dry run, a cost estimate, a retry
    answered from its ``Idempotency-Key``'s job) is a read (``shared.access.only_reads``,
    submission's ``ratelimit.replays_as_read``). A service's operator token has limits of
    its own (``GuardedServiceSettings.operator_rate_factor``)."""
    write_burst: int = Field(default=50, ge=1)
    """Writes a user may make at once before ``write_rate_per_s`` applies."""
    read_rate_per_s: float = Field(default=50.0, gt=0)
    """Reads (``GET``, ``HEAD``, and requests that store nothing: dry runs, cost estimates,
    retries answered from their ``Idempotency-Key``'s job) each user may make to this
    service per second, sustained."""
    read_burst: int = Field(default=200, ge=1)
    """Reads a user may make at once before ``read_rate_per_s`` applies."""
    team_rate_factor: float = Field(default=10.0, ge=1, le=1_000_000)
    """A team's users together may make this many times a user's reads and writes (rate
    and burst): an admin creating users does not multiply the team's rate past it."""
    nats: NatsSettings = Field(default_factory=NatsSettings)
    database: DatabaseSettings = Field(default_factory=DatabaseSettings)
    storage: StorageSettings = Field(default_factory=StorageSettings)
    telemetry: TelemetrySettings = Field(default_factory=TelemetrySettings)
    cors_origins: Annotated[list[str], NoDecode] = Field(
        default_factory=list, validation_alias="TRAINYARD_CORS_ORIGINS"
    )
    """Web origins (``http://host:port``) whose pages may call this service's API from a
    browser (the web dashboard's, i.e. the submission service's public URL), comma-separated
    or a JSON list, shared by every service (no service prefix). Empty: no cross-origin
    access. Requests still need a token; ``*`` is refused."""
    audit_retention_days: int = Field(
        default=0, ge=0, le=36_500, validation_alias="TRAINYARD_AUDIT_RETENTION_DAYS"
    )
    """Days the service keeps an audit-log entry (``shared.retention``), shared by every
    service (no service prefix); 0, the default: forever. Else at least ``MIN_AUDIT_DAYS``
    (30: the table refuses to delete a younger entry), at most 36500 (100 years); e.g. 400
    outlasts a yearly audit."""

    @field_validator("audit_retention_days")
    @classmethod
    def _audit_floor(cls, value: int) -> int:
        if 0 < value < MIN_AUDIT_DAYS:
            raise ValueError(f"must be 0 (keep forever) or at least {MIN_AUDIT_DAYS}")
        return value

    @field_validator("cors_origins", mode="before")
    @classmethod
    def _origins(cls, value: object) -> object:
        if isinstance(value, str):
            text = value.strip()
            try:
                value = json.loads(text) if text.startswith("[") else text.split(",")
            except ValueError as exc:
                raise ValueError(f"must be valid JSON ({exc})") from None
        if not isinstance(value, list):
            return value
        origins = [str(item).strip().rstrip("/") for item in value if str(item).strip()]
        for origin in origins:
            if not _ORIGIN.fullmatch(origin):
                raise ValueError(
                    f"{origin!r} is not an origin: give scheme://host[:port] (no path, no *)"
                )
        return origins


class GuardedServiceSettings(ServiceSettings):
    """A service whose HTTP API is for operators and, by role, for users (scheduler,
    registry, billing, runner; see ``shared.access``)."""

    admin_token: SecretStr = Field(min_length=1)
    """Required (the service refuses to start without it): the operator credential of this
    service. Every route but ``/healthz`` and ``/readyz`` requires either it or a user token
    (``Authorization: Bearer <token>``). Never given to jobs or users; rotate it by
    restarting with a new value. It must be a bearer credential a request can carry
    (``shared.auth.is_token68``: at most 1024 of ``A-Z a-z 0-9 - . _ ~ + /``, then ``=``
    padding), or no request could ever present it."""
    identity_url: str | None = None
    """Base URL of the submission service, which checks user tokens (``GET /v1/me``) for
    this service on every request. Unset: only the operator token is accepted."""
    operator_rate_factor: float = Field(default=10.0, ge=1, le=1_000_000)
    """The operator token may make this many times a user's reads and writes (rate and
    burst) to this service, in one bucket each for the token (``shared.ratelimit``
    ``OperatorRateLimits``); past the burst, 429 with ``Retry-After`` naming the operator
    token's limit. Generous, so that operations never meet it, yet a stolen token or a
    runaway script cannot make requests without bound."""

    @field_validator("identity_url")
    @classmethod
    def _usable_identity_url(cls, value: str | None) -> str | None:
        return optional_http_url(value)

    @field_validator("admin_token")
    @classmethod
    def _presentable(cls, value: SecretStr) -> SecretStr:
        if not is_token68(value.get_secret_value()):
            raise ValueError(
                f"must be at most {MAX_TOKEN_LENGTH} characters of A-Z a-z 0-9 - . _ ~ + / "
                "(then = padding), as a bearer token is"
            )
        return value


def invalid_settings(
    settings_type: type[BaseSettings], error: ValidationError | SettingsError
) -> list[str]:
    """One line per bad setting of ``settings_type`` (or of the shared settings it holds),
    ``VARIABLE: reason (got 'value')``: its environment variable, never the field's name in
    the code, and what is wrong in plain words, as the API says it of a bad field
    (``http_errors.plain_message``: ``must be an integer``, ``must be at most 65535``).
    A rule across settings names its first setting, and the others by their variables too.
    The value is never echoed for a secret (``SecretStr`` settings), a missing setting, or
    a rule across settings (its input is every setting given). ``error`` may be
    pydantic-settings' own refusal of a value that is not JSON where JSON is read."""
    kinds: dict[str, type[BaseSettings]] = {settings_type.__name__: settings_type}
    for held in settings_type.model_fields.values():
        if isinstance(held.annotation, type) and issubclass(held.annotation, BaseSettings):
            kinds[held.annotation.__name__] = held.annotation
    if isinstance(error, SettingsError):
        return [_unreadable(list(kinds.values()), error)]
    failing = kinds.get(error.title, settings_type)
    return [_bad_setting(failing, e) for e in error.errors()]


def setting_variable(kind: type[BaseSettings], name: str) -> str:
    """The environment variable of ``kind``'s field ``name``: its own (``validation_alias``)
    or the class's prefix and the name, in capitals."""
    field = kind.model_fields.get(name)
    alias = field.validation_alias if field is not None else None
    if isinstance(alias, str):
        return alias
    return f"{kind.model_config.get('env_prefix', '')}{name}".upper()


_SETTINGS_ERROR = re.compile(r'error (?:parsing|getting) value for field "(\w+)"')


def _unreadable(kinds: list[type[BaseSettings]], error: SettingsError) -> str:
    """pydantic-settings refuses a value it reads as JSON (a list, a mapping) before any
    validation, naming the field alone: its variable (of the class that has the field and
    whose variable is set) and the parser's reason."""
    found = _SETTINGS_ERROR.search(str(error))
    name = found.group(1) if found else ""
    candidates = [setting_variable(kind, name) for kind in kinds if name in kind.model_fields]
    variable = next(
        (v for v in candidates if v in os.environ), candidates[0] if candidates else "settings"
    )
    cause = error.__cause__
    reason = f"must be valid JSON ({cause})" if cause is not None else "cannot be read"
    given = os.environ.get(variable)
    return f"{variable}: {reason}" + ("" if given is None else f" (got {given!r})")


def _bad_setting(kind: type[BaseSettings], e: ErrorDetails) -> str:
    """The line of one pydantic error of ``kind``'s settings."""
    # Imported here: http_errors stands on the bus, which stands on these settings.
    from trainyard_platform.shared.http_errors import plain_message

    fields = kind.model_fields
    names = {name: setting_variable(kind, name) for name in fields}
    reason = _setting_message(e) or plain_message(e)
    # A model's own words name its settings by their fields: said by their variables (a
    # field of one word, ``url``, ``stream``, is a word of the reason too, and left as it is).
    for name, variable in names.items():
        if "_" in name:
            reason = re.sub(rf"(?<![\w]){re.escape(name)}(?![\w])", variable, reason)
    if not e["loc"]:
        # A rule across settings: ``<field>: why`` names the setting it is about, else the
        # first one it names; no value echoed (the input is every setting given).
        head, sep, rest = reason.partition(": ")
        if sep and head in names.values():
            return f"{head}: {rest}"
        named = sorted((reason.find(v), v) for v in names.values() if v in reason)
        if named:
            first = named[0][1]
            rest = reason.removeprefix(f"{first} ")
            return f"{first}: {rest if rest.startswith('must') else reason}"
        return f"{kind.model_config.get('env_prefix', '')}*: {reason}"
    name, *within = (str(part) for part in e["loc"])
    field = fields.get(name)
    # A field read from a variable of its own (``validation_alias``) is reported by it.
    variable = name if field is None else names[name]
    # An entry of a JSON value (a price book's flavor) is named inside its variable.
    where = ""
    if within:
        part = "key" if within[-1] == "[key]" else "entry"
        where = f" ({part} {within[0]!r})"
    secret = field is not None and "SecretStr" in str(field.annotation)
    # A URL's password is hidden (a DSN or a NATS URL may carry one).
    shown = redact_password(e["input"]) if isinstance(e["input"], str) else e["input"]
    got = "" if e["type"] == "missing" or secret else f" (got {shown!r})"
    return f"{variable}{where}: {reason}{got}"


def _setting_message(e: ErrorDetails) -> str | None:
    """What an environment variable is told where the API's words for a body field would
    not fit it (None elsewhere): a variable is set or not, and its value is text."""
    if e["type"] == "missing":
        return "must be set"
    context = e.get("ctx") or {}
    if e["type"] == "too_short" and context.get("field_type") == "Value":
        # A constrained secret (``SecretStr``): its length is in characters, not items.
        least = context.get("min_length")
        return "must not be empty" if least == 1 else f"must be at least {least} characters"
    return None

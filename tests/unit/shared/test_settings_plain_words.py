"""A bad setting is told in plain words, as the API tells a bad field (``plain_message``):
the environment variable, then what is wrong with it (``must be an integer``, ``must be at
most 65535``), never pydantic's phrasing (``Input should be a valid integer, unable to parse
string as an integer``, ``Value error, ...``) nor a field's name in the code
(``pool_min_size``) in place of its variable.

Every setting of every settings class a service reads at start (its own, the infrastructure's
it holds, the OTEL_* ones, the event schema base) is given values of every kind that one
setting or another refuses."""

from __future__ import annotations

import importlib
import re

import pytest
from pydantic_settings import BaseSettings

from tests.integration.test_openapi_fuzz import NOT_PLAIN
from trainyard_platform.shared.runtime import service_settings_or_exit
from trainyard_platform.shared.telemetry import OtelExportSettings

SERVICES = {
    "billing": "trainyard_platform.services.billing.config",
    "registry": "trainyard_platform.services.registry.config",
    "runner": "trainyard_platform.services.runner.config",
    "scheduler": "trainyard_platform.services.scheduler.config",
    "submission": "trainyard_platform.services.submission.config",
}

BAD = [
    "",
    "x",
    "-1",
    "0",
    "1.5",
    "inf",
    "nan",
    "99999999999999999999999",
    "1e400",
    "70000",
    "[",
    "{",
    "[1]",
    '{"a": -1, "-bad key": "x"}',
    "a" * 300,
    "not a url",
]
"""Values of every kind some setting refuses: not a number, out of range, not finite, beyond
64 bits, not JSON, JSON of the wrong shape, too long, not a URL."""


def _kinds(settings: type[BaseSettings]) -> list[type[BaseSettings]]:
    kinds = [settings]
    for field in settings.model_fields.values():
        held = field.annotation
        if isinstance(held, type) and issubclass(held, BaseSettings):
            kinds.append(held)
    return kinds


def _variables(kind: type[BaseSettings]) -> dict[str, str]:
    """Each field of ``kind`` (not a settings class it holds) -> its environment variable."""
    prefix = str(kind.model_config.get("env_prefix", ""))
    found = {}
    for name, field in kind.model_fields.items():
        held = field.annotation
        if isinstance(held, type) and issubclass(held, BaseSettings):
            continue
        alias = field.validation_alias
        found[name] = alias if isinstance(alias, str) else f"{prefix}{name}".upper()
    return found


def _cases() -> list[tuple[str, str]]:
    """(service, variable) of every setting a service reads at start; the shared ones once."""
    from trainyard_platform.shared.events.envelope import EventSchemaSettings

    cases: list[tuple[str, str]] = []
    shared: set[str] = set()
    for service, module in SERVICES.items():
        settings = importlib.import_module(module).Settings
        for kind in [*_kinds(settings), OtelExportSettings, EventSchemaSettings]:
            for variable in _variables(kind).values():
                own = variable.startswith(f"TRAINYARD_{service.upper()}_")
                if own or variable not in shared:
                    shared.add(variable)
                    cases.append((service, variable))
    return cases


CASES = _cases()
FIELD_NAMES = {
    name
    for module in SERVICES.values()
    for kind in [*_kinds(importlib.import_module(module).Settings), OtelExportSettings]
    for name in _variables(kind)
    if "_" in name  # a word of its own (url, port) may well be said
}


def _refusal(
    service: str,
    variable: str,
    value: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> list[str]:
    """The lines the service's start says of ``variable=value`` (none when it is taken)."""
    settings = importlib.import_module(SERVICES[service]).Settings
    with monkeypatch.context() as env:
        env.setenv(f"TRAINYARD_{service.upper()}_ADMIN_TOKEN", "op-token")
        env.setenv(variable, value)
        try:
            service_settings_or_exit("prog", settings)
        except SystemExit as exited:
            assert exited.code == 2
        else:
            return []
        finally:
            err = capsys.readouterr().err
    return err.splitlines()


def test_the_walk_finds_every_kind_of_setting() -> None:
    variables = {variable for _, variable in CASES}
    assert {
        "TRAINYARD_BILLING_PRICES",
        "TRAINYARD_NATS_MAX_DELIVER",
        "TRAINYARD_DATABASE_POOL_MIN_SIZE",
        "TRAINYARD_STORAGE_S3_READ_TIMEOUT_SECONDS",
        "TRAINYARD_LOG_FORMAT",
        "TRAINYARD_CORS_ORIGINS",
        "OTEL_SDK_DISABLED",
        "TRAINYARD_EVENTS_SCHEMA_BASE",
        "TRAINYARD_RUNNER_HEARTBEAT_TTL_SECONDS",
        "TRAINYARD_SCHEDULER_AGEING_SECONDS",
    } <= variables
    assert {service for service, _ in CASES} == set(SERVICES)


@pytest.mark.parametrize(("service", "variable"), CASES, ids=[f"{s}-{v}" for s, v in CASES])
def test_every_bad_value_of_every_setting_is_said_in_plain_words(
    service: str,
    variable: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    wrong = []
    for value in BAD:
        for line in _refusal(service, variable, value, monkeypatch, capsys):
            said = line.removeprefix("prog: invalid setting ")
            if said == line:
                wrong.append(f"{value!r}: not a refusal: {line}")
            elif not re.match(r"(TRAINYARD|OTEL)_[A-Z0-9_]+( \((entry|key) '.*'\))?: \S", said):
                wrong.append(f"{value!r}: names no variable first: {line}")
            elif any(phrase in said for phrase in NOT_PLAIN):
                wrong.append(f"{value!r}: not plain words: {line}")
            elif any(re.search(rf"(?<![\w]){name}(?![\w])", said) for name in FIELD_NAMES):
                wrong.append(f"{value!r}: a field's name, not its variable: {line}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize(
    ("variable", "value", "said"),
    [
        ("TRAINYARD_BILLING_PORT", "x", "TRAINYARD_BILLING_PORT: must be an integer (got 'x')"),
        ("TRAINYARD_BILLING_PORT", "70000", "TRAINYARD_BILLING_PORT: must be at most 65535"),
        (
            "TRAINYARD_NATS_RETENTION_HOURS",
            "-1",
            "TRAINYARD_NATS_RETENTION_HOURS: must be greater than 0",
        ),
        (
            "TRAINYARD_NATS_ACK_WAIT_SECONDS",
            "inf",
            "TRAINYARD_NATS_ACK_WAIT_SECONDS: must be a finite number",
        ),
        ("TRAINYARD_LOG_FORMAT", "xml", "TRAINYARD_LOG_FORMAT: must be 'json' or 'text'"),
        ("OTEL_SDK_DISABLED", "maybe", "OTEL_SDK_DISABLED: must be true or false"),
        ("TRAINYARD_BILLING_ADMIN_TOKEN", "", "TRAINYARD_BILLING_ADMIN_TOKEN: must not be empty"),
        (
            "TRAINYARD_DATABASE_POOL_MIN_SIZE",
            "20",
            "TRAINYARD_DATABASE_POOL_MIN_SIZE: must not exceed TRAINYARD_DATABASE_POOL_MAX_SIZE"
            " (20 > 10)",
        ),
        (
            "TRAINYARD_NATS_RETENTION_HOURS",
            "0.01",
            "TRAINYARD_NATS_DUPLICATE_WINDOW_SECONDS: must not exceed"
            " TRAINYARD_NATS_RETENTION_HOURS (120 s > 36 s)",
        ),
        (
            "TRAINYARD_BILLING_PRICES",
            "{",
            "TRAINYARD_BILLING_PRICES: must be valid JSON (Expecting property name enclosed in"
            " double quotes: line 1 column 2 (char 1)) (got '{')",
        ),
        (
            "TRAINYARD_CORS_ORIGINS",
            "[1",
            "TRAINYARD_CORS_ORIGINS: must be valid JSON (Expecting ',' delimiter: line 1 column"
            " 3 (char 2)) (got '[1')",
        ),
        (
            "TRAINYARD_EVENTS_SCHEMA_BASE",
            "bad",
            "TRAINYARD_EVENTS_SCHEMA_BASE: must match the pattern",
        ),
    ],
)
def test_the_words_for_the_commonest_mistakes(
    variable: str,
    value: str,
    said: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    lines = _refusal("billing", variable, value, monkeypatch, capsys)
    assert any(line.startswith(f"prog: invalid setting {said}") for line in lines), lines

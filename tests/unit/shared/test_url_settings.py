"""A URL setting that can name no server is refused at start, with exit status 2 and one
line naming it (``shared.url_checks``), like every other bad setting; a well-formed one is
taken as it is (a server that cannot be reached is an outage, waited out elsewhere).

Before, ``TRAINYARD_NATS_URL=not a url`` was waited for like a DNS outage, for ever, and
``nats://:::`` failed inside the start-up with a traceback and status 1; a bad identity,
registry or OTLP URL started a service that failed every request or export."""

from __future__ import annotations

import importlib

import pytest
from pydantic_settings import BaseSettings

from trainyard_platform.shared.runtime import service_settings_or_exit
from trainyard_platform.shared.telemetry import OtelExportSettings
from trainyard_platform.shared.url_checks import nats_url_problem

SERVICES = ("billing", "registry", "runner", "scheduler", "submission")

CHECKED_AT_START = {
    "TRAINYARD_DATABASE_URL",  # asyncpg's own parse: one line, status 1 (test_startup_failures)
    "TRAINYARD_STORAGE_URI",  # open_store's parse: one line, status 1 (test_startup_failures)
    "TRAINYARD_STORAGE_S3_ENDPOINT",  # the MinIO client's parse: one line, status 1
}
"""URL settings whose client parses them at start, refusing a bad one naming the setting."""


def _url_settings(service: str) -> list[str]:
    """The variables of every URL-like setting of ``service`` (its own, the infrastructure's
    it holds, and the ``OTEL_*`` endpoints), but those in ``CHECKED_AT_START``."""
    kind = importlib.import_module(f"trainyard_platform.services.{service}.config").Settings
    kinds: list[type[BaseSettings]] = [kind, OtelExportSettings]
    for field in kind.model_fields.values():
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseSettings):
            kinds.append(field.annotation)
    found = []
    for each in kinds:
        prefix = each.model_config.get("env_prefix", "")
        for name, field in each.model_fields.items():
            if field.validation_alias or not name.endswith(("url", "uri", "endpoint")):
                continue
            variable = f"{prefix}{name}".upper()
            if variable not in CHECKED_AT_START:
                found.append(variable)
    return found


URL_SETTINGS = [(service, variable) for service in SERVICES for variable in _url_settings(service)]


def test_the_walk_finds_the_url_settings() -> None:
    # The parametrised test below would pass vacuously if the walk found nothing.
    assert ("billing", "TRAINYARD_NATS_URL") in URL_SETTINGS
    assert ("runner", "TRAINYARD_RUNNER_IDENTITY_URL") in URL_SETTINGS
    assert ("submission", "TRAINYARD_SUBMISSION_REGISTRY_URL") in URL_SETTINGS
    assert ("submission", "TRAINYARD_SUBMISSION_BILLING_PUBLIC_URL") in URL_SETTINGS
    assert ("scheduler", "OTEL_EXPORTER_OTLP_ENDPOINT") in URL_SETTINGS


@pytest.mark.parametrize(("service", "variable"), URL_SETTINGS)
@pytest.mark.parametrize(
    "value", ["not a url", "nats://:::", "http://:::/", "http://user:hunter2@bad host:80/"]
)
def test_a_url_setting_that_names_no_server_is_refused_naming_it(
    service: str,
    variable: str,
    value: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    kind = importlib.import_module(f"trainyard_platform.services.{service}.config").Settings
    monkeypatch.setenv(variable, value)

    with pytest.raises(SystemExit) as exited:
        service_settings_or_exit("prog", kind)

    assert exited.value.code == 2
    err = capsys.readouterr().err
    [line] = [line for line in err.splitlines() if f"invalid setting {variable}:" in line]
    assert "(expected " in line  # the reason, with what would do
    assert "hunter2" not in err and "Traceback" not in err  # a URL's password is hidden
    assert "hunter2" not in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("not a url", "must not contain spaces (expected nats://host:port)"),
        ("nats://:::", "the port is not a number from 0 to 65535 (expected nats://host:port)"),
        ("nats://:4222", "names no host (expected nats://host:port)"),
        ("http://nats:4222", "scheme 'http' is not one of nats, tls, ws, wss"),
        ("nats://bad!host:4222", "'bad!host' is not a host name or an IP address"),
    ],
)
def test_a_bad_nats_url_is_told_why(url: str, reason: str) -> None:
    problem = nats_url_problem(url)
    assert problem is not None and problem.startswith(reason)


@pytest.mark.parametrize(
    "url",
    [
        "nats://127.0.0.1:4222",
        "nats://admin:pw@nats:4222",
        "tls://nats.example.com:4443",
        "127.0.0.1:4222",  # the client's own reading: nats://
        "nats",  # nats://nats:4222
        "ws://[::1]:8080",
        "nats://nats_1:4222",  # a container's name
    ],
)
def test_a_well_formed_nats_url_is_taken(url: str) -> None:
    assert nats_url_problem(url) is None

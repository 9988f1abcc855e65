"""A service started with bad settings names each one and starts nothing."""

from __future__ import annotations

import json

import pytest

from trainyard_platform.services.billing.config import Settings
from trainyard_platform.services.runner.__main__ import main as runner_main
from trainyard_platform.shared.runtime import serve_from_command_line
from trainyard_platform.shared.settings import NatsSettings


async def _must_not_serve(_: Settings) -> int:
    raise AssertionError("served with invalid settings")


def test_bad_settings_are_named_with_their_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TRAINYARD_NATS_RETENTION_HOURS", "-1")

    with pytest.raises(SystemExit) as exited:
        serve_from_command_line("billing", "test", Settings, _must_not_serve, [])

    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "invalid setting TRAINYARD_NATS_RETENTION_HOURS: must be greater than 0" in err
    assert "(got '-1')" in err
    assert "Traceback" not in err


def test_a_bad_service_setting_is_named_with_the_service_prefix(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TRAINYARD_BILLING_SHUTDOWN_GRACE_SECONDS", "soon")

    with pytest.raises(SystemExit) as exited:
        serve_from_command_line("billing", "test", Settings, _must_not_serve, [])

    assert exited.value.code == 2
    assert "invalid setting TRAINYARD_BILLING_SHUTDOWN_GRACE_SECONDS:" in capsys.readouterr().err


@pytest.mark.parametrize("days", ["29", "-1", "36501"])
def test_an_audit_retention_out_of_its_bounds_is_refused(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], days: str
) -> None:
    # The table refuses to delete an entry of the last 30 days: a shorter retention could
    # never be honoured, so it is refused at start rather than failing every round; so is
    # one whose cutoff would fall before the first year a datetime holds.
    monkeypatch.setenv("TRAINYARD_AUDIT_RETENTION_DAYS", days)

    with pytest.raises(SystemExit) as exited:
        serve_from_command_line("billing", "test", Settings, _must_not_serve, [])

    assert exited.value.code == 2
    assert "invalid setting TRAINYARD_AUDIT_RETENTION_DAYS:" in capsys.readouterr().err


def test_the_runner_names_a_bad_setting_too(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TRAINYARD_NATS_MAX_DELIVER", "many")

    with pytest.raises(SystemExit) as exited:
        runner_main([])

    assert exited.value.code == 2
    assert "invalid setting TRAINYARD_NATS_MAX_DELIVER:" in capsys.readouterr().err


SERVICES = {
    "billing": "trainyard_platform.services.billing.config",
    "registry": "trainyard_platform.services.registry.config",
    "runner": "trainyard_platform.services.runner.config",
    "scheduler": "trainyard_platform.services.scheduler.config",
    "submission": "trainyard_platform.services.submission.config",
}


def _number_settings() -> list[tuple[str, str]]:
    """(service, environment variable) of every number setting of every service, its own
    and the infrastructure's it holds."""
    import importlib

    from pydantic_settings import BaseSettings

    found: list[tuple[str, str]] = []
    for service, module in SERVICES.items():
        kind = importlib.import_module(module).Settings
        kinds: list[type[BaseSettings]] = [kind]
        for field in kind.model_fields.values():
            held = field.annotation
            if isinstance(held, type) and issubclass(held, BaseSettings):
                kinds.append(held)
        for each in kinds:
            prefix = each.model_config.get("env_prefix", "")
            for name, field in each.model_fields.items():
                if field.annotation in (float, int) and not field.validation_alias:
                    found.append((service, f"{prefix}{name.upper()}"))
    return found


NUMBER_SETTINGS = _number_settings()


def test_every_service_has_number_settings_to_check() -> None:
    # The parametrised test below would pass vacuously if the walk found nothing.
    assert {service for service, _ in NUMBER_SETTINGS} == set(SERVICES)
    assert ("scheduler", "TRAINYARD_SCHEDULER_AGEING_SECONDS") in NUMBER_SETTINGS
    assert ("billing", "TRAINYARD_NATS_PUBLISH_TIMEOUT_SECONDS") in NUMBER_SETTINGS


@pytest.mark.parametrize(("service", "variable"), NUMBER_SETTINGS)
@pytest.mark.parametrize("value", ["inf", "-inf", "nan"])
def test_no_number_setting_takes_a_non_finite_value(
    service: str, variable: str, value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``inf`` passed ``gt=0`` bounds: a scheduler started with ``AGEING_SECONDS=inf`` never
    aged a job, and a negative or infinite publish timeout hung or failed every publish."""
    import importlib

    from pydantic import ValidationError

    from trainyard_platform.shared.settings import invalid_settings

    monkeypatch.setenv(f"TRAINYARD_{service.upper()}_ADMIN_TOKEN", "op-token")
    monkeypatch.setenv(variable, value)
    kind = importlib.import_module(SERVICES[service]).Settings
    with pytest.raises(ValidationError) as refused:
        kind()
    lines = invalid_settings(kind, refused.value)
    assert any(line.startswith(f"{variable}:") for line in lines), lines


@pytest.mark.parametrize(
    ("variable", "value", "reason"),
    [
        ("TRAINYARD_NATS_PUBLISH_TIMEOUT_SECONDS", "0", "must be greater than 0"),
        ("TRAINYARD_NATS_RETRY_DELAY_SECONDS", "-1", "must be at least 0"),
        ("TRAINYARD_NATS_DUPLICATE_WINDOW_SECONDS", "0", "must be greater than 0"),
        ("TRAINYARD_BILLING_PORT", "70000", "must be at most 65535"),
        ("TRAINYARD_BILLING_SHUTDOWN_GRACE_SECONDS", "-5", "must be at least 0"),
        ("TRAINYARD_DATABASE_POOL_MAX_SIZE", "0", "must be at least 1"),
        (
            "TRAINYARD_DATABASE_POOL_MIN_SIZE",
            "20",
            "TRAINYARD_DATABASE_POOL_MIN_SIZE: must not exceed TRAINYARD_DATABASE_POOL_MAX_SIZE",
        ),
        # JetStream refuses a stream whose duplicate window outlasts its max_age, and every
        # stream takes the one window: a short age with the default window (120 s) started
        # the service, which then failed making its streams.
        (
            "TRAINYARD_NATS_RETENTION_HOURS",
            "0.01",
            "TRAINYARD_NATS_DUPLICATE_WINDOW_SECONDS: must not exceed TRAINYARD_NATS_RETENTION_HOURS"
            " (120 s > 36 s)",
        ),
        (
            "TRAINYARD_NATS_DEADLETTER_MAX_AGE_DAYS",
            "0.001",
            "TRAINYARD_NATS_DUPLICATE_WINDOW_SECONDS: must not exceed"
            " TRAINYARD_NATS_DEADLETTER_MAX_AGE_DAYS (120 s > 86.4 s)",
        ),
    ],
)
def test_numbers_out_of_range_are_refused(
    variable: str,
    value: str,
    reason: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv(variable, value)

    with pytest.raises(SystemExit) as exited:
        serve_from_command_line("billing", "test", Settings, _must_not_serve, [])

    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert reason in err
    assert "Traceback" not in err


def test_a_bad_price_is_named_with_its_flavor(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(
        "TRAINYARD_BILLING_PRICES", '{"cpu": -1, "a100": "nan", "Big GPU": 1.0, "t4": 0.35}'
    )

    with pytest.raises(SystemExit) as exited:
        serve_from_command_line("billing", "test", Settings, _must_not_serve, [])

    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "TRAINYARD_BILLING_PRICES (entry 'cpu'): must be at least 0" in err
    assert "TRAINYARD_BILLING_PRICES (entry 'a100'): must be a finite number" in err
    assert "TRAINYARD_BILLING_PRICES (key 'Big GPU'): must be a lower-case letter" in err
    assert "'t4'" not in err


def test_a_bad_secret_and_a_missing_setting_are_named_but_never_echoed(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The value of a bad token is most of a real token; a missing setting's input is every
    setting given (the operator's whole environment of this service)."""
    monkeypatch.setenv("TRAINYARD_BILLING_ADMIN_TOKEN", "almost-the-real-token!")
    monkeypatch.setenv("TRAINYARD_BILLING_IDENTITY_URL", "http://id.example")

    with pytest.raises(SystemExit):
        serve_from_command_line("billing", "test", Settings, _must_not_serve, [])
    err = capsys.readouterr().err
    assert "invalid setting TRAINYARD_BILLING_ADMIN_TOKEN: must be at most" in err
    assert "almost-the-real-token" not in err

    monkeypatch.delenv("TRAINYARD_BILLING_ADMIN_TOKEN")
    with pytest.raises(SystemExit):
        serve_from_command_line("billing", "test", Settings, _must_not_serve, [])
    err = capsys.readouterr().err
    assert "invalid setting TRAINYARD_BILLING_ADMIN_TOKEN: must be set\n" in err
    assert "id.example" not in err


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_under_the_json_log_format_the_refusal_is_one_json_log_line(
    service: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A log pipeline reads JSON lines only: the refusal was plain text whatever the format,
    so it was lost or mangled there."""
    import importlib

    main = importlib.import_module(f"trainyard_platform.services.{service}.__main__").main
    monkeypatch.setenv("TRAINYARD_LOG_FORMAT", "json")
    monkeypatch.setenv(f"TRAINYARD_{service.upper()}_SHUTDOWN_GRACE_SECONDS", "soon")
    monkeypatch.setenv(f"TRAINYARD_{service.upper()}_ADMIN_TOKEN", "almost-the-real-token!")
    monkeypatch.setenv("OTEL_SDK_DISABLED", "maybe")

    with pytest.raises(SystemExit) as exited:
        main([])

    assert exited.value.code == 2
    err = capsys.readouterr().err
    [line] = err.splitlines()
    record = json.loads(line)
    assert set(record) == {"time", "level", "service", "logger", "message"}
    assert record["level"] == "CRITICAL" and record["service"] == service
    message = record["message"]
    assert message.startswith("cannot start: invalid setting ")
    assert f"TRAINYARD_{service.upper()}_SHUTDOWN_GRACE_SECONDS: " in message
    assert "OTEL_SDK_DISABLED: " in message
    assert "almost-the-real-token" not in err


def test_a_bad_log_format_is_named_in_text(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TRAINYARD_LOG_FORMAT", "JSON ")

    with pytest.raises(SystemExit):
        serve_from_command_line("billing", "test", Settings, _must_not_serve, [])
    assert "invalid setting TRAINYARD_LOG_FORMAT: must be 'json' or 'text'" in (
        capsys.readouterr().err
    )


def test_a_shared_variable_is_named_as_it_is_set(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TRAINYARD_LOG_FORMAT", "xml")

    with pytest.raises(SystemExit):
        serve_from_command_line("billing", "test", Settings, _must_not_serve, [])
    assert (
        "invalid setting TRAINYARD_LOG_FORMAT: must be 'json' or 'text'" in capsys.readouterr().err
    )


@pytest.mark.parametrize("service", sorted(SERVICES))
@pytest.mark.parametrize(
    ("variable", "value"),
    [("OTEL_EXPORTER_OTLP_PROTOCOL", "bogus"), ("OTEL_SDK_DISABLED", "maybe")],
)
def test_every_service_names_a_bad_otel_variable_before_it_starts(
    service: str,
    variable: str,
    value: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The submission's and the runner's own command lines checked their settings but not
    the OTEL_* ones the services read themselves: a traceback and status 1 from inside the
    start-up, where the others said one line and exited with 2."""
    import importlib

    main = importlib.import_module(f"trainyard_platform.services.{service}.__main__").main
    monkeypatch.setenv(variable, value)

    with pytest.raises(SystemExit) as exited:
        main([])

    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"invalid setting {variable}: " in err
    assert "Traceback" not in err


@pytest.mark.parametrize("value", ["0", "86401", "inf"])
def test_a_redelivery_delay_cap_past_a_day_or_none_is_named(
    value: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``TRAINYARD_NATS_RETRY_DELAY_MAX_SECONDS`` bounds the doubling redelivery delay; a
    cap of nothing, or of more than a day, is refused at start naming it."""
    monkeypatch.setenv("TRAINYARD_NATS_RETRY_DELAY_MAX_SECONDS", value)

    with pytest.raises(SystemExit) as exited:
        serve_from_command_line("billing", "test", Settings, _must_not_serve, [])

    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "invalid setting TRAINYARD_NATS_RETRY_DELAY_MAX_SECONDS:" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("variable", "too_long", "longest"),
    [
        ("TRAINYARD_NATS_ACK_WAIT_SECONDS", "9223372037", "9223372036"),
        ("TRAINYARD_NATS_ACK_WAIT_SECONDS", "1e300", "9223372036"),
        ("TRAINYARD_NATS_DUPLICATE_WINDOW_SECONDS", "1e12", "9223372036"),
        ("TRAINYARD_NATS_RETENTION_HOURS", "2562048", "2562047"),
        ("TRAINYARD_NATS_DEADLETTER_MAX_AGE_DAYS", "106752", "106751"),
    ],
)
def test_a_duration_longer_than_jetstream_holds_is_named_at_start(
    variable: str,
    too_long: str,
    longest: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """JetStream takes these durations in nanoseconds, in 64 bits: the ack wait (a
    consumer's ``ack_wait``, and a redelivery delay) and the streams' windows and ages had
    no upper bound, so a huge one started the service and overflowed later (a consumer or
    stream the server refused, a redelivery delay it could not read). It is refused at start now, naming
    the variable and the most it may be; that most is taken."""
    monkeypatch.setenv(variable, too_long)

    with pytest.raises(SystemExit) as exited:
        serve_from_command_line("billing", "test", Settings, _must_not_serve, [])

    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"invalid setting {variable}: must be at most {longest} " in err
    assert "Traceback" not in err
    monkeypatch.setenv(variable, longest)
    if variable == "TRAINYARD_NATS_DUPLICATE_WINDOW_SECONDS":
        # A window may not outlast the streams' ages (the next test): with theirs at their
        # longest, the longest window taken is the dead letters' longest age, in whole days.
        monkeypatch.setenv("TRAINYARD_NATS_RETENTION_HOURS", "2562047")
        monkeypatch.setenv("TRAINYARD_NATS_DEADLETTER_MAX_AGE_DAYS", "106751")
        monkeypatch.setenv(variable, str(106751 * 86400))
    assert NatsSettings()  # the longest JetStream holds is taken


def test_a_heartbeat_ttl_longer_than_jetstream_holds_is_named_at_start(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The runner's heartbeats carry their TTL (``Nats-TTL``), a duration JetStream holds in
    nanoseconds too: a longer one failed every heartbeat's publish; it is refused at start."""
    monkeypatch.setenv("TRAINYARD_RUNNER_HEARTBEAT_TTL_SECONDS", "9223372037")

    with pytest.raises(SystemExit) as exited:
        runner_main([])

    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "invalid setting TRAINYARD_RUNNER_HEARTBEAT_TTL_SECONDS: must be at most" in err

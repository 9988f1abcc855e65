"""The SDK's own number variables (span limits, the batch span processor's sizes and
delays) with a bad value crashed every service at start with the SDK's ``ValueError``
traceback from inside the start-up (``OTEL_SPAN_LINK_COUNT_LIMIT=-3``,
``OTEL_BSP_MAX_QUEUE_SIZE=0``), or logged a traceback and went on with a default
(``OTEL_BSP_SCHEDULE_DELAY=abc``). Now each is checked with the other ``OTEL_*`` variables
the services read: one line naming the variable, exit status 2, before anything starts."""

from __future__ import annotations

import importlib

import pytest

from trainyard_platform.shared.telemetry import OtelExportSettings

SERVICES = ("billing", "registry", "runner", "scheduler", "submission")

BAD = [
    ("OTEL_SPAN_LINK_COUNT_LIMIT", "-3"),
    ("OTEL_SPAN_EVENT_COUNT_LIMIT", "many"),
    ("OTEL_EVENT_ATTRIBUTE_COUNT_LIMIT", "1.5"),
    ("OTEL_LINK_ATTRIBUTE_COUNT_LIMIT", "-1"),
    ("OTEL_ATTRIBUTE_COUNT_LIMIT", "x"),
    ("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "x"),
    ("OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT", "-10"),
    ("OTEL_BSP_MAX_QUEUE_SIZE", "0"),
    ("OTEL_BSP_SCHEDULE_DELAY", "abc"),
    ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "-5"),
    ("OTEL_BSP_EXPORT_TIMEOUT", "soon"),
]


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, _ in BAD:
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize("service", SERVICES)
@pytest.mark.parametrize(("variable", "value"), BAD)
def test_a_bad_sdk_number_is_named_before_the_service_starts(
    service: str,
    variable: str,
    value: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    main = importlib.import_module(f"trainyard_platform.services.{service}.__main__").main
    monkeypatch.setenv(variable, value)

    with pytest.raises(SystemExit) as exited:
        main([])

    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"invalid setting {variable}: " in err
    assert repr(value) in err
    assert "Traceback" not in err


def test_a_batch_larger_than_the_queue_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "100")
    monkeypatch.setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "200")
    with pytest.raises(ValueError, match="OTEL_BSP_MAX_EXPORT_BATCH_SIZE"):
        OtelExportSettings()
    monkeypatch.delenv("OTEL_BSP_MAX_QUEUE_SIZE")  # the SDK's default queue: 2048
    OtelExportSettings()


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("OTEL_SPAN_LINK_COUNT_LIMIT", "0"),
        ("OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT", " 4096 "),
        ("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", ""),  # the SDK's "no limit"
        ("OTEL_BSP_SCHEDULE_DELAY", "500"),
        ("OTEL_BSP_EXPORT_TIMEOUT", "0"),
    ],
)
def test_values_the_sdk_takes_are_taken(
    variable: str, value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(variable, value)
    OtelExportSettings()

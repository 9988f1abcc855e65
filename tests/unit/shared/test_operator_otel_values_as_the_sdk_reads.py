"""The services read some ``OTEL_*`` variables themselves; they must read them as the
standard and the SDK do, or the process ends up half configured:

- enum values are case-insensitive (the SDK lowercases its sampler's name):
  ``OTEL_TRACES_EXPORTER=OTLP`` was ignored as unknown, ``OTEL_TRACES_EXPORTER=None`` too
  (spans kept going to the endpoint), ``OTEL_EXPORTER_OTLP_PROTOCOL=GRPC`` stopped the
  service;
- ``OTEL_SDK_DISABLED`` is true only for ``true`` (any case; the SDK's test): ``1`` or
  ``yes`` made the services drop their exporters and database spans while the SDK went on
  recording every span and metric. Such a value is now refused at start, naming it."""

from __future__ import annotations

import pytest

from trainyard_platform.shared.telemetry import OtelExportSettings, span_exporters

_VARIABLES = (
    "OTEL_TRACES_EXPORTER",
    "OTEL_METRICS_EXPORTER",
    "OTEL_LOGS_EXPORTER",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
    "OTEL_SDK_DISABLED",
)


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in _VARIABLES:
        monkeypatch.delenv(name, raising=False)


def test_exporter_names_are_read_in_any_case(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "OTLP, Console")
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "Prometheus")
    monkeypatch.setenv("OTEL_LOGS_EXPORTER", "NONE")
    export = OtelExportSettings()
    assert export.unknown_exporters() == []
    assert export.otlp_on and export.console_on


def test_none_in_capitals_turns_export_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "None")
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "NONE")
    export = OtelExportSettings()
    assert not export.otlp_on and not export.otlp_metrics_on
    assert span_exporters() == []


@pytest.mark.parametrize("value", ["GRPC", " grpc ", "Grpc"])
def test_a_protocol_is_read_in_any_case(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", value)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "HTTP/PROTOBUF")
    export = OtelExportSettings()
    assert export.protocol == "grpc"
    assert export.metrics_protocol == "http/protobuf"


@pytest.mark.parametrize(("value", "disabled"), [("TRUE", True), ("true", True), ("False", False)])
def test_sdk_disabled_is_true_only_for_true(
    value: str, disabled: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_SDK_DISABLED", value)
    assert OtelExportSettings().sdk_disabled is disabled


@pytest.mark.parametrize("value", ["1", "yes", "on", "0", "no"])
def test_a_boolean_the_sdk_does_not_read_is_refused(
    value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_SDK_DISABLED", value)
    with pytest.raises(ValueError, match="sdk_disabled") as refused:
        OtelExportSettings()
    assert "true or false" in str(refused.value)

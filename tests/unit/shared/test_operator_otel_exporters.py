"""An ``OTEL_TRACES_EXPORTER`` or ``OTEL_METRICS_EXPORTER`` value the services do not have
(``zipkin``, a typo) was ignored without a word: the operator saw no spans and
no reason. It is still ignored (the process runs on), with a warning naming it."""

from __future__ import annotations

import logging

import pytest

from trainyard_platform.shared.telemetry import (
    OtelExportSettings,
    span_exporters,
    warn_unknown_exporters,
)


def test_unknown_exporters_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp, zipkn")
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "prometheus,logging")
    assert OtelExportSettings().unknown_exporters() == [
        "OTEL_TRACES_EXPORTER=zipkn",
        "OTEL_METRICS_EXPORTER=logging",
    ]
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "otlp,prometheus")
    assert OtelExportSettings().unknown_exporters() == []


def test_an_unknown_exporter_is_warned_about_and_exports_nothing(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "bogus")
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    assert span_exporters() == []
    with caplog.at_level(logging.WARNING, logger="trainyard_platform.shared.telemetry"):
        assert warn_unknown_exporters() == ["OTEL_TRACES_EXPORTER=bogus"]
    assert any("OTEL_TRACES_EXPORTER=bogus" in r.getMessage() for r in caplog.records)


def test_a_logs_exporter_is_warned_about_as_these_services_have_none(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # OTEL_LOGS_EXPORTER=otlp (the standard way to ship logs to a collector) was ignored
    # without a word: the operator looked for logs in the collector and found none.
    monkeypatch.delenv("OTEL_TRACES_EXPORTER", raising=False)
    monkeypatch.delenv("OTEL_METRICS_EXPORTER", raising=False)
    monkeypatch.setenv("OTEL_LOGS_EXPORTER", "otlp")
    with caplog.at_level(logging.WARNING, logger="trainyard_platform.shared.telemetry"):
        assert warn_unknown_exporters() == ["OTEL_LOGS_EXPORTER=otlp"]
    assert any("standard error" in r.getMessage() for r in caplog.records)
    monkeypatch.setenv("OTEL_LOGS_EXPORTER", "none")
    assert OtelExportSettings().unknown_exporters() == []

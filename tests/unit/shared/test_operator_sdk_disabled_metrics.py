"""``OTEL_SDK_DISABLED=true`` turns off the whole SDK, metrics included: ``/metrics`` then
serves an empty page, so every alert rule goes quiet while the targets stay up. The docs
said only "no spans", and nothing at start said more. Now the start-up warns, naming the
variable, what it costs and what turns spans off alone."""

from __future__ import annotations

import logging

import pytest
from opentelemetry import metrics

from trainyard_platform.shared import metrics as shared_metrics


@pytest.fixture
def no_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    # setup_metrics installs nothing when a provider is already there (other tests'); the
    # check of what it would install is made against the API's proxy.
    monkeypatch.setattr(metrics, "get_meter_provider", lambda: metrics.NoOpMeterProvider())
    monkeypatch.setattr(metrics, "set_meter_provider", lambda provider: None)


def test_a_disabled_sdk_is_said_to_empty_the_scrape(
    no_provider: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    with caplog.at_level(logging.WARNING):
        provider = shared_metrics.setup_metrics("scheduler")
    assert provider is not None
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(
        "OTEL_SDK_DISABLED" in w and "/metrics" in w and "OTEL_TRACES_SAMPLER=always_off" in w
        for w in warnings
    ), warnings
    provider.shutdown()


def test_no_warning_when_the_sdk_is_on(
    no_provider: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv("OTEL_SDK_DISABLED", raising=False)
    with caplog.at_level(logging.WARNING):
        provider = shared_metrics.setup_metrics("scheduler")
    assert provider is not None
    assert not [r for r in caplog.records if "OTEL_SDK_DISABLED" in r.getMessage()]
    provider.shutdown()

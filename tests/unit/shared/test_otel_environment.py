"""The standard OTEL_* variables shape the tracer provider and exporters the services build."""

from __future__ import annotations

import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as GrpcSpanExporter,
)
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

from trainyard_platform.shared.runtime import serve_from_command_line
from trainyard_platform.shared.settings import ServiceSettings
from trainyard_platform.shared.telemetry import OtelExportSettings, service_resource, span_exporters

_STANDARD = (
    "OTEL_SERVICE_NAME",
    "OTEL_RESOURCE_ATTRIBUTES",
    "OTEL_TRACES_SAMPLER",
    "OTEL_TRACES_SAMPLER_ARG",
    "OTEL_SDK_DISABLED",
    "OTEL_TRACES_EXPORTER",
    "OTEL_METRICS_EXPORTER",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
)


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in _STANDARD:
        monkeypatch.delenv(name, raising=False)


def test_the_service_keeps_its_default_name_when_the_environment_names_none() -> None:
    assert service_resource("scheduler").attributes["service.name"] == "scheduler"


def test_otel_service_name_wins_over_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_SERVICE_NAME", "trainyard-scheduler-eu")
    assert service_resource("scheduler").attributes["service.name"] == "trainyard-scheduler-eu"


def test_resource_attributes_are_added(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=prod,k8s.pod.name=s-1")
    attributes = service_resource("billing").attributes
    assert attributes["deployment.environment"] == "prod"
    assert attributes["k8s.pod.name"] == "s-1"
    assert attributes["service.name"] == "billing"


def test_a_service_name_in_resource_attributes_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "service.name=billing-b")
    assert service_resource("billing").attributes["service.name"] == "billing-b"


def test_the_sampler_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0.25")
    sampler = TracerProvider(resource=service_resource("runner")).sampler
    assert isinstance(sampler, TraceIdRatioBased)
    assert sampler.rate == 0.25


def test_the_default_sampler_follows_the_parent() -> None:
    assert isinstance(TracerProvider().sampler, ParentBased)


def test_sdk_disabled_makes_spans_no_ops(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    provider = TracerProvider(resource=service_resource("registry"))
    with provider.get_tracer("t").start_as_current_span("s") as span:
        assert not span.is_recording()
    assert span_exporters() == []


def test_no_endpoint_means_no_otlp_exporter() -> None:
    assert span_exporters() == []


def test_the_traces_endpoint_reaches_the_http_exporter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://collector:4318/v1/traces")
    [exporter] = span_exporters()
    assert isinstance(exporter, OTLPSpanExporter)
    assert exporter._endpoint == "http://collector:4318/v1/traces"


def test_the_general_endpoint_gets_the_signal_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://jaeger:4318")
    [exporter] = span_exporters()
    assert isinstance(exporter, OTLPSpanExporter)
    assert exporter._endpoint == "http://jaeger:4318/v1/traces"


def test_protocol_grpc_builds_the_grpc_exporter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://jaeger:4317")
    [exporter] = span_exporters()
    assert isinstance(exporter, GrpcSpanExporter)
    assert exporter._endpoint == "jaeger:4317"


def test_traces_exporter_none_turns_otlp_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://jaeger:4318")
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    assert span_exporters() == []


def test_traces_exporter_otlp_uses_the_sdk_default_endpoint(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
    [exporter] = span_exporters()
    assert isinstance(exporter, OTLPSpanExporter)
    assert exporter._endpoint == "http://localhost:4318/v1/traces"


def test_an_unknown_protocol_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
    with pytest.raises(ValueError, match="exporter_otlp_protocol"):
        OtelExportSettings()


def test_metrics_go_over_otlp_unless_the_exporter_is_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert not OtelExportSettings().otlp_metrics_on
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://jaeger:4318")
    assert OtelExportSettings().otlp_metrics_on
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")
    assert not OtelExportSettings().otlp_metrics_on
    assert OtelExportSettings().otlp_on  # traces still go


def test_the_metrics_endpoint_alone_turns_their_export_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """``OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`` alone pushed no metrics (only the general
    endpoint turned the push on), while ``..._TRACES_ENDPOINT`` alone sends spans: a
    deployment sending metrics to its own collector got none, and no line said why."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "http://collector:4318/v1/metrics")
    assert OtelExportSettings().otlp_metrics_on
    assert not OtelExportSettings().otlp_on  # no span goes there
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")
    assert not OtelExportSettings().otlp_metrics_on


def test_pushed_metrics_take_the_metrics_protocol_not_the_traces_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=grpc`` made the metrics exporter gRPC too, which
    then sent to the general endpoint's HTTP port; the metrics have a variable of their own."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc")
    assert OtelExportSettings().protocol == "grpc"
    assert OtelExportSettings().metrics_protocol == "http/protobuf"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    assert OtelExportSettings().metrics_protocol == "grpc"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "http/protobuf")
    assert OtelExportSettings().metrics_protocol == "http/protobuf"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "http/json")
    with pytest.raises(ValueError, match="exporter_otlp_metrics_protocol"):
        OtelExportSettings()


def test_a_service_with_a_bad_protocol_exits_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")

    async def never(_: ServiceSettings) -> int:
        raise AssertionError("started with a bad setting")

    with pytest.raises(SystemExit) as exited:
        serve_from_command_line("things", "a test", ServiceSettings, never, argv=[])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "OTEL_EXPORTER_OTLP_PROTOCOL" in err and "http/json" in err

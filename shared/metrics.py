"""Prometheus metrics: the provider, the ``/metrics`` route and the catalogue of what we export.

Contract:
- ``setup_metrics`` installs the process's OpenTelemetry meter provider with a Prometheus
  reader (``prometheus_client`` text format on ``GET /metrics``) and, when
  ``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`` is set or ``OTEL_METRICS_EXPORTER`` names ``otlp`` (and
  not ``none``: ``shared.telemetry.OtelExportSettings``), an OTLP reader pushing every 15 s
  as well; the exporter reads ``OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`` and the rest itself.
  ``OTEL_METRICS_EXPORTER`` naming ``console`` (not with ``none``) adds a reader writing
  them to standard output every 15 s (``metric_readers``). ``OTEL_SDK_DISABLED=true``
  turns metrics off too, as the standard says (``/metrics`` is empty); the start-up warns.
  Code records through OpenTelemetry instruments (``instrument``), so one
  API feeds both.
- ``CATALOGUE`` declares every Trainyard metric: its OpenTelemetry name, kind, unit, labels
  and the Prometheus series it exports as (``MetricSpec.series``). Alert rules and the
  dashboard in deploy/ may only use these series (``tests/unit/deploy/test_alerts.py``).
- Labels are service-level names only (route template, consumer, event type, queue, flavor,
  state, outcome): never a user, job id, node-specific subject or token, so ``/metrics`` is
  served without a token (``metrics_route``) and says nothing of any tenant beyond counts by
  queue (a team's implicit queue is named ``default:<team>``: queue names are the one place
  a team's name shows) and flavor.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final, Literal

from litestar import Response, get
from litestar.handlers import HTTPRouteHandler
from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    ConsoleMetricExporter,
    MetricReader,
    PeriodicExportingMetricReader,
)
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from trainyard_platform.shared.telemetry import OtelExportSettings, service_resource

log = logging.getLogger(__name__)

REGISTRY: Final = CollectorRegistry()
"""The process's Prometheus registry (the reader of the one meter provider writes here)."""
METRICS_EXPORT_SECONDS: Final = 15.0
"""How often the OTLP and console readers push unless ``OTEL_METRIC_EXPORT_INTERVAL`` (ms)
says otherwise (Prometheus pulls at its own pace)."""
LATENCY_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
WAIT_BUCKETS: Final = (1, 5, 15, 60, 300, 900, 3600, 4 * 3600, 12 * 3600, 24 * 3600)
SIZE_BUCKETS: Final = tuple(float(2**n) for n in range(10, 38, 3))  # 1 KiB .. 128 GiB

Kind = Literal["counter", "histogram", "updown", "gauge"]


@dataclass(frozen=True)
class MetricSpec:
    """One metric: OpenTelemetry ``name`` and ``unit`` (UCUM; ``{thing}`` for a count)."""

    name: str
    kind: Kind
    unit: str
    description: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] | None = None

    @property
    def prometheus(self) -> str:
        """The metric family name the Prometheus exporter gives it."""
        base = self.name.replace(".", "_")
        if self.unit == "s":
            base += "_seconds"
        return base + "_total" if self.kind == "counter" else base

    @property
    def series(self) -> frozenset[str]:
        """Every series name a scrape shows for it."""
        if self.kind == "histogram":
            return frozenset(self.prometheus + s for s in ("_bucket", "_sum", "_count"))
        return frozenset({self.prometheus})


def _specs(*specs: MetricSpec) -> dict[str, MetricSpec]:
    return {s.name: s for s in specs}


CATALOGUE: Final = _specs(
    # Every service.
    MetricSpec(
        "trainyard.http.server.duration",
        "histogram",
        "s",
        "HTTP request latency by route template",
        ("method", "route", "status"),
        LATENCY_BUCKETS,
    ),
    MetricSpec(
        "trainyard.events.handled",
        "counter",
        "{event}",
        "Deliveries of events settled after their handler ran, each once, by consumer and "
        "event type; outcome ok (applied), failed (will be retried) or dead_lettered",
        ("consumer", "type", "outcome"),
    ),
    MetricSpec(
        "trainyard.events.handling.duration",
        "histogram",
        "s",
        "Time of the attempt that applied a batch of events, by consumer and event type",
        ("consumer", "type"),
        LATENCY_BUCKETS,
    ),
    MetricSpec(
        "trainyard.consumer.paused",
        "updown",
        "{consumer}",
        "Consumers waiting out an infrastructure outage with a message in hand",
        ("consumer",),
    ),
    MetricSpec(
        "trainyard.dependency.away",
        "updown",
        "{dependency}",
        "Dependencies of the process (postgresql, object_store, nats) that failed and have "
        "not answered since",
        ("dependency",),
    ),
    MetricSpec(
        "trainyard.consumer.outage_retries",
        "counter",
        "{retry}",
        "Retries of a message (or fetch) after an infrastructure fault",
        ("consumer",),
    ),
    MetricSpec(
        "trainyard.loop.failed_rounds",
        "counter",
        "{round}",
        "Rounds of a service's own loop (scheduling pass, fast path, lost-node sweep, budget "
        "check, storage collector, retention) that failed and are tried again, by cause: "
        "outage (PostgreSQL or the object store away) or error (anything else: a bug)",
        ("loop", "cause"),
    ),
    MetricSpec(
        "trainyard.consumer.dead_letters",
        "counter",
        "{message}",
        "Messages copied to the dead-letter stream, by consumer and kind",
        ("consumer", "kind"),
    ),
    MetricSpec(
        "trainyard.outbox.backlog",
        "gauge",
        "{event}",
        "Outbox rows committed but not yet published (parked rows excluded)",
    ),
    MetricSpec(
        "trainyard.outbox.lag",
        "gauge",
        "s",
        "Age of the oldest unpublished outbox row (0 when none waits)",
    ),
    MetricSpec(
        "trainyard.outbox.parked",
        "gauge",
        "{event}",
        "Outbox rows the bus will never take, kept for an operator",
    ),
    MetricSpec(
        "trainyard.consumer.lag",
        "gauge",
        "{message}",
        "Messages of the stream not yet delivered to the service's consumer (state "
        "undelivered), and delivered but not yet acknowledged (unacknowledged)",
        ("consumer", "state"),
    ),
    MetricSpec(
        "trainyard.deadletters.waiting",
        "gauge",
        "{message}",
        "Dead letters waiting for an operator (redrive or discard), by consumer",
        ("consumer",),
    ),
    # Scheduler (read from its tables every 15 s: services/scheduler/metrics.py).
    MetricSpec(
        "trainyard.scheduler.queue.depth",
        "gauge",
        "{job}",
        "Jobs waiting (QUEUED) by queue",
        ("queue",),
    ),
    MetricSpec(
        "trainyard.scheduler.queue.oldest_wait",
        "gauge",
        "s",
        "How long the longest-waiting job of each queue has waited since submission",
        ("queue",),
    ),
    MetricSpec(
        "trainyard.scheduler.queue.wait",
        "histogram",
        "s",
        "How long each granted job waited in its queue, from entering it (its submission, or "
        "the end of its last attempt) to its grant",
        ("queue",),
        WAIT_BUCKETS,
    ),
    MetricSpec(
        "trainyard.scheduler.allocations",
        "counter",
        "{allocation}",
        "Allocations granted, by GPU flavor",
        ("flavor",),
    ),
    MetricSpec(
        "trainyard.scheduler.preemptions",
        "counter",
        "{allocation}",
        "Allocations ended by preemption, by GPU flavor",
        ("flavor",),
    ),
    MetricSpec(
        "trainyard.scheduler.gpus",
        "gauge",
        "{gpu}",
        "GPUs by flavor and state: allocated (leased to a job), stopping (still leased to "
        "an ended allocation while its runner stops the job), idle (on a ready node, "
        "free), cordoned (free on a cordoned node: no job is placed there), lost (on a node "
        "that stopped heartbeating)",
        ("flavor", "state"),
    ),
    MetricSpec(
        "trainyard.scheduler.gpus.stopping_for",
        "gauge",
        "s",
        "Seconds the oldest GPU of the flavor still leased to an ended allocation (state "
        "stopping) has been held since it ended; 0 when none is",
        ("flavor",),
    ),
    MetricSpec(
        "trainyard.scheduler.nodes",
        "gauge",
        "{node}",
        "Runner nodes by state (ready, lost)",
        ("state",),
    ),
    MetricSpec(
        "trainyard.scheduler.nodes.cordoned",
        "gauge",
        "{node}",
        "Nodes that take no new allocation, by who cordoned them: an operator, or the "
        "scheduler after repeated platform failures",
        ("by",),
    ),
    MetricSpec(
        "trainyard.scheduler.nodes.capped",
        "gauge",
        "{node}",
        "Ready nodes the node inventory gives less than their heartbeat claims, by what it "
        "capped: undeclared, gpu_flavor, gpu_count, topology",
        ("field",),
    ),
    MetricSpec(
        "trainyard.scheduler.jobs.finished",
        "counter",
        "{job}",
        "Jobs that reached a terminal state, by state",
        ("state",),
    ),
    # Billing.
    MetricSpec(
        "trainyard.billing.budget.used",
        "gauge",
        "1",
        "Share of each team budget's amount spent this UTC month (bills and what running "
        "allocations have accrued; 1 = all of it)",
        ("team",),
    ),
    MetricSpec(
        "trainyard.billing.budget.exhausted",
        "gauge",
        "1",
        "1 while a team budget is spent this UTC month (spent >= amount), else 0",
        ("team",),
    ),
    # Runner.
    MetricSpec(
        "trainyard.runner.allocated_gpus",
        "gauge",
        "{gpu}",
        "GPUs of running jobs on this node, busy or idle (the job's mean utilisation under "
        "5%; NVML nodes only)",
        ("state",),
    ),
    MetricSpec(
        "trainyard.runner.checkpoint.upload.duration",
        "histogram",
        "s",
        "Time to upload one checkpoint to the object store",
        (),
        LATENCY_BUCKETS,
    ),
    MetricSpec(
        "trainyard.runner.checkpoint.upload.bytes",
        "histogram",
        "By",
        "Size of each uploaded checkpoint",
        (),
        SIZE_BUCKETS,
    ),
)
"""Every metric Trainyard exports, by OpenTelemetry name."""


def declare(spec: MetricSpec) -> MetricSpec:
    """Add ``spec`` to the catalogue (a service module's own metric) and return it."""
    known = CATALOGUE.setdefault(spec.name, spec)
    if known != spec:
        raise ValueError(f"metric {spec.name} declared twice, differently")
    return spec


def exported_series() -> frozenset[str]:
    """Every Prometheus series name the catalogue declares."""
    return frozenset().union(*(s.series for s in CATALOGUE.values()))


def instrument(name: str, meter: metrics.Meter | None = None) -> Any:
    """The synchronous instrument of catalogue entry ``name`` (counter, histogram or
    up-down counter)."""
    spec = CATALOGUE[name]
    m = meter or metrics.get_meter("trainyard")
    if spec.kind == "counter":
        return m.create_counter(spec.name, unit=spec.unit, description=spec.description)
    if spec.kind == "updown":
        return m.create_up_down_counter(spec.name, unit=spec.unit, description=spec.description)
    if spec.kind == "histogram":
        return m.create_histogram(
            spec.name,
            unit=spec.unit,
            description=spec.description,
            explicit_bucket_boundaries_advisory=list(spec.buckets or LATENCY_BUCKETS),
        )
    raise ValueError(f"{name} is a gauge: use observe()")


Reading = Callable[[], Iterable[tuple[float, dict[str, str]]]]


def observe(name: str, reading: Reading, meter: metrics.Meter | None = None) -> None:
    """Register gauge ``name``: each collection reports what ``reading()`` returns (values
    with their labels). ``reading`` must be cheap and non-blocking: it runs on the scrape."""
    spec = CATALOGUE[name]
    if spec.kind != "gauge":
        raise ValueError(f"{name} is a {spec.kind}, not a gauge")

    def callback(_: CallbackOptions) -> Iterable[Observation]:
        return [Observation(value, labels) for value, labels in reading()]

    (meter or metrics.get_meter("trainyard")).create_observable_gauge(
        spec.name, callbacks=[callback], unit=spec.unit, description=spec.description
    )


def setup_metrics(service_name: str) -> MeterProvider | None:
    """Install the process's meter provider (see the module) and return it; None when one
    is installed already (one per process, e.g. several services in one test process share
    it and its ``/metrics``). Its owner calls ``force_flush()`` at the stop, within its own
    bound (``ServiceRuntime``): the provider registers no exit handler, whose final export
    would hold the process's exit for the exporter's timeout when the collector does not
    answer."""
    if isinstance(metrics.get_meter_provider(), MeterProvider):
        return None
    if OtelExportSettings().sdk_disabled:
        # The standard meaning (the whole SDK off) holds, but an empty scrape silences
        # every alert while the target stays up: said once, at start.
        log.warning(
            "OTEL_SDK_DISABLED=true: no metrics either; GET /metrics serves nothing and no "
            "alert rule can fire (for no spans alone: OTEL_TRACES_SAMPLER=always_off)"
        )
    provider = MeterProvider(
        metric_readers=metric_readers(),
        resource=service_resource(service_name),
        shutdown_on_exit=False,
    )
    metrics.set_meter_provider(provider)
    return provider


def metric_readers(export: OtelExportSettings | None = None) -> list[MetricReader]:
    """The readers of the process's meter provider: Prometheus' (``/metrics``, always), an
    OTLP push and a console one (standard output), each every 15 s (or
    ``OTEL_METRIC_EXPORT_INTERVAL``) when the standard variables ask for it
    (``OtelExportSettings``)."""
    from opentelemetry.exporter.prometheus import PrometheusMetricReader

    export = export or OtelExportSettings()
    readers: list[MetricReader] = [PrometheusMetricReader(registry=REGISTRY)]
    pushed: list[Any] = []
    if export.otlp_metrics_on:
        pushed.append(_otlp_metric_exporter(export.metrics_protocol))
    if export.console_metrics_on:
        pushed.append(ConsoleMetricExporter(out=sys.stdout))
    interval_ms = export.metric_export_interval_ms or METRICS_EXPORT_SECONDS * 1000
    for exporter in pushed:
        readers.append(PeriodicExportingMetricReader(exporter, export_interval_millis=interval_ms))
    return readers


def _otlp_metric_exporter(protocol: str) -> Any:
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (
            OTLPMetricExporter as GrpcMetricExporter,
        )

        return GrpcMetricExporter()
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

    return OTLPMetricExporter()


def metrics_text() -> bytes:
    """The current scrape, in the Prometheus text format."""
    return generate_latest(REGISTRY)


def metrics_route() -> HTTPRouteHandler:
    """``GET /metrics``, open to anyone (``shared.access.OPEN_PATHS``: Prometheus scrapes
    without a token; see the module for why that is safe)."""

    @get("/metrics", include_in_schema=False, sync_to_thread=False)
    def scrape() -> Response[bytes]:
        # The header given whole: Litestar appends "; charset=utf-8" to any text/* media
        # type, and the exposition format's already names it, so a scrape said the
        # parameter twice, which Prometheus 3 refuses (the scrape fails).
        return Response(
            metrics_text(),
            media_type=CONTENT_TYPE_LATEST,
            headers={"content-type": CONTENT_TYPE_LATEST},
        )

    return scrape

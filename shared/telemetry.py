"""OpenTelemetry set-up and W3C trace-context propagation over NATS and HTTP headers.

Contract:
- ``setup_tracing`` installs a tracer provider configured the standard way: the SDK reads
  every ``OTEL_*`` variable itself. ``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES``
  win over the service's default name; ``OTEL_TRACES_SAMPLER``/``OTEL_TRACES_SAMPLER_ARG``
  pick the sampler; ``OTEL_SDK_DISABLED=true`` makes every tracer a no-op. Spans go over
  OTLP when an endpoint is set (``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or
  ``OTEL_EXPORTER_OTLP_ENDPOINT``) or ``OTEL_TRACES_EXPORTER`` names ``otlp``, with the
  protocol of ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL``/``OTEL_EXPORTER_OTLP_PROTOCOL``
  (``http/protobuf``, the default, or ``grpc``); the exporter reads its endpoint, headers,
  timeout and compression from the environment (``http/protobuf`` is the SDK's exporter
  writing the request itself, ``shared.otlp_http``: the same request for a third of the CPU).
  ``OTEL_TRACES_EXPORTER`` naming ``console`` sends spans to standard output as well;
  ``none`` turns every exporter off; a value these services do not have (``zipkin``, a typo)
  is ignored with a warning naming it, as is any ``OTEL_LOGS_EXPORTER`` but ``none`` (logs
  go to standard error only). Independently, spans go to a JSON-lines file when ``TRAINYARD_TELEMETRY_SPAN_FILE``
  is set (``trainyard trace JOB`` reads it).
- ``inject``/``extract`` carry the current context in a plain ``dict[str, str]`` of headers
  (``traceparent``/``tracestate``), the same for NATS messages and HTTP requests, so one job
  is one trace across every service it touches.
- ``tracer(name)`` is where code gets its tracer: the process's current provider's, looked
  up again when the provider changes (a module may ask before ``setup_tracing`` runs).
  Its ``start_as_current_span`` behaves as the API's (the span starts when the block is
  entered, is current inside it, records an escaping ``Exception`` and the ERROR status --
  a database error's quoted values withheld, ``shared.span_errors`` --, and ends on exit), with one small context manager where the API stacks three generator
  ones (the proxy tracer's, the SDK tracer's and ``use_span``): a few microseconds less on
  every span of a busy service (BENCHMARKS.md, "Tracing cost"). Database spans are made as
  lightly (``shared.db_spans``). It is a ``with`` context manager only, not a decorator.
- ``meter(name)`` is where code gets its metric instruments (``shared.metrics`` installs the
  provider that serves them on ``/metrics``).
- ``setup_tracing`` also turns on database spans (``opentelemetry-instrumentation-asyncpg``,
  once per process): every query made on any asyncpg connection is a ``CLIENT`` span named
  by its SQL verb, with ``db.system``, ``db.name``, ``db.user``, the peer and the statement
  text (placeholders ``$1``..., never the parameter values). Only inside a recording span:
  a query with no current span (a background loop polling its table) makes no span, so
  polling never opens a trace of its own. The spans are the library's own, each statement and
  connection described once (``shared.db_spans``). ``OTEL_PYTHON_DISABLED_INSTRUMENTATIONS``
  naming ``asyncpg`` (or ``OTEL_SDK_DISABLED=true``) leaves queries untraced.
"""

from __future__ import annotations

import json
import logging
import math
import re
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Literal

from opentelemetry import context as otel_context
from opentelemetry import metrics, trace
from opentelemetry.sdk.resources import SERVICE_NAME, OTELResourceDetector, Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.trace import StatusCode
from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from trainyard.tracing import PROPAGATOR
from trainyard.tracing import inject as inject
from trainyard_platform.shared.db_spans import WithinTraceAsyncPG
from trainyard_platform.shared.logs import Throttle, error_text, held_back
from trainyard_platform.shared.otel_import_check import whole_number
from trainyard_platform.shared.settings import TelemetrySettings, optional_http_url
from trainyard_platform.shared.span_errors import record_error

log = logging.getLogger(__name__)

# Injecting is the client distribution's (its HTTP client sends the context too); one
# propagator and one ``inject`` for both.
_PROPAGATOR = PROPAGATOR


KNOWN_TRACES_EXPORTERS: Final = frozenset({"otlp", "console", "none"})
KNOWN_METRICS_EXPORTERS: Final = frozenset({"otlp", "prometheus", "console", "none"})
"""``prometheus``: the scrape of ``GET /metrics``, which is always served. ``console``: the
SDK's console exporter, on standard output (the logs are on standard error)."""
KNOWN_LOGS_EXPORTERS: Final = frozenset({"none"})
"""Logs are never exported by the SDK: each service writes them to standard error (JSON
lines under ``TRAINYARD_LOG_FORMAT=json``) for the platform's log collector to ship."""


class OtelExportSettings(BaseSettings):
    """The standard variables that choose whether and how spans leave over OTLP (the
    exporters read the rest: endpoint, headers, timeout, compression, certificates)."""

    model_config = SettingsConfigDict(env_prefix="OTEL_")

    traces_exporter: str = ""
    """Comma-separated exporters; ``otlp`` turns OTLP on without an endpoint variable (the
    SDK's default endpoint), ``console`` writes spans to standard output, ``none`` turns
    every exporter off. Empty: OTLP on when an endpoint is set."""
    metrics_exporter: str = ""
    """Like ``traces_exporter`` for metrics pushed over OTLP (``none``: Prometheus scrapes
    ``/metrics`` only, which it always may)."""
    logs_exporter: str = ""
    """Only ``none`` (or empty): these services export no logs (``KNOWN_LOGS_EXPORTERS``)."""
    exporter_otlp_endpoint: str = ""
    exporter_otlp_traces_endpoint: str = ""
    exporter_otlp_metrics_endpoint: str = ""
    exporter_otlp_protocol: Literal["http/protobuf", "grpc", ""] = ""
    exporter_otlp_traces_protocol: Literal["http/protobuf", "grpc", ""] = ""
    exporter_otlp_metrics_protocol: Literal["http/protobuf", "grpc", ""] = ""
    sdk_disabled: bool = Field(default=False)
    python_disabled_instrumentations: str = ""
    """Comma-separated instrumentations left off (``asyncpg``: no database spans)."""

    # The SDK reads these numbers itself, and a bad one fails inside the start-up with its
    # ValueError's traceback (span limits; a batch processor's size of 0) or logs one and
    # goes on with its default (a batch processor's number that is not one): checked here,
    # so the service refuses it at start, naming it, as any other bad setting.
    attribute_count_limit: str = ""
    attribute_value_length_limit: str = ""
    span_attribute_count_limit: str = ""
    span_attribute_value_length_limit: str = ""
    span_event_count_limit: str = ""
    span_link_count_limit: str = ""
    event_attribute_count_limit: str = ""
    link_attribute_count_limit: str = ""
    """Span limits: a whole number from 0, or empty (the SDK's default; no limit for the
    value lengths)."""
    bsp_schedule_delay: str = ""
    bsp_max_queue_size: str = ""
    bsp_max_export_batch_size: str = ""
    """The batch span processor's delay (ms) and sizes: a whole number from 1 (the batch at
    most the queue), or empty (the SDK's default: 5000, 2048, 512)."""
    metric_export_interval: str = ""
    """How often metrics are pushed (OTLP, console), in milliseconds: a positive number, or
    empty (``shared.metrics.METRICS_EXPORT_SECONDS``, 15 s; the services pass it to the
    SDK, which would otherwise read this variable itself)."""
    bsp_export_timeout: str = ""
    """Its export timeout (ms): a whole number from 0, or empty (the SDK's 30000)."""

    @field_validator(
        "attribute_count_limit",
        "attribute_value_length_limit",
        "span_attribute_count_limit",
        "span_attribute_value_length_limit",
        "span_event_count_limit",
        "span_link_count_limit",
        "event_attribute_count_limit",
        "link_attribute_count_limit",
        "bsp_export_timeout",
    )
    @classmethod
    def _count(cls, value: str) -> str:
        return whole_number(value, minimum=0)

    @field_validator("bsp_schedule_delay", "bsp_max_queue_size", "bsp_max_export_batch_size")
    @classmethod
    def _positive(cls, value: str) -> str:
        return whole_number(value, minimum=1)

    @field_validator("metric_export_interval")
    @classmethod
    def _interval(cls, value: str) -> str:
        text = value.strip()
        if not text:
            return text
        try:
            number = float(text)
        except ValueError:
            number = math.nan
        if not (math.isfinite(number) and number > 0):
            raise ValueError("must be a number of milliseconds above 0, or empty")
        return text

    @property
    def metric_export_interval_ms(self) -> float | None:
        """``OTEL_METRIC_EXPORT_INTERVAL`` as a number, None when unset."""
        return float(self.metric_export_interval) if self.metric_export_interval else None

    @model_validator(mode="after")
    def _batch_fits_the_queue(self) -> OtelExportSettings:
        queue = int(self.bsp_max_queue_size or _SDK_BSP_QUEUE)
        batch = int(self.bsp_max_export_batch_size or _SDK_BSP_BATCH)
        if batch > queue:
            raise ValueError(
                f"OTEL_BSP_MAX_EXPORT_BATCH_SIZE ({batch}) must not exceed "
                f"OTEL_BSP_MAX_QUEUE_SIZE ({queue})"
            )
        return self

    @field_validator(
        "exporter_otlp_protocol",
        "exporter_otlp_traces_protocol",
        "exporter_otlp_metrics_protocol",
        mode="before",
    )
    @classmethod
    def _protocol_in_any_case(cls, value: object) -> object:
        # An enum of the standard: case-insensitive (``GRPC``).
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("sdk_disabled", mode="before")
    @classmethod
    def _as_the_sdk_reads_it(cls, value: object) -> object:
        # The SDK's providers are off only for "true" (any case); pydantic would also take
        # "1" or "yes", leaving the services' exporters off and the SDK on.
        if not isinstance(value, str):
            return value
        text = value.strip().lower()
        if text not in ("true", "false", ""):
            raise ValueError("must be true or false (as the SDK reads it)")
        return text == "true"

    @field_validator(
        "exporter_otlp_endpoint", "exporter_otlp_traces_endpoint", "exporter_otlp_metrics_endpoint"
    )
    @classmethod
    def _usable_endpoint(cls, value: str) -> str:
        # The exporters would fail every export, for ever, on one they cannot parse.
        return optional_http_url(value) or ""

    def unknown_exporters(self) -> list[str]:
        """``OTEL_TRACES_EXPORTER``/``OTEL_METRICS_EXPORTER``/``OTEL_LOGS_EXPORTER`` values
        these services do not have, each as ``VARIABLE=value`` (they are ignored; ``setup_tracing`` warns)."""
        known = {
            "traces_exporter": KNOWN_TRACES_EXPORTERS,
            "metrics_exporter": KNOWN_METRICS_EXPORTERS,
            "logs_exporter": KNOWN_LOGS_EXPORTERS,
        }
        unknown: list[str] = []
        for name, values in known.items():
            for value in getattr(self, name).split(","):
                if value.strip() and value.strip().lower() not in values:
                    unknown.append(f"OTEL_{name.upper()}={value.strip()}")
        return unknown

    @property
    def database_spans_on(self) -> bool:
        disabled = {e.strip() for e in self.python_disabled_instrumentations.split(",")}
        return not self.sdk_disabled and "asyncpg" not in disabled

    @property
    def otlp_on(self) -> bool:
        exporters = _named(self.traces_exporter)
        if "none" in exporters or self.sdk_disabled:
            return False
        return "otlp" in exporters or bool(
            self.exporter_otlp_traces_endpoint or self.exporter_otlp_endpoint
        )

    @property
    def console_on(self) -> bool:
        """Spans go to standard output too (``console`` among the traces exporters)."""
        return _console(self.traces_exporter, self.sdk_disabled)

    @property
    def console_metrics_on(self) -> bool:
        """Metrics go to standard output every 15 s too (``console`` among the metrics
        exporters)."""
        return _console(self.metrics_exporter, self.sdk_disabled)

    @property
    def otlp_metrics_on(self) -> bool:
        exporters = _named(self.metrics_exporter)
        if "none" in exporters or self.sdk_disabled:
            return False
        # As for spans: the signal's own endpoint turns its export on, as the general one does.
        return "otlp" in exporters or bool(
            self.exporter_otlp_metrics_endpoint or self.exporter_otlp_endpoint
        )

    @property
    def protocol(self) -> str:
        """The protocol of spans (the traces one, else the general one)."""
        return self.exporter_otlp_traces_protocol or self.exporter_otlp_protocol or "http/protobuf"

    @property
    def metrics_protocol(self) -> str:
        """The protocol of pushed metrics: the metrics one, else the general one (never the
        traces one, which is for spans)."""
        return self.exporter_otlp_metrics_protocol or self.exporter_otlp_protocol or "http/protobuf"


def _named(exporters: str) -> set[str]:
    """The exporters a comma-separated list names, in lower case: the standard's enum
    values are case-insensitive (``OTLP``, ``None``)."""
    return {e.strip().lower() for e in exporters.split(",") if e.strip()}


def _console(exporters: str, sdk_disabled: bool) -> bool:
    named = _named(exporters)
    return "console" in named and "none" not in named and not sdk_disabled


_SDK_BSP_QUEUE: Final = 2048
_SDK_BSP_BATCH: Final = 512
"""The batch span processor's sizes when their variables are not set (the SDK's)."""


def service_resource(default_name: str) -> Resource:
    """The SDK's resource (``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_SERVICE_NAME``, the SDK's own
    attributes) named ``default_name`` unless the environment names the service."""
    return Resource.create({SERVICE_NAME: default_name}).merge(OTELResourceDetector().detect())


def setup_tracing(service_name: str, settings: TelemetrySettings) -> TracerProvider:
    """Install and return the process's tracer provider; call ``shutdown()`` on exit.

    ``service_name`` is the default ``service.name``. The sampler is the SDK's choice from
    ``OTEL_TRACES_SAMPLER`` (parent-based always-on when unset). When an SDK provider is
    already installed (several services in one test process), the exporters are added to
    it instead: OpenTelemetry allows one global provider per process.
    """
    warn_unknown_exporters()
    current = trace.get_tracer_provider()
    if isinstance(current, TracerProvider):
        add_exporters(current, settings)
        instrument_database(current)
        return current
    provider = TracerProvider(resource=service_resource(service_name))
    add_exporters(provider, settings)
    trace.set_tracer_provider(provider)
    instrument_database(provider)
    return provider


def warn_unknown_exporters(export: OtelExportSettings | None = None) -> list[str]:
    """Warn about each exporter the environment names that these services do not have
    (``OtelExportSettings.unknown_exporters``: ignored); return them."""
    unknown = (export or OtelExportSettings()).unknown_exporters()
    for value in unknown:
        log.warning(
            "%s is not an exporter of these services (traces: otlp, console, none; metrics: "
            "otlp, prometheus, console, none; logs: none, they go to standard error): ignored",
            value,
        )
    return unknown


def instrument_database(provider: trace.TracerProvider) -> bool:
    """Trace asyncpg's queries into ``provider`` (see the module: only inside a recording
    span, never the parameters); once per process. True when database spans are on."""
    if not OtelExportSettings().database_spans_on:
        return False
    # A singleton: one wrapping per process.
    instrumentor = WithinTraceAsyncPG()
    if not instrumentor.is_instrumented_by_opentelemetry:
        # capture_parameters stays False: values ($1...) can be tokens or credentials.
        instrumentor.instrument(tracer_provider=DirectTracerProvider(provider))
    return True


def span_exporters(export: OtelExportSettings | None = None) -> list[SpanExporter]:
    """The exporters the standard variables ask for: OTLP (built without arguments so the
    exporter itself reads its endpoint and options from the environment) and the console's,
    each when asked for."""
    export = export or OtelExportSettings()
    exporters: list[SpanExporter] = []
    if export.console_on:
        # The stream of now, not the SDK's default (sys.stdout when the SDK was imported).
        exporters.append(ConsoleSpanExporter(out=sys.stdout))
    if not export.otlp_on:
        return exporters
    if export.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter as GrpcSpanExporter,
        )

        return [*exporters, GrpcSpanExporter()]
    from trainyard_platform.shared.otlp_http import HttpSpanExporter

    return [*exporters, HttpSpanExporter()]


def add_exporters(provider: TracerProvider, settings: TelemetrySettings) -> None:
    """Attach the exporters the environment asks for (OTLP, see ``span_exporters``) and the
    JSON-lines span file of ``settings`` to ``provider``."""
    for exporter in span_exporters():
        provider.add_span_processor(BatchSpanProcessor(exporter))
    if settings.span_file:
        # Simple (synchronous) processor: a span is on disk as soon as it ends, so tests
        # and ``trainyard trace`` can read it without waiting for a batch flush.
        provider.add_span_processor(SimpleSpanProcessor(JsonLinesSpanExporter(settings.span_file)))


def tracer(name: str) -> trace.Tracer:
    """Module ``name``'s tracer, from the process's tracer provider (see the module)."""
    return _DirectTracer(name)


class _DirectTracer(trace.Tracer):
    """A tracer that hands every call to its provider's tracer, with a lighter
    ``start_as_current_span`` (see the module). ``provider`` None: the global provider,
    whichever it is at the call (its tracer is asked for again when it changes)."""

    def __init__(
        self,
        name: str,
        provider: trace.TracerProvider | None = None,
        *args: Any,
        **kwargs: Any,
    ) -> None:
        self._name = name
        self._fixed = provider
        self._args = args
        self._kwargs = kwargs
        self._provider: trace.TracerProvider | None = None
        self._tracer: trace.Tracer = trace.NoOpTracer()

    def _current(self) -> trace.Tracer:
        provider = self._fixed or trace.get_tracer_provider()
        if provider is not self._provider:
            self._tracer = provider.get_tracer(self._name, *self._args, **self._kwargs)
            self._provider = provider
        return self._tracer

    def start_span(
        self,
        name: str,
        context: otel_context.Context | None = None,
        kind: trace.SpanKind = trace.SpanKind.INTERNAL,
        attributes: Any = None,
        links: Sequence[trace.Link] | None = None,
        start_time: int | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
    ) -> trace.Span:
        return self._current().start_span(
            name,
            context,
            kind,
            attributes,
            links,
            start_time,
            record_exception,
            set_status_on_exception,
        )

    def start_as_current_span(  # type: ignore[override]  # a context manager, not a decorator
        self,
        name: str,
        context: otel_context.Context | None = None,
        kind: trace.SpanKind = trace.SpanKind.INTERNAL,
        attributes: Any = None,
        links: Sequence[trace.Link] | None = None,
        start_time: int | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
        end_on_exit: bool = True,
    ) -> _CurrentSpan:
        return _CurrentSpan(
            self._current(),
            (name, context, kind, attributes, links, start_time),
            record_exception,
            set_status_on_exception,
            end_on_exit,
        )


class _CurrentSpan:
    """``with``: start a span, make it current, and on exit do what ``trace.use_span`` does
    (restore the context; for an ``Exception`` leaving the block, record it and set the
    ERROR status as asked; end the span when ``end_on_exit``)."""

    __slots__ = ("_args", "_end", "_record", "_set_status", "_span", "_token", "_tracer")

    def __init__(
        self,
        tracer: trace.Tracer,
        args: tuple[
            str,
            otel_context.Context | None,
            trace.SpanKind,
            Any,
            Sequence[trace.Link] | None,
            int | None,
        ],
        record_exception: bool,
        set_status_on_exception: bool,
        end_on_exit: bool,
    ) -> None:
        self._tracer = tracer
        self._args = args
        self._record = record_exception
        self._set_status = set_status_on_exception
        self._end = end_on_exit

    def __enter__(self) -> trace.Span:
        name, context, kind, attributes, links, start_time = self._args
        self._span = span = self._tracer.start_span(
            name,
            context,
            kind,
            attributes,
            links,
            start_time,
            self._record,
            self._set_status,
        )
        self._token = otel_context.attach(trace.set_span_in_context(span))
        return span

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        span = self._span
        try:
            otel_context.detach(self._token)
            # As use_span: only an Exception is an error (GeneratorExit, CancelledError and
            # the like are not).
            if isinstance(error, Exception) and span.is_recording():
                record_error(span, error, record=self._record, set_status=self._set_status)
        finally:
            if self._end:
                span.end()


class DirectTracerProvider(trace.TracerProvider):
    """``provider``, whose tracers are ``_DirectTracer`` ones (for an instrumentation
    library, which asks its provider for its tracer)."""

    def __init__(self, provider: trace.TracerProvider) -> None:
        self._provider = provider

    def get_tracer(self, instrumenting_module_name: str, *args: Any, **kwargs: Any) -> trace.Tracer:
        return _DirectTracer(instrumenting_module_name, self._provider, *args, **kwargs)


def meter(name: str) -> metrics.Meter:
    """The meter instruments of module ``name`` come from (the process's provider)."""
    return metrics.get_meter(name)


def recorded_trace_id() -> str | None:
    """The W3C trace id (32 hex digits) of the current span when its trace is recorded (the
    span context's sampled flag), else None: outside a span, with the SDK disabled, and when
    the sampler dropped the trace (``OTEL_TRACES_SAMPLER=always_off``, a ratio, a caller's
    ``traceparent`` flagged not sampled). An id of a dropped trace names nothing any trace
    store or span file holds, so it is never handed out as one to look up."""
    ctx = trace.get_current_span().get_span_context()
    return format(ctx.trace_id, "032x") if ctx.is_valid and ctx.trace_flags.sampled else None


def extract(headers: Mapping[str, Any] | None) -> otel_context.Context:
    """The trace context carried by ``headers`` (an empty context when there is none).
    Only strings (or lists of them, a repeated header) are header values: a stored context (a
    job's JSON) with any other value there is read as if it lacked it, never an error.

    The W3C propagator's answer, whatever the headers; the usual case -- a version ``00``
    ``traceparent`` exactly as ``inject`` writes it, no ``tracestate`` -- is read here with
    one compiled pattern, at about half the propagator's CPU (which looks the header up
    through its getter and searches a pattern that allows padding and other versions); a
    consumer's span, a job's span and its queue wait each extract once (BENCHMARKS.md,
    "Tracing cost")."""
    if not headers:
        return otel_context.Context()
    traceparent = headers.get(_TRACEPARENT)
    if isinstance(traceparent, str) and _TRACESTATE not in headers:
        match = _PLAIN_TRACEPARENT.fullmatch(traceparent)
        if match is not None:
            trace_hex, span_hex, flags_hex = match.groups()
            trace_id, span_id = int(trace_hex, 16), int(span_hex, 16)
            if trace_id and span_id:  # all-zero ids are invalid: the propagator says so
                parent = trace.SpanContext(
                    trace_id, span_id, True, _TRACE_FLAGS[int(flags_hex, 16)], None
                )
                span = trace.NonRecordingSpan(parent)
                return trace.set_span_in_context(span, otel_context.Context())
    return _PROPAGATOR.extract({k: v for k, v in headers.items() if _header_value(v)})


def _header_value(value: Any) -> bool:
    """A value the propagator reads: a string, or a list of them (a repeated header)."""
    return isinstance(value, str) or (
        isinstance(value, list | tuple) and all(isinstance(v, str) for v in value)
    )


_TRACEPARENT = "traceparent"
_TRACESTATE = "tracestate"
_PLAIN_TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
"""A version-00 ``traceparent`` with nothing around it (``fullmatch``): what ``inject`` and
every W3C implementation send; anything else goes to the propagator."""
_TRACE_FLAGS = tuple(trace.TraceFlags(flags) for flags in range(256))


def check_span_file(settings: TelemetrySettings) -> None:
    """Raise the ``OSError`` of appending to ``settings``' span file, when it has one that
    cannot be appended to (a service refuses to start on it: ``ServiceRuntime``)."""
    if settings.span_file:
        with open(settings.span_file, "a", encoding="utf-8"):
            pass


class JsonLinesSpanExporter(SpanExporter):
    """Appends each finished span as one JSON object per line (several processes may share
    the file: each line is written with a single ``write`` call in append mode). A batch
    that cannot be written (a full disk, a folder removed) is dropped: one warning a minute
    per reason says so (the SDK would log a traceback for each span)."""

    def __init__(self, path: str | Path) -> None:
        self._path = Path(path)
        self._lock = threading.Lock()
        self._throttle = Throttle()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = "".join(json.dumps(span_record(s)) + "\n" for s in spans)
        with self._lock:
            try:
                with self._path.open("a", encoding="utf-8") as out:
                    out.write(lines)
            except OSError as exc:
                reason = error_text(exc)
                repeats = self._throttle.due(reason)
                if repeats is not None:
                    log.warning(
                        "span file %s (TRAINYARD_TELEMETRY_SPAN_FILE): cannot append: %s; "
                        "spans are dropped%s",
                        self._path,
                        reason,
                        held_back(repeats),
                    )
                return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None


def span_record(span: ReadableSpan) -> dict[str, Any]:
    """The fields of a span that tests and humans read: ``status`` and
    ``status_description`` only for a span that ended in error, ``events`` (name,
    ``time_ns``, attributes: a queue wait's ``job.pending`` reasons, an exception) only for
    one that has any."""
    ctx = span.get_span_context()
    assert ctx is not None
    record: dict[str, Any] = {
        "service": span.resource.attributes.get("service.name"),
        "name": span.name,
        "trace_id": format(ctx.trace_id, "032x"),
        "span_id": format(ctx.span_id, "016x"),
        "parent_id": format(span.parent.span_id, "016x") if span.parent else None,
        "kind": span.kind.name,
        "attributes": {k: _plain(v) for k, v in (span.attributes or {}).items()},
        "start_ns": span.start_time,
        "end_ns": span.end_time,
    }
    if span.status.status_code is StatusCode.ERROR:
        record["status"] = "ERROR"
        record["status_description"] = span.status.description or ""
    if span.events:
        record["events"] = [
            {
                "name": event.name,
                "time_ns": event.timestamp,
                "attributes": {k: _plain(v) for k, v in (event.attributes or {}).items()},
            }
            for event in span.events
        ]
    return record


def _plain(value: object) -> object:
    return list(value) if isinstance(value, tuple) else value

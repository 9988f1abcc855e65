"""ASGI middleware: one SERVER span per HTTP request, named by route template, child of the
caller's ``traceparent``; and the request's latency on ``trainyard.http.server.duration``.

Contract:
- The span is named ``METHOD /route/{template}`` (``GET /v1/jobs/{job_id}``), following
  OpenTelemetry's HTTP conventions, with ``http.route``, ``url.path``,
  ``http.request.method`` and ``http.response.status_code``; the raw path (ids in it) is an
  attribute, never the name, so Jaeger shows one operation per route.
- Probes and scrapes (``UNTRACED``: ``/healthz``, ``/readyz``, ``/metrics``) get no span and
  no latency point: a kubelet polling every few seconds would drown the traces.
- Work done while handling the request (including outbox rows it writes) inherits the span,
  so a job's trace starts at the client's submit call.
- A request whose route has a ``job_id`` path parameter is handled in that job's log scope
  (``logs.job_scope``): its log lines carry the ``job_id``. The span names no job, so the
  job's trace (``trainyard trace``) does not gather every poll of its view.

Why hand-written rather than ``litestar.plugins.opentelemetry``: that plugin wraps
``opentelemetry-instrumentation-asgi``; its default extractor names the span by the raw path
(and puts the raw path in ``http.route``), so it would need our own extractor and exclusion
list; it adds internal ``http send``/``http receive`` spans unless told not to, and records
its own latency histogram under other names. These lines give the conventional span and
our catalogued metric with no further dependency.
"""

from __future__ import annotations

import time
from typing import Any, Final

from opentelemetry import trace
from opentelemetry.context import attach, detach

from trainyard_platform.shared.logs import job_scope
from trainyard_platform.shared.metrics import instrument
from trainyard_platform.shared.telemetry import extract, tracer

ASGIApp = Any  # litestar.types.ASGIApp; kept loose so shared/ stays framework-light

UNTRACED: Final = frozenset({"/healthz", "/readyz", "/metrics"})
"""Paths served without a span or a latency point."""

_tracer = tracer(__name__)
_latency = instrument("trainyard.http.server.duration")


def route_of(scope: dict[str, Any]) -> str:
    """The route template Litestar matched (``/v1/jobs/{job_id}``), or the raw path when
    the request matched none."""
    template = scope.get("path_template")
    return str(template) if template else str(scope["path"])


def tracing_middleware(app: ASGIApp) -> ASGIApp:
    async def middleware(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] in UNTRACED:
            await app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", [])}
        method, route = scope["method"], route_of(scope)
        status = 500  # what the client sees if the app raises before starting a response
        started = time.perf_counter()
        token = attach(extract(headers))
        try:
            with _tracer.start_as_current_span(
                f"{method} {route}",
                kind=trace.SpanKind.SERVER,
                attributes={
                    "http.request.method": method,
                    "http.route": route,
                    "url.path": scope["path"],
                },
            ) as span:

                async def send_with_status(message: dict[str, Any]) -> None:
                    nonlocal status
                    if message["type"] == "http.response.start":
                        status = message["status"]
                        span.set_attribute("http.response.status_code", status)
                    await send(message)

                job_id = (scope.get("path_params") or {}).get("job_id")
                if job_id is None:
                    await app(scope, receive, send_with_status)
                else:
                    # The request's log lines name its job; the span does not (a poll of
                    # the job's view is not part of the job's trace: ``trainyard trace``).
                    with job_scope(str(job_id)):
                        await app(scope, receive, send_with_status)
        finally:
            detach(token)
            _latency.record(
                time.perf_counter() - started,
                {"method": method, "route": route, "status": str(status)},
            )

    return middleware

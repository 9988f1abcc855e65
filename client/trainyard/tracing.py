"""W3C trace context (``traceparent``) on the client's requests, with the OpenTelemetry API.

Only the API is needed: a program that configures OpenTelemetry (the services do, in
``shared.telemetry``) gets its current span's context sent along; one that does not sends
nothing extra, because the API's default span carries no valid context.
"""

from __future__ import annotations

from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

PROPAGATOR = TraceContextTextMapPropagator()
"""The one propagator: the services extract with it what clients inject."""


def inject(headers: dict[str, str] | None = None) -> dict[str, str]:
    """Return ``headers`` with the current trace context added."""
    carrier = dict(headers or {})
    PROPAGATOR.inject(carrier)
    return carrier

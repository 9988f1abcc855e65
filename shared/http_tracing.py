"""ASGI middleware: one SERVER span per HTTP request, child of the caller's ``traceparent``.

Work done while handling the request (including outbox rows it writes) inherits this span,
so a job's trace starts at the client's submit call.
"""

from __future__ import annotations

from typing import Any

from opentelemetry import trace
from opentelemetry.context import attach, detach

from shared.telemetry import extract, tracer

ASGIApp = Any  # litestar.types.ASGIApp; kept loose so shared/ stays framework-light

_tracer = tracer(__name__)


def tracing_middleware(app: ASGIApp) -> ASGIApp:
    async def middleware(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", [])}
        token = attach(extract(headers))
        try:
            with _tracer.start_as_current_span(
                f"{scope['method']} {scope['path']}",
                kind=trace.SpanKind.SERVER,
                attributes={"http.request.method": scope["method"], "url.path": scope["path"]},
            ) as span:

                async def send_with_status(message: dict[str, Any]) -> None:
                    if message["type"] == "http.response.start":
                        span.set_attribute("http.response.status_code", message["status"])
                    await send(message)

                await app(scope, receive, send_with_status)
        finally:
            detach(token)

    return middleware

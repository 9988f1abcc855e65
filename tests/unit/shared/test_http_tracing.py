"""HTTP server spans are named by route template; probes and scrapes are not traced; the
scrape is open and parses as Prometheus text with the request's latency in it."""

from __future__ import annotations

from typing import Any

from litestar import get
from litestar.connection import ASGIConnection
from litestar.handlers import BaseRouteHandler
from litestar.params import FromPath
from litestar.testing import TestClient
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from trainyard_platform.shared.access import is_open_probe
from trainyard_platform.shared.http_app import service_app
from trainyard_platform.shared.metrics import setup_metrics
from trainyard_platform.shared.runtime import ServiceRuntime
from trainyard_platform.shared.settings import ServiceSettings


@get("/v1/things/{thing_id:str}", sync_to_thread=False)
def one_thing(thing_id: FromPath[str]) -> dict[str, str]:
    return {"id": thing_id}


async def _closed_guard(
    connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler
) -> None:
    from litestar.exceptions import NotAuthorizedException

    if not is_open_probe(connection) and connection.headers.get("authorization") != "Bearer ok":
        raise NotAuthorizedException("no")


def _app() -> Any:
    setup_metrics("things")
    runtime = ServiceRuntime("things", ServiceSettings())
    return service_app("things", [*runtime.health_handlers(), one_thing], _closed_guard)


def test_spans_are_named_by_route_and_probes_are_not_traced(spans: InMemorySpanExporter) -> None:
    with TestClient(_app()) as client:
        assert client.get("/healthz").status_code == 200
        assert client.get("/readyz").status_code == 200
        assert client.get("/metrics").status_code == 200
        answer = client.get("/v1/things/abc-123", headers={"Authorization": "Bearer ok"})
        assert answer.status_code == 200
    [span] = [s for s in spans.get_finished_spans() if s.kind.name == "SERVER"]
    assert span.name == "GET /v1/things/{thing_id}"
    assert span.attributes is not None
    assert span.attributes["http.route"] == "/v1/things/{thing_id}"
    assert span.attributes["url.path"] == "/v1/things/abc-123"
    assert span.attributes["http.response.status_code"] == 200


def test_metrics_need_no_token_and_hold_the_route_latency() -> None:
    with TestClient(_app()) as client:
        client.get("/v1/things/x1", headers={"Authorization": "Bearer ok"})
        assert client.get("/v1/things/x2").status_code == 401
        scrape = client.get("/metrics")
    assert scrape.status_code == 200
    assert scrape.headers["content-type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(scrape.text)}
    latency = families["trainyard_http_server_duration_seconds"]
    counts = {
        (s.labels["route"], s.labels["status"]): s.value
        for s in latency.samples
        if s.name.endswith("_count")
    }
    assert counts[("/v1/things/{thing_id}", "200")] >= 1
    assert counts[("/v1/things/{thing_id}", "401")] >= 1
    assert not any("x1" in str(s.labels) for s in latency.samples)

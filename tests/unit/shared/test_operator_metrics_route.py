"""``GET /metrics`` answers with a Content-Type a Prometheus 3 server can parse.

Prometheus 3 fails a scrape whose Content-Type it cannot parse (unless the job sets
``fallback_scrape_protocol``), and Go's ``mime.ParseMediaType`` refuses a header that
names a parameter twice: the route once sent ``...; charset=utf-8; charset=utf-8``, so
every target of deploy/prometheus would have been down."""

from __future__ import annotations

from email.message import Message

from litestar import Litestar
from litestar.testing import TestClient
from prometheus_client import CONTENT_TYPE_LATEST

from trainyard_platform.shared.metrics import metrics_route


def _parameter_names(content_type: str) -> list[str]:
    message = Message()
    message["content-type"] = content_type
    return [name for name, _ in message.get_params()[1:]]


def test_metrics_content_type_is_the_exposition_formats_own() -> None:
    with TestClient(Litestar(route_handlers=[metrics_route()])) as client:
        response = client.get("/metrics")
    assert response.status_code == 200
    content_type = response.headers["content-type"]
    assert content_type == CONTENT_TYPE_LATEST
    names = _parameter_names(content_type)
    assert len(names) == len(set(names)), f"a parameter named twice: {content_type}"

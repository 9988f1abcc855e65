"""The HTTP client: auth and trace headers, error mapping, and ``wait``."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace import TracerProvider

from trainyard import client as client_module
from trainyard.client import TrainyardClient, TrainyardError

Route = Callable[[httpx.Request], httpx.Response]


def _client(route: Route) -> TrainyardClient:
    return TrainyardClient("http://api.test/", "ty_secret", transport=httpx.MockTransport(route))


def _view(status: str, **changes: Any) -> dict[str, Any]:
    view: dict[str, Any] = {
        "id": "job-1",
        "status": status,
        "model": None,
        "cost": {"final": False},
        "history": [],
    }
    return {**view, **changes}


def test_requests_carry_the_token_and_the_trace_context() -> None:
    seen: list[httpx.Request] = []

    def route(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(201, json=_view("QUEUED"))

    tracer = TracerProvider().get_tracer("test")
    with tracer.start_as_current_span("submit") as span:
        _client(route).submit({"name": "x"}, idempotency_key="k-1")
    (request,) = seen
    assert request.method == "POST"
    assert request.url == "http://api.test/v1/jobs"
    assert request.headers["Authorization"] == "Bearer ty_secret"
    assert request.headers["Idempotency-Key"] == "k-1"
    trace_id = format(span.get_span_context().trace_id, "032x")
    assert request.headers["traceparent"].split("-")[1] == trace_id
    assert json.loads(request.content) == {"name": "x"}


def test_paths_and_query_parameters() -> None:
    seen: list[str] = []

    def route(request: httpx.Request) -> httpx.Response:
        seen.append(f"{request.method} {request.url.raw_path.decode()}")
        return httpx.Response(200, json=[] if request.url.path == "/v1/jobs" else _view("QUEUED"))

    api = _client(route)
    api.get_job("job-1")
    api.cancel("job-1")
    api.list_jobs(status="RUNNING", limit=5)
    api.get_job("../admin")
    assert seen == [
        "GET /v1/jobs/job-1",
        "POST /v1/jobs/job-1/cancel",
        "GET /v1/jobs?limit=5&status=RUNNING",
        "GET /v1/jobs/..%2Fadmin",
    ]


def test_http_errors_raise_with_the_servers_field_errors() -> None:
    body = {"detail": "invalid job spec", "errors": [{"field": "gpus", "message": "too few"}]}
    api = _client(lambda _: httpx.Response(422, json=body))
    with pytest.raises(TrainyardError) as caught:
        api.submit({})
    assert caught.value.status == 422
    assert caught.value.message == "invalid job spec"
    assert caught.value.errors == [{"field": "gpus", "message": "too few"}]
    assert str(caught.value) == "422 invalid job spec (gpus: too few)"


def test_non_json_error_and_unreachable_server() -> None:
    with pytest.raises(TrainyardError) as caught:
        _client(lambda _: httpx.Response(502, text="<html>bad gateway</html>")).get_job("j")
    assert caught.value.status == 502

    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    with pytest.raises(TrainyardError) as caught:
        _client(refuse).get_job("j")
    assert caught.value.status == 0
    assert "cannot reach" in str(caught.value)


def _sequence(views: list[dict[str, Any]]) -> Route:
    """Answers each GET with the next view, then repeats the last one."""
    feed: Iterator[dict[str, Any]] = iter(views)
    last: dict[str, Any] = {}

    def route(_: httpx.Request) -> httpx.Response:
        nonlocal last
        last = next(feed, last)
        return httpx.Response(200, json=last)

    return route


def test_wait_returns_once_a_succeeded_job_has_its_model_and_final_cost() -> None:
    views = [
        _view("QUEUED"),
        _view("RUNNING"),
        _view("RUNNING"),
        _view("SUCCEEDED"),
        _view("SUCCEEDED", model={"name": "m"}),
        _view("SUCCEEDED", model={"name": "m"}, cost={"final": True}),
        _view("SUCCEEDED", model={"name": "m"}, cost={"final": True}, extra=1),
    ]
    changes: list[str] = []
    final = _client(_sequence(views)).wait(
        "job-1", timeout_s=30, poll_s=0, on_change=lambda v: changes.append(v["status"])
    )
    assert final["cost"]["final"] and final["model"]
    assert "extra" not in final  # returned as soon as it settled
    assert changes == ["QUEUED", "RUNNING", "SUCCEEDED", "SUCCEEDED", "SUCCEEDED"]


def test_wait_gives_up_on_late_results_after_the_settle_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(client_module, "SETTLE_SECONDS", 0.05)
    final = _client(_sequence([_view("FAILED")])).wait("job-1", timeout_s=30, poll_s=0.01)
    assert final["status"] == "FAILED"


def test_wait_times_out_naming_the_last_status() -> None:
    api = _client(_sequence([_view("PENDING")]))
    with pytest.raises(TimeoutError, match="PENDING"):
        api.wait("job-1", timeout_s=0.05, poll_s=0.01)


def test_upload_bundle_skips_what_the_team_has_and_puts_the_rest(tmp_path: Path) -> None:
    stored: dict[str, bytes] = {}
    seen: list[str] = []

    def route(request: httpx.Request) -> httpx.Response:
        sha = request.url.path.rsplit("/", 1)[1]
        seen.append(f"{request.method} {request.url.path}")
        if request.method == "HEAD":
            return httpx.Response(200 if sha in stored else 404)
        assert request.headers["Content-Type"] == "application/gzip"
        assert request.headers["Content-Length"] == str(len(request.content))
        stored[sha] = request.content
        return httpx.Response(201, json={"sha256": sha, "created": True})

    bundle = tmp_path / "b.tar.gz"
    bundle.write_bytes(b"bundle bytes")
    api = _client(route)
    assert api.upload_bundle(bundle, "ab" * 32) is True
    assert api.upload_bundle(bundle, "ab" * 32) is False
    assert stored == {"ab" * 32: b"bundle bytes"}
    path = "/v1/bundles/" + "ab" * 32
    assert seen == [f"HEAD {path}", f"PUT {path}", f"HEAD {path}"]


def test_upload_bundle_errors(tmp_path: Path) -> None:
    def route(request: httpx.Request) -> httpx.Response:
        if request.method == "HEAD":
            return httpx.Response(404)
        return httpx.Response(413, json={"detail": "bundle too large: at most 10 bytes"})

    bundle = tmp_path / "b.tar.gz"
    bundle.write_bytes(b"x" * 11)
    with pytest.raises(TrainyardError) as caught:
        _client(route).upload_bundle(bundle, "ab" * 32)
    assert caught.value.status == 413 and "at most 10 bytes" in str(caught.value)
    with pytest.raises(TrainyardError) as caught:
        _client(lambda r: httpx.Response(401)).bundle_stored("ab" * 32)
    assert caught.value.status == 401


def test_logs_passes_the_cursor() -> None:
    seen: list[httpx.Request] = []

    def route(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"chunks": [], "cursor": "c"})

    assert _client(route).logs("job/1", after="c0", limit=5)["cursor"] == "c"
    assert seen[0].url.raw_path.decode() == "/v1/jobs/job%2F1/logs?after=c0&limit=5"

"""A job view without a status is a malformed answer at once: before, ``wait`` (and every
command polling a job) kept asking a server that answered ``{}`` until its timeout, hours
by default, as if the job were still running."""

from __future__ import annotations

import threading

import httpx
import pytest

from trainyard.client import MalformedAnswer, TrainyardClient

JOB = "3f2a91c0-0000-4000-8000-000000000000"


@pytest.mark.parametrize("view", [{}, {"status": None}, {"status": 5}, {"job_id": JOB}])
def test_a_job_view_without_a_status_is_refused_not_polled(view: dict[str, object]) -> None:
    asked = []

    def route(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.path)
        return httpx.Response(200, json=view)

    client = TrainyardClient("http://api.test", "ty_x", 5.0, transport=httpx.MockTransport(route))
    outcome: list[BaseException] = []

    def wait() -> None:
        try:
            client.wait(JOB, timeout_s=3600, poll_s=0.01)
        except BaseException as exc:  # (recorded for the assertion below)
            outcome.append(exc)

    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()
    waiter.join(timeout=30)
    assert not waiter.is_alive(), f"wait still polling after {len(asked)} requests"
    assert len(outcome) == 1 and isinstance(outcome[0], MalformedAnswer), outcome
    assert f"GET /v1/jobs/{JOB}" in str(outcome[0])
    assert "status" in str(outcome[0])
    assert asked == [f"/v1/jobs/{JOB}"]

"""``GET /v1/jobs`` a page at a time: keyset cursors in ``Link: <...>; rel="next"``, the body
still a plain list, a bad cursor a 422 on ``after``, and the client following the cursor."""

from __future__ import annotations

import asyncio
import base64
import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from tests.integration.submission.conftest import SPEC, Submission
from trainyard import client as client_module
from trainyard.client import TrainyardClient

pytestmark = pytest.mark.integration

T0 = datetime(2026, 1, 1, tzinfo=UTC)


async def _store_jobs(
    submission: Submission, team: str, statuses: list[str], ties_every: int = 7
) -> list[str]:
    return [job for job, _ in await _store(submission, team, statuses, ties_every)]


async def _store(
    submission: Submission, team: str, statuses: list[str], ties_every: int = 7
) -> list[tuple[str, str]]:
    """Jobs of ``team``'s first user written straight to the table, one per status given, a
    minute apart, except that every ``ties_every``-th shares the time of the one before (the
    list then orders them by id); returns their ids in list order (newest first)."""
    async with submission.pool.acquire() as conn:
        team_id, user_id = await conn.fetchrow(
            "SELECT t.id, min(u.id) FROM teams t JOIN users u ON u.team_id = t.id "
            "WHERE t.name = $1 GROUP BY t.id",
            team,
        )
        rows = []
        at = T0
        for i, status in enumerate(statuses):
            if i % ties_every != 1:
                at += timedelta(minutes=1)
            rows.append((str(uuid.uuid4()), team_id, user_id, f"job-{i}", SPEC, status, at, at))
        await conn.executemany(
            "INSERT INTO jobs (id, team_id, user_id, name, spec, status, submitted_at, "
            "updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
            rows,
        )
    ordered = sorted(rows, key=lambda r: (r[6], r[0]), reverse=True)
    return [(r[0], r[5]) for r in ordered]


def _next(response: httpx.Response) -> str | None:
    link = response.links.get("next")
    return None if link is None else str(link["url"])


async def _walk(submission: Submission, url: str, token: str | None = None) -> list[list[str]]:
    """Follow ``rel="next"`` from ``url``; the ids of each page."""
    pages: list[list[str]] = []
    next_url: str | None = url
    while next_url is not None:
        response = await submission.client.get(next_url, headers=submission.auth(token))
        assert response.status_code == 200, response.text
        body = response.json()
        assert isinstance(body, list)
        pages.append([job["id"] for job in body])
        next_url = _next(response)
        assert len(pages) < 100, "the links never end"
    return pages


async def test_pages_follow_the_cursor_through_every_job_once_newest_first(
    submission: Submission,
) -> None:
    expected = await _store_jobs(submission, "ml", ["QUEUED"] * 53)
    pages = await _walk(submission, "/v1/jobs?limit=10")
    assert [len(p) for p in pages] == [10, 10, 10, 10, 10, 3]
    assert [job for page in pages for job in page] == expected


async def test_a_page_that_ends_the_list_exactly_has_no_next_link(
    submission: Submission,
) -> None:
    expected = await _store_jobs(submission, "ml", ["QUEUED"] * 20)
    pages = await _walk(submission, "/v1/jobs?limit=10")
    assert [len(p) for p in pages] == [10, 10]
    assert [job for page in pages for job in page] == expected
    everything = await submission.client.get("/v1/jobs?limit=500", headers=submission.auth())
    assert _next(everything) is None
    assert [job["id"] for job in everything.json()] == expected


async def test_the_next_link_keeps_the_status_filter_and_the_limit(
    submission: Submission,
) -> None:
    stored = await _store(submission, "ml", ["QUEUED", "PENDING", "PENDING", "QUEUED"] * 9)
    pending = [job for job, status in stored if status == "PENDING"]
    first = await submission.client.get(
        "/v1/jobs?status=PENDING&limit=4", headers=submission.auth()
    )
    link = _next(first)
    assert link is not None
    query = httpx.URL(link).params
    assert query["status"] == "PENDING" and query["limit"] == "4" and query["after"]
    pages = await _walk(submission, "/v1/jobs?status=PENDING&limit=4")
    assert [len(p) for p in pages] == [4, 4, 4, 4, 2]
    assert [job for page in pages for job in page] == pending


async def test_jobs_submitted_after_the_first_page_do_not_shift_the_later_ones(
    submission: Submission,
) -> None:
    expected = await _store_jobs(submission, "ml", ["QUEUED"] * 12)
    first = await submission.client.get("/v1/jobs?limit=5", headers=submission.auth())
    assert [job["id"] for job in first.json()] == expected[:5]
    new = await submission.submit()  # the newest job now; it belongs before the first page
    link = _next(first)
    assert link is not None
    rest = await _walk(submission, link)
    listed = [job for page in rest for job in page]
    assert listed == expected[5:]
    assert new["id"] not in listed


async def test_a_cursor_is_only_a_position_in_the_callers_own_team(
    submission: Submission,
) -> None:
    ours = await _store_jobs(submission, "ml", ["QUEUED"] * 6)
    theirs = await _store_jobs(submission, "vision", ["QUEUED"] * 6)
    first = await submission.client.get("/v1/jobs?limit=3", headers=submission.auth())
    link = _next(first)
    assert link is not None
    # The other team using our cursor sees its own jobs older than that position, never ours.
    other = submission.other_team_token
    listed = [job for page in await _walk(submission, link, other) for job in page]
    assert listed
    assert set(listed) <= set(theirs)
    assert not set(listed) & set(ours)


def _cursor(value: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")


@pytest.mark.parametrize(
    "after",
    [
        "not-a-cursor!",
        "%%%",
        base64.urlsafe_b64encode(b"\xff\xfe").decode(),
        _cursor({"at": "2026-01-01T00:00:00+00:00"}),
        _cursor(["2026-01-01T00:00:00+00:00"]),
        _cursor(["2026-01-01T00:00:00", "naive-time"]),
        _cursor(["yesterday", "job"]),
        _cursor(["2026-01-01T00:00:00+00:00", 7]),
        _cursor(["2026-01-01T00:00:00+00:00", ""]),
        "A" * 300,
    ],
)
async def test_a_cursor_this_endpoint_did_not_give_is_a_422_on_after(
    submission: Submission, after: str
) -> None:
    response = await submission.client.get(
        "/v1/jobs", params={"after": after}, headers=submission.auth()
    )
    assert response.status_code == 422, response.text
    assert [e["field"] for e in response.json()["errors"]] == ["after"]


async def test_an_empty_cursor_is_the_first_page(submission: Submission) -> None:
    expected = await _store_jobs(submission, "ml", ["QUEUED"] * 3)
    response = await submission.client.get("/v1/jobs?after=", headers=submission.auth())
    assert response.status_code == 200
    assert [job["id"] for job in response.json()] == expected


class _AppTransport(httpx.BaseTransport):
    """A synchronous transport (for ``TrainyardClient`` in a thread) that sends each request
    through the test's async client, on the test's event loop."""

    def __init__(self, client: httpx.AsyncClient, loop: asyncio.AbstractEventLoop) -> None:
        self._client = client
        self._loop = loop
        self.paths: list[str] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.paths.append(request.url.raw_path.decode())
        forwarded = self._client.build_request(
            request.method, request.url.raw_path.decode(), headers=request.headers
        )
        future = asyncio.run_coroutine_threadsafe(self._client.send(forwarded), self._loop)
        response = future.result(timeout=30)
        return httpx.Response(
            response.status_code, headers=response.headers, content=response.content
        )


async def test_the_client_follows_the_cursor_past_one_page(
    submission: Submission, monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = await _store_jobs(submission, "ml", ["QUEUED"] * 23)
    monkeypatch.setattr(client_module, "LIST_PAGE_MAX", 10)
    transport = _AppTransport(submission.client, asyncio.get_running_loop())
    api = TrainyardClient("http://submission", submission.admin_token, transport=transport)
    with api:
        everything = await asyncio.to_thread(api.list_jobs, limit=100)
        some = await asyncio.to_thread(api.list_jobs, limit=15)
    assert [job["id"] for job in everything] == expected
    assert [job["id"] for job in some] == expected[:15]
    limits = [httpx.URL(path).params["limit"] for path in transport.paths]
    assert limits == ["10", "10", "10", "10", "5"]
    assert all("after=" in path for path in transport.paths[1:3] + transport.paths[4:])


async def test_a_listed_job_shows_its_cost_so_far_and_its_spec_summary(
    submission: Submission,
) -> None:
    billed_twice, billed_once, unbilled = await _store_jobs(submission, "ml", ["QUEUED"] * 3)
    async with submission.pool.acquire() as conn:
        await conn.executemany(
            "INSERT INTO job_costs (allocation_id, job_id, gpu_flavor, gpus, started_at, "
            "ended_at, gpu_seconds, price_per_gpu_hour, cost, currency) "
            "VALUES ($1, $2, 'cpu', 1, $3, $3, 60, 2.0, $4, 'USD')",
            [
                ("a-1", billed_twice, T0, 0.25),
                ("a-2", billed_twice, T0, 0.5),
                ("a-3", billed_once, T0, 1.0),
            ],
        )
    response = await submission.client.get("/v1/jobs", headers=submission.auth())
    listed = {job["id"]: job for job in response.json()}
    assert (listed[billed_twice]["cost"], listed[billed_twice]["currency"]) == (0.75, "USD")
    assert (listed[billed_once]["cost"], listed[billed_once]["currency"]) == (1.0, "USD")
    assert (listed[unbilled]["cost"], listed[unbilled]["currency"]) == (0, None)
    assert {(job["gpu_flavor"], job["gpus"]) for job in listed.values()} == {
        (SPEC["gpu_flavor"], SPEC["gpus"])
    }

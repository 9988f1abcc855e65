"""The admin API on a real database: define, read back, delete, refuse bad input naming the
field and deletes that would orphan something; retire a node taken out for good."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import asyncpg
import httpx
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from pydantic import SecretStr

from tests.integration.scheduler.conftest import Scheduler, make_spec
from trainyard_platform.services.scheduler import repository as repo
from trainyard_platform.services.scheduler.admission import load_facts
from trainyard_platform.services.scheduler.api import create_app
from trainyard_platform.services.scheduler.metrics import scheduler_readings
from trainyard_platform.services.scheduler.scheduling import run_pass
from trainyard_platform.shared.access import service_guard
from trainyard_platform.shared.events.payloads import (
    AllocationGranted,
    JobCancelRequested,
    JobPending,
)
from trainyard_platform.shared.metrics_sampler import Sampler

pytestmark = pytest.mark.integration

TOKEN = "op-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
async def http(pool: asyncpg.Pool) -> AsyncIterator[httpx.AsyncClient]:
    # The app runs in the test's own event loop (the pool's), not in a portal thread.
    transport = httpx.ASGITransport(app=create_app(pool, service_guard(SecretStr(TOKEN))))
    async with httpx.AsyncClient(transport=transport, base_url="http://scheduler") as client:
        yield client


async def put(http: httpx.AsyncClient, path: str, body: dict[str, Any]) -> Any:
    return await http.put(f"/v1/admin/{path}", json=body, headers=AUTH)


async def delete(http: httpx.AsyncClient, path: str) -> Any:
    return await http.delete(f"/v1/admin/{path}", headers=AUTH)


def conflict(response: Any) -> str:
    """The detail of a 409, whose one error names the path parameter it is about."""
    assert response.status_code == 409, response.text
    body = response.json()
    parameter = "node_id" if "/v1/admin/nodes/" in str(response.request.url) else "name"
    assert [e["field"] for e in body["errors"]] == [parameter], body
    assert body["errors"][0]["message"]
    detail: str = body["detail"]
    return detail


async def add_job(pool: asyncpg.Pool, job_id: str, **spec: Any) -> None:
    now = datetime.now(UTC)
    async with pool.acquire() as conn:
        await repo.insert_job(conn, job_id, make_spec(**spec), now, now)


async def known(pool: asyncpg.Pool, *teams: str) -> None:
    """Teams the scheduler has seen, as a first job of each makes them (its implicit queue):
    queues for them need no word from the submission service, which owns teams and which these
    tests run without (the break-glass token has no user token to ask it with)."""
    async with pool.acquire() as conn:
        for team in teams:
            await repo.queue_for_team(conn, team)


async def finish(pool: asyncpg.Pool, job_id: str) -> None:
    await pool.execute("UPDATE jobs SET status = 'CANCELLED' WHERE job_id = $1", job_id)


def fields(response: Any) -> dict[str, str]:
    assert response.status_code == 422, response.text
    return {e["field"]: e["message"] for e in response.json()["errors"]}


async def test_every_admin_route_needs_the_token(http: httpx.AsyncClient) -> None:
    for path in ("flavors", "cohorts", "queues", "priority-classes", "node-inventory"):
        assert (await http.get(f"/v1/admin/{path}")).status_code == 401
    response = await http.put("/v1/admin/cohorts/research", json={})
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    assert (await http.get("/v1/queue")).status_code == 401


async def test_define_a_cohort_and_queues_with_quotas(
    http: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    await known(pool, "vision")
    response = await put(http, "flavors/a100", {"description": "80 GB"})
    assert response.status_code == 201
    assert response.json() == {
        "name": "a100",
        "description": "80 GB",
        "nodes": 0,
        "ready_nodes": 0,
        "gpus": 0,
        "ready_gpus": 0,
    }
    assert (await put(http, "cohorts/research", {})).status_code == 201
    assert (await put(http, "cohorts/research", {"description": "ML"})).status_code == 200
    body = {
        "team": "vision",
        "cohort": "research",
        "weight": 2,
        "quotas": {"a100": {"nominal": 8, "borrowing_limit": 4}},
    }
    response = await put(http, "queues/vision", body)
    assert response.status_code == 201, response.text
    assert response.json() == {
        "name": "vision",
        "team": "vision",
        "cohort": "research",
        "weight": 2.0,
        "implicit": False,
        "quotas": {"a100": {"nominal": 8, "borrowing_limit": 4, "lending_limit": None}},
    }
    # Replacing the quotas replaces them all.
    body["quotas"] = {"a100": {"nominal": 4, "lending_limit": 2}}
    response = await put(http, "queues/vision", body)
    assert response.status_code == 200
    assert response.json()["quotas"] == {
        "a100": {"nominal": 4, "borrowing_limit": None, "lending_limit": 2}
    }
    (listed,) = (await http.get("/v1/admin/queues", headers=AUTH)).json()
    assert listed == response.json()
    cohort = (await http.get("/v1/admin/cohorts/research", headers=AUTH)).json()
    assert (cohort["description"], cohort["queues"]) == ("ML", ["vision"])
    assert (await http.get("/v1/admin/queues/nope", headers=AUTH)).status_code == 404
    rows = await pool.fetch("SELECT queue, flavor, nominal, lending_limit FROM quotas")
    assert [tuple(r) for r in rows] == [("vision", "a100", 4, 2)]


async def test_priority_classes_are_seeded_and_can_be_defined(http: httpx.AsyncClient) -> None:
    seeded = (await http.get("/v1/admin/priority-classes", headers=AUTH)).json()
    assert [(c["name"], c["value"], c["preemptible"]) for c in seeded] == [
        ("high", 1000, False),
        ("normal", 100, True),
        ("low", 0, True),
    ]
    body = {"value": 500, "preemptible": True, "min_runtime_seconds": 600, "description": "x"}
    assert (await put(http, "priority-classes/urgent", body)).status_code == 201
    got = (await http.get("/v1/admin/priority-classes/urgent", headers=AUTH)).json()
    assert (got["value"], got["min_runtime_seconds"]) == (500, 600.0)


async def test_bad_input_is_refused_with_the_field_named(
    http: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    await put(http, "flavors/a100", {})
    assert fields(await put(http, "queues/Vision", {"team": "vision"})) == {
        "name": "must be a lower-case letter, then at most 39 lower-case letters, digits or '-'"
    }
    assert fields(await put(http, "flavors/A100", {})) == {
        "name": "must be a lower-case letter or a digit, then at most 39 lower-case letters, "
        "digits or '-'"
    }
    found = fields(
        await put(
            http,
            "queues/vision",
            {"team": "vision", "quotas": {"a100": {"nominal": -1}}, "extra": 1},
        )
    )
    assert set(found) == {"quotas.a100.nominal", "extra"}
    found = fields(
        await put(
            http,
            "queues/vision",
            {"team": "vision", "cohort": "ghost", "quotas": {"h900": {"nominal": 1}}},
        )
    )
    assert set(found) == {"cohort", "quotas.h900"}
    assert "PUT /v1/admin/cohorts/ghost" in found["cohort"]
    found = fields(
        await put(
            http,
            "queues/vision",
            {"team": "vision", "quotas": {"a100": {"nominal": 1, "lending_limit": 1}}},
        )
    )
    assert found == {"quotas.a100": "borrowing and lending limits need a cohort"}
    found = fields(await put(http, "priority-classes/urgent", {"value": 1.5, "preemptible": "yes"}))
    assert set(found) == {"value", "preemptible"}
    found = fields(await raw_put(http, "cohorts/c1", b"{not json"))
    assert list(found) == ["body"]
    form = {**AUTH, "Content-Type": "application/x-www-form-urlencoded"}
    for headers in (AUTH, form, {**AUTH, "Content-Type": "application/json; charset=latin-1"}):
        refused = await http.put("/v1/admin/cohorts/c1", content=b"{}", headers=headers)
        assert shape(refused, 415)["detail"].startswith("unsupported media type")
    # Nothing of it was stored.
    assert await pool.fetchval("SELECT count(*) FROM queues") == 0
    assert await pool.fetchval("SELECT count(*) FROM priority_classes") == 3


async def test_a_team_has_one_queue_and_a_queue_keeps_its_team(
    http: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    await known(pool, "vision")
    assert (await put(http, "queues/vision", {"team": "vision"})).status_code == 201
    response = await put(http, "queues/vision-2", {"team": "vision"})
    assert response.status_code == 409
    assert response.json()["detail"] == "team vision already has queue vision"
    assert [e["field"] for e in response.json()["errors"]] == ["team"]
    assert fields(await put(http, "queues/vision", {"team": "nlp"})) == {
        "team": "queue vision belongs to team vision; a queue keeps its team"
    }


async def test_defining_a_queue_takes_over_the_teams_implicit_queue(
    http: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    now = datetime.now(UTC)
    async with pool.acquire() as conn:
        await repo.insert_job(conn, "job-1", make_spec(team="vision"), now, now)
    assert await pool.fetchval("SELECT queue FROM jobs") == "default:vision"
    implicit = (await http.get("/v1/admin/queues/default:vision", headers=AUTH)).json()
    assert (implicit["implicit"], implicit["quotas"]) == (True, {})

    await put(http, "flavors/cpu", {})
    response = await put(
        http, "queues/vision", {"team": "vision", "quotas": {"cpu": {"nominal": 2}}}
    )
    assert response.status_code == 201
    assert response.json()["implicit"] is False
    assert await pool.fetchval("SELECT queue FROM jobs") == "vision"
    names = [q["name"] for q in (await http.get("/v1/admin/queues", headers=AUTH)).json()]
    assert names == ["vision"]


async def test_flavors_show_their_nodes(http: httpx.AsyncClient, pool: asyncpg.Pool) -> None:
    now = datetime.now(UTC)
    async with pool.acquire() as conn:
        await repo.upsert_node(conn, "n1", "h1", "h200", 8, now, "rack-1")
        await repo.upsert_node(conn, "n2", "h2", "h200", 8, now, "rack-1")
    (flavor,) = (await http.get("/v1/admin/flavors", headers=AUTH)).json()
    assert (flavor["name"], flavor["nodes"], flavor["ready_gpus"]) == ("h200", 2, 16)
    queue = (await http.get("/v1/queue", headers=AUTH)).json()
    assert [n["topology"] for n in queue["nodes"]] == ["rack-1", "rack-1"]


# --- DELETE ----------------------------------------------------------------------------


async def test_delete_answers_204_then_404(http: httpx.AsyncClient, pool: asyncpg.Pool) -> None:
    await known(pool, "vision")
    await put(http, "flavors/a100", {})
    await put(http, "cohorts/research", {})
    await put(http, "queues/vision", {"team": "vision", "quotas": {"a100": {"nominal": 2}}})
    await put(http, "priority-classes/urgent", {"value": 500, "preemptible": True})
    assert (await http.delete("/v1/admin/cohorts/research")).status_code == 401
    for path, absent in [
        ("queues/vision", "no queue vision"),
        ("flavors/a100", "no flavor a100"),
        ("cohorts/research", "no cohort research"),
        ("priority-classes/urgent", "no priority class urgent"),
    ]:
        response = await delete(http, path)
        assert response.status_code == 204, response.text
        assert response.content == b""
        assert (await http.get(f"/v1/admin/{path}", headers=AUTH)).status_code == 404
        response = await delete(http, path)
        assert response.status_code == 404
        assert response.json() == {"detail": absent, "errors": []}
    # A queue no job ever named leaves nothing behind, its quotas included.
    assert await pool.fetchval("SELECT count(*) FROM queues") == 0
    assert await pool.fetchval("SELECT count(*) FROM quotas") == 0


async def test_a_flavor_of_a_node_a_quota_or_an_unfinished_job_stays(
    http: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    await known(pool, "vision")
    now = datetime.now(UTC)
    async with pool.acquire() as conn:
        await repo.upsert_node(conn, "n1", "h1", "h200", 8, now)
    assert conflict(await delete(http, "flavors/h200")) == "flavor h200 is in use by nodes n1"

    await put(http, "flavors/a100", {})
    await put(http, "queues/vision", {"team": "vision", "quotas": {"a100": {"nominal": 2}}})
    await add_job(pool, "job-1", team="nlp", gpu_flavor="a100")
    assert conflict(await delete(http, "flavors/a100")) == (
        "flavor a100 is in use by the quotas of queues vision; unfinished jobs job-1"
    )
    await put(http, "queues/vision", {"team": "vision"})
    assert conflict(await delete(http, "flavors/a100")) == (
        "flavor a100 is in use by unfinished jobs job-1"
    )
    await finish(pool, "job-1")
    assert (await delete(http, "flavors/a100")).status_code == 204


async def test_a_cohort_with_queues_stays(http: httpx.AsyncClient, pool: asyncpg.Pool) -> None:
    await known(pool, "nlp", "vision")
    await put(http, "cohorts/research", {})
    for team in ("nlp", "vision"):
        await put(http, f"queues/{team}", {"team": team, "cohort": "research"})
    assert conflict(await delete(http, "cohorts/research")) == (
        "cohort research is in use by queues nlp, vision"
    )
    await delete(http, "queues/nlp")
    await put(http, "queues/vision", {"team": "vision"})
    assert (await delete(http, "cohorts/research")).status_code == 204


async def test_a_queue_with_unfinished_jobs_stays_and_finished_ones_keep_their_history(
    http: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    await known(pool, "vision")
    await put(http, "flavors/cpu", {})
    await put(http, "queues/vision", {"team": "vision", "quotas": {"cpu": {"nominal": 2}}})
    for n in range(1, 8):
        await add_job(pool, f"job-{n}", team="vision")
    assert conflict(await delete(http, "queues/vision")) == (
        "queue vision is in use by unfinished jobs job-1, job-2, job-3, job-4, job-5 and 2 more"
    )
    assert await pool.fetchval("SELECT count(*) FROM quotas") == 1
    await pool.execute("UPDATE jobs SET status = 'SUCCEEDED'")
    assert (await delete(http, "queues/vision")).status_code == 204
    assert (await http.get("/v1/admin/queues/vision", headers=AUTH)).status_code == 404
    (implicit,) = (await http.get("/v1/admin/queues", headers=AUTH)).json()
    assert implicit == {
        "name": "default:vision",
        "team": "vision",
        "cohort": None,
        "weight": 1.0,
        "implicit": True,
        "quotas": {},
    }
    assert set(await pool.fetch("SELECT DISTINCT queue FROM jobs")) == {("default:vision",)}
    # The team can be given a queue again: it takes over the implicit one.
    assert (await put(http, "queues/vision-2", {"team": "vision"})).status_code == 201


async def test_a_priority_class_of_unfinished_jobs_stays(
    http: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    await put(http, "priority-classes/urgent", {"value": 500, "preemptible": False})
    await add_job(pool, "job-1", priority="urgent")
    await add_job(pool, "job-2", priority="low")
    assert conflict(await delete(http, "priority-classes/urgent")) == (
        "priority class urgent is in use by unfinished jobs job-1"
    )
    await finish(pool, "job-1")
    assert (await delete(http, "priority-classes/urgent")).status_code == 204


async def test_after_its_queue_is_deleted_a_team_schedules_in_its_implicit_queue(
    http: httpx.AsyncClient, scheduler: Scheduler
) -> None:
    await known(scheduler.pool, "vision")
    await scheduler.heartbeat("n1", gpus=2)
    await put(http, "queues/vision", {"team": "vision", "quotas": {"cpu": {"nominal": 4}}})
    await scheduler.submit("job-1", gpus=3)  # more than the cluster has: it waits
    await scheduler.wait_for(JobPending, lambda p: p.job_id == "job-1")
    assert conflict(await delete(http, "queues/vision")) == (
        "queue vision is in use by unfinished jobs job-1"
    )
    await scheduler.send(JobCancelRequested(job_id="job-1", team="vision", user="ada"), "job-1")
    assert (await delete(http, "queues/vision")).status_code == 204

    await scheduler.submit("job-2", gpus=2)
    (grant,) = await scheduler.wait_for(AllocationGranted)
    assert (grant.job_id, len(grant.gpu_indices)) == ("job-2", 2)
    queues = await scheduler.pool.fetch("SELECT job_id, queue FROM jobs ORDER BY job_id")
    assert [tuple(r) for r in queues] == [("job-1", "default:vision"), ("job-2", "default:vision")]


def shape(response: Any, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert "Traceback" not in response.text
    body: dict[str, Any] = response.json()
    assert set(body) == {"detail", "errors"} and isinstance(body["detail"], str), body
    for error in body["errors"]:
        assert set(error) == {"field", "message"} and error["message"], body
    return body


async def raw_put(http: httpx.AsyncClient, path: str, content: bytes) -> Any:
    headers = {**AUTH, "Content-Type": "application/json"}
    return await http.put(f"/v1/admin/{path}", content=content, headers=headers)


async def test_bodies_are_screened_before_the_model(
    http: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    # A NUL in a queue's cohort name, in a quota's flavor key, and in the queue's own name.
    response = await put(http, "queues/research", {"team": "ml", "cohort": "re\x00search"})
    assert "control characters" in fields(response)["cohort"]
    shape(response, 422)
    response = await put(http, "queues/research", {"team": "ml", "quotas": {"a1\x00": {}}})
    assert "control characters" in shape(response, 422)["errors"][0]["message"]
    shape(await put(http, "queues/re%00search", {"team": "ml"}), 422)

    response = await raw_put(http, "cohorts/research", b'{"description": "a", "description": "b"}')
    assert fields(response) == {"description": "duplicate key"}
    response = await raw_put(
        http, "priority-classes/urgent", b'{"value": 1e999, "preemptible": true}'
    )
    assert "finite" in fields(response)["value"]
    response = await raw_put(http, "cohorts/research", b"[" * 30_000 + b"]" * 30_000)
    assert shape(response, 422)["errors"]
    # Free text keeps its newlines.
    response = await put(http, "flavors/a100", {"description": "80 GB\nSXM"})
    assert response.status_code == 201, response.text

    big = b'{"description": "' + b"x" * (64 * 1024) + b'"}'
    assert "64 KiB" in shape(await raw_put(http, "cohorts/research", big), 413)["detail"]

    async def streamed() -> AsyncIterator[bytes]:  # no Content-Length: checked as it streams
        for _ in range(100):
            yield b" " * 1024

    response = await http.put(
        "/v1/admin/cohorts/research",
        content=streamed(),
        headers={**AUTH, "Content-Type": "application/json"},
    )
    shape(response, 413)
    assert await pool.fetchval("SELECT count(*) FROM cohorts") == 0


async def test_queues_come_a_page_at_a_time(http: httpx.AsyncClient, pool: asyncpg.Pool) -> None:
    await known(pool, "q1", "q2", "q3", "q4", "q5")
    # GET /v1/admin/queues answered every queue in one body, and every team has one (its
    # implicit queue at least). Now a page of at most limit, the rest by the Link cursor.
    assert (await put(http, "flavors/a100", {"description": "A100"})).status_code in (200, 201)
    for team in ("q1", "q2", "q3", "q4", "q5"):
        body = {"team": team, "quotas": {"a100": {"nominal": 1}}}
        assert (await put(http, f"queues/{team}", body)).status_code == 201
    seen: list[str] = []
    url: str | None = "/v1/admin/queues?limit=2"
    for _ in range(10):
        assert url is not None
        page = await http.get(url, headers=AUTH)
        assert page.status_code == 200, page.text
        assert len(page.json()) <= 2
        seen += [q["name"] for q in page.json()]
        assert all(
            q["quotas"] == {"a100": {"nominal": 1, "borrowing_limit": None, "lending_limit": None}}
            for q in page.json()
        )
        url = page.links.get("next", {}).get("url")
        if url is None:
            break
    assert seen == ["q1", "q2", "q3", "q4", "q5"]
    for bad in ({"after": "bm90IGEgY3Vyc29y"}, {"limit": 501}):
        refused = await http.get("/v1/admin/queues", params=bad, headers=AUTH)
        assert next(iter(bad)) in fields(refused)


async def test_a_queue_s_waiting_line_comes_a_page_at_a_time(
    http: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    # GET /v1/queue answered every waiting job of every queue in one body: 100,000 pending
    # jobs, 100,000 rows. Now each queue shows the head of its line and how many wait, and
    # GET /v1/queue/{name}/pending pages through the whole line in queue order.
    for n in range(105):
        await add_job(pool, f"job-{n:03}", team="vision")
    # The last pass placed three of them: they come first, by position; the rest by arrival.
    for position, job in enumerate(("job-104", "job-050", "job-007"), start=1):
        await pool.execute(
            "UPDATE jobs SET pending_position = $1, pending_reason = 'waiting' WHERE job_id = $2",
            position,
            job,
        )
    order = ["job-104", "job-050", "job-007"] + [
        f"job-{n:03}" for n in range(105) if n not in (104, 50, 7)
    ]
    (queue,) = (await http.get("/v1/queue", headers=AUTH)).json()["queues"]
    assert queue["waiting"] == 105
    assert [p["job_id"] for p in queue["pending"]] == order[:100]

    seen: list[str] = []
    url: str | None = "/v1/queue/default:vision/pending?limit=40"
    for _ in range(10):
        assert url is not None
        page = await http.get(url, headers=AUTH)
        assert page.status_code == 200, page.text
        assert len(page.json()) <= 40
        seen += [p["job_id"] for p in page.json()]
        url = page.links.get("next", {}).get("url")
        if url is None:
            break
    assert seen == order
    for bad in ({"after": "bm90IGEgY3Vyc29y"}, {"limit": 1001}, {"limit": 0}):
        refused = await http.get("/v1/queue/default:vision/pending", params=bad, headers=AUTH)
        assert next(iter(bad)) in fields(refused)
    missing = await http.get("/v1/queue/ghost/pending", headers=AUTH)
    assert missing.status_code == 404
    assert missing.json()["detail"] == "no queue ghost"
    assert (await http.get("/v1/queue/default:vision/pending")).status_code == 401


async def every_page(http: httpx.AsyncClient, url: str | None) -> list[str]:
    """The names of every page from ``url`` on, following ``Link: <...>; rel="next"``."""
    seen: list[str] = []
    for _ in range(20):
        assert url is not None
        page = await http.get(url, headers=AUTH)
        assert page.status_code == 200, page.text
        assert len(page.json()) <= 2
        seen += [item["name"] for item in page.json()]
        url = page.links.get("next", {}).get("url")
        if url is None:
            return seen
    raise AssertionError(f"more than 20 pages from {url}")


async def test_flavors_cohorts_and_priority_classes_come_a_page_at_a_time(
    http: httpx.AsyncClient,
) -> None:
    # GET /v1/admin/{flavors,cohorts,priority-classes} answered every one in one body; now a
    # page of at most limit, as GET /v1/admin/queues, the rest by the Link cursor.
    for name in ("f1", "f2", "f3", "f4", "f5"):
        assert (await put(http, f"flavors/{name}", {})).status_code == 201
        assert (await put(http, f"cohorts/c-{name}", {})).status_code == 201
    for name, value in (("urgent", 500), ("alpha", 100)):
        body = {"value": value, "preemptible": True}
        assert (await put(http, f"priority-classes/{name}", body)).status_code == 201
    assert await every_page(http, "/v1/admin/flavors?limit=2") == ["f1", "f2", "f3", "f4", "f5"]
    assert await every_page(http, "/v1/admin/cohorts?limit=2") == [
        "c-f1",
        "c-f2",
        "c-f3",
        "c-f4",
        "c-f5",
    ]
    assert await every_page(http, "/v1/admin/priority-classes?limit=2") == [
        "high",
        "urgent",
        "alpha",
        "normal",
        "low",
    ]
    for kind in ("flavors", "cohorts", "priority-classes"):
        for bad in ({"after": "bm90IGEgY3Vyc29y"}, {"limit": 501}):
            refused = await http.get(f"/v1/admin/{kind}", params=bad, headers=AUTH)
            assert next(iter(bad)) in fields(refused), kind


# --- cordon ----------------------------------------------------------------------------


async def test_cordon_needs_a_known_node_and_a_reason(
    http: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    for verb in ("cordon", "uncordon"):
        response = await http.post(f"/v1/admin/nodes/n1/{verb}", json={"reason": "x"})
        assert response.status_code == 401, response.text
        response = await http.post(
            f"/v1/admin/nodes/nope/{verb}", json={"reason": "disk"}, headers=AUTH
        )
        assert response.status_code == 404, response.text
        assert response.json()["detail"] == "no node nope"
    async with pool.acquire() as conn:
        await repo.upsert_node(conn, "n1", "h1", "h200", 8, datetime.now(UTC))
    for body, message in (
        ({}, "field required"),
        ({"reason": ""}, "at least 1 character"),
        ({"reason": "   "}, "must not be blank"),
        ({"reason": "x" * 501}, "at most 500 characters"),
        ({"reason": 7}, 'must be a string (quote it: "7")'),
    ):
        response = await http.post("/v1/admin/nodes/n1/cordon", json=body, headers=AUTH)
        assert message in fields(response)["reason"], (body, response.text)
    response = await http.post(
        "/v1/admin/nodes/n1/cordon", json={"reason": "disk", "until": "never"}, headers=AUTH
    )
    assert "until" in fields(response)
    json_type = {**AUTH, "Content-Type": "application/json"}
    response = await http.post("/v1/admin/nodes/n1/cordon", content=b"not json", headers=json_type)
    assert response.status_code == 422 and response.json()["detail"], response.text
    # Nothing was stored or audited by any of those.
    assert await pool.fetchval("SELECT cordoned_at FROM nodes WHERE node_id = 'n1'") is None
    assert (await http.get("/v1/audit", headers=AUTH)).json() == []
    # An operator's second cordon keeps its start and takes the new reason.
    first = (
        await http.post("/v1/admin/nodes/n1/cordon", json={"reason": "disk"}, headers=AUTH)
    ).json()["cordon"]
    again = (
        await http.post("/v1/admin/nodes/n1/cordon", json={"reason": "fan"}, headers=AUTH)
    ).json()["cordon"]
    assert (again["since"], again["reason"]) == (first["since"], "fan")


# --- retire ----------------------------------------------------------------------------


async def alerted(pool: asyncpg.Pool) -> dict[str, float]:
    """The gauges ``TrainyardNodeLost`` and ``TrainyardGPUsLost`` read, sampled once: nodes by
    state, GPUs by ``flavor/state`` (only the non-zero ones)."""
    reader = InMemoryMetricReader()
    sampler = Sampler(meter=MeterProvider(metric_readers=[reader]).get_meter("test"))
    scheduler_readings(sampler, pool)
    await sampler.sample_once()
    data = reader.get_metrics_data()
    assert data is not None
    points: dict[str, float] = {}
    for metric in (m for r in data.resource_metrics for s in r.scope_metrics for m in s.metrics):
        for point in metric.data.data_points:  # type: ignore[union-attr]
            labels, value = point.attributes or {}, float(point.value)  # type: ignore[union-attr]
            if metric.name == "trainyard.scheduler.nodes":
                points[f"nodes/{labels['state']}"] = value
            elif metric.name == "trainyard.scheduler.gpus" and value:
                points[f"{labels['flavor']}/{labels['state']}"] = value
    return points


async def test_a_lost_node_holding_nothing_is_retired_until_it_heartbeats_again(
    http: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    # Before: no route forgot a node; a runner stopped for good left its node lost forever,
    # the lost-node alerts firing and its flavor undeletable.
    assert (await http.delete("/v1/admin/nodes/n1")).status_code == 401
    response = await http.delete("/v1/admin/nodes/n1", headers=AUTH)
    assert response.status_code == 404, response.text
    assert response.json() == {"detail": "no node n1", "errors": []}
    now = datetime.now(UTC)
    async with pool.acquire() as conn:
        await repo.upsert_node(conn, "n1", "h1", "h200", 8, now)
        await repo.upsert_node(conn, "n2", "h2", "a100", 4, now)
    assert conflict(await delete(http, "nodes/n1")).startswith(
        "node n1 is ready (last heartbeat 20"
    )
    # Lost, but still holding a job's allocation and GPU lease: refused, naming the job.
    await add_job(pool, "job-1", gpu_flavor="h200")
    async with pool.acquire() as conn, conn.transaction():
        await run_pass(conn, now)
    await pool.execute("UPDATE nodes SET status = 'LOST', lost_at = now() WHERE node_id = 'n1'")
    assert conflict(await delete(http, "nodes/n1")) == (
        "node n1 is in use by the live allocations or GPU leases of jobs job-1"
    )
    await pool.execute(
        "UPDATE allocations SET status = 'RELEASED', released_at = granted_at, outcome = 'lost'"
    )
    await pool.execute("UPDATE gpu_leases SET released_at = now()")
    await finish(pool, "job-1")
    assert await alerted(pool) == {
        "nodes/ready": 1, "nodes/lost": 1, "a100/idle": 4, "h200/lost": 8
    }  # fmt: skip
    assert conflict(await delete(http, "flavors/h200")) == "flavor h200 is in use by nodes n1"

    for _ in range(2):  # a second retire changes nothing
        response = await delete(http, "nodes/n1")
        assert response.status_code == 204, response.text
    assert await alerted(pool) == {"nodes/ready": 1, "nodes/lost": 0, "a100/idle": 4}
    queue = (await http.get("/v1/queue", headers=AUTH)).json()
    assert [n["node_id"] for n in queue["nodes"]] == ["n2"]
    queue = (await http.get("/v1/queue", params={"retired": "true"}, headers=AUTH)).json()
    assert [(n["node_id"], n["retired_at"] is not None) for n in queue["nodes"]] == [
        ("n1", True),
        ("n2", False),
    ]
    flavor = (await http.get("/v1/admin/flavors/h200", headers=AUTH)).json()
    assert (flavor["nodes"], flavor["gpus"]) == (0, 0)
    async with pool.acquire() as conn:
        assert [n["node_id"] for n in (await repo.load_snapshot_rows(conn)).nodes] == ["n2"]
        facts = await load_facts(conn, make_spec(gpu_flavor="h200", gpus=8))
        assert facts.largest_node == 0  # its 8 GPUs no longer judge a job's size
    retired = [
        e for e in (await http.get("/v1/audit", headers=AUTH)).json() if "retire" in e["action"]
    ]
    assert [(e["action"], e["target"]) for e in retired] == [("retire node", "n1")] * 2
    assert (await delete(http, "flavors/h200")).status_code == 204  # its history stays
    assert await pool.fetchval("SELECT count(*) FROM allocations WHERE node_id = 'n1'") == 1

    # The machine came back: its heartbeat makes it an ordinary node again.
    async with pool.acquire() as conn:
        await repo.upsert_node(conn, "n1", "h1", "h200", 8, datetime.now(UTC))
    queue = (await http.get("/v1/queue", headers=AUTH)).json()
    assert [(n["node_id"], n["status"], n["retired_at"]) for n in queue["nodes"]] == [
        ("n1", "READY", None),
        ("n2", "READY", None),
    ]
    assert await alerted(pool) == {
        "nodes/ready": 2, "nodes/lost": 0, "a100/idle": 4, "h200/idle": 8
    }  # fmt: skip


async def patch(http: httpx.AsyncClient, path: str, body: Any) -> Any:
    return await http.patch(
        f"/v1/admin/{path}",
        content=json.dumps(body).encode(),
        headers={**AUTH, "Content-Type": "application/merge-patch+json"},
    )


async def test_a_patch_changes_only_the_fields_it_names(
    http: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    await known(pool, "vision")
    for path in ("flavors/a100", "flavors/h100", "cohorts/research"):
        assert (await put(http, path, {})).status_code == 201
    body = {
        "team": "vision",
        "cohort": "research",
        "weight": 2,
        "quotas": {"a100": {"nominal": 8, "borrowing_limit": 4}, "h100": {"nominal": 2}},
    }
    assert (await put(http, "queues/vision", body)).status_code == 201
    response = await patch(http, "queues/vision", {"weight": 3})
    assert response.status_code == 200, response.text
    assert response.json() == {
        "name": "vision",
        "team": "vision",
        "cohort": "research",
        "weight": 3.0,
        "implicit": False,
        "quotas": {
            "a100": {"nominal": 8, "borrowing_limit": 4, "lending_limit": None},
            "h100": {"nominal": 2, "borrowing_limit": None, "lending_limit": None},
        },
    }
    # Within a flavor too; null removes a limit, a flavor, or puts a field to its default.
    response = await patch(
        http,
        "queues/vision",
        {"quotas": {"a100": {"borrowing_limit": None, "lending_limit": 1}, "h100": None}},
    )
    assert response.status_code == 200, response.text
    assert response.json()["quotas"] == {
        "a100": {"nominal": 8, "borrowing_limit": None, "lending_limit": 1}
    }
    assert response.json()["weight"] == 3.0
    response = await http.patch(  # plain application/json is read as the same patch
        "/v1/admin/queues/vision", json={"weight": None}, headers=AUTH
    )
    assert response.status_code == 200 and response.json()["weight"] == 1.0, response.text
    # A priority class alike: its other fields stay.
    response = await patch(http, "priority-classes/normal", {"min_runtime_seconds": 120})
    assert response.status_code == 200, response.text
    assert response.json() == {
        "name": "normal",
        "value": 100,
        "preemptible": True,
        "min_runtime_seconds": 120.0,
        "description": response.json()["description"],
    }
    # The audit log keeps each patch as it was sent.
    entries = (await http.get("/v1/audit", headers=AUTH)).json()
    patches = [(e["action"], e["target"], e["detail"]) for e in entries if "patch" in e["action"]]
    assert sorted(patches, key=str) == sorted(
        [
            ("patch queue", "vision", {"weight": 3}),
            (
                "patch queue",
                "vision",
                {"quotas": {"a100": {"borrowing_limit": None, "lending_limit": 1}, "h100": None}},
            ),
            ("patch queue", "vision", {"weight": None}),
            ("patch priority-class", "normal", {"min_runtime_seconds": 120}),
        ],
        key=str,
    )


async def test_a_bad_patch_names_the_field_and_changes_nothing(
    http: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    await known(pool, "vision", "audio")
    for path in ("flavors/a100", "cohorts/research"):
        assert (await put(http, path, {})).status_code == 201
    body = {
        "team": "vision",
        "cohort": "research",
        "weight": 2,
        "quotas": {"a100": {"nominal": 8, "borrowing_limit": 4}},
    }
    assert (await put(http, "queues/vision", body)).status_code == 201
    before = (await http.get("/v1/admin/queues/vision", headers=AUTH)).json()
    audited = len((await http.get("/v1/audit", headers=AUTH)).json())
    for patch_body, field, message in (
        ({"weight": -1}, "weight", "must be greater than 0"),
        ({"weight": "3"}, "weight", "must be a number (remove the quotes: 3)"),
        ({"quotas": {"a100": {"lending_limit": 9}}}, "quotas.a100.lending_limit", "nominal"),
        ({"quotas": {"h100": {"nominal": 1}}}, "quotas.h100", "unknown flavor"),
        ({"quotas": {"a100": {"nominal": None}}}, "quotas.a100.nominal", "field required"),
        ({"cohort": None}, "quotas.a100", "need a cohort"),
        ({"cohort": "nope"}, "cohort", "unknown cohort"),
        ({"team": "audio"}, "team", "keeps its team"),
        ({"colour": "red"}, "colour", "unknown field"),
        ({"team": None}, "team", "field required"),
        ({"quotas": {"a100": 5}}, "quotas.a100", "object"),
        ({"quotas": {"a100": {"nominal": 10**30}}}, "quotas.a100.nominal", ""),
        ({"weight": "\u0007"}, "weight", ""),
        ([{"op": "replace", "path": "/weight", "value": 3}], "body", "JSON object"),
    ):
        response = await patch(http, "queues/vision", patch_body)
        assert message in fields(response).get(field, ""), (patch_body, response.text)
    assert (await patch(http, "queues/nope", {"weight": 2})).status_code == 404
    assert (await patch(http, "priority-classes/nope", {"value": 2})).status_code == 404
    response = await http.patch(
        "/v1/admin/queues/vision",
        content=b'{"weight": 3}',
        headers={**AUTH, "Content-Type": "text/plain"},
    )
    assert response.status_code == 415, response.text
    assert (await http.get("/v1/admin/queues/vision", headers=AUTH)).json() == before
    assert len((await http.get("/v1/audit", headers=AUTH)).json()) == audited


async def test_a_put_with_if_none_match_creates_and_never_replaces(
    http: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    """``If-None-Match: *`` makes a queue's or a priority class's ``PUT`` create only: one
    another admin made since the caller's patch found none is answered 412 and kept as it
    is (before, the ``PUT`` replaced it whole), so that caller can patch it instead."""
    await known(pool, "vision")
    assert (await put(http, "cohorts/research", {})).status_code == 201
    create_only = {**AUTH, "If-None-Match": "*"}
    for path, first, second in (
        (
            "queues/vision",
            {"team": "vision", "cohort": "research", "weight": 2},
            {"team": "vision", "weight": 5},
        ),
        (
            "priority-classes/urgent",
            {"value": 500, "preemptible": False, "min_runtime_seconds": 60},
            {"value": 7, "preemptible": True},
        ),
    ):
        made = await http.put(f"/v1/admin/{path}", json=first, headers=create_only)
        assert made.status_code == 201, made.text
        kept = (await http.get(f"/v1/admin/{path}", headers=AUTH)).json()
        again = await http.put(f"/v1/admin/{path}", json=second, headers=create_only)
        assert again.status_code == 412, again.text
        assert "exists already" in again.json()["detail"] and "PATCH" in again.json()["detail"]
        assert (await http.get(f"/v1/admin/{path}", headers=AUTH)).json() == kept
        odd = await http.put(
            f"/v1/admin/{path}", json=second, headers={**AUTH, "If-None-Match": '"v1"'}
        )
        assert "If-None-Match" in fields(odd), odd.text
    # Only the two creations (and the cohort) were written and audited.
    actions = [e["action"] for e in (await http.get("/v1/audit", headers=AUTH)).json()]
    assert sorted(actions) == ["put cohort", "put priority-class", "put queue"]


def precondition_failed(response: Any) -> dict[str, str]:
    """A 412's errors by field (the header that failed), its detail naming it too."""
    assert response.status_code == 412, response.text
    body = response.json()
    assert len(body["errors"]) == 1 and body["errors"][0]["field"] in body["detail"], body
    return {e["field"]: e["message"] for e in body["errors"]}


async def test_if_none_match_and_if_match_hold_on_every_admin_write(
    http: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    """RFC 9110: ``If-None-Match: *`` proceeds only when the resource does not exist,
    ``If-Match: *`` only when it does, on every ``PUT``, ``PATCH`` and ``DELETE`` of a
    flavor, cohort, queue, priority class or node declaration: a false one is 412 naming the
    header and why, nothing changed nor audited. (Before, ``PATCH`` and ``DELETE`` ignored
    both headers, as did the flavors' and cohorts' ``PUT``; ``If-Match`` was ignored
    everywhere.)"""
    await known(pool, "vision")
    assert (await put(http, "flavors/h200", {})).status_code == 201
    absent_only = {**AUTH, "If-None-Match": "*"}
    existing_only = {**AUTH, "If-Match": "*"}
    resources = (
        ("flavors/a100", {"description": "80 GB"}, None),
        ("cohorts/research", {}, None),
        ("queues/vision", {"team": "vision", "weight": 2}, {"weight": 3}),
        ("priority-classes/urgent", {"value": 500, "preemptible": False}, {"value": 7}),
        ("node-inventory/n1", {"gpu_flavor": "h200", "gpu_count": 8}, {"gpu_count": 4}),
    )
    for path, body, change in resources:
        url = f"/v1/admin/{path}"
        created = await http.put(url, json=body, headers=existing_only)
        assert "does not exist" in precondition_failed(created)["If-Match"], path
        assert (await http.get(url, headers=AUTH)).status_code == 404
        assert (await http.put(url, json=body, headers=absent_only)).status_code == 201
        kept = (await http.get(url, headers=AUTH)).json()
        if change is not None:
            patched = await http.patch(url, json=change, headers=absent_only)
            assert "exists already" in precondition_failed(patched)["If-None-Match"], path
        deleted = await http.delete(url, headers=absent_only)
        assert "exists already" in precondition_failed(deleted)["If-None-Match"], path
        assert (await http.get(url, headers=AUTH)).json() == kept
        replaced = await http.put(url, json=body, headers=existing_only)
        assert replaced.status_code == 200, replaced.text
        if change is not None:
            patched = await http.patch(url, json=change, headers=existing_only)
            assert patched.status_code == 200, patched.text
        odd = await http.delete(url, headers={**AUTH, "If-Match": "v1"})  # unquoted
        assert "If-Match" in fields(odd), path
    audited = len((await http.get("/v1/audit", headers=AUTH)).json())
    # A DELETE (or PATCH) of none is 404 whatever its conditions (RFC 9110, 13.2.1); with
    # the conditions holding, each goes ahead.
    for path, _, change in reversed(resources):
        url = f"/v1/admin/{path}"
        assert (await http.delete(url, headers=existing_only)).status_code == 204, path
        for conditions in (existing_only, absent_only):
            assert (await http.delete(url, headers=conditions)).status_code == 404, path
            if change is not None:
                missing = await http.patch(url, json=change, headers=conditions)
                assert missing.status_code == 404, path
    assert len((await http.get("/v1/audit", headers=AUTH)).json()) == audited + len(resources)


async def test_every_admin_write_with_a_stale_etag_is_412_and_the_fresh_one_proceeds(
    http: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    """The ``GET`` of a flavor, cohort, queue, priority class or node declaration carries
    ``ETag``; a write
    with ``If-Match: <it>`` proceeds while the resource is as it was read, and is 412,
    naming ``If-Match`` and that it changed, once another change fell between: two
    operators' read-modify-writes no longer overwrite each other silently. A write
    without a condition goes ahead as before. (Before, there was no ``ETag``, and an
    ``If-Match`` other than ``*`` was refused with 422.)"""
    await known(pool, "vision")
    resources = (
        ("flavors/a100", {"description": "80 GB"}, {"description": "80 GB, NVLink"}),
        ("cohorts/research", {"description": "r"}, {"description": "research"}),
        ("queues/vision", {"team": "vision", "weight": 2}, {"team": "vision", "weight": 3}),
        (
            "priority-classes/urgent",
            {"value": 500, "preemptible": False},
            {"value": 7, "preemptible": False},
        ),
        (
            "node-inventory/n1",
            {"gpu_flavor": "h200", "gpu_count": 8},
            {"gpu_flavor": "h200", "gpu_count": 4},
        ),
    )
    assert (await put(http, "flavors/h200", {})).status_code == 201
    # The field each patch changes, of the kinds that take a PATCH.
    patches = {"queues": "weight", "priority-classes": "value", "node-inventory": "gpu_count"}
    for path, first, theirs in resources:
        patched_field = patches.get(path.split("/")[0])
        url = f"/v1/admin/{path}"
        made = await http.put(url, json=first, headers=AUTH)
        assert made.status_code == 201, made.text
        read = await http.get(url, headers=AUTH)
        tag = read.headers["ETag"]
        assert tag == made.headers["ETag"] and tag.startswith('"'), path
        # Another operator's change falls between this read and this write.
        other = await http.put(url, json=theirs, headers={**AUTH, "If-Match": tag})
        assert other.status_code == 200, other.text
        assert other.headers["ETag"] != tag, path
        kept = (await http.get(url, headers=AUTH)).json()
        audited = len((await http.get("/v1/audit", headers=AUTH)).json())
        stale = {**AUTH, "If-Match": tag}
        refused = [await http.put(url, json=first, headers=stale)]
        if patched_field is not None:
            refused.append(await http.patch(url, json={patched_field: 9}, headers=stale))
        refused.append(await http.delete(url, headers=stale))
        for response in refused:
            message = precondition_failed(response)["If-Match"]
            assert "was changed since it was read" in message, (path, message)
            assert other.headers["ETag"] in message, (path, message)
        assert (await http.get(url, headers=AUTH)).json() == kept, path
        assert len((await http.get("/v1/audit", headers=AUTH)).json()) == audited, path
        fresh = {**AUTH, "If-Match": other.headers["ETag"]}
        if patched_field is not None:
            patched = await http.patch(url, json={patched_field: 9}, headers=fresh)
            assert patched.status_code == 200, patched.text
            assert patched.headers["ETag"] == (await http.get(url, headers=AUTH)).headers["ETag"]
            fresh = {**AUTH, "If-Match": patched.headers["ETag"]}
        # Without a condition, as before.
        assert (await http.put(url, json=first, headers=AUTH)).status_code == 200, path
        stale = {**AUTH, "If-Match": fresh["If-Match"]}
        assert (
            "was changed" in precondition_failed(await http.delete(url, headers=stale))["If-Match"]
        )
        now = (await http.get(url, headers=AUTH)).headers["ETag"]
        assert (await http.delete(url, headers={**AUTH, "If-Match": now})).status_code == 204, path
    weak = await http.delete("/v1/admin/flavors/a100", headers={**AUTH, "If-Match": 'W/"x"'})
    assert weak.status_code == 422 and "weak entity tag" in fields(weak)["If-Match"]

"""An attempt that failed through the platform (the runner's ``job.failed`` with
``failure_kind`` ``platform_error``) is charged to the platform, not its team: through
billing's real consumer (inbox, handlers, ledger) on PostgreSQL and its HTTP app.

Job ``p`` of team ml had two attempts of 2 a100 for 30 minutes (2.5 each at 2.5 per
GPU-hour): ``p-1`` failed through the platform (a full disk), ``p-2`` failed through its own
code. Job ``v`` of team vision had one, ``v-1``, of 1 a100 for an hour, failed through the
platform. Every event is delivered twice (the same id again, and the same fact under a new
id), with the runner's report before or after the scheduler's release."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import asyncpg
import httpx
import pytest
from pydantic import SecretStr

from tests.integration.billing.conftest import feed
from tests.integration.billing.test_waste import (
    DAY,
    RANGE,
    at,
    failed,
    granted,
    released,
    spec,
    submitted,
)
from trainyard_platform.services.billing import budgets_repository as budgets
from trainyard_platform.services.billing import ledger_repository as ledger
from trainyard_platform.services.billing import waste_rollups
from trainyard_platform.services.billing.api import create_app
from trainyard_platform.services.billing.budgets import month_start
from trainyard_platform.shared.access import service_guard
from trainyard_platform.shared.events import Envelope, Payload, parse_envelope
from trainyard_platform.shared.events.payloads import BudgetUpdated, CostRecorded
from trainyard_platform.shared.events.trust import RUNNER
from trainyard_platform.shared.identity import IdentityClient

pytestmark = pytest.mark.integration

OPERATOR = {"Authorization": "Bearer s3cret"}
ML = {"Authorization": "Bearer ml-admin"}
VISION = {"Authorization": "Bearer vision-viewer"}
USERS = {
    "ml-admin": {"user": "ada", "team": "ml", "role": "admin", "token_id": 1},
    "vision-viewer": {"user": "cy", "team": "vision", "role": "viewer", "token_id": 2},
    "vision-admin": {"user": "cy", "team": "vision", "role": "admin", "token_id": 3},
}
P = spec("ml", "ada", "a100", 2, "normal")
V = spec("vision", "cy", "a100", 1, "normal")


def _me(request: httpx.Request) -> httpx.Response:
    token = request.headers.get("authorization", "").removeprefix("Bearer ")
    if token in USERS:
        return httpx.Response(200, json=USERS[token])
    return httpx.Response(401, json={"detail": "unknown token"})


@pytest.fixture
async def client(pool: asyncpg.Pool) -> AsyncIterator[httpx.AsyncClient]:
    identity = IdentityClient(
        "http://submission",
        http=httpx.AsyncClient(transport=httpx.MockTransport(_me), base_url="http://submission"),
    )
    app = create_app(pool, service_guard(SecretStr("s3cret"), identity), [])
    transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=transport, base_url="http://billing") as c:
        yield c
    await identity.aclose()


def attempts() -> list[tuple[Envelope[Payload], Envelope[Payload], Envelope[Payload]]]:
    """(grant, runner's report, release) of each attempt."""
    out = []
    for alloc, job_id, job, start, end, kind in (
        ("p-1", "p", P, at(1), at(1.5), "platform_error"),
        ("p-2", "p", P, at(2), at(2.5), "user_error"),
        ("v-1", "v", V, at(1), at(2), "platform_error"),
    ):
        out.append(
            (
                granted(alloc, job_id, job, "n1", start, "q"),
                failed(alloc, job_id, "n1", end, RUNNER, kind),  # type: ignore[arg-type]
                released(alloc, job_id, job, "n1", start, end, "failed"),
            )
        )
    return out


def again(envelope: Envelope[Payload]) -> Envelope[Payload]:
    """The same fact said again as a new event (a new id)."""
    return Envelope.wrap(envelope.data, source=envelope.source, subject=envelope.subject)


async def deliver(pool: asyncpg.Pool, report_first: bool) -> None:
    await feed(pool, submitted("p", P, DAY), submitted("v", V, DAY))
    for grant, report, release in attempts():
        await feed(pool, grant)
        first, second = (report, release) if report_first else (release, report)
        for envelope in (first, second, first, second, again(first), again(second)):
            await feed(pool, envelope)


def _sums(rows: list[dict[str, Any]]) -> dict[str, tuple[Decimal, Decimal]]:
    return {r["team"]: (Decimal(r["gpu_seconds"]), Decimal(r["cost"])) for r in rows}


async def _get(client: httpx.AsyncClient, path: str, headers: dict[str, str], **params: Any) -> Any:
    answer = await client.get(path, params=params, headers=headers)
    assert answer.status_code == 200, answer.text
    return answer.json()


async def _rollups(pool: asyncpg.Pool) -> tuple[list[Any], list[Any]]:
    """The cost and waste rollups' rows that hold anything."""
    costs = await pool.fetch(
        "SELECT * FROM cost_rollups WHERE gpu_seconds <> 0 OR cost <> 0 "
        "ORDER BY granularity, bucket, team"
    )
    waste = await pool.fetch(
        "SELECT * FROM waste_rollups_hourly WHERE gpu_micros <> 0 OR wall_micros <> 0 "
        "OR starts <> 0 OR continues <> 0 "
        "ORDER BY hour, figure, team, project, user_name, queue, gpu_flavor, price_per_gpu_hour"
    )
    return [tuple(r.values()) for r in costs], [tuple(r.values()) for r in waste]


@pytest.mark.parametrize("report_first", [True, False], ids=["report-first", "release-first"])
async def test_a_platform_failure_is_the_platform_s_not_the_team_s(
    pool: asyncpg.Pool, client: httpx.AsyncClient, report_first: bool
) -> None:
    """Before, ``p-1`` and ``v-1`` were charged to ml and vision like ``p-2``: ml's costs
    said 5 for job p, vision's 2.5 for a job that did nothing wrong, and the waste report
    counted both as the team's failed attempts."""
    put = await client.put("/v1/budgets/ml", json={"amount": "4", "policy": "refuse"}, headers=ML)
    assert put.status_code == 201, put.text
    await deliver(pool, report_first)

    bills = {
        r["allocation_id"]: (r["charged_to"], r["cost"])
        for r in await pool.fetch("SELECT allocation_id, charged_to, cost FROM usage_ledger")
    }
    assert bills == {
        "p-1": ("platform", Decimal("2.500000")),
        "p-2": ("team", Decimal("2.500000")),
        "v-1": ("platform", Decimal("2.500000")),
    }
    ledger_sums = {
        r["allocation_id"]: r["cost"]
        for r in await pool.fetch(
            "SELECT allocation_id, sum(cost) AS cost FROM ledger_entries GROUP BY 1"
        )
    }
    assert ledger_sums.get("p-1", 0) == 0 and ledger_sums.get("v-1", 0) == 0
    assert ledger_sums["p-2"] == Decimal("2.500000")

    # The team's costs: p-2 only, from the rollups and from the ledger (by job).
    by_team = await _get(client, "/v1/costs", OPERATOR, group_by="team", **RANGE)
    assert _sums(by_team["rows"]) == {"ml": (Decimal(3600), Decimal("2.500000"))}
    by_job = await _get(client, "/v1/costs", OPERATOR, group_by="team,job", **RANGE)
    assert [(r["job"], Decimal(r["cost"])) for r in by_job["rows"]] == [("p", Decimal("2.500000"))]
    job = await _get(client, "/v1/jobs/p/cost", ML)
    assert [a["allocation_id"] for a in job["allocations"]] == ["p-2"]
    nothing = await client.get("/v1/jobs/v/cost", headers=VISION)
    assert nothing.status_code == 404, nothing.text
    usage = await _get(client, "/v1/usage", OPERATOR)
    assert [(t["team"], Decimal(t["cost"])) for t in usage["teams"]] == [
        ("ml", Decimal("2.500000"))
    ]

    # Not in the budget: 2.5 of 4 spent (it was 5: exhausted).
    async with pool.acquire() as conn:
        held = await budgets.get(conn, "ml", None)
        assert held is not None
        spent = await budgets.spent(conn, held, DAY.replace(day=1), at(24))
    assert spent == Decimal("2.500000")

    # The say to the other services: the platform's attempts cost their teams 0.
    said: dict[str, list[float]] = {}
    revisions: dict[str, list[int]] = {}
    for r in await pool.fetch("SELECT body FROM outbox WHERE event_id LIKE 'cost:%' ORDER BY seq"):
        data = parse_envelope(r["body"]).data
        assert isinstance(data, CostRecorded)
        said.setdefault(data.allocation_id, []).append(data.cost)
        revisions.setdefault(data.allocation_id, []).append(data.revision)
    assert said["p-2"] == [2.5]
    assert said["p-1"][-1] == 0 and said["v-1"][-1] == 0
    # A correction says a higher revision than the bill it corrects: consumers keep it
    # whichever of the two reaches them last.
    expected = [0] if report_first else [0, 1]
    assert revisions == {"p-1": expected, "p-2": [0], "v-1": expected}

    # The waste report: the platform's time as platform_failure, the team's as failed.
    waste = await _get(client, "/v1/waste", OPERATOR, group_by="team", **RANGE)
    rows = {
        (r["figure"], r["team"]): (Decimal(r["gpu_seconds"]), Decimal(r["cost"]))
        for r in waste["rows"]
    }
    assert rows["platform_failure", "ml"] == (Decimal(3600), Decimal("2.500000"))
    assert rows["platform_failure", "vision"] == (Decimal(3600), Decimal("2.500000"))
    assert rows["failed_attempts", "ml"] == (Decimal(3600), Decimal("2.500000"))
    assert ("failed_attempts", "vision") not in rows
    (unattributed,) = waste["unattributed"]
    assert Decimal(unattributed["ledger_cost"]) == Decimal("2.500000")
    # From the facts (by job) the same figures as from the rollups (by team).
    by_job_waste = await _get(client, "/v1/waste", OPERATOR, group_by="job", **RANGE)
    assert {
        (r["figure"], r["job"]): (Decimal(r["gpu_seconds"]), Decimal(r["cost"]))
        for r in by_job_waste["rows"]
        if r["figure"] in ("platform_failure", "failed_attempts")
    } == {
        ("platform_failure", "p"): (Decimal(3600), Decimal("2.500000")),
        ("platform_failure", "v"): (Decimal(3600), Decimal("2.500000")),
        ("failed_attempts", "p"): (Decimal(3600), Decimal("2.500000")),
    }
    # A team sees its own figures only.
    mine = await _get(client, "/v1/waste", ML, group_by="team", **RANGE)
    assert {r["team"] for r in mine["rows"]} == {"ml"}
    assert any(r["figure"] == "platform_failure" for r in mine["rows"])

    # Rollups recomputed from the facts and the ledger equal those kept live.
    kept = await _rollups(pool)
    async with pool.acquire() as conn, conn.transaction():
        await ledger.rebuild_rollups(conn)
        await waste_rollups.rebuild_all(conn)
    assert await _rollups(pool) == kept
    assert await _get(client, "/v1/waste", OPERATOR, group_by="team", **RANGE) == waste


async def test_a_platform_failure_reported_after_the_bill_lowers_the_budget_s_spending(
    pool: asyncpg.Pool, client: httpx.AsyncClient
) -> None:
    """The release of an attempt (2.5) exhausts vision's budget of 2 this month; the
    runner's report that it failed through the platform, arriving after, makes it the
    platform's, and the budget's state is said again: not exhausted (before, the charge
    stayed and so did the state submission refuses by)."""
    put = await client.put(
        "/v1/budgets/vision",
        json={"amount": "2", "policy": "refuse"},
        headers={"Authorization": "Bearer vision-admin"},
    )
    assert put.status_code == 201, put.text
    start = month_start(datetime.now(UTC)) + timedelta(minutes=1)
    end = start + timedelta(hours=1)
    await feed(
        pool,
        granted("v-1", "v", V, "n1", start, "q"),
        released("v-1", "v", V, "n1", start, end, "failed"),
    )
    await feed(pool, failed("v-1", "v", "n1", end, RUNNER, "platform_error"))
    said = [
        parse_envelope(r["body"]).data
        for r in await pool.fetch(
            "SELECT body FROM outbox WHERE event_id LIKE 'budget:vision:%' ORDER BY seq"
        )
    ]
    states = [s.exhausted for s in said if isinstance(s, BudgetUpdated)]
    assert states == [False, True, False]  # set; spent by the charge; the charge reversed


async def test_a_report_that_names_another_job_makes_nothing_the_platform_s(
    pool: asyncpg.Pool, client: httpx.AsyncClient
) -> None:
    """A runner's ``platform_error`` for allocation ``p-2`` under another job's id is not
    that allocation's report: its team is charged and its time is a failed attempt."""
    _, (grant, _, release), _ = attempts()
    forged = failed("p-2", "not-p", "n1", at(2.5), RUNNER, "platform_error")
    await feed(pool, submitted("p", P, DAY), grant, forged, release)
    assert await pool.fetchval("SELECT charged_to FROM usage_ledger") == "team"
    rows = (await _get(client, "/v1/waste", OPERATOR, group_by="job", **RANGE))["rows"]
    assert {r["figure"] for r in rows} & {"failed_attempts", "platform_failure"} == {
        "failed_attempts"
    }

"""``GET /v1/waste`` over facts fed through billing's real consumer on a real database: each
waste figure's situation is created by the events that say it, and is seen priced.

Prices: a100 2.50 and cpu 0.10 per GPU-hour. The day (2026-11-02, UTC):

- ml/ada's job ``j`` (normal, 2 a100, queue ml-q): submitted 10:00, granted 10:30,
  checkpoint 11:10, failed 11:30; granted again 11:40, succeeded 12:40 reporting a mean GPU
  utilisation of 2 % and a data-wait share of 0.25.
- vision/cy's job ``l`` (low, 4 cpu, queue vis-q) on node n-2 (8 cpu): submitted and
  granted 10:00, succeeded 14:00 (no utilisation reported).
- ml/bob's job ``h`` (high, 1 cpu, queue ml-q): submitted 12:00, granted 14:00, failed
  for good 15:00 (the scheduler says so).
- Node n-2 beats at 12:00 and 12:01 (4 free cpu while ``h`` waits), and at 12:03:30 (after
  a gap too long to say anything); the scheduler placed on its 8 cpu from 09:00.
"""

from __future__ import annotations

import csv
import io
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import asyncpg
import httpx
import pytest
from pydantic import SecretStr

from tests.integration.billing.conftest import Billing, feed, release_event
from trainyard_platform.services.billing import ledger_repository as ledger
from trainyard_platform.services.billing.api import create_app
from trainyard_platform.shared.access import service_guard
from trainyard_platform.shared.bus import Bus
from trainyard_platform.shared.events import Envelope, Payload
from trainyard_platform.shared.events.payloads import (
    AllocationGranted,
    AllocationReleased,
    CheckpointRef,
    CheckpointSaved,
    FailureKind,
    JobFailed,
    JobSpec,
    JobSubmitted,
    JobSucceeded,
    NodeSupplied,
    RunnerHeartbeat,
)
from trainyard_platform.shared.events.trust import RUNNER, SCHEDULER, owner, routing_key_of
from trainyard_platform.shared.identity import IdentityClient

pytestmark = pytest.mark.integration

OPERATOR = {"Authorization": "Bearer s3cret"}
ML = {"Authorization": "Bearer ml-viewer"}
USERS = {"ml-viewer": {"user": "ada", "team": "ml", "role": "viewer", "token_id": 1}}
DAY = datetime(2026, 11, 2, tzinfo=UTC)
RANGE = {"from": "2026-11-01T00:00:00Z", "to": "2026-12-01T00:00:00Z"}


def at(hours: float) -> datetime:
    return DAY + timedelta(hours=hours)


def spec(team: str, user: str, flavor: str, gpus: int, priority: str) -> JobSpec:
    return JobSpec(
        name="job",
        team=team,
        user=user,
        gpus=gpus,
        gpu_flavor=flavor,
        seed=1,
        max_runtime_seconds=36000,
        priority=priority,
        project=f"{team}-project",
    )


def wrap(payload: Payload, source: str | None = None) -> Envelope[Payload]:
    return Envelope.wrap(payload, source=source or owner(payload), subject=routing_key_of(payload))


def submitted(job_id: str, job: JobSpec, when: datetime) -> Envelope[Payload]:
    return wrap(JobSubmitted(job_id=job_id, spec=job, submitted_at=when))


def granted(
    allocation_id: str,
    job_id: str,
    job: JobSpec,
    node: str,
    when: datetime,
    queue: str,
    attempt: int = 1,
) -> Envelope[Payload]:
    grant = AllocationGranted(
        allocation_id=allocation_id,
        job_id=job_id,
        node_id=node,
        gpu_indices=list(range(job.gpus)),
        epoch=attempt,
        attempt=attempt,
        granted_at=when,
        spec=job,
        queue=queue,
    )
    return wrap(grant)


def released(
    allocation_id: str,
    job_id: str,
    job: JobSpec,
    node: str,
    start: datetime,
    end: datetime,
    outcome: str,
) -> Envelope[Payload]:
    return release_event(
        AllocationReleased(
            allocation_id=allocation_id,
            job_id=job_id,
            node_id=node,
            team=job.team,
            user=job.user,
            gpu_flavor=job.gpu_flavor,
            gpus=job.gpus,
            granted_at=start,
            released_at=end,
            outcome=outcome,  # type: ignore[arg-type]
        )
    )


def succeeded(
    allocation_id: str, job_id: str, node: str, when: datetime, *, epoch: int = 1, **metrics: float
) -> Envelope[Payload]:
    done = JobSucceeded(
        job_id=job_id,
        allocation_id=allocation_id,
        node_id=node,
        epoch=epoch,
        finished_at=when,
        metrics=metrics,
    )
    return wrap(done, RUNNER)


def failed(
    allocation_id: str,
    job_id: str,
    node: str,
    when: datetime,
    source: str,
    failure_kind: FailureKind = "user_error",
    *,
    epoch: int = 1,
    **metrics: float,
) -> Envelope[Payload]:
    report = JobFailed(
        job_id=job_id,
        allocation_id=allocation_id,
        node_id=node,
        epoch=epoch,
        finished_at=when,
        exit_code=1,
        reason="exit 1",
        failure_kind=failure_kind,
        metrics=metrics,
    )
    return wrap(report, source)


def supplied(
    node: str, when: datetime, gpus: int = 8, flavor: str = "cpu", sequence: int | None = None
) -> Envelope[Payload]:
    """The scheduler's word on what it places on ``node`` (its claim capped)."""
    said = NodeSupplied(
        node_id=node, gpu_flavor=flavor, gpu_count=gpus, judged_at=when, sequence=sequence
    )
    return wrap(said)


def beat(node: str, when: datetime, running: list[str], gpus: int = 8) -> Envelope[Payload]:
    payload = RunnerHeartbeat(
        node_id=node,
        hostname=node,
        gpu_flavor="cpu",
        gpu_count=gpus,
        running_allocations=running,
        sent_at=when,
    )
    return wrap(payload)


J = spec("ml", "ada", "a100", 2, "normal")
L = spec("vision", "cy", "cpu", 4, "low")
H = spec("ml", "bob", "cpu", 1, "high")


async def the_day(pool: asyncpg.Pool) -> None:
    checkpoint = CheckpointSaved(
        job_id="j",
        allocation_id="j-1",
        epoch=1,
        checkpoint=CheckpointRef(
            uri="s3://c/j/1", manifest_uri="s3://c/j/1.json", step=10, size_bytes=1, sha256="0"
        ),
        saved_at=at(11 + 10 / 60),
    )
    await feed(
        pool,
        submitted("j", J, at(10)),
        submitted("l", L, at(10)),
        granted("l-1", "l", L, "n-2", at(10), "vis-q"),
        granted("j-1", "j", J, "n-1", at(10.5), "ml-q"),
        wrap(checkpoint),
    )
    await feed(
        pool,
        # one attempt, busy (50 %): the job goes on
        failed("j-1", "j", "n-1", at(11.5), RUNNER, gpu_utilization_mean=50.0),
        released("j-1", "j", J, "n-1", at(10.5), at(11.5), "failed"),
        granted("j-2", "j", J, "n-1", at(11 + 40 / 60), "ml-q", attempt=2),
        submitted("h", H, at(12)),
    )
    await feed(pool, supplied("n-2", at(9)))
    await feed(pool, beat("n-2", at(12), ["l-1"]))
    await feed(pool, beat("n-2", at(12 + 1 / 60), ["l-1"]))
    await feed(pool, beat("n-2", at(12 + 3.5 / 60), ["l-1"]))
    await feed(
        pool,
        succeeded(
            "j-2", "j", "n-1", at(12 + 40 / 60), epoch=2, gpu_utilization_mean=2.0,
            data_wait_fraction_mean=0.25,
        ),
        released("j-2", "j", J, "n-1", at(11 + 40 / 60), at(12 + 40 / 60), "succeeded"),
        succeeded("l-1", "l", "n-2", at(14)),
        released("l-1", "l", L, "n-2", at(10), at(14), "succeeded"),
        granted("h-1", "h", H, "n-2", at(14), "ml-q"),
    )  # fmt: skip
    await feed(
        pool,
        released("h-1", "h", H, "n-2", at(14), at(15), "failed"),
        failed("h-1", "h", "n-2", at(15), SCHEDULER),  # the scheduler: failed for good
    )


def _me(request: httpx.Request) -> httpx.Response:
    token = request.headers.get("authorization", "").removeprefix("Bearer ")
    if token in USERS:
        return httpx.Response(200, json=USERS[token])
    return httpx.Response(401, json={"detail": "unknown token"})


@pytest.fixture
async def client(pool: asyncpg.Pool) -> AsyncIterator[httpx.AsyncClient]:
    await the_day(pool)
    identity = IdentityClient(
        "http://submission",
        http=httpx.AsyncClient(transport=httpx.MockTransport(_me), base_url="http://submission"),
    )
    app = create_app(pool, service_guard(SecretStr("s3cret"), identity), [])
    transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=transport, base_url="http://billing") as c:
        yield c
    await identity.aclose()


async def waste(
    client: httpx.AsyncClient, headers: dict[str, str] = OPERATOR, **params: Any
) -> dict[str, Any]:
    response = await client.get("/v1/waste", params={**RANGE, **params}, headers=headers)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def figures(body: dict[str, Any], *keys: str) -> dict[tuple[Any, ...], tuple[Decimal, Decimal]]:
    """``(figure, *keys) -> (gpu_seconds, cost)`` of the report's rows."""
    return {
        (r["figure"], *(r[k] for k in keys)): (Decimal(r["gpu_seconds"]), Decimal(r["cost"]))
        for r in body["rows"]
    }


async def test_unattributed_spend_is_zero_and_the_ledger_is_all_owned(
    client: httpx.AsyncClient,
) -> None:
    body = await waste(client)
    costs = await client.get("/v1/costs", params=RANGE, headers=OPERATOR)
    (total,) = costs.json()["totals"]
    (unattributed,) = body["unattributed"]
    # 2 a100 x 2 h + 4 cpu x 4 h + 1 cpu x 1 h, all billed and every second of it owned
    assert Decimal(unattributed["ledger_gpu_seconds"]) == 2 * 7200 + 4 * 14400 + 3600
    assert Decimal(unattributed["ledger_gpu_seconds"]) == Decimal(total["gpu_seconds"])
    assert Decimal(unattributed["ledger_cost"]) == Decimal(total["cost"])
    assert Decimal(unattributed["gpu_seconds"]) == 0
    assert Decimal(unattributed["cost"]) == 0


async def test_a_bill_without_an_owner_is_unattributed(
    client: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    """The check sees a bill without its project (as bills from before billing kept one)
    and one without a job id; the rollups are rebuilt from the ledger, as at a start."""
    for allocation, job, project in (("old", "old-job", None), ("nameless", "", "p")):
        await pool.execute(
            "INSERT INTO ledger_entries (allocation_id, revision, kind, job_id, team, project, "
            "user_name, queue, gpu_flavor, node_id, gpus, started_at, ended_at, outcome, "
            "gpu_seconds, price_per_gpu_hour, currency, cost, event_id, recorded_at) VALUES "
            "($1, 0, 'charge', $2, 'ml', $3, 'ada', NULL, 'a100', 'n-1', 1, $4, $5, "
            "'succeeded', 3600, 2.5, 'USD', 2.5, 'e', now())",
            allocation,
            job,
            project,
            at(20),
            at(21),
        )
    async with pool.acquire() as conn, conn.transaction():
        await ledger.rebuild_rollups(conn)
    (unattributed,) = (await waste(client))["unattributed"]
    assert Decimal(unattributed["gpu_seconds"]) == 7200
    assert Decimal(unattributed["cost"]) == Decimal(5)


async def test_failed_attempts_and_the_work_lost_since_the_checkpoint(
    client: httpx.AsyncClient,
) -> None:
    rows = figures(await waste(client, group_by="job"), "job")
    # j's first attempt: 2 a100 for an hour, failed; 20 minutes since its checkpoint lost
    assert rows["failed_attempts", "j"] == (Decimal(7200), Decimal("5.000000"))
    assert rows["lost_work", "j"] == (Decimal(2400), Decimal("1.666667"))
    # h failed for good after an hour of 1 cpu, with no checkpoint: all of it lost
    assert rows["failed_attempts", "h"] == (Decimal(3600), Decimal("0.100000"))
    assert rows["lost_work", "h"] == (Decimal(3600), Decimal("0.100000"))
    assert ("failed_attempts", "l") not in rows  # succeeded


async def test_queueing_per_team_and_queue(client: httpx.AsyncClient) -> None:
    body = await waste(client, group_by="team,queue")
    rows = {(r["figure"], r["team"], r["queue"]): r for r in body["rows"]}
    ml = rows["queueing", "ml", "ml-q"]
    # j: 30 min before its first grant and 10 after its failure, 2 a100 (4800 GPU-s, 3.33);
    # h: 2 h before its grant, 1 cpu (7200 GPU-s, 0.20)
    assert Decimal(ml["gpu_seconds"]) == 4800 + 7200
    assert Decimal(ml["cost"]) == Decimal("3.333333") + Decimal("0.2")
    assert Decimal(ml["seconds"]) == 40 * 60 + 2 * 3600
    assert ml["count"] == 3
    assert ("queueing", "vision", "vis-q") not in rows  # l was granted at once


async def test_idle_gpus_allocated_and_unallocated(client: httpx.AsyncClient) -> None:
    body = await waste(client, group_by="job")
    rows = figures(body, "job")
    # j's second attempt ran at 2 % utilisation: idle; its failed first one at 50 %: busy;
    # l and h reported none: not measured, never counted as idle or busy
    assert rows["idle_gpus", "j"] == (Decimal(7200), Decimal("5.000000"))
    assert ("idle_gpus_unmeasured", "j") not in rows
    assert rows["idle_gpus_unmeasured", "l"][0] == 4 * 14400
    assert ("idle_gpus", "l") not in rows
    # 4 of n-2's 8 cpu free from 12:00 to 12:01 while h waited; the 2.5 min gap after it
    # says nothing
    (spare,) = body["unallocated"]
    assert spare["figure"] == "unallocated_gpus"
    assert (spare["flavor"], Decimal(spare["gpu_seconds"]), Decimal(spare["cost"])) == (
        "cpu",
        Decimal(240),
        Decimal("0.006667"),
    )


async def test_input_bound_time(client: httpx.AsyncClient) -> None:
    rows = figures(await waste(client, group_by="job"), "job")
    # a quarter of j's second attempt (2 a100 for an hour) waiting for data
    assert rows["input_bound", "j"] == (Decimal(1800), Decimal("1.250000"))
    assert rows["input_bound_unmeasured", "l"][0] == 4 * 14400
    assert rows["input_bound_unmeasured", "j"][0] == 7200  # its first attempt measured none


async def test_a_low_priority_job_holding_gpus_while_a_higher_one_waits(
    client: httpx.AsyncClient,
) -> None:
    rows = figures(await waste(client, group_by="team,job"), "team", "job")
    # l (low) held 4 cpu from 12:00 to 14:00 while h (high) waited for cpu
    assert rows["low_priority_holding", "vision", "l"] == (Decimal(28800), Decimal("0.800000"))
    # j (normal, a100) held nothing anyone of a higher priority waited for
    assert ("low_priority_holding", "ml", "j") not in rows


async def test_success_rate_per_day_team_and_queue(client: httpx.AsyncClient) -> None:
    body = await waste(client)
    success = {(s["day"][:10], s["team"], s["queue"]): s for s in body["success"]}
    ml = success["2026-11-02", "ml", "ml-q"]
    # j succeeded (its failed first attempt is not an end), h failed for good
    assert (ml["ended"], ml["succeeded"], ml["failed"]) == (2, 1, 1)
    assert Decimal(ml["success_rate"]) == Decimal("0.5")
    vision = success["2026-11-02", "vision", "vis-q"]
    assert (vision["ended"], vision["succeeded"]) == (1, 1)
    assert Decimal(vision["success_rate"]) == 1


async def test_a_user_sees_only_their_team(client: httpx.AsyncClient) -> None:
    body = await waste(client, ML, group_by="team")
    assert {r["team"] for r in body["rows"]} == {"ml"}
    assert {s["team"] for s in body["success"]} == {"ml"}
    assert body["unallocated"] == []
    refused = await client.get("/v1/waste", params={"team": "vision"}, headers=ML)
    assert refused.status_code == 404


async def test_filters_range_and_redelivery(client: httpx.AsyncClient, pool: asyncpg.Pool) -> None:
    before = await waste(client, group_by="job")
    await the_day(pool)  # every event again, as new deliveries: nothing changes
    assert await waste(client, group_by="job") == before
    only = await waste(client, group_by="job", flavor="a100")
    assert {r["job"] for r in only["rows"]} == {"j"}
    # 10:00 to 11:00 only: j's first wait (30 min) and 30 min of its failed attempt
    hour = await waste(
        client, group_by="job", job="j", **{"from": "2026-11-02T10:00:00Z"},
        to="2026-11-02T11:00:00Z",
    )  # fmt: skip
    rows = figures(hour, "job")
    assert rows["queueing", "j"][0] == 3600
    assert rows["failed_attempts", "j"][0] == 3600


async def test_a_job_refused_on_arrival_never_waits(
    client: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    refused = JobFailed(
        job_id="r",
        allocation_id="",
        node_id="",
        epoch=0,
        finished_at=at(9),
        exit_code=None,
        reason="refused: no such queue",
        failure_kind="rejected",
    )
    await feed(pool, submitted("r", H, at(9)), wrap(refused, SCHEDULER))
    rows = figures(await waste(client, group_by="job"), "job")
    assert not [key for key in rows if key[1] == "r"]
    body = await waste(client)
    assert sum(s["ended"] for s in body["success"]) == 3  # j, l and h; not r


async def test_a_job_refused_before_its_submission_arrives_never_waits(
    client: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    """The scheduler's refusal of r2 is handled before its submission (two subjects, two
    publishers: any order), and each is delivered again: r2 never waits. Before, the
    refusal found nothing to forget and the submission then kept r2 waiting for ever."""
    refused = JobFailed(
        job_id="r2",
        allocation_id="",
        node_id="",
        epoch=0,
        finished_at=at(9),
        exit_code=None,
        reason="refused: no such queue",
        failure_kind="rejected",
    )
    await feed(pool, wrap(refused, SCHEDULER))
    await feed(pool, submitted("r2", H, at(9)))
    await feed(pool, wrap(refused, SCHEDULER), submitted("r2", H, at(9)))
    rows = figures(await waste(client, group_by="job"), "job")
    assert not [key for key in rows if key[1] == "r2"]
    assert await pool.fetchval("SELECT count(*) FROM waste_jobs WHERE job_id = 'r2'") == 0


async def test_bad_parameters_are_refused_naming_them(client: httpx.AsyncClient) -> None:
    response = await client.get(
        "/v1/waste", params={"colour": "red", "group_by": "team"}, headers=OPERATOR
    )
    assert response.status_code == 422
    assert [e["field"] for e in response.json()["errors"]] == ["colour"]
    response = await client.get(
        "/v1/waste", params={"group_by": "team,size", "from": "x"}, headers=OPERATOR
    )
    assert response.status_code == 422
    assert {e["field"] for e in response.json()["errors"]} == {"group_by", "from"}
    granularity = await client.get("/v1/waste", params={"granularity": "day"}, headers=OPERATOR)
    assert granularity.status_code == 422


async def test_csv(client: httpx.AsyncClient) -> None:
    response = await client.get(
        "/v1/waste", params={**RANGE, "group_by": "job", "format": "csv"}, headers=OPERATOR
    )
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/csv")
    lines = list(csv.DictReader(io.StringIO(response.text)))
    lost = next(r for r in lines if r["job"] == "j" and r["figure"] == "lost_work")
    assert (lost["gpu_seconds"], lost["cost"]) == ("2400.000000", "1.666667")
    assert response.headers["trainyard-truncated"] == "false"
    # Cut short at ``limit``: the CSV has no ``truncated`` of its own, its header says so.
    cut = await client.get(
        "/v1/waste",
        params={**RANGE, "group_by": "job", "format": "csv", "limit": "1"},
        headers=OPERATOR,
    )
    assert len(cut.text.splitlines()) == 2 < len(lines) + 1
    assert cut.headers["trainyard-truncated"] == "true"


async def test_the_facts_arrive_through_the_bus(billing: Billing, pool: asyncpg.Pool) -> None:
    """Billing's consumer subscribes to what waste needs: submissions, checkpoints, ends,
    heartbeats and the scheduler's word on nodes travel through the real NATS into its tables."""
    bus: Bus = billing.bus
    events = [
        submitted("bus-j", J, at(30)),
        granted("bus-1", "bus-j", J, "n-9", at(30), "ml-q"),
        succeeded("bus-1", "bus-j", "n-9", at(31), gpu_utilization_mean=50.0),
        supplied("n-9", at(30)),
        beat("n-9", at(31), []),
    ]
    for envelope in events:
        await bus.publish(envelope)
    await billing.processed(events[-1])
    for envelope in events:
        await billing.processed(envelope)
    assert await pool.fetchval("SELECT count(*) FROM waste_jobs WHERE job_id = 'bus-j'") == 1
    assert await pool.fetchval(
        "SELECT gpu_utilization_mean FROM waste_run_reports WHERE allocation_id = 'bus-1'"
    ) == Decimal(50)
    assert await pool.fetchval("SELECT outcome FROM waste_job_ends WHERE job_id = 'bus-j'") == (
        "succeeded"
    )
    assert await pool.fetchval("SELECT sent_at FROM waste_nodes WHERE node_id = 'n-9'") == at(31)
    assert await pool.fetchval("SELECT gpu_count FROM waste_node_supply WHERE node_id = 'n-9'") == 8


async def test_a_name_the_database_cannot_hold_is_refused_naming_it(
    client: httpx.AsyncClient,
) -> None:
    for name in ("team", "job", "project"):
        response = await client.get("/v1/waste", params={name: "a\x00"}, headers=OPERATOR)
        assert response.status_code == 422, response.text
        assert name in response.text


async def test_a_range_longer_than_a_quarter_is_refused_naming_to(
    client: httpx.AsyncClient,
) -> None:
    """The waste report reads every job of its range (queueing and holding are computed
    from the facts when asked), so any viewer asking for ten years made billing load every
    job ever submitted; a range is at most 93 days."""
    year = {"from": "2026-01-01T00:00:00Z", "to": "2027-01-01T00:00:00Z"}
    response = await client.get("/v1/waste", params=year, headers=ML)
    assert response.status_code == 422, response.text
    (error,) = response.json()["errors"]
    assert error["field"] == "to" and "93 days" in error["message"], error
    quarter = {"from": "2026-10-01T00:00:00Z", "to": "2027-01-02T00:00:00Z"}
    assert (await client.get("/v1/waste", params=quarter, headers=ML)).status_code == 200


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
async def test_a_measurement_that_is_no_number_leaves_the_allocation_billed(
    pool: asyncpg.Pool, value: float
) -> None:
    """A runner's end report said a mean GPU utilisation of NaN: billing kept it, and when
    the scheduler released the allocation its rollup compared NaN (an error), so the release
    failed until it was dead-lettered and the allocation was never billed. A node taken over
    so made its jobs free. A measurement that is no finite number is now unmeasured."""
    await feed(pool, granted("x-1", "x", J, "n-1", at(10), "ml-q"))
    await feed(
        pool,
        succeeded(
            "x-1", "x", "n-1", at(11), gpu_utilization_mean=value, data_wait_fraction_mean=value
        ),
    )
    await feed(pool, released("x-1", "x", J, "n-1", at(10), at(11), "succeeded"))
    assert await pool.fetchval(
        "SELECT gpu_seconds FROM usage_ledger WHERE allocation_id = 'x-1'"
    ) == Decimal(2 * 3600)
    measured = await pool.fetchrow(
        "SELECT gpu_utilization_mean, data_wait_fraction_mean FROM waste_run_reports "
        "WHERE allocation_id = 'x-1'"
    )
    assert measured is not None
    assert (measured["gpu_utilization_mean"], measured["data_wait_fraction_mean"]) == (None, None)

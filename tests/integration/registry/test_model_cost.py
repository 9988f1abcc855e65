"""Cost per model on real PostgreSQL and NATS: billing's ``cost.recorded`` events reach the
registry through its own consumer, and a fine-tuned model version's cost is its own job's
allocations plus every job upstream of it — its parent model's job with its failed attempt,
the jobs that produced its datasets (another team's too, counted but not listed) — exact to
the micro-unit, and the same however often billing's events are redelivered."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from decimal import Decimal
from typing import Any

import asyncpg
import pytest

from tests.integration.registry.modelkit import ML, OPERATOR, VISION, app_as, apply
from tests.integration.registry.test_datasets import add
from tests.integration.registry.test_registry import T0, ref, spec, started, succeeded
from trainyard_platform.shared.bus import Bus
from trainyard_platform.shared.events import Envelope
from trainyard_platform.shared.events.payloads import CostRecorded, JobSpec
from trainyard_platform.shared.events.trust import BILLING
from trainyard_platform.shared.storage import ObjectStore

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("registry")]


def bill(job: str, allocation: str, cost: str, team: str = "vision", minutes: int = 60) -> Any:
    return CostRecorded(
        allocation_id=allocation,
        job_id=job,
        team=team,
        user="alice",
        gpu_flavor="a100",
        gpus=1,
        started_at=T0,
        ended_at=T0 + timedelta(minutes=minutes),
        gpu_seconds=60.0 * minutes,
        price_per_gpu_hour=float(cost),
        cost=float(cost),
        currency="USD",
    )


async def say(bus: Bus, payload: CostRecorded, event_id: str | None = None) -> Envelope[Any]:
    envelope: Envelope[Any] = Envelope.wrap(
        payload, source=BILLING, subject=payload.job_id, event_id=event_id
    )
    await bus.publish(envelope)
    return envelope


async def billed(pool: asyncpg.Pool, allocation: str, cost: str) -> None:
    """Wait until the registry's consumer holds ``cost`` as the allocation's bill."""
    async with asyncio.timeout(20):
        while True:
            async with pool.acquire() as conn:
                found = await conn.fetchval(
                    "SELECT cost FROM allocation_costs WHERE allocation_id = $1", allocation
                )
            if found == Decimal(cost):
                return
            await asyncio.sleep(0.05)


async def lifecycle(
    pool: asyncpg.Pool,
    store: ObjectStore,
    job: str,
    job_spec: JobSpec,
    allocations: list[str],
    *,
    model: bool = True,
) -> None:
    """``job`` starts once per allocation (each a restart of the one before) and succeeds on
    the last, with a checkpoint when ``model``."""
    for attempt, allocation in enumerate(allocations):
        await apply(pool, store, job, started(job, allocation, attempt, job_spec))
    artifact = ref(store, job, 10) if model else None
    last = len(allocations)  # the epoch of the last attempt's start
    await apply(pool, store, job, succeeded(job, allocations[-1], artifact, epoch=last))


async def test_a_fine_tuned_model_costs_its_job_and_everything_upstream_once(
    bus: Bus, pool: asyncpg.Pool, store: ObjectStore
) -> None:
    tag = uuid.uuid4().hex[:6]
    base, tuned = f"base-{tag}", f"tuned-{tag}"
    prep, ml_prep, base_job, tuned_job = (f"{what}-{tag}" for what in ("prep", "mlp", "b", "t"))
    # Data: vision's own features made by a prep job; ml's, made by ml's job and granted.
    await lifecycle(pool, store, prep, spec(f"prep-{tag}", register_model=False), [f"{prep}-1"])
    ml_spec = spec(f"mlprep-{tag}", "ml", register_model=False)
    await lifecycle(pool, store, ml_prep, ml_spec, [f"{ml_prep}-1"], model=False)
    async with app_as(pool, store, VISION) as vision:
        made = await add(vision, "vision", f"raw-{tag}", producing_job_id=prep)
        assert made.status_code == 201, made.text
    async with app_as(pool, store, ML) as ml:
        assert (await add(ml, "ml", f"feat-{tag}", producing_job_id=ml_prep)).status_code == 201
        assert (await ml.put(f"/v1/datasets/ml/feat-{tag}/grants/vision")).status_code == 200
    # The base model: a failed first attempt, then a restart that succeeds.
    base_spec = spec(base).model_copy(
        update={"datasets": [f"vision/raw-{tag}:1", f"ml/feat-{tag}:1"]}
    )
    await lifecycle(pool, store, base_job, base_spec, [f"{base_job}-1", f"{base_job}-2"])
    # Fine-tuned from it: preempted once, then done.
    tuned_spec = spec(tuned).model_copy(update={"parent_model": f"vision/{base}:1"})
    await lifecycle(pool, store, tuned_job, tuned_spec, [f"{tuned_job}-1", f"{tuned_job}-2"])

    # Billing's events, through NATS to the registry's consumer.
    await say(bus, bill(prep, f"{prep}-1", "0.1"))
    await say(bus, bill(ml_prep, f"{ml_prep}-1", "0.2", team="ml"))
    failed = await say(bus, bill(base_job, f"{base_job}-1", "1.25"))
    await say(bus, bill(base_job, f"{base_job}-2", "0.333333"))
    await say(bus, bill(tuned_job, f"{tuned_job}-1", "2.000001"))  # the preempted attempt
    await say(bus, bill(tuned_job, f"{tuned_job}-2", "0.5", minutes=30))
    # A lost node's bill amended by billing (a later end): it replaces, never adds.
    amended = bill(tuned_job, f"{tuned_job}-2", "0.75", minutes=45)
    await say(bus, amended, event_id=f"cost:{tuned_job}-2:amended")
    await billed(pool, f"{tuned_job}-2", "0.75")
    # Redelivery: the same events again (stored twice by the stream under new message ids,
    # so the registry's inbox is what must catch them), the amended one too, and the
    # original bill after its amendment.
    for envelope in (failed, failed):
        await bus.publish_raw(
            envelope.nats_subject, envelope.to_json(), f"again-{uuid.uuid4()}", {}
        )
    await say(bus, bill(tuned_job, f"{tuned_job}-2", "0.5", minutes=30))
    await say(bus, amended, event_id=f"cost:{tuned_job}-2:amended")
    barrier = f"barrier-{tag}"
    await say(bus, bill(barrier, barrier, "9"))
    await billed(pool, barrier, "9")  # in order: everything before it was handled

    async with app_as(pool, store, VISION) as vision:
        answer = await vision.get(f"/v1/models/vision/{tuned}/versions/1")
        assert answer.status_code == 200, answer.text
        cost = answer.json()["cost"]
        by_alias = await vision.put(
            f"/v1/models/vision/{tuned}/aliases/production", json={"version": 1}
        )
        assert by_alias.status_code == 200
        aliased = await vision.get(f"/v1/models/vision/{tuned}/versions/by-alias/production")
        assert aliased.json()["cost"] == cost
        parent = (await vision.get(f"/v1/models/vision/{base}/versions/1")).json()["cost"]

    # own: 2.000001 + 0.75; upstream: 1.25 + 0.333333 (base) + 0.1 (prep) + 0.2 (ml's prep)
    assert cost["currency"] == "USD"
    assert (cost["own_job"], cost["upstream"], cost["total"]) == (
        "2.750001",
        "1.883333",
        "4.633334",
    )
    assert cost["by_currency"] == [
        {"currency": "USD", "total": "4.633334", "own_job": "2.750001", "upstream": "1.883333"}
    ]
    jobs = {j["job_id"]: j for j in cost["jobs"]}
    assert cost["jobs"][0]["job_id"] == tuned_job and cost["jobs"][0]["relation"] == "own"
    assert set(jobs) == {tuned_job, base_job, prep}  # ml's job is counted, not shown
    assert cost["hidden_jobs"] == 1
    assert jobs[tuned_job]["allocations"] == 2 and jobs[tuned_job]["costs"] == {"USD": "2.750001"}
    assert jobs[base_job] == {
        "job_id": base_job,
        "team": "vision",
        "name": base,
        "status": "succeeded",
        "relation": "upstream",
        "allocations": 2,  # the failed attempt and the restart
        "costs": {"USD": "1.583333"},
    }
    assert jobs[prep]["costs"] == {"USD": "0.100000"}
    assert cost["complete"] is True
    # The parent's own cost is its job and its data's jobs, nothing of its child.
    assert (parent["own_job"], parent["upstream"], parent["total"]) == (
        "1.583333",
        "0.300000",
        "1.883333",
    )
    async with app_as(pool, store, OPERATOR) as operator:
        seen = (await operator.get(f"/v1/models/vision/{tuned}/versions/1")).json()["cost"]
    assert seen["hidden_jobs"] == 0 and len(seen["jobs"]) == 4
    assert seen["total"] == cost["total"]
    async with pool.acquire() as conn:
        rows = await conn.fetchval(
            "SELECT count(*) FROM allocation_costs WHERE job_id = ANY($1::text[])",
            [prep, ml_prep, base_job, tuned_job],
        )
    assert rows == 6  # one row per allocation, whatever was redelivered


async def test_while_an_upstream_job_runs_the_cost_says_it_is_incomplete(
    pool: asyncpg.Pool, store: ObjectStore
) -> None:
    tag = uuid.uuid4().hex[:6]
    prep, job = f"prep-{tag}", f"j-{tag}"
    await apply(pool, store, prep, started(prep, f"{prep}-1", 0, spec(f"p-{tag}")))
    async with app_as(pool, store, VISION) as vision:
        made = await add(vision, "vision", f"raw-{tag}", producing_job_id=prep)
        assert made.status_code == 201, made.text
    job_spec = spec(f"m-{tag}").model_copy(update={"datasets": [f"vision/raw-{tag}:1"]})
    await lifecycle(pool, store, job, job_spec, [f"{job}-1"])
    async with app_as(pool, store, VISION) as vision:
        cost = (await vision.get(f"/v1/models/vision/m-{tag}/versions/1")).json()["cost"]
    # Nothing billed yet (an allocation is billed when it ends): zero, in no currency.
    assert (cost["currency"], cost["total"], cost["by_currency"]) == (None, "0.000000", [])
    assert [(j["job_id"], j["allocations"], j["costs"]) for j in cost["jobs"]] == [
        (job, 0, {}),
        (prep, 0, {}),
    ]
    assert cost["complete"] is False  # the prep job still runs: more will be billed


async def test_billing_s_correction_is_kept_whatever_order_its_events_come_in(
    pool: asyncpg.Pool, store: ObjectStore
) -> None:
    """An attempt that failed through the platform, reported after its release: billing
    said 2.5, then its correction, 0 (revision 1, the same end). Before, the registry kept
    2.5 (it replaced a row only by a later end). The correction wins whether it comes after
    the bill, before it, or before the bill said again; an amendment (a later end) is kept
    against the first bill arriving late too."""
    tag = uuid.uuid4().hex[:6]
    job = f"j-{tag}"
    first = bill(job, f"{job}-1", "2.5")
    correction = first.model_copy(update={"cost": 0.0, "gpu_seconds": 0.0, "revision": 1})
    orders = {
        f"{job}-1": [first, correction, first],
        f"{job}-2": [correction, first],
    }
    for allocation, events in orders.items():
        for event in events:
            await apply(pool, store, job, event.model_copy(update={"allocation_id": allocation}))
    amended = bill(job, f"{job}-3", "3.75", minutes=90).model_copy(update={"revision": 1})
    await apply(pool, store, job, amended)
    await apply(pool, store, job, bill(job, f"{job}-3", "2.5"))
    rows = await pool.fetch(
        "SELECT allocation_id, cost, revision FROM allocation_costs WHERE job_id = $1 "
        "ORDER BY allocation_id",
        job,
    )
    assert [(r["allocation_id"], r["cost"], r["revision"]) for r in rows] == [
        (f"{job}-1", Decimal(0), 1),
        (f"{job}-2", Decimal(0), 1),
        (f"{job}-3", Decimal("3.75"), 1),
    ]

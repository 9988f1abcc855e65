"""GPUs an ended allocation held stay out of placement while its runner may still be stopping
the job there (``services.scheduler.leases``), through NATS and Postgres: a gang cancelled on
one runner's report keeps its other member's GPUs leased, a waiting job is told they are
being freed, and they are placed again only once that runner reports its end, or a heartbeat
the scheduler handles later no longer lists the allocation."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from tests.integration.scheduler.conftest import Scheduler, preempted
from trainyard_platform.services.scheduler import repository as repo
from trainyard_platform.services.scheduler.convert import stopping_holder
from trainyard_platform.services.scheduler.leases import CANCEL_STOP_REASON
from trainyard_platform.services.scheduler.metrics import scheduler_readings
from trainyard_platform.services.scheduler.schemas import queue_view
from trainyard_platform.shared.events.payloads import (
    AllocationGranted,
    AllocationReleased,
    AllocationRevoked,
    JobCancelled,
    JobCancelRequested,
    JobPending,
    RunnerHeartbeat,
)
from trainyard_platform.shared.metrics_sampler import Sampler

pytestmark = pytest.mark.integration


def beat(node_id: str, running: list[str], sent_at: datetime) -> RunnerHeartbeat:
    return RunnerHeartbeat(
        node_id=node_id,
        hostname=f"{node_id}.local",
        gpu_flavor="cpu",
        gpu_count=2,
        running_allocations=running,
        sent_at=sent_at,
    )


async def held(scheduler: Scheduler) -> list[tuple[str, int]]:
    """The GPUs leased to ended allocations (stopping), by node and index."""
    rows = await scheduler.pool.fetch(
        "SELECT l.node_id, l.gpu_index FROM gpu_leases l JOIN allocations a "
        "USING (allocation_id) WHERE l.released_at IS NULL AND a.released_at IS NOT NULL "
        "AND l.stopping_since IS NOT NULL ORDER BY l.node_id, l.gpu_index"
    )
    return [(r["node_id"], r["gpu_index"]) for r in rows]


async def cancelled_gang_still_stopping_on_n2(
    scheduler: Scheduler, team: str = "vision"
) -> tuple[AllocationGranted, AllocationGranted, JobPending]:
    """job-1 (of vision) runs on n1 and n2 (2 GPUs each) and is cancelled; n1's runner
    reports its stop, n2's has not yet; job-2 (of ``team``) asks for all four GPUs. Returns
    job-1's grants on n1 and n2 and job-2's pending note."""
    await scheduler.heartbeat("n1", gpus=2)
    await scheduler.heartbeat("n2", gpus=2)
    await scheduler.submit("job-1", gpus=4)
    grants = await scheduler.wait_for(AllocationGranted, count=2)
    on_n1, on_n2 = sorted(grants, key=lambda g: g.node_id)
    assert (on_n1.node_id, on_n2.node_id) == ("n1", "n2")

    await scheduler.send(JobCancelRequested(job_id="job-1", team="vision", user="ada"), "job-1")
    await scheduler.wait_for(AllocationRevoked, count=2)
    await scheduler.send(preempted(on_n1, CANCEL_STOP_REASON), "job-1")
    await scheduler.wait_for(JobCancelled)
    released = await scheduler.wait_for(AllocationReleased, count=2)
    assert {r.allocation_id for r in released} == {on_n1.allocation_id, on_n2.allocation_id}
    # The books are closed (billed, job cancelled), but n2's runner may still be stopping it.
    assert await held(scheduler) == [("n2", 0), ("n2", 1)]

    await scheduler.submit("job-2", gpus=4, team=team)
    (pending,) = await scheduler.wait_for(JobPending, lambda p: p.job_id == "job-2")
    return on_n1, on_n2, pending


async def test_a_cancelled_gangs_gpus_are_placed_again_only_once_its_last_runner_stopped(
    scheduler: Scheduler,
) -> None:
    _, on_n2, pending = await cancelled_gang_still_stopping_on_n2(scheduler)
    assert stopping_holder("job-1") in pending.reason
    assert "GPUs are being freed" in pending.reason
    assert pending.blocking == "job-1"

    # n2's runner still lists the allocation it is stopping: the GPUs stay held, whatever the
    # passes meanwhile (one runs after every heartbeat batch and on the timer).
    await scheduler.send(beat("n2", [on_n2.allocation_id], datetime.now(UTC)), "n2")
    assert await held(scheduler) == [("n2", 0), ("n2", 1)]
    assert scheduler.events(AllocationGranted, lambda g: g.job_id == "job-2") == []
    # The operators' view shows them used, not free.
    async with scheduler.pool.acquire() as conn:
        view = queue_view(
            await repo.all_nodes(conn),
            await repo.running_allocations(conn),
            [],
            [],
            [],
            await repo.stopping_leases(conn),
        )
    n2 = next(n for n in view.nodes if n.node_id == "n2")
    assert (n2.free_gpus, n2.used_gpus) == (
        [],
        {0: stopping_holder("job-1"), 1: stopping_holder("job-1")},
    )

    # Its report that the job stopped (fenced as stale: the allocation ended) frees them.
    await scheduler.send(preempted(on_n2, CANCEL_STOP_REASON), "job-1")
    grants = await scheduler.wait_for(AllocationGranted, lambda g: g.job_id == "job-2", count=2)
    assert sorted((g.node_id, tuple(g.gpu_indices)) for g in grants) == [
        ("n1", (0, 1)),
        ("n2", (0, 1)),
    ]
    assert await held(scheduler) == []


async def test_a_heartbeat_sent_after_the_end_without_the_allocation_frees_its_gpus(
    scheduler: Scheduler,
) -> None:
    _, on_n2, pending = await cancelled_gang_still_stopping_on_n2(scheduler, team="speech")
    # Another team's job is named by its team only, a stopping one too.
    assert "job-1" not in pending.reason
    assert "a vision job (stopping: its GPUs are being freed)" in pending.reason
    assert pending.blocking == "vision"

    # One that still lists it keeps them held, whatever its runner's clock says.
    ahead = datetime.now(UTC) + timedelta(days=1)
    await scheduler.send(beat("n2", [on_n2.allocation_id], ahead), "n2")
    assert await held(scheduler) == [("n2", 0), ("n2", 1)]
    assert scheduler.events(AllocationGranted, lambda g: g.job_id == "job-2") == []

    # The runner restarted (it kills what the old process left) and never said the end:
    # its next heartbeat no longer lists the allocation, and the GPUs are free, though its
    # clock runs an hour behind the scheduler's (the scheduler orders by its own clock).
    behind = datetime.now(UTC) - timedelta(hours=1)
    await scheduler.send(beat("n2", [], behind), "n2")
    grants = await scheduler.wait_for(AllocationGranted, lambda g: g.job_id == "job-2", count=2)
    assert sorted(g.node_id for g in grants) == ["n1", "n2"]
    assert await held(scheduler) == []


async def gauges(scheduler: Scheduler) -> dict[tuple[str, ...], float]:
    """The scheduler's GPU gauges for flavor ``cpu``, sampled once from the database: each
    state of ``trainyard.scheduler.gpus``, and ``stopping_for``."""
    reader = InMemoryMetricReader()
    sampler = Sampler(meter=MeterProvider(metric_readers=[reader]).get_meter("test"))
    scheduler_readings(sampler, scheduler.pool)
    await sampler.sample_once()
    data = reader.get_metrics_data()
    assert data is not None
    return {
        (metric.name.rsplit(".", 1)[-1], *(str(v) for k, v in attrs.items() if k != "flavor")): (
            float(point.value)  # type: ignore[union-attr]
        )
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name.startswith("trainyard.scheduler.gpus")
        for point in metric.data.data_points  # type: ignore[union-attr]
        for attrs in [dict(point.attributes or {})]
        if attrs.get("flavor") == "cpu"
    }


async def test_operators_see_gpus_held_for_an_ended_allocation_and_for_how_long(
    scheduler: Scheduler,
) -> None:
    # Before: counted "allocated", GPUs held for a runner that never said it stopped looked
    # like a running job's, and nothing said how long they had been held.
    _, on_n2, _ = await cancelled_gang_still_stopping_on_n2(scheduler)
    await scheduler.pool.execute(
        "UPDATE gpu_leases SET stopping_since = now() - interval '10 minutes' "
        "WHERE stopping_since IS NOT NULL AND released_at IS NULL"
    )
    read = await gauges(scheduler)
    assert {k: v for k, v in read.items() if k[0] == "gpus"} == {
        ("gpus", "allocated"): 0,
        ("gpus", "stopping"): 2,
        ("gpus", "idle"): 2,
        ("gpus", "cordoned"): 0,
        ("gpus", "lost"): 0,
    }
    assert read[("stopping_for",)] >= 600

    await scheduler.send(preempted(on_n2, CANCEL_STOP_REASON), "job-1")
    await scheduler.wait_for(AllocationGranted, lambda g: g.job_id == "job-2", count=2)
    read = await gauges(scheduler)
    assert (read[("gpus", "allocated")], read[("gpus", "stopping")]) == (4, 0)
    assert read[("stopping_for",)] == 0

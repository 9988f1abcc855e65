"""The scheduler's readings, queried from a real PostgreSQL: every series an alert or a
panel reads exists from the start at 0 (a series that appears only with its first event
reads as "unknown" to Prometheus, and ``increase`` misses that first event), and only the
policy's own preemptions count as preemptions."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from tests.integration.scheduler.conftest import RUNNER_RESTARTED, Scheduler, preempted
from trainyard_platform.services.scheduler.metrics import scheduler_readings
from trainyard_platform.shared.events.payloads import AllocationGranted
from trainyard_platform.shared.metrics_sampler import Sampler

pytestmark = pytest.mark.integration


async def readings(scheduler: Scheduler, name: str, label: str = "flavor") -> dict[str, float]:
    """``name``'s points by their ``label`` label, sampled once from the database."""
    reader = InMemoryMetricReader()
    sampler = Sampler(meter=MeterProvider(metric_readers=[reader]).get_meter("test"))
    scheduler_readings(sampler, scheduler.pool)
    await sampler.sample_once()
    data = reader.get_metrics_data()
    assert data is not None
    return {
        str(point.attributes[label]): float(point.value)  # type: ignore[index]
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == name
        for point in metric.data.data_points  # type: ignore[union-attr]
    }


async def test_allocations_and_preemptions_per_flavor_from_zero(scheduler: Scheduler) -> None:
    await scheduler.heartbeat("n1", gpus=1)
    await scheduler.heartbeat("n2", gpus=8, flavor="a100")
    await scheduler.submit("job-1", gpus=1)
    (grant,) = await scheduler.wait_for(AllocationGranted)

    assert await readings(scheduler, "trainyard.scheduler.allocations") == {"cpu": 1, "a100": 0}
    assert await readings(scheduler, "trainyard.scheduler.preemptions") == {"cpu": 0, "a100": 0}

    # The runner restarted under the job: it reports it preempted, with no notice given.
    await scheduler.send(preempted(grant, RUNNER_RESTARTED), "job-1")
    await scheduler.wait_for(AllocationGranted, count=2)
    assert await readings(scheduler, "trainyard.scheduler.preemptions") == {"cpu": 0, "a100": 0}
    assert await readings(scheduler, "trainyard.scheduler.allocations") == {"cpu": 2, "a100": 0}


async def test_cordoned_nodes_by_who_cordoned_them_from_zero(scheduler: Scheduler) -> None:
    name = "trainyard.scheduler.nodes.cordoned"
    assert await readings(scheduler, name, "by") == {"operator": 0, "scheduler": 0}
    await scheduler.heartbeat("n1", gpus=1)
    await scheduler.heartbeat("n2", gpus=1)
    await scheduler.heartbeat("n3", gpus=1)
    await scheduler.pool.execute(
        "UPDATE nodes SET cordoned_at = now(), cordon_reason = 'r', cordoned_by = 'ops', "
        "cordoned_until = CASE node_id WHEN 'n1' THEN NULL ELSE now() + interval '1 hour' END "
        "WHERE node_id IN ('n1', 'n2')"
    )
    assert await readings(scheduler, name, "by") == {"operator": 1, "scheduler": 1}


async def test_free_gpus_of_a_cordoned_node_are_not_idle(scheduler: Scheduler) -> None:
    # Before: they counted idle, and TrainyardGPUsIdleWhileJobsWait fired for as long as a
    # node was cordoned while jobs waited, though no job could be placed on them.
    await scheduler.heartbeat("n1", gpus=2)
    await scheduler.heartbeat("n2", gpus=1)
    await scheduler.pool.execute(
        "UPDATE nodes SET cordoned_at = now(), cordon_reason = 'r', cordoned_by = 'ops' "
        "WHERE node_id = 'n1'"
    )
    reader = InMemoryMetricReader()
    sampler = Sampler(meter=MeterProvider(metric_readers=[reader]).get_meter("test"))
    scheduler_readings(sampler, scheduler.pool)
    await sampler.sample_once()
    data = reader.get_metrics_data()
    assert data is not None
    gpus = {
        str(point.attributes["state"]): float(point.value)  # type: ignore[index]
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == "trainyard.scheduler.gpus"
        for point in metric.data.data_points  # type: ignore[union-attr]
    }
    assert gpus == {"allocated": 0, "stopping": 0, "idle": 1, "cordoned": 2, "lost": 0}


async def test_a_grant_records_its_job_s_wait_in_its_queue(scheduler: Scheduler) -> None:
    # The pass's grants record trainyard.scheduler.queue.wait (a histogram by queue); read
    # from the process's scrape, as Prometheus reads it.
    from prometheus_client.parser import text_string_to_metric_families

    from trainyard_platform.shared.metrics import metrics_text, setup_metrics

    setup_metrics("scheduler")  # the process's provider (none when one is there already)

    def granted_in(queue: str) -> float:
        for family in text_string_to_metric_families(metrics_text().decode()):
            if family.name == "trainyard_scheduler_queue_wait_seconds":
                for sample in family.samples:
                    if sample.name.endswith("_count") and sample.labels["queue"] == queue:
                        return sample.value
        return 0.0

    before = granted_in("default:vision")
    await scheduler.heartbeat("n1", gpus=1)
    await scheduler.submit("job-1", gpus=1)
    await scheduler.wait_for(AllocationGranted)
    assert granted_in("default:vision") == before + 1

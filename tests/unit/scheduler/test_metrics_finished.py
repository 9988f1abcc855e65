"""Every series of the scheduler's gauges exists at 0 where nothing is in it: the terminal
states of ``trainyard.scheduler.jobs.finished`` (FAILED and CANCELLED were missing until a
job ended in them, so Prometheus read them as unknown and ``increase`` missed the first
such job), and each GPU state of every flavor in ``trainyard.scheduler.gpus`` (a flavor
whose nodes were all lost had no ``idle`` or ``allocated`` series, and ``lost`` vanished
once they came back)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from trainyard_platform.services.scheduler.metrics import scheduler_readings
from trainyard_platform.shared.metrics_sampler import Sampler

GPUS = [
    # 3 leased, 1 of them to an ended allocation its runner has been stopping for 90 s.
    {
        "flavor": "h100",
        "status": "READY",
        "gpus": 8,
        "leased": 3,
        "stopping": 1,
        "stopping_for": 90.0,
    },
    {
        "flavor": "a100",
        "status": "LOST",
        "gpus": 8,
        "leased": 0,
        "stopping": 0,
        "stopping_for": 0.0,
    },
]


class FakeConnection:
    async def fetch(self, query: str) -> list[dict[str, Any]]:
        if "status IN ('SUCCEEDED'" in query:
            return [{"status": "SUCCEEDED", "jobs": 3}]
        if "gpu_leases" in query:
            return GPUS
        return []


class FakePool:
    @asynccontextmanager
    async def acquire(self) -> AsyncIterator[FakeConnection]:
        yield FakeConnection()


async def sample(name: str) -> dict[tuple[str, ...], float]:
    """``name``'s points by their labels' values, sampled once from ``FakePool``."""
    reader = InMemoryMetricReader()
    sampler = Sampler(meter=MeterProvider(metric_readers=[reader]).get_meter("test"))
    scheduler_readings(sampler, FakePool())  # type: ignore[arg-type]
    await sampler.sample_once()
    data = reader.get_metrics_data()
    assert data is not None
    return {
        tuple(str(v) for v in (point.attributes or {}).values()): point.value  # type: ignore[misc]
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == name
        for point in metric.data.data_points  # type: ignore[union-attr]
    }


async def test_every_terminal_state_is_reported_from_zero() -> None:
    finished = await sample("trainyard.scheduler.jobs.finished")
    assert finished == {("SUCCEEDED",): 3, ("FAILED",): 0, ("CANCELLED",): 0}


async def test_every_gpu_state_of_every_flavor_is_reported_lost_nodes_too() -> None:
    gpus = await sample("trainyard.scheduler.gpus")
    assert gpus == {
        ("h100", "allocated"): 2,
        ("h100", "stopping"): 1,
        ("h100", "idle"): 5,
        ("h100", "cordoned"): 0,
        ("h100", "lost"): 0,
        ("a100", "allocated"): 0,
        ("a100", "stopping"): 0,
        ("a100", "idle"): 0,
        ("a100", "cordoned"): 0,
        ("a100", "lost"): 8,
    }


async def test_gpus_held_for_an_ended_allocation_say_how_long_by_flavor() -> None:
    stopping_for = await sample("trainyard.scheduler.gpus.stopping_for")
    assert stopping_for == {("h100",): 90.0, ("a100",): 0.0}

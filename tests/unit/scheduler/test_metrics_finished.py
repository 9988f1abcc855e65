"""Every terminal state's series of ``trainyard.scheduler.jobs.finished`` exists from the
start at 0: FAILED and CANCELLED were missing until a job ended in them, so Prometheus read
them as unknown and ``increase`` missed the first such job."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from trainyard_platform.services.scheduler.metrics import scheduler_readings
from trainyard_platform.shared.metrics_sampler import Sampler


class FakeConnection:
    async def fetch(self, query: str) -> list[dict[str, Any]]:
        if "status IN ('SUCCEEDED'" in query:
            return [{"status": "SUCCEEDED", "jobs": 3}]
        return []


class FakePool:
    @asynccontextmanager
    async def acquire(self) -> AsyncIterator[FakeConnection]:
        yield FakeConnection()


async def test_every_terminal_state_is_reported_from_zero() -> None:
    reader = InMemoryMetricReader()
    sampler = Sampler(meter=MeterProvider(metric_readers=[reader]).get_meter("test"))
    scheduler_readings(sampler, FakePool())  # type: ignore[arg-type]
    await sampler.sample_once()
    data = reader.get_metrics_data()
    assert data is not None
    finished = {
        point.attributes["state"]: point.value  # type: ignore[index]
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == "trainyard.scheduler.jobs.finished"
        for point in metric.data.data_points  # type: ignore[union-attr]
    }
    assert finished == {"SUCCEEDED": 3, "FAILED": 0, "CANCELLED": 0}

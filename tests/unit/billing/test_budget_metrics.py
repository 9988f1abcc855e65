"""Billing exports each team budget's share spent and whether it is exhausted, so the
issue's "budget exhausted" alert has a series (billing exported no budget metric)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from trainyard_platform.services.billing import budgets_repository as repo
from trainyard_platform.services.billing.budgets import Budget, month_start
from trainyard_platform.services.billing.metrics import billing_readings
from trainyard_platform.shared.metrics_sampler import Sampler

NOW = datetime(2026, 3, 10, tzinfo=UTC)


def budget(team: str, amount: str, project: str | None = None) -> Budget:
    return Budget(
        team=team,
        project=project,
        amount=Decimal(amount),
        currency="EUR",
        thresholds=(50, 80, 100),
        policy="warn",
        revision=1,
        updated_by="admin",
        updated_at=NOW,
    )


SPENT = {("vision", None): "150", ("nlp", None): "25", ("nlp", "chat"): "999"}


class FakePool:
    def __init__(self) -> None:
        self.down = False

    @asynccontextmanager
    async def acquire(self) -> AsyncIterator[object]:
        if self.down:
            raise ConnectionRefusedError("the database is down")
        yield object()


def readings(reader: InMemoryMetricReader) -> dict[str, dict[str, float]]:
    data = reader.get_metrics_data()
    found: dict[str, dict[str, float]] = {}
    for resource in data.resource_metrics if data else []:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:  # type: ignore[union-attr]
                    team = str((point.attributes or {})["team"])
                    found.setdefault(metric.name, {})[team] = point.value
    return found


async def test_team_budgets_are_read_as_share_spent_and_exhausted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def of_teams(conn: Any, team: str | None) -> list[Budget]:
        return [budget("nlp", "100"), budget("nlp", "10", "chat"), budget("vision", "100")]

    async def spent(conn: Any, b: Budget, month: datetime, now: datetime) -> Decimal:
        assert month == month_start(now) and now.tzinfo is not None
        return Decimal(SPENT[(b.team, b.project)])

    monkeypatch.setattr(repo, "of_teams", of_teams)
    monkeypatch.setattr(repo, "spent", spent)
    reader = InMemoryMetricReader()
    sampler = Sampler(meter=MeterProvider(metric_readers=[reader]).get_meter("test"))
    pool = FakePool()
    billing_readings(sampler, pool)  # type: ignore[arg-type]
    await sampler.sample_once()
    # Team budgets only (a project's would add a label per project).
    assert readings(reader) == {
        "trainyard.billing.budget.used": {"nlp": 0.25, "vision": 1.5},
        "trainyard.billing.budget.exhausted": {"nlp": 0.0, "vision": 1.0},
    }
    pool.down = True
    await sampler.sample_once()
    assert readings(reader) == {}, "unknown while unreadable, not stale"

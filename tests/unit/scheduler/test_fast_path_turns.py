"""The arrival fast path gives the event loop a turn every ``YIELD_EVERY`` jobs of a batch."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest

from trainyard_platform.services.scheduler import fast_path


async def test_a_long_batch_lets_other_tasks_run_while_it_is_decided(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    jobs = [f"job-{i}" for i in range(3 * fast_path.YIELD_EVERY + 1)]
    decided: list[str] = []

    async def queued_rows(conn: object, job_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        row = {"queue": "q", "priority_class": "normal", "eligible_at": None}
        return {j: {**row, "job_id": j} for j in job_ids}

    async def publish_notes(conn: object, news: object) -> None:
        return None

    def decide(kept: object, job: SimpleNamespace) -> dict[str, object]:
        decided.append(job.job_id)
        return {}

    monkeypatch.setattr(fast_path.repo, "queued_rows", queued_rows)
    monkeypatch.setattr(fast_path, "publish_notes", publish_notes)
    monkeypatch.setattr(fast_path, "pending_job", lambda row: SimpleNamespace(**row))
    monkeypatch.setattr(fast_path, "decide", decide)
    now = datetime(2026, 1, 1, tzinfo=UTC)
    kept: Any = SimpleNamespace(
        valid_until=now + timedelta(minutes=1),
        result=SimpleNamespace(
            built=SimpleNamespace(
                held_back=(),
                backing_off=(),
                budget_held=(),
                holds={},
                lowers={},
                reserves={},
                class_names=("normal",),
            )
        ),
        incremental=SimpleNamespace(knows=lambda job_id: False),
        note_before=lambda job_id: None,
        published={},
        arrivals=0,
    )
    seen_at: list[int] = []

    async def other_task() -> None:
        while True:
            seen_at.append(len(decided))
            await asyncio.sleep(0)

    other = asyncio.create_task(other_task())
    await asyncio.sleep(0)  # it runs once before the batch
    assert await fast_path.decide_arrivals(None, kept, jobs, now)  # type: ignore[arg-type]
    other.cancel()
    assert decided == jobs
    during = [n for n in seen_at if 0 < n < len(jobs)]
    assert during == [fast_path.YIELD_EVERY * k for k in (1, 2, 3)]

"""Property: the waste report read from the rollups (whole hours) plus the facts (the hours
from the current one on) equals the report computed from the facts alone, row by row to the
micro-unit; and a rebuild gives the same rollups as those kept event by event.

Hypothesis generates jobs of two teams on two flavors, each with attempts at any minute
(failed through the job or through the platform, preempted, lost and then reported
succeeded later, or succeeded), checkpoints,
run reports with or without a utilisation and a data-wait share, and any order of their
events in which a grant precedes its allocation's releases, with some events delivered
twice. They go through billing's real consumer (the inbox and handlers) into a real
PostgreSQL; the rollups are those it kept. The on-demand side is ``waste_report`` over the
allocation pieces of ``waste_repository.facts``, as ``GET /v1/waste`` by job computes it.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.integration.billing.conftest import feed
from tests.integration.billing.test_waste import failed, granted, released, spec, submitted, wrap
from tests.integration.billing.test_waste import succeeded as success
from trainyard_platform.services.billing import catalogue_repository as catalogue
from trainyard_platform.services.billing import waste_repository as repo
from trainyard_platform.services.billing import waste_rollups as rollups
from trainyard_platform.services.billing.costs import CostQuery, Dimension
from trainyard_platform.services.billing.waste import allocation_pieces
from trainyard_platform.services.billing.waste_schemas import waste_report
from trainyard_platform.shared.events import Envelope, Payload, parse_envelope
from trainyard_platform.shared.events.payloads import CheckpointRef, CheckpointSaved, JobPreempted
from trainyard_platform.shared.events.trust import RUNNER

pytestmark = pytest.mark.integration

T0 = datetime(2026, 11, 3, 9, 0, tzinfo=UTC)
GROUPINGS: list[tuple[Dimension, ...]] = [(), ("team",), ("team", "queue"), ("user", "flavor")]


@dataclass(frozen=True)
class Attempt:
    start: int
    """Minutes after T0."""
    minutes: int
    fate: str
    """failed, platform_failed (through the platform), preempted, lost_then_succeeded or
    succeeded."""
    checkpoint: int | None
    """Minutes into the attempt."""
    utilization: float | None
    data_wait: float | None


attempts = st.builds(
    Attempt,
    start=st.integers(0, 600),
    minutes=st.integers(1, 300),
    fate=st.sampled_from(
        ["failed", "platform_failed", "preempted", "lost_then_succeeded", "succeeded"]
    ),
    checkpoint=st.none() | st.integers(0, 300),
    utilization=st.none() | st.sampled_from([0.0, 3.5, 60.0]),
    data_wait=st.none() | st.sampled_from([0.0, 0.123456789, 0.5, 1.0]),
)
jobs = st.lists(
    st.tuples(
        st.sampled_from(["t1", "t2"]),
        st.sampled_from(["a100", "cpu"]),
        st.integers(1, 4),
        st.lists(attempts, min_size=1, max_size=3),
    ),
    min_size=1,
    max_size=4,
)


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def events(tag: str, drawn: list[Any]) -> list[list[Envelope[Payload]]]:
    """Per allocation, its events in an order its grant comes first in."""
    out = []
    for j, (team, flavor, gpus, tries) in enumerate(drawn):
        job_id = f"{tag}-j{j}"
        job = spec(f"{tag}-{team}", f"u{j % 2}", flavor, gpus, "normal")
        out.append([submitted(job_id, job, at(0))])
        for n, a in enumerate(tries, start=1):
            alloc, node = f"{job_id}-{n}", f"n{j}"
            start, end = at(a.start), at(a.start + a.minutes)
            metrics = {}
            if a.utilization is not None:
                metrics["gpu_utilization_mean"] = a.utilization
            if a.data_wait is not None:
                metrics["data_wait_fraction_mean"] = a.data_wait
            sent = [granted(alloc, job_id, job, node, start, f"q-{team}", attempt=n)]
            if a.checkpoint is not None:
                saved = CheckpointSaved(
                    job_id=job_id,
                    allocation_id=alloc,
                    epoch=n,
                    checkpoint=CheckpointRef(
                        uri="s3://c", manifest_uri="s3://c.json", step=1, size_bytes=1, sha256="0"
                    ),
                    saved_at=at(a.start + min(a.checkpoint, a.minutes)),
                )
                sent.append(wrap(saved))
            if a.fate in ("failed", "platform_failed"):
                kind = "platform_error" if a.fate == "platform_failed" else "user_error"
                sent.append(failed(alloc, job_id, node, end, RUNNER, kind, epoch=n, **metrics))
                sent.append(released(alloc, job_id, job, node, start, end, "failed"))
            elif a.fate == "preempted":
                report = JobPreempted(
                    job_id=job_id,
                    allocation_id=alloc,
                    node_id=node,
                    epoch=n,
                    finished_at=end,
                    reason="preempted",
                    metrics=metrics,
                )
                sent.append(wrap(report, RUNNER))
                sent.append(released(alloc, job_id, job, node, start, end, "preempted"))
            elif a.fate == "lost_then_succeeded":
                lost = at(a.start + a.minutes / 2)
                sent.append(released(alloc, job_id, job, node, start, lost, "lost"))
                sent.append(success(alloc, job_id, node, end, epoch=n, **metrics))
                sent.append(released(alloc, job_id, job, node, start, end, "succeeded"))
            else:
                sent.append(success(alloc, job_id, node, end, epoch=n, **metrics))
                sent.append(released(alloc, job_id, job, node, start, end, "succeeded"))
            out.append(sent)
    return out


@st.composite
def histories(draw: st.DrawFn) -> tuple[list[Any], list[list[Envelope[Payload]]], int]:
    drawn = draw(jobs)
    streams = events("x", drawn)
    # Interleave the allocations' streams in any order, each kept in its own order but for
    # run reports and checkpoints, which may come after the release; some sent twice.
    batches: list[list[Envelope[Payload]]] = []
    queues = [list(s) for s in streams]
    while any(queues):
        i = draw(st.sampled_from([k for k, q in enumerate(queues) if q]))
        q = queues[i]
        k = (
            0
            if len(q) == 1 or q[0].type.endswith(".allocation.granted.v1")
            else draw(st.integers(0, len(q) - 1))
        )
        envelope = q.pop(k)
        batches.append([envelope])
        if draw(st.booleans()):  # delivered again (the inbox drops it)
            batches.append([envelope])
    since_hours = draw(st.integers(0, 18))
    return drawn, batches, since_hours


def _retag(batches: list[list[Envelope[Payload]]], tag: str) -> list[list[Envelope[Payload]]]:
    """The same events under this example's own ids (Hypothesis replays examples)."""
    return [
        [parse_envelope(e.to_json().replace(b'"x-', f'"{tag}-'.encode())) for e in batch]
        for batch in batches
    ]


async def _reports(conn: asyncpg.Connection, team: str, since: datetime) -> None:
    book = await catalogue.schedule(conn)
    now = datetime(2026, 12, 4, tzinfo=UTC)
    start, end = T0.replace(hour=0), T0.replace(hour=0) + timedelta(days=2)
    for group_by in GROUPINGS:
        for filters in ({}, {"team": team}):
            query = CostQuery(start, end, None, group_by, dict(filters))  # type: ignore[arg-type]
            held, _ = await repo.facts(conn, start, end, filters.get("team"))
            pieces = [p for a in held for p in allocation_pieces(a)]
            common: dict[str, Any] = {
                "unallocated": [],
                "ledger": [],
                "jobless": [],
                "success": [],
                "book": book,
                "currency": "USD",
                "now": now,
                "limit": 10_000,
            }
            on_demand = waste_report(query, pieces=pieces, **common)
            cut = max(start, min(end, since))
            rolled = await rollups.read(conn, query, cut, book)
            from_rollups = waste_report(
                query, pieces=[], rolled=rolled, edge=pieces, since=cut, **common
            )
            assert from_rollups.model_dump() == on_demand.model_dump(), (group_by, filters)


async def _rollup_rows(conn: asyncpg.Connection) -> list[tuple[Any, ...]]:
    rows = await conn.fetch(
        "SELECT * FROM waste_rollups_hourly WHERE gpu_micros <> 0 OR wall_micros <> 0 "
        "OR starts <> 0 OR continues <> 0"
    )
    return sorted(tuple(r.values()) for r in rows)


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(history=histories())
async def test_the_rollups_report_equals_the_facts_report(
    pool: asyncpg.Pool, history: tuple[list[Any], list[list[Envelope[Payload]]], int]
) -> None:
    drawn, batches, since_hours = history
    tag = uuid.uuid4().hex[:8]
    for batch in _retag(batches, tag):
        await feed(pool, *batch)
    team = f"{tag}-{drawn[0][0]}"
    async with pool.acquire() as conn:
        kept = await _rollup_rows(conn)  # as the consumer kept them, event by event
        assert kept
        await _reports(conn, team, T0.replace(hour=0) + timedelta(hours=since_hours))
        async with conn.transaction():
            await rollups.rebuild_all(conn)
        assert await _rollup_rows(conn) == kept

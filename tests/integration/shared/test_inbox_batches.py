"""The inbox on batches: each event applied once, whatever the batch holds, or none at all.

The bus hands a handler whole fetched batches; JetStream may put the same event in one batch
twice (a redelivery fetched beside its first delivery, an event published twice under two
message ids). These tests drive ``idempotent`` / ``idempotent_batches`` / ``prepared_batches`` directly
with such batches, on a real database.
"""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from trainyard_platform.shared.bus import Delivery
from trainyard_platform.shared.db import open_pool
from trainyard_platform.shared.events import Envelope, Payload
from trainyard_platform.shared.events.payloads import JobCancelRequested, JobProgress
from trainyard_platform.shared.events.trust import BILLING, RUNNER, SUBMISSION
from trainyard_platform.shared.inbox import (
    TransactionalBatchHandler,
    idempotent,
    idempotent_batches,
    prepared_batches,
)
from trainyard_platform.shared.settings import DatabaseSettings

pytestmark = pytest.mark.integration


def _delivery(job_id: str) -> Delivery:
    envelope = Envelope.wrap(
        JobCancelRequested(job_id=job_id, team="t", user="u"), source=SUBMISSION, subject=job_id
    )
    return Delivery(envelope)


async def _effects(pool: asyncpg.Pool) -> list[str]:
    rows = await pool.fetch("SELECT job_id FROM effects ORDER BY n")
    return [r["job_id"] for r in rows]


async def _inbox(pool: asyncpg.Pool, consumer: str) -> set[str]:
    rows = await pool.fetch("SELECT event_id FROM inbox WHERE consumer = $1", consumer)
    return {r["event_id"] for r in rows}


@pytest.fixture
async def effects(pool: asyncpg.Pool) -> asyncpg.Pool:
    await pool.execute("CREATE TABLE effects (n serial PRIMARY KEY, job_id text NOT NULL)")
    return pool


async def _apply(envelope: Envelope[Payload], conn: asyncpg.Connection) -> None:
    await conn.execute("INSERT INTO effects (job_id) VALUES ($1)", envelope.subject)


async def test_the_same_event_twice_in_one_batch_is_applied_once(effects: asyncpg.Pool) -> None:
    a, b, c = _delivery("job-a"), _delivery("job-b"), _delivery("job-c")
    handle = idempotent(effects, "c1", _apply)

    await handle([a, b, a, c, b, a])

    assert await _effects(effects) == ["job-a", "job-b", "job-c"]  # once each, first order
    assert await _inbox(effects, "c1") == {a.envelope.id, b.envelope.id, c.envelope.id}


async def test_a_batch_handler_sees_each_first_time_delivery_once_in_order(
    effects: asyncpg.Pool,
) -> None:
    a, b, c = _delivery("job-a"), _delivery("job-b"), _delivery("job-c")
    seen: list[list[str]] = []

    async def bulk(deliveries: Sequence[Delivery], conn: asyncpg.Connection) -> None:
        seen.append([d.envelope.subject for d in deliveries])

    handle = idempotent_batches(effects, "c1", bulk)
    await handle([b])
    # b was applied in an earlier batch; a comes twice, c once.
    await handle([a, b, a, c, a])
    await handle([c, b, a])

    assert seen == [["job-b"], ["job-a", "job-c"], []]


async def test_an_event_applied_before_is_skipped_and_consumers_are_separate(
    effects: asyncpg.Pool,
) -> None:
    a, b = _delivery("job-a"), _delivery("job-b")
    await idempotent(effects, "c1", _apply)([a])
    await idempotent(effects, "c1", _apply)([a, b])
    await idempotent(effects, "c2", _apply)([a])  # another consumer applies it for itself

    assert await _effects(effects) == ["job-a", "job-b", "job-a"]
    assert await _inbox(effects, "c1") == {a.envelope.id, b.envelope.id}
    assert await _inbox(effects, "c2") == {a.envelope.id}


async def test_a_failing_batch_applies_and_records_nothing(effects: asyncpg.Pool) -> None:
    a, bad = _delivery("job-a"), _delivery("job-bad")

    async def apply_or_fail(envelope: Envelope[Payload], conn: asyncpg.Connection) -> None:
        await _apply(envelope, conn)
        if envelope.subject == "job-bad":
            raise RuntimeError("this event cannot be applied")

    with pytest.raises(RuntimeError):
        await idempotent(effects, "c1", apply_or_fail)([a, bad])

    assert await _effects(effects) == []
    assert await _inbox(effects, "c1") == set()  # so a retry applies `a` after all
    await idempotent(effects, "c1", apply_or_fail)([a])
    assert await _effects(effects) == ["job-a"]


async def test_the_guard_runs_first_and_a_refusal_records_nothing(effects: asyncpg.Pool) -> None:
    a = _delivery("job-a")
    calls: list[str] = []

    class Refused(Exception):
        pass

    async def refuse(conn: asyncpg.Connection) -> None:
        calls.append("guard")
        # Inside the batch's transaction, before anything of the batch is written.
        assert conn.is_in_transaction()
        assert await conn.fetchval("SELECT count(*) FROM inbox") == 0
        raise Refused("not the leader")

    async def apply(envelope: Envelope[Payload], conn: asyncpg.Connection) -> None:
        calls.append("handler")
        await _apply(envelope, conn)

    with pytest.raises(Refused):
        await idempotent(effects, "c1", apply, guard=refuse)([a])
    assert calls == ["guard"]
    assert await _inbox(effects, "c1") == set()

    async def allow(conn: asyncpg.Connection) -> None:
        calls.append("guard")

    await idempotent(effects, "c1", apply, guard=allow)([a])
    assert calls == ["guard", "guard", "handler"]
    assert await _effects(effects) == ["job-a"]


async def test_each_event_is_handled_in_a_span_of_its_consumer(
    effects: asyncpg.Pool, spans: InMemorySpanExporter
) -> None:
    a, b = _delivery("job-a"), _delivery("job-b")
    await idempotent(effects, "c1", _apply)([a, b, a])
    handled = [s for s in spans.get_finished_spans() if s.name.endswith(" process")]
    assert [s.attributes["messaging.message.id"] for s in handled] == [
        a.envelope.id,
        b.envelope.id,
    ]
    assert {s.attributes["messaging.consumer.group.name"] for s in handled} == {"c1"}


async def test_prepare_runs_holding_no_connection_on_events_not_applied_before(
    effects: asyncpg.Pool, database_url: str
) -> None:
    """``prepared_batches``: the slow part runs before the transaction, holding none of the
    pool's connections (with a pool of one, another user of it gets that connection
    meanwhile), and only for events the inbox has not recorded; what it prepared reaches
    the transactional handler, which applies each event once."""
    a, b, c = _delivery("job-a"), _delivery("job-b"), _delivery("job-c")
    await idempotent(effects, "c1", _apply)([b])
    prepared: list[list[str]] = []
    settings = DatabaseSettings(
        url=database_url, pool_min_size=1, pool_max_size=1, acquire_timeout_seconds=3
    )
    async with open_pool(settings, "t") as one:

        async def prepare(deliveries: Sequence[Delivery]) -> TransactionalBatchHandler:
            subjects = [d.envelope.subject or "" for d in deliveries]
            prepared.append(subjects)
            async with one.acquire() as conn:  # free: the inbox's read gave it back
                await conn.fetchval("SELECT 1")

            async def finish(fresh: Sequence[Delivery], conn: asyncpg.Connection) -> None:
                for delivery in fresh:
                    await _apply(delivery.envelope, conn)

            return finish

        handle = prepared_batches(one, "c1", prepare)
        await handle([a, b, a, c])
        await handle([c, b])
        # What it does not want is applied without being prepared.
        d, e = _delivery("job-d"), _delivery("job-e")
        picky = prepared_batches(
            one, "c1", prepare, wants=lambda delivery: delivery.envelope.subject == "job-e"
        )
        await picky([d])
        await picky([d, e])

    assert prepared == [["job-a", "job-a", "job-c"], [], [], ["job-e"]]
    assert await _effects(effects) == ["job-b", "job-a", "job-c", "job-d", "job-e"]


def _said_by(source: str, event_id: str, job_id: str) -> Delivery:
    """A delivery of ``job_id``'s cancel request, as if ``source`` had said it with ``event_id``
    (the source check is the bus's, before the inbox)."""
    envelope = Envelope.wrap(
        JobCancelRequested(job_id=job_id, team="t", user="u"),
        source=source,
        subject=job_id,
        event_id=event_id,
    )
    return Delivery(envelope)


async def test_an_id_said_first_by_another_source_keeps_no_event_out(
    effects: asyncpg.Pool, database_url: str
) -> None:
    """An event is one per source and id (CloudEvents): a runner node taken over that sent
    one of its own events under an id billing will use (``budget:<team>::<revision>``, which
    anyone can foresee) kept billing's event out of every consumer that reads both, and so a
    spent budget held none of that team's jobs. Now each source's id is its own; rows
    recorded before sources were (source '') still count for an event of any source."""
    squat = _said_by(RUNNER, "budget:vision::7", "job-squat")
    real = _said_by(BILLING, "budget:vision::7", "job-real")
    await idempotent(effects, "c1", _apply)([squat])
    await idempotent(effects, "c1", _apply)([real, squat])
    await idempotent(effects, "c1", _apply)([real])
    assert await _effects(effects) == ["job-squat", "job-real"]

    prepared: list[list[str]] = []

    async def prepare(deliveries: Sequence[Delivery]) -> TransactionalBatchHandler:
        prepared.append([d.envelope.subject or "" for d in deliveries])

        async def finish(fresh: Sequence[Delivery], conn: asyncpg.Connection) -> None:
            for delivery in fresh:
                await _apply(delivery.envelope, conn)

        return finish

    await prepared_batches(effects, "c2", prepare)([squat])
    await prepared_batches(effects, "c2", prepare)([real])
    assert prepared == [["job-squat"], ["job-real"]]

    # Recorded before the inbox kept sources: still applied once, whoever says it.
    await effects.execute("INSERT INTO inbox (consumer, event_id) VALUES ('c3', 'old-1')")
    await idempotent(effects, "c3", _apply)([_said_by(BILLING, "old-1", "job-old")])
    await prepared_batches(effects, "c3", prepare)([_said_by(RUNNER, "old-1", "job-old")])
    assert prepared[2:] == [[]]
    assert await _effects(effects) == ["job-squat", "job-real", "job-squat", "job-real"]


def _reported_by(node_id: str, event_id: str, job_id: str) -> Delivery:
    """A delivery of a runner's report from ``node_id`` under ``event_id`` (the bus checked
    that its subject names that node)."""
    envelope = Envelope.wrap(
        JobProgress(job_id=job_id, allocation_id="a", step=1, metrics={}, node_id=node_id),
        source=RUNNER,
        subject=job_id,
        event_id=event_id,
    )
    return Delivery(envelope)


async def test_a_runner_node_keeps_no_other_nodes_event_out_under_its_id(
    effects: asyncpg.Pool,
) -> None:
    """Every runner node says one source, ``trainyard/runner``: a node that sent a report of
    its own under the id a gang peer's coming report will carry (``uuid5`` of the peer's
    allocation and kind, which its grant lets it foresee) had the peer's skipped as a repeat
    by every consumer. Now the node its subject names is part of who said it
    (``trust.sender_of``); rows recorded before that (source ``trainyard/runner``) still
    count for the id from any node."""
    peer_end = "3b0c8f4e-5a8e-5b53-9c1f-1f0f3a0f6c2d"
    squat = _reported_by("node-a", peer_end, "job-squat")
    real = _reported_by("node-b", peer_end, "job-real")
    await idempotent(effects, "c1", _apply)([squat])
    await idempotent(effects, "c1", _apply)([real, squat])
    await idempotent(effects, "c1", _apply)([real])
    assert await _effects(effects) == ["job-squat", "job-real"]

    await effects.execute(
        "INSERT INTO inbox (consumer, source, event_id) VALUES ('c3', $1, 'old-2')", RUNNER
    )
    await idempotent(effects, "c3", _apply)([_reported_by("node-b", "old-2", "job-old")])
    assert await _effects(effects) == ["job-squat", "job-real"]

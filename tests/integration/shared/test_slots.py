"""Places for work in flight that every replica counts together (``shared.slots``), on a
real PostgreSQL: two instances over their own pools stand for two replicas.

Before, each such limit (a team's model transfers, bundle uploads, comparisons) was a
count in one process's memory, so N replicas let a team N times its share."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import AsyncIterator, Coroutine, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any, TypeVar

import asyncpg
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from trainyard_platform.shared.db import open_pool
from trainyard_platform.shared.settings import DatabaseSettings
from trainyard_platform.shared.slots import SWEPT_PER_ROUND, Slot, Slots
from trainyard_platform.shared.telemetry import instrument_database

pytestmark = pytest.mark.integration

T = TypeVar("T")


@asynccontextmanager
async def replica(database_url: str) -> AsyncIterator[asyncpg.Pool]:
    """Another replica's own pool on the same database (``pool`` migrated it)."""
    async with open_pool(DatabaseSettings(url=database_url), "t") as p:
        yield p


async def test_two_replicas_together_hold_at_most_the_share(
    pool: asyncpg.Pool, database_url: str
) -> None:
    async with replica(database_url) as other:
        replicas = [Slots(pool, "work"), Slots(other, "work")]
        share = 3
        now = most = 0
        release = asyncio.Event()
        started = asyncio.Queue[int]()

        async def one(slots: Slots) -> bool:
            nonlocal now, most
            slot = await slots.take("team:vision", share)
            if slot is None:
                return False
            now += 1
            most = max(most, now)
            started.put_nowait(1)
            await release.wait()
            now -= 1
            await slots.give_back(slot)
            return True

        tries = [asyncio.create_task(one(replicas[i % 2])) for i in range(12)]
        for _ in range(share):
            await asyncio.wait_for(started.get(), 30)
        # Every try has either its place or its refusal before any place is given back.
        async with asyncio.timeout(30):
            while sum(t.done() for t in tries) < len(tries) - share:
                await asyncio.sleep(0.01)
        # Another scope has its own share, held beside vision's.
        other_team = await replicas[1].take("team:ml", 1)
        assert other_team is not None
        release.set()
        taken = await asyncio.gather(*tries)
        assert most == share, f"{most} places of a share of {share} held at once"
        assert taken.count(True) == share
        await replicas[1].give_back(other_team)
        # Given back, the places are free again, on either replica.
        again = [await replicas[i % 2].take("team:vision", share) for i in range(share)]
        assert None not in again
        assert await replicas[0].take("team:vision", share) is None
        for i, slot in enumerate(again):
            assert slot is not None
            await replicas[i % 2].give_back(slot)
        assert await pool.fetchval("SELECT count(*) FROM held_slots") == 0


class _Frozen:
    """A replica running on an event loop of its own, in a thread, that can be stopped
    dead: nothing it scheduled (its lease renewals) runs again, as when its process dies."""

    def __init__(self) -> None:
        self.pool: asyncpg.Pool | None = None
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def call(self, work: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(work, self.loop).result(60)

    def die(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(60)

    def open_pool(self, database_url: str) -> asyncpg.Pool:
        async def opened() -> asyncpg.Pool:
            return await asyncpg.create_pool(
                database_url, min_size=1, server_settings={"search_path": "t"}
            )

        self.pool = self.call(opened())
        return self.pool

    def bury(self) -> None:
        """Close what the dead replica left open, so its database can be dropped."""

        async def close() -> None:
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()
            if self.pool is not None:
                await self.pool.close()

        burial = threading.Thread(target=self.loop.run_until_complete, args=(close(),))
        burial.start()
        burial.join(60)
        self.loop.close()


@contextmanager
def frozen() -> Iterator[_Frozen]:
    dead = _Frozen()
    try:
        yield dead
    finally:
        if dead.thread.is_alive():
            dead.die()
        dead.bury()


async def test_a_dead_replicas_places_free_themselves_after_their_lease(
    pool: asyncpg.Pool, database_url: str
) -> None:
    lease_s = 6.0
    survivor = Slots(pool, "work", lease_s=lease_s)
    with frozen() as dead:
        doomed = Slots(dead.open_pool(database_url), "work", lease_s=lease_s)
        held: list[Slot | None] = [dead.call(doomed.take("team:vision", 2)) for _ in range(2)]
        assert None not in held
        # Alive, the first replica renews its leases: past the first lease, the survivor
        # still gets no place.
        assert await survivor.take("team:vision", 2) is None
        await asyncio.sleep(lease_s * 1.5)
        assert await survivor.take("team:vision", 2) is None
        dead.die()
        # Dead, it renews nothing: its places free themselves when their leases end.
        got: list[Slot] = []
        for _ in range(600):
            slot = await survivor.take("team:vision", 2)
            if slot is not None:
                got.append(slot)
                if len(got) == 2:
                    break
            else:
                await asyncio.sleep(0.1)
        assert len(got) == 2, "a dead replica's places were never freed"
        assert await survivor.take("team:vision", 2) is None
        for slot in got:
            await survivor.give_back(slot)


async def test_rows_of_holders_long_gone_are_deleted_while_places_are_renewed(
    pool: asyncpg.Pool,
) -> None:
    """Before, a dead holder's row stayed until a take of the same number of its scope:
    with a team that never again ran that many at once (or a share lowered since), for
    ever, one row per team and number. Now each renewal round deletes some of its kind's
    rows whose lease ended more than a lease ago; live rows, and other kinds', are kept."""
    lease_s = 1.5
    gone = SWEPT_PER_ROUND + 20  # more than one round deletes
    await pool.execute(
        """INSERT INTO held_slots (kind, scope, slot, holder, expires_at)
           SELECT kind, 'team:' || n, 0, 'dead:1:x', now() - interval '1 hour'
           FROM generate_series(1, $1) AS n, unnest(ARRAY['work', 'other']) AS kind""",
        gone,
    )
    # Another replica's live place.
    await pool.execute(
        """INSERT INTO held_slots (kind, scope, slot, holder, expires_at)
           VALUES ('work', 'team:ml', 0, 'alive:2:y', now() + interval '1 hour')"""
    )
    slots = Slots(pool, "work", lease_s=lease_s)
    live = await slots.take("team:vision", 1)
    assert live is not None
    async with asyncio.timeout(60):
        while await pool.fetchval(
            "SELECT count(*) FROM held_slots WHERE kind = 'work' AND holder = 'dead:1:x'"
        ):
            await asyncio.sleep(0.1)
    held = await pool.fetch("SELECT kind, scope, holder FROM held_slots ORDER BY kind, scope")
    kinds = Counter(row["kind"] for row in held)
    assert kinds["other"] == gone, "another kind's rows were swept"
    scopes = {row["scope"] for row in held if row["kind"] == "work"}
    assert {"team:vision", "team:ml"} <= scopes, "a live place was swept"
    await slots.give_back(live)
    await slots.close()


async def test_lease_renewals_are_in_no_requests_trace(
    pool: asyncpg.Pool, spans: InMemorySpanExporter
) -> None:
    """Before, the renewing task was started inside the first request that took a place,
    and so ran in its context: while that request lasted (a bundle upload, a model
    transfer: minutes), every renewal and sweep -- of every place of the replica, other
    teams' too -- was a span of its trace, and its log lines carried that request's ids.
    Now the task runs outside every request's context, as the group commit's batches do;
    the take stays the request's own."""
    provider = trace.get_tracer_provider()
    assert isinstance(provider, TracerProvider)
    assert instrument_database(provider)
    slots = Slots(pool, "traced", lease_s=0.6)
    expiry = "SELECT expires_at FROM held_slots WHERE kind = 'traced'"
    spans.clear()
    with trace.get_tracer("test").start_as_current_span("request") as request:
        slot = await slots.take("team:vision", 1)
        assert slot is not None
        with trace.use_span(trace.INVALID_SPAN):  # the test's own reads: in no trace
            taken = await pool.fetchval(expiry)
            async with asyncio.timeout(30):  # renewed at least once while it runs
                while await pool.fetchval(expiry) == taken:
                    await asyncio.sleep(0.05)
    await slots.give_back(slot)
    await slots.close()
    ours = request.get_span_context().trace_id
    statements = [
        str((s.attributes or {}).get("db.statement", ""))
        for s in spans.get_finished_spans()
        if s.context is not None
        and s.context.trace_id == ours
        and s.instrumentation_scope is not None
        and s.instrumentation_scope.name == "opentelemetry.instrumentation.asyncpg"
    ]
    assert len(statements) == 1, statements
    assert "WITH free AS" in statements[0], statements


async def test_a_busy_pool_does_not_cost_a_holder_its_place(
    pool: asyncpg.Pool, database_url: str
) -> None:
    """Before, the leases were renewed on the pool the requests use: with every connection
    of it in use for longer than a lease (slow requests, a pool of a few), each renewal gave
    up waiting for one, the lease ran out, and another replica took the place while its
    holder's work still ran, past the team's share. Now the renewals have a connection of
    their own."""
    lease_s = 3.0
    settings = DatabaseSettings(
        url=database_url, pool_min_size=1, pool_max_size=1, acquire_timeout_seconds=0.5
    )
    async with open_pool(settings, "t") as busy, replica(database_url) as other:
        holder = Slots(busy, "work", lease_s=lease_s)
        rival = Slots(other, "work", lease_s=lease_s)
        slot = await holder.take("team:vision", 1)
        assert slot is not None
        async with busy.acquire():  # the pool's one connection, in use for three leases
            loop = asyncio.get_running_loop()
            until = loop.time() + 3 * lease_s
            while loop.time() < until:
                assert await rival.take("team:vision", 1) is None, "the holder lost its place"
                await asyncio.sleep(0.2)
        await holder.give_back(slot)
        await holder.close()
        await rival.close()
    assert await pool.fetchval("SELECT count(*) FROM held_slots") == 0


async def test_a_stopped_app_leaves_no_place_in_its_database(
    pool: asyncpg.Pool, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The registry's and submission's apps over a real database: a place of every kind
    they keep (transfers, comparisons, bundle uploads) is held when the app stops, and none
    is left in ``held_slots`` after, nor a renewer running. The comparisons' and uploads'
    places were never closed: their rows stayed until their leases ran out."""
    from pydantic import SecretStr

    from trainyard_platform.services.registry.api import create_app as registry_app
    from trainyard_platform.services.submission.api import AppDeps
    from trainyard_platform.services.submission.api import create_app as submission_app
    from trainyard_platform.services.submission.config import Settings as SubmissionSettings
    from trainyard_platform.shared.access import service_guard
    from trainyard_platform.shared.storage import LocalStore

    made: list[Slots] = []
    init = Slots.__init__

    def recorded(self: Slots, *args: Any, **options: Any) -> None:
        init(self, *args, **options)
        made.append(self)

    monkeypatch.setattr(Slots, "__init__", recorded)
    guard = service_guard(SecretStr("operator"), None)
    apps = {
        "registry": registry_app(pool, guard, []),
        "submission": submission_app(SubmissionSettings(), AppDeps(pool, LocalStore(tmp_path), [])),
    }
    kinds = sorted(s.kind for s in made)
    assert kinds == ["registry.comparisons", "registry.transfers", "submission.bundle_uploads"]
    for service, app in apps.items():
        async with app.lifespan():
            for slots in made:
                if slots.kind.startswith(f"{service}."):
                    assert await slots.take("team:1", 2) is not None
    assert await pool.fetchval("SELECT count(*) FROM held_slots") == 0
    assert [s.kind for s in made if s._renewer is not None and not s._renewer.done()] == []

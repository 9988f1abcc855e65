"""Billing counts a node's unallocated GPUs from what the scheduler places on it
(``node.supplied``: its heartbeat claim capped by the operators' node inventory), never from
the node's own word: before, a node whose heartbeat claimed more GPUs than it has inflated
the platform's unallocated GPUs.

Built on ``test_waste``'s day (its ``client``), with nodes and jobs of their own later that
month (each test its own hours).
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import asyncpg
import httpx
import pytest

from tests.integration.billing.conftest import feed, until
from tests.integration.billing.test_waste import (
    H,
    at,
    beat,
    client,
    failed,
    granted,
    released,
    spec,
    submitted,
    supplied,
)
from trainyard_platform.services.billing import repository as repo
from trainyard_platform.services.billing import waste_repository
from trainyard_platform.services.billing.domain import Usage
from trainyard_platform.services.billing.handlers import BillingHandlers
from trainyard_platform.services.billing.waste_repository import _HELD, _WAITING
from trainyard_platform.shared.events.payloads import RunnerHeartbeat
from trainyard_platform.shared.events.trust import SCHEDULER

pytestmark = pytest.mark.integration

H1 = timedelta(hours=1)

__all__ = ["client"]  # the fixture, with test_waste's day fed


async def free_gpus(pool: asyncpg.Pool, node: str) -> list[int]:
    rows = await pool.fetch("SELECT free_gpus FROM waste_unallocated WHERE node_id = $1", node)
    return [r["free_gpus"] for r in rows]


async def test_a_node_claiming_more_gpus_counts_only_those_placed_on(
    client: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    """n-6 claims 64 cpu; the scheduler places on the 8 declared: 8 sat free, not 64."""
    await feed(pool, submitted("w6", H, at(90)), supplied("n-6", at(90), gpus=8))
    await feed(pool, beat("n-6", at(91), [], gpus=64))
    await feed(pool, beat("n-6", at(91 + 1 / 60), [], gpus=64))
    assert await free_gpus(pool, "n-6") == [8]


async def test_a_node_claiming_fewer_gpus_than_placed_on_counts_its_claim(
    client: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    """A claim below the scheduler's last word (a GPU gone bad, not judged yet) counts."""
    await feed(pool, submitted("w7", H, at(92)), supplied("n-7", at(92), gpus=8))
    await feed(pool, beat("n-7", at(93), [], gpus=3))
    await feed(pool, beat("n-7", at(93 + 1 / 60), [], gpus=3))
    assert await free_gpus(pool, "n-7") == [3]


async def test_a_node_the_scheduler_places_nothing_on_or_has_not_judged_counts_nothing(
    client: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    """n-8 is undeclared while the inventory is required (no flavor, no GPU);
    n-10: its judgement has not reached billing: neither node's claim counts."""
    await feed(pool, submitted("w8", H, at(94)), supplied("n-8", at(94), gpus=0, flavor=""))
    for node in ("n-8", "n-10"):
        await feed(pool, beat(node, at(95), [], gpus=8))
        await feed(pool, beat(node, at(95 + 1 / 60), [], gpus=8))
        assert await free_gpus(pool, node) == []


async def test_the_latest_judgement_of_a_node_counts_whatever_order_they_come_in(
    client: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    await feed(pool, submitted("w11", H, at(96)))
    await feed(pool, supplied("n-11", at(96), gpus=2), supplied("n-11", at(95), gpus=8))
    await feed(pool, beat("n-11", at(97), [], gpus=8))
    await feed(pool, beat("n-11", at(97 + 1 / 60), [], gpus=8))
    assert await free_gpus(pool, "n-11") == [2]


async def test_a_later_sequence_counts_whatever_the_scheduler_clock_said(
    client: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    """n-14's judgements are ordered by their sequence (the version of its supply in the
    scheduler's database): the 2nd, judged by a leader whose clock is behind, is the one
    kept, whichever comes first; one said again (same sequence) is kept too, and one of a
    scheduler from before the sequence (none) never replaces one with a sequence. Before,
    the later ``judged_at`` won: two leaders or a clock step kept an older judgement."""
    await feed(pool, submitted("w14", H, at(100)))
    await feed(
        pool,
        supplied("n-14", at(100), gpus=2, sequence=2),
        supplied("n-14", at(101), gpus=8, sequence=1),
        supplied("n-14", at(102), gpus=8),
    )
    await feed(pool, beat("n-14", at(103), [], gpus=8))
    await feed(pool, beat("n-14", at(103 + 1 / 60), [], gpus=8))
    assert await free_gpus(pool, "n-14") == [2]
    await feed(
        pool, supplied("n-15", at(101), gpus=8), supplied("n-15", at(100), gpus=3, sequence=1)
    )
    await feed(pool, supplied("n-15", at(99), gpus=3, sequence=1))
    row = await pool.fetchrow(
        "SELECT gpu_count, sequence FROM waste_node_supply WHERE node_id = 'n-15'"
    )
    assert (row["gpu_count"], row["sequence"]) == (3, 1)


async def test_a_node_leaving_its_allocations_out_of_its_heartbeat_counts_them_held(
    client: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    """n-12 runs o-1 (4 of its 8 GPUs) and heartbeats that it runs nothing: billing's own
    record of the grant holds them, so 4 sat free, not 8. n-13's allocation was released
    before the interval: all 8 count. Before, a node's word on what it ran was taken, and
    a node leaving its allocations out had their GPUs counted unallocated."""
    job = spec("ml", "bob", "cpu", 4, "normal")
    await feed(
        pool,
        submitted("w12", H, at(98)),
        submitted("o", job, at(98)),
        supplied("n-12", at(98)),
        supplied("n-13", at(98)),
        granted("o-1", "o", job, "n-12", at(98), "ml-q"),
        granted("o-2", "o", job, "n-13", at(98), "ml-q"),
        released("o-2", "o", job, "n-13", at(98), at(98.5), "failed"),
    )
    for node in ("n-12", "n-13"):
        await feed(pool, beat(node, at(99), []))
        await feed(pool, beat(node, at(99 + 1 / 60), []))
    assert await free_gpus(pool, "n-12") == [4]
    assert await free_gpus(pool, "n-13") == [8]


async def test_a_job_still_stopping_after_its_release_holds_its_gpus_until_it_exits(
    client: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    """s-17 (4 of n-17's 8 GPUs) is released lost at its node's last heartbeat before a
    short network cut; s-18 (4 of n-18's 8) is revoked by force (preempted). Both nodes
    then say they still run them while the jobs stop, and then no more: until the heartbeat
    after the last that names it, each holds its 4 GPUs (4 free, not 8), though neither is
    billed past its release. Before, a released allocation's GPUs were counted free at
    once: a job still stopping had its GPUs counted unallocated until it exited."""
    job = spec("ml", "bob", "cpu", 4, "normal")
    await feed(
        pool,
        submitted("w17", H, at(105)),
        submitted("s", job, at(105)),
        supplied("n-17", at(105)),
        supplied("n-18", at(105)),
        granted("s-17", "s", job, "n-17", at(105), "ml-q"),
        granted("s-18", "s", job, "n-18", at(105), "ml-q"),
    )
    for node, allocation in (("n-17", "s-17"), ("n-18", "s-18")):
        await feed(pool, beat(node, at(105.5), [allocation]))
    await feed(
        pool,
        released("s-17", "s", job, "n-17", at(105), at(105.5), "lost"),
        released("s-18", "s", job, "n-18", at(105), at(105.5 + 1 / 60), "preempted"),
    )
    for node, allocation in (("n-17", "s-17"), ("n-18", "s-18")):
        for minutes, running in ((1, [allocation]), (1.5, [allocation]), (2, []), (2.5, [])):
            await feed(pool, beat(node, at(105.5 + minutes / 60), running))
    for node in ("n-17", "n-18"):
        assert sorted(await free_gpus(pool, node)) == [4, 4, 4, 8], node
    bills = await pool.fetch(
        "SELECT ended_at FROM usage_ledger WHERE allocation_id IN ('s-17', 's-18') "
        "ORDER BY allocation_id"
    )
    assert [b["ended_at"] for b in bills] == [at(105.5), at(105.5 + 1 / 60)]


async def test_gpus_billed_to_a_job_are_never_counted_free_whatever_came_first(
    client: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    """g-19's grant (4 of n-19's 8 GPUs, from 107:00) is handled after two heartbeats of its
    node that do not name it yet: the interval between them counted 8 free, then 4 once
    the grant came. a-20 (4 of n-20's 8), released lost at 107:00, is billed again up to
    107:01:30 when its runner's late success amends it; the intervals its node's
    heartbeats counted meanwhile (naming nothing) count it held from then on, and one
    after its new end does not. Redelivered, nothing changes. Before, GPUs billed to a
    job stayed counted free (unallocated) at the same time."""
    job = spec("ml", "bob", "cpu", 4, "normal")
    await feed(
        pool,
        submitted("w19", H, at(106.5)),
        submitted("g", job, at(106.5)),
        supplied("n-19", at(106.5)),
        supplied("n-20", at(106.5)),
        granted("a-20", "g", job, "n-20", at(106.5), "ml-q"),
        released("a-20", "g", job, "n-20", at(106.5), at(107), "lost"),
    )
    for node in ("n-19", "n-20"):
        for minutes in (0, 1, 2, 3):
            await feed(pool, beat(node, at(107 + minutes / 60), []))
    assert await free_gpus(pool, "n-19") == [8, 8, 8]
    assert await free_gpus(pool, "n-20") == [8, 8, 8]
    late = (
        granted("g-19", "g", job, "n-19", at(107), "ml-q", attempt=2),
        released("a-20", "g", job, "n-20", at(106.5), at(107 + 1.5 / 60), "succeeded"),
    )
    await feed(pool, *late)
    await feed(pool, *late)
    assert await free_gpus(pool, "n-19") == [4, 4, 4]
    rows = await pool.fetch(
        "SELECT started_at, free_gpus FROM waste_unallocated WHERE node_id = 'n-20' "
        "ORDER BY started_at"
    )
    assert [(r["started_at"], r["free_gpus"]) for r in rows] == [
        (at(107), 4),
        (at(107 + 1 / 60), 4),
        (at(107 + 2 / 60), 8),
    ]
    bill = await pool.fetchval("SELECT ended_at FROM usage_ledger WHERE allocation_id = 'a-20'")
    assert bill == at(107 + 1.5 / 60)


async def test_an_interval_is_gone_once_billing_learns_no_job_was_waiting_then(
    client: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    """n-21's 8 GPUs sit free from 108:01 to 108:03 while q, c and r3 (all of its flavor)
    seem to wait: what says otherwise comes after the heartbeats (other subjects). q's grant
    on n-22 at 108:00 and c's end at 108:00 leave r3 waiting; the scheduler's refusal of r3
    leaves none, and the intervals are gone. Before, they stayed counted, judged from what
    billing had consumed when each heartbeat came."""
    await feed(
        pool,
        submitted("q", H, at(108)),
        submitted("c", H, at(108)),
        submitted("r3", H, at(108)),
        supplied("n-21", at(108)),
    )
    for minutes in (1, 2, 3):
        await feed(pool, beat("n-21", at(108 + minutes / 60), []))
    assert await free_gpus(pool, "n-21") == [8, 8]
    await feed(pool, granted("q-1", "q", H, "n-22", at(108), "ml-q"))
    await feed(pool, failed("c-1", "c", "n-22", at(108), SCHEDULER))
    assert await free_gpus(pool, "n-21") == [8, 8]  # r3 still waited
    await feed(pool, failed("", "r3", "", at(108 + 0.5 / 60), SCHEDULER, "rejected"))
    assert await free_gpus(pool, "n-21") == []


async def test_a_node_s_held_gpus_are_read_without_walking_its_history(
    pool: asyncpg.Pool,
) -> None:
    """n-16 has had 3,000 allocations, each billed long ago, and holds two now (o-16a, 2
    GPUs, open; o-16b, 1 GPU, released within the interval). Its held GPUs (read at every
    heartbeat, every 2 s of every node) count those two and read a handful of pages.
    Before, each heartbeat walked every allocation the node ever had (``0014``'s index by
    node and grant time, and the bill of each): a cost that only grew, about 20 ms a
    heartbeat at 50,000."""
    start = datetime(2026, 1, 1, tzinfo=UTC)
    history = 3000
    await pool.execute(
        """INSERT INTO announced_allocations (allocation_id, job_id, node_id, team, user_name,
                                              gpu_flavor, gpus, granted_at, event_id,
                                              recorded_at)
           SELECT 'h16-' || i, 'h16', 'n-16', 'ml', 'bob', 'cpu', 1,
                  $1::timestamptz + i * interval '10 minutes', 'e-h16-' || i, now()
           FROM generate_series(1, $2::int) i""",
        start,
        history,
    )
    async with pool.acquire() as conn:
        for i in range(1, history + 1):
            granted_at = start + timedelta(minutes=10 * i)
            await repo.insert_usage(conn, usage(f"h16-{i}", granted_at, minutes=5), "e", start)
    now = start + timedelta(minutes=10 * (history + 1))
    await pool.execute(
        """INSERT INTO announced_allocations (allocation_id, job_id, node_id, team, user_name,
                                              gpu_flavor, gpus, granted_at, event_id,
                                              recorded_at)
           VALUES ('o-16a', 'o16', 'n-16', 'ml', 'bob', 'cpu', 2, $1, 'e-a', $1),
                  ('o-16b', 'o16', 'n-16', 'ml', 'bob', 'cpu', 1, $1, 'e-b', $1)""",
        now - timedelta(minutes=30),
    )
    async with pool.acquire() as conn:
        released_b = usage("o-16b", now - timedelta(minutes=30), minutes=30 - 1 / 60)
        await repo.insert_usage(conn, released_b, "e", now)
        await conn.execute("ANALYZE announced_allocations; ANALYZE usage_ledger")
        interval = (now - timedelta(seconds=2), now)
        held = await conn.fetch(_HELD, "n-16", *interval, ["o-16a"])
        assert sorted((h["allocation_id"], h["gpus"]) for h in held) == [("o-16a", 2), ("o-16b", 1)]
        (plan,) = json.loads(
            await conn.fetchval(
                f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {_HELD}", "n-16", *interval, ["o-16a"]
            )
        )
    pages = plan["Plan"]["Shared Hit Blocks"] + plan["Plan"]["Shared Read Blocks"]
    assert pages < 30, f"{pages} pages read for a node with {history} allocations billed"


def usage(allocation_id: str, granted_at: datetime, *, minutes: float) -> Usage:
    """A bill of one GPU of n-16 from ``granted_at`` for ``minutes`` (its price is not read)."""
    return Usage(
        allocation_id=allocation_id,
        job_id="h16",
        team="ml",
        user="bob",
        node_id="n-16",
        gpu_flavor="cpu",
        gpus=1,
        started_at=granted_at,
        ended_at=granted_at + timedelta(minutes=minutes),
        outcome="succeeded",
        gpu_seconds=Decimal(60 * minutes),
        price_per_gpu_hour=Decimal("0.1"),
        currency="USD",
        cost=Decimal(0),
    )


async def test_whether_a_job_waits_is_read_without_walking_the_flavor_s_history(
    pool: asyncpg.Pool,
) -> None:
    """5,000 jobs of the flavor ``h17`` were submitted and ended long ago; one was
    submitted an hour ago and waits. Whether a job of the flavor waits (read at every
    heartbeat of a node with GPUs free, and again for each interval a grant, a job's end or
    a refusal may take back) finds it, or finds none once it has ended, reading a handful
    of pages. Before, it walked every job the flavor ever had (the index by flavor and
    submission, and the end of each): a cost that only grew."""
    start = datetime(2025, 1, 1, tzinfo=UTC)
    history = 5000
    await pool.execute(
        """INSERT INTO waste_jobs (job_id, team, project, user_name, gpu_flavor, gpus,
                                   priority, submitted_at, recorded_at)
           SELECT 'h17-' || i, 'ml', 'ml-project', 'bob', 'h17', 1, 'high',
                  $1::timestamptz + i * interval '10 minutes', now()
           FROM generate_series(1, $2::int) i""",
        start,
        history,
    )
    async with pool.acquire() as conn:
        for i in range(1, history + 1):
            ended_at = start + timedelta(minutes=10 * i + 5)
            await waste_repository.record_end(conn, f"h17-{i}", "succeeded", ended_at, start)
    now = start + timedelta(minutes=10 * (history + 10))
    await feed(pool, submitted("w17", spec("ml", "bob", "h17", 1, "high"), now - H1))

    async def waiting_pages() -> tuple[bool, int]:
        async with pool.acquire() as conn:
            await conn.execute("ANALYZE waste_jobs; ANALYZE waste_job_ends")
            found = await conn.fetchval(_WAITING, "h17", now)
            (plan,) = json.loads(
                await conn.fetchval(
                    f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {_WAITING}", "h17", now
                )
            )
        return found, plan["Plan"]["Shared Hit Blocks"] + plan["Plan"]["Shared Read Blocks"]

    found, pages = await waiting_pages()
    assert found
    assert pages < 40, f"{pages} pages read to find the job waiting among {history} ended"
    async with pool.acquire() as conn:
        await waste_repository.record_end(conn, "w17", "cancelled", now - H1 / 2, now)
    found, pages = await waiting_pages()
    assert not found
    assert pages < 40, f"{pages} pages read to find no job waiting among {history} ended"


async def test_a_grant_and_a_heartbeat_of_its_node_handled_at_once_count_its_gpus_held(
    client: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    """n-23's grant of 4 GPUs at 110:00 (to w23b) is handled by one replica while another
    handles n-23's heartbeat of 110:01, neither committed. Whichever commits first, the
    interval from 110:00 counts 4 free, not 8: the grant's hold waits for the heartbeat
    (or the heartbeat for the grant) on the node. Before, each saw the other's database
    without the other's change: the interval counted the granted GPUs free for good."""
    job = spec("ml", "bob", "cpu", 4, "high")
    await feed(
        pool,
        submitted("w23", H, at(110)),
        submitted("w23b", job, at(110)),
        supplied("n-23", at(110)),
        beat("n-23", at(110), []),
    )
    grant = granted("a-23", "w23b", job, "n-23", at(110), "ml-q")
    second = beat("n-23", at(110 + 1 / 60), [])
    assert isinstance(second.data, RunnerHeartbeat)
    async with pool.acquire() as granting, pool.acquire() as beating:
        granting_tx, beating_tx = granting.transaction(), beating.transaction()
        await granting_tx.start()
        await BillingHandlers().dispatch(grant, granting)
        await beating_tx.start()
        heartbeat = asyncio.create_task(waste_repository.record_heartbeat(beating, second.data))
        await asyncio.sleep(0.5)  # the heartbeat has read what it can by now
        await granting_tx.commit()
        await heartbeat
        await beating_tx.commit()
    assert await free_gpus(pool, "n-23") == [4]


async def _done_or_waiting_on_a_lock(
    pool: asyncpg.Pool, task: asyncio.Task[None], conn: asyncpg.Connection
) -> None:
    """Wait until ``task`` (running on ``conn``) has finished, or waits on a lock another
    transaction holds: it has read all it can before that one commits."""
    pid = conn.get_server_pid()

    async def settled() -> bool:
        if task.done():
            return True
        return bool(
            await pool.fetchval(
                "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1", pid
            )
        )

    await until(settled)


@pytest.mark.parametrize("first", ["grant", "heartbeat"])
async def test_a_grant_and_a_heartbeat_of_another_node_handled_at_once_count_no_wait(
    pool: asyncpg.Pool, first: str
) -> None:
    """w25, the only job of the flavor ``h25``, is granted n-25a's GPUs at 120:00 by one
    replica while another handles n-25b's heartbeat of 120:01, both uncommitted, the one
    or the other first. No job of ``h25`` was waiting at 120:01, so n-25b's 8 free GPUs
    from 120:00 count nothing, whichever commits first. Before, each read the database
    without the other's change: the heartbeat found w25 waiting (its grant not committed)
    and recorded the interval, and the grant's recheck found no interval to take back (the
    heartbeat's not committed): 8 GPU-minutes counted unallocated while nothing waited."""
    job = spec("ml", "bob", "h25", 1, "high")
    await feed(
        pool,
        submitted("w25", job, at(119)),
        supplied("n-25a", at(119), flavor="h25"),
        supplied("n-25b", at(119), flavor="h25"),
        beat("n-25b", at(120), []),
    )
    grant = granted("a-25", "w25", job, "n-25a", at(120), "ml-q")
    second = beat("n-25b", at(120 + 1 / 60), [])
    assert isinstance(second.data, RunnerHeartbeat)
    heartbeat = second.data
    async with pool.acquire() as granting, pool.acquire() as beating:

        async def grant_it() -> None:
            await BillingHandlers().dispatch(grant, granting)

        async def beat_it() -> None:
            await waste_repository.record_heartbeat(beating, heartbeat)

        handlers = {granting: grant_it, beating: beat_it}
        one, other = (granting, beating) if first == "grant" else (beating, granting)
        one_tx, other_tx = one.transaction(), other.transaction()
        await one_tx.start()
        await other_tx.start()
        await handlers[one]()
        later = asyncio.create_task(handlers[other]())
        await _done_or_waiting_on_a_lock(pool, later, other)
        await one_tx.commit()
        await later
        await other_tx.commit()
    assert await free_gpus(pool, "n-25b") == []


async def test_a_job_s_end_judges_again_only_the_intervals_since_its_submission(
    pool: asyncpg.Pool,
) -> None:
    """n-24 has 3,000 unallocated intervals of the flavor ``h24`` from long ago (while
    h24-old waited). w24, submitted an hour ago, ends, on its runner's word, at a time
    before it was submitted (a runner says its own ``finished_at``). Its end judges again
    whether a job waited at the intervals since its submission only: none before it could
    have counted w24 waiting. Before, it read every interval of the flavor since the time
    the runner said, one event at a time, as far back as a runner would say."""
    start = datetime(2030, 1, 1, tzinfo=UTC)  # after every other test's intervals
    history = 3000
    await pool.execute(
        """INSERT INTO waste_jobs (job_id, team, project, user_name, gpu_flavor, gpus,
                                   priority, submitted_at, recorded_at)
           VALUES ('h24-old', 'ml', 'ml-project', 'bob', 'h24', 1, 'high', $1, $1)""",
        start,
    )
    await pool.execute(
        """INSERT INTO waste_unallocated (node_id, gpu_flavor, free_gpus, started_at, ended_at,
                                          held)
           SELECT 'n-24', 'h24', 8, $1::timestamptz + i * interval '1 minute',
                  $1::timestamptz + (i + 1) * interval '1 minute', '{}'
           FROM generate_series(1, $2::int) i""",
        start,
        history,
    )
    async with pool.acquire() as conn:
        last = start + timedelta(minutes=history + 2)
        await waste_repository.record_end(conn, "h24-old", "succeeded", last, last)
        await conn.execute("ANALYZE waste_unallocated")
    now = start + timedelta(days=30)
    await feed(pool, submitted("w24", spec("ml", "bob", "h24", 1, "high"), now - H1))
    async with pool.acquire() as conn, conn.transaction():
        await waste_repository.record_end(conn, "w24", "succeeded", start, now)
        read = await conn.fetchval(
            "SELECT coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0) "
            "FROM pg_stat_xact_user_tables WHERE relname = 'waste_unallocated'"
        )
    assert await free_gpus(pool, "n-24") == [8] * history  # h24-old waited then
    assert read < 50, f"{read} intervals read for a job submitted after all {history}"

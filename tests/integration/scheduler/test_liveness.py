"""Liveness that survives the observer's own outage, and real results that are kept.

The scheduler runs its leader work (consumer, passes, lost-node watch) and outbox relay on a
NATS connection that goes through a TCP proxy (``tests.fixtures.tcp_proxy``), which the tests
cut; the runners' heartbeats and reports come over a connection of their own, straight to
NATS. Billing runs for real where a test checks what is billed. Time is short and bounded:
node timeout 1 s, reconnect grace 0.5 s, a sweep every 0.1 s.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any, TypeVar

import asyncpg
import pytest
from pydantic import SecretStr

from tests.fixtures.tcp_proxy import TcpProxy
from tests.integration.scheduler.conftest import make_spec, until
from trainyard_platform.services.billing.config import Settings as BillingSettings
from trainyard_platform.services.billing.handlers import SUBJECTS as BILLING_SUBJECTS
from trainyard_platform.services.billing.handlers import BillingHandlers
from trainyard_platform.services.billing.service import MIGRATIONS as BILLING_MIGRATIONS
from trainyard_platform.services.billing.service import seed_prices
from trainyard_platform.services.scheduler import loops
from trainyard_platform.services.scheduler.loops import LeaderWork
from trainyard_platform.services.scheduler.scheduling import Tuning
from trainyard_platform.services.scheduler.service import MIGRATIONS, NAME, SUBJECTS
from trainyard_platform.shared.bus import Bus
from trainyard_platform.shared.db import migrate, open_pool
from trainyard_platform.shared.events import Envelope, Payload, parse_envelope
from trainyard_platform.shared.events.payloads import (
    AllocationGranted,
    AllocationReleased,
    AllocationRevoked,
    CheckpointRef,
    CheckpointSaved,
    CostRecorded,
    Environment,
    JobFailed,
    JobPreempted,
    JobStarted,
    JobSubmitted,
    JobSucceeded,
    RunnerHeartbeat,
)
from trainyard_platform.shared.events.trust import owner
from trainyard_platform.shared.inbox import idempotent, idempotent_batches
from trainyard_platform.shared.outbox import OutboxRelay
from trainyard_platform.shared.settings import DatabaseSettings, NatsSettings

pytestmark = pytest.mark.integration

P = TypeVar("P", bound=Payload)
TIMEOUT_S = 1.0
GRACE_S = 0.5
CHECK_S = 0.1
BEAT_S = 0.2


def now() -> datetime:
    return datetime.now(UTC)


class Runner:
    """A node's heartbeats, every ``BEAT_S`` while ``beating``, straight to NATS."""

    def __init__(self, bus: Bus, node_id: str, gpus: int) -> None:
        self.bus = bus
        self.node_id = node_id
        self.gpus = gpus
        self.beating = asyncio.Event()
        self.beating.set()
        self.last_sent: datetime | None = None
        self._task = asyncio.create_task(self._beat())

    async def _beat(self) -> None:
        while True:
            await self.beating.wait()
            self.last_sent = now()
            beat = RunnerHeartbeat(
                node_id=self.node_id,
                hostname=f"{self.node_id}.local",
                gpu_flavor="cpu",
                gpu_count=self.gpus,
                sent_at=self.last_sent,
            )
            await self.bus.publish(Envelope.wrap(beat, source=owner(beat), subject=self.node_id))
            await asyncio.sleep(BEAT_S)

    def silence(self) -> None:
        self.beating.clear()

    def resume(self) -> None:
        self.beating.set()

    async def stop(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


class Live:
    """The scheduler behind the proxy, billing (optional), runners, and what was said."""

    def __init__(self, pool: asyncpg.Pool, bus: Bus, proxy: TcpProxy) -> None:
        self.pool = pool
        self.bus = bus
        self.proxy = proxy
        self.billing: asyncpg.Pool | None = None
        self.work: LeaderWork | None = None
        self.scheduler_bus: Bus | None = None
        self.seen: list[Envelope[Payload]] = []
        self.runners: list[Runner] = []

    # --- what was said ---

    def events(self, kind: type[P], where: Callable[[P], bool] = lambda _: True) -> list[P]:
        return [e.data for e in self.seen if isinstance(e.data, kind) and where(e.data)]

    def envelopes(self, kind: type[Payload]) -> list[Envelope[Payload]]:
        return [e for e in self.seen if isinstance(e.data, kind)]

    async def wait_for(
        self, kind: type[P], where: Callable[[P], bool] = lambda _: True, count: int = 1
    ) -> list[P]:
        await until(lambda: len(self.events(kind, where)) >= count)
        return self.events(kind, where)

    # --- talking to the scheduler ---

    async def send(self, payload: Payload, subject: str) -> None:
        """Publish (straight to NATS, as a runner or submission would) and wait until the
        scheduler has applied it."""
        envelope = Envelope.wrap(payload, source=owner(payload), subject=subject)
        await self.bus.publish(envelope)

        async def done() -> bool:
            return bool(
                await self.pool.fetchval(
                    "SELECT true FROM inbox WHERE consumer = $1 AND event_id = $2",
                    NAME,
                    envelope.id,
                )
            )

        await until(done)

    def runner(self, node_id: str, gpus: int = 1) -> Runner:
        runner = Runner(self.bus, node_id, gpus)
        self.runners.append(runner)
        return runner

    async def node_status(self, node_id: str) -> str | None:
        status: str | None = await self.pool.fetchval(
            "SELECT status FROM nodes WHERE node_id = $1", node_id
        )
        return status

    async def job(self, job_id: str = "job-1") -> asyncpg.Record:
        return await self.pool.fetchrow(
            "SELECT status, status_reason, attempt, restarts FROM jobs WHERE job_id = $1", job_id
        )

    async def running_on(
        self, node_id: str, job_id: str = "job-1", **spec: Any
    ) -> AllocationGranted:
        """A runner beating for ``node_id``, ``job_id`` submitted, granted there and started."""
        self.runner(node_id)
        await until(lambda: self._ready(node_id))
        submitted = JobSubmitted(job_id=job_id, spec=make_spec(gpus=1, **spec), submitted_at=now())
        await self.send(submitted, job_id)
        (grant,) = await self.wait_for(AllocationGranted, lambda g: g.job_id == job_id)
        await self.send(started(grant), job_id)
        return grant

    async def _ready(self, node_id: str) -> bool:
        return await self.node_status(node_id) == "READY"

    @property
    def watch_cutoff(self) -> datetime | None:
        assert self.work is not None
        return self.work.watch.last_cutoff

    async def judged_after(self, moment: datetime) -> None:
        """Wait until the watch has judged nodes with a cutoff after ``moment``: a node
        silent since before it would have been declared lost by then."""

        def done() -> bool:
            cutoff = self.watch_cutoff
            return cutoff is not None and cutoff > moment

        await until(done)


@pytest.fixture
async def pool(database_url: str) -> AsyncIterator[asyncpg.Pool]:
    async with open_pool(DatabaseSettings(url=database_url), NAME) as p:
        await migrate(p, NAME, MIGRATIONS)
        yield p


@pytest.fixture
async def proxy(nats_settings: NatsSettings) -> AsyncIterator[TcpProxy]:
    host, port = nats_settings.url.rsplit("@", 1)[-1].split("//")[-1].split(":")
    async with TcpProxy(host, int(port.rstrip("/"))) as started_proxy:
        yield started_proxy


Start = Callable[..., Awaitable[Live]]


@pytest.fixture
async def live(
    pool: asyncpg.Pool,
    bus: Bus,
    proxy: TcpProxy,
    nats_settings: NatsSettings,
    database_url: str,
) -> AsyncIterator[Start]:
    """``await live(billing=False)``: the scheduler (through the proxy) and, with ``billing``,
    the billing service's consumer, running until the test ends."""
    async with contextlib.AsyncExitStack() as stack:
        harness = Live(pool, bus, proxy)
        stop = asyncio.Event()
        tasks: list[asyncio.Task[None]] = []

        async def collect(msg: Any) -> None:
            harness.seen.append(parse_envelope(msg.data))

        async def start(billing: bool = False) -> Live:
            sub = await bus.nats.subscribe("trainyard.>", cb=collect)
            stack.push_async_callback(sub.unsubscribe)
            through_proxy = nats_settings.model_copy(
                update={"url": proxy.url_for(nats_settings.url)}
            )
            scheduler_bus = await stack.enter_async_context(
                Bus.connect(through_proxy, "scheduler-liveness")
            )
            work = LeaderWork(
                NAME,
                pool,
                scheduler_bus,
                SUBJECTS,
                Tuning(cancel_grace_s=5.0, restart_backoff_s=0.2),
                pass_interval_s=0.2,
                node_check_interval_s=CHECK_S,
                node_timeout_s=TIMEOUT_S,
                node_reconnect_grace_s=GRACE_S,
            )
            harness.work, harness.scheduler_bus = work, scheduler_bus
            tasks.append(
                asyncio.create_task(OutboxRelay(pool, scheduler_bus, idle_poll_s=0.05).run(stop))
            )
            tasks.append(asyncio.create_task(work.run(stop)))
            if billing:
                billing_pool = await stack.enter_async_context(
                    open_pool(DatabaseSettings(url=database_url), "billing")
                )
                await migrate(billing_pool, "billing", BILLING_MIGRATIONS)
                settings = BillingSettings(
                    prices={"cpu": 3.6}, currency="USD", admin_token=SecretStr("t")
                )
                await seed_prices(billing_pool, settings)
                handle = idempotent(billing_pool, "billing", BillingHandlers().dispatch)
                tasks.append(
                    asyncio.create_task(
                        bus.consume_batches("billing", BILLING_SUBJECTS, handle, stop)
                    )
                )
                tasks.append(
                    asyncio.create_task(OutboxRelay(billing_pool, bus, idle_poll_s=0.05).run(stop))
                )
                harness.billing = billing_pool
            # First thing on exit: stop what uses the buses and pools, then close them.
            stack.push_async_callback(shut)
            return harness

        async def shut() -> None:
            proxy.restore()
            for runner in harness.runners:
                await runner.stop()
            stop.set()
            await asyncio.wait_for(asyncio.gather(*tasks), timeout=30)

        yield start


def started(grant: AllocationGranted, epoch: int | None = None) -> JobStarted:
    return JobStarted(
        job_id=grant.job_id,
        allocation_id=grant.allocation_id,
        node_id=grant.node_id,
        attempt=grant.attempt,
        epoch=grant.epoch if epoch is None else epoch,
        started_at=now(),
        code_version="abc",
        environment=Environment(
            python="3.11",
            torch="2",
            platform="linux",
            hostname="h",
            node_id=grant.node_id,
            gpu_flavor="cpu",
        ),
        spec=grant.spec,
    )


def succeeded(
    grant: AllocationGranted, finished_at: datetime, epoch: int | None = None
) -> JobSucceeded:
    return JobSucceeded(
        job_id=grant.job_id,
        allocation_id=grant.allocation_id,
        node_id=grant.node_id,
        epoch=grant.epoch if epoch is None else epoch,
        finished_at=finished_at,
    )


def lost_release(grant: AllocationGranted) -> Callable[[AllocationReleased], bool]:
    return lambda r: r.allocation_id == grant.allocation_id and r.outcome == "lost"


# --- the observer's own outage -----------------------------------------------------------


@pytest.mark.parametrize("runners_cut_off_too", [False, True], ids=["bus-kept-beats", "all-cut"])
async def test_the_schedulers_own_bus_outage_declares_no_node_lost(
    live: Start, runners_cut_off_too: bool
) -> None:
    """The scheduler is cut off from NATS three node timeouts long. Its heartbeats wait in
    the stream (the runners still reach NATS), or none are sent at all (the runners were cut
    off by the same outage and beat again once it ends): either way no node is lost, no job
    is requeued, nothing is released, and the watch does judge again afterwards."""
    s = await live()
    grant = await s.running_on("n1")
    await s.judged_after(now())  # the watch judges before the outage
    (runner,) = s.runners
    assert s.scheduler_bus is not None

    async with s.proxy.cut_for(3 * TIMEOUT_S):
        if runners_cut_off_too:
            runner.silence()
        await until(lambda: s.scheduler_bus is not None and s.scheduler_bus.connected_since is None)
    runner.resume()
    restored = now()

    # Once it hears again, the node's clock restarts: it gets the timeout plus the grace.
    await s.judged_after(restored + timedelta(seconds=GRACE_S))
    assert await s.node_status("n1") == "READY"
    assert s.events(AllocationReleased) == []
    assert s.events(AllocationGranted) == [grant]
    job = await s.job()
    assert (job["status"], job["restarts"]) == ("RUNNING", 0)


async def test_heartbeats_still_in_the_stream_are_not_a_dead_node(
    live: Start, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scheduler's consumer lags (a batch it cannot apply yet, held three timeouts
    long) while the node's heartbeats queue up in the stream: the watch judges by what the
    scheduler has had the chance to read, so the node is not lost."""
    gate = asyncio.Event()
    gate.set()
    real = idempotent_batches

    def gated(*args: Any, **kwargs: Any) -> Callable[..., Awaitable[None]]:
        apply = real(*args, **kwargs)

        async def handle(deliveries: Any) -> None:
            await gate.wait()  # outside the transaction: the watch is not held up
            await apply(deliveries)

        return handle

    monkeypatch.setattr(loops, "idempotent_batches", gated)
    s = await live()
    await s.running_on("n1")
    await s.judged_after(now())

    gate.clear()
    stalled = now()
    try:
        await asyncio.sleep(3 * TIMEOUT_S)
        assert await s.node_status("n1") == "READY"
        assert s.events(AllocationReleased) == []
        # Meanwhile it judged nothing newer than what it had read.
        cutoff = s.watch_cutoff
        assert cutoff is not None and cutoff < stalled
    finally:
        gate.set()
    resumed = now()

    await s.judged_after(resumed)
    assert await s.node_status("n1") == "READY"
    assert s.events(AllocationReleased) == []


async def test_a_node_silent_while_the_scheduler_hears_is_lost(live: Start) -> None:
    s = await live()
    grant = await s.running_on("n1")
    await s.judged_after(now())
    (runner,) = s.runners
    runner.silence()
    silent_since = now()

    (released,) = await s.wait_for(AllocationReleased, lost_release(grant))
    noticed = now()
    assert await s.node_status("n1") == "LOST"
    last = await s.pool.fetchval("SELECT last_heartbeat FROM nodes WHERE node_id = 'n1'")
    assert released.released_at == last  # billed up to the last heartbeat heard
    # Not before the timeout, and soon after it (the grace only follows a new hearing).
    assert noticed - last >= timedelta(seconds=TIMEOUT_S)
    assert noticed - silent_since < timedelta(seconds=TIMEOUT_S + 3)
    job = await s.job()
    assert (job["status"], job["restarts"]) == ("QUEUED", 1)


# --- a real result is kept ----------------------------------------------------------------


def _verdicts(s: Any) -> list[Envelope[Payload]]:
    return [e for e in s.envelopes(JobSucceeded) if e.source == owner(AllocationGranted)]


@pytest.mark.parametrize("newer", ["none", "granted", "started"])
async def test_a_success_reported_after_the_node_was_lost_is_kept_and_billed_once(
    live: Start, newer: str
) -> None:
    """n1 goes silent and is declared lost; its job is requeued (and, with ``newer``, placed
    again on n2, and started there). Then n1's runner reports that the job had succeeded.
    The job is SUCCEEDED, not run again (a newer attempt is stopped), and every allocation
    is billed once: n1's for the time it really ran, to the reported finish."""
    s = await live(billing=True)
    grant = await s.running_on("n1", max_restarts=2)
    await s.judged_after(now())
    s.runners[0].silence()
    await s.wait_for(AllocationReleased, lost_release(grant))

    regrant: AllocationGranted | None = None
    if newer != "none":
        s.runner("n2")
        (regrant,) = await s.wait_for(AllocationGranted, lambda g: g.node_id == "n2")
        assert regrant.attempt == 1
        if newer == "started":
            await s.send(started(regrant), "job-1")
    finished_at = now()
    await s.send(succeeded(grant, finished_at), "job-1")

    job = await s.job()
    assert job["status"] == "SUCCEEDED"
    assert "after its node was lost" in job["status_reason"]
    releases = await s.wait_for(
        AllocationReleased, lambda r: r.allocation_id == grant.allocation_id, count=2
    )
    assert [r.outcome for r in releases] == ["lost", "succeeded"]
    assert releases[1].released_at == finished_at  # what it really ran
    assert [e.id for e in s.envelopes(AllocationReleased) if e.data is releases[1]] == [
        f"late-success:{grant.allocation_id}"
    ]
    # The scheduler says the success again as its verdict: the other services saw that
    # allocation end, so they would not take the runner's word for it.
    await until(lambda: _verdicts(s))
    (verdict,) = _verdicts(s)
    assert verdict.id == f"kept-success:{grant.allocation_id}"
    assert verdict.nats_subject == "trainyard.job.succeeded.v1.by-scheduler"
    assert isinstance(verdict.data, JobSucceeded)
    assert (verdict.data.allocation_id, verdict.data.finished_at) == (
        grant.allocation_id,
        finished_at,
    )
    if regrant is not None:
        (stopped,) = await s.wait_for(
            AllocationReleased, lambda r: r.allocation_id == regrant.allocation_id
        )
        assert stopped.outcome == "cancelled"
        (fenced,) = await s.wait_for(
            AllocationRevoked, lambda r: r.allocation_id == regrant.allocation_id
        )
        assert (fenced.reason, fenced.node_id) == ("fenced", "n2")
        live_rows = await s.pool.fetchval(
            "SELECT count(*) FROM allocations WHERE released_at IS NULL"
        )
        assert live_rows == 0

    # Billed once per allocation: n1's bill amended to the real interval, one row each.
    assert s.billing is not None
    billing = s.billing

    expected = [grant.allocation_id] + ([regrant.allocation_id] if regrant else [])

    async def billed() -> bool:
        # n1's bill amended, and the newer attempt's release (if any) billed: both arrive
        # as events, in no particular order.
        amended = await billing.fetchval(
            "SELECT outcome = 'succeeded' FROM usage_ledger WHERE allocation_id = $1",
            grant.allocation_id,
        )
        count = await billing.fetchval("SELECT count(*) FROM usage_ledger")
        return bool(amended) and count >= len(expected)

    await until(billed)
    rows = await billing.fetch("SELECT * FROM usage_ledger ORDER BY started_at")
    assert [r["allocation_id"] for r in rows] == expected
    first = rows[0]
    assert (first["started_at"], first["ended_at"]) == (grant.granted_at, finished_at)
    real = Decimal((finished_at - grant.granted_at).total_seconds()).quantize(Decimal("0.000001"))
    assert first["gpu_seconds"] == real
    costs = await s.wait_for(
        CostRecorded, lambda c: c.allocation_id == grant.allocation_id, count=2
    )
    assert costs[-1].ended_at == finished_at
    assert costs[-1].cost > costs[0].cost

    # Not run again, and said only once: a repeated report changes nothing.
    await s.send(succeeded(grant, now()), "job-1")
    await asyncio.sleep(5 * 0.2)  # a few passes
    assert len(s.events(AllocationGranted)) == (1 if regrant is None else 2)
    assert len(s.events(AllocationReleased, lambda r: r.allocation_id == grant.allocation_id)) == 2
    assert (await s.job())["status"] == "SUCCEEDED"
    assert len(await billing.fetch("SELECT 1 FROM usage_ledger")) == len(expected)


async def test_a_stale_allocations_late_progress_is_still_refused(live: Start) -> None:
    """After n1 was lost and the job's newer attempt started on n2, n1's runner's late
    start, checkpoint, failure, preemption, and a success at another epoch change nothing."""
    s = await live()
    grant = await s.running_on("n1", max_restarts=2)
    await s.judged_after(now())
    s.runners[0].silence()
    await s.wait_for(AllocationReleased, lost_release(grant))
    s.runner("n2")
    (regrant,) = await s.wait_for(AllocationGranted, lambda g: g.node_id == "n2")
    await s.send(started(regrant), "job-1")
    before = await s.job()

    ref = CheckpointRef(uri="s3://b/c", manifest_uri="s3://b/m", step=10, size_bytes=1, sha256="0")
    late: list[Payload] = [
        started(grant),
        CheckpointSaved(
            job_id="job-1",
            allocation_id=grant.allocation_id,
            epoch=grant.epoch,
            checkpoint=ref,
            saved_at=now(),
        ),
        JobFailed(
            job_id="job-1",
            allocation_id=grant.allocation_id,
            node_id="n1",
            epoch=grant.epoch,
            finished_at=now(),
            exit_code=1,
            reason="crashed",
        ),
        JobPreempted(
            job_id="job-1",
            allocation_id=grant.allocation_id,
            node_id="n1",
            epoch=grant.epoch,
            finished_at=now(),
            reason="revoked",
        ),
        succeeded(grant, now(), epoch=regrant.epoch),  # another allocation's epoch
    ]
    for payload in late:
        await s.send(payload, "job-1")

    after = await s.job()
    assert (
        (after["status"], after["attempt"], after["restarts"])
        == (
            before["status"],
            before["attempt"],
            before["restarts"],
        )
        == ("RUNNING", 1, 1)
    )
    rows = await s.pool.fetch(
        "SELECT allocation_id::text, status, outcome FROM allocations ORDER BY epoch"
    )
    assert [(r["allocation_id"], r["status"], r["outcome"]) for r in rows] == [
        (grant.allocation_id, "RELEASED", "lost"),
        (regrant.allocation_id, "RUNNING", None),
    ]
    assert [r.allocation_id for r in s.events(AllocationReleased)] == [grant.allocation_id]
    assert len(s.events(AllocationGranted)) == 2

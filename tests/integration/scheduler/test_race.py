"""Two scheduler processes race over one Postgres and one NATS; the leader is killed with
SIGKILL in the middle of a stream of heartbeats and submissions.

What must hold: exactly one leads at a time, the follower takes over, no GPU ever has two
live leases, every job is known exactly once and ends up allocated or pending (with its
JobPending published), every allocation is announced exactly once, and the allocations that
were live when the leader died are still live afterwards (a takeover loses nothing).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import sys
from collections import Counter
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from nats.errors import TimeoutError as NatsTimeoutError

from tests.integration.scheduler.conftest import make_spec, until
from trainyard_platform.deploy.local.ports import free_port
from trainyard_platform.services.scheduler.service import NAME
from trainyard_platform.shared.bus import Bus
from trainyard_platform.shared.db import open_pool
from trainyard_platform.shared.events import Envelope, Payload, parse_envelope
from trainyard_platform.shared.events.payloads import (
    AllocationGranted,
    JobPending,
    JobSubmitted,
    RunnerHeartbeat,
)
from trainyard_platform.shared.events.trust import owner
from trainyard_platform.shared.settings import DatabaseSettings, NatsSettings

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
JOBS = 60
GPUS_PER_NODE = 4


class Replica:
    """One ``python -m trainyard_platform.services.scheduler`` process."""

    def __init__(self, name: str, process: asyncio.subprocess.Process, port: int, log: Path):
        self.name = name
        self.process = process
        self.url = f"http://127.0.0.1:{port}"
        self.log = log

    async def role(self, http: httpx.AsyncClient) -> str | None:
        if self.process.returncode is not None:
            return None
        try:
            response = await http.get(f"{self.url}/readyz")
        except httpx.TransportError:
            return None
        body = response.json()
        return str(body["role"]) if body.get("ready") else None


@contextlib.asynccontextmanager
async def replicas(
    database_url: str, nats: NatsSettings, tmp_path: Path, count: int
) -> AsyncIterator[list[Replica]]:
    started: list[Replica] = []
    try:
        for i in range(count):
            port = free_port()
            env = {
                **os.environ,
                "TRAINYARD_DATABASE_URL": database_url,
                "TRAINYARD_NATS_URL": nats.url,
                # Messages the dead leader held unacknowledged come back this soon.
                "TRAINYARD_NATS_ACK_WAIT_SECONDS": "2",
                "TRAINYARD_NATS_RETRY_DELAY_SECONDS": "0.1",
                "TRAINYARD_SCHEDULER_PORT": str(port),
                "TRAINYARD_SCHEDULER_LEADER_RETRY_SECONDS": "0.2",
                "TRAINYARD_SCHEDULER_LEADER_CHECK_SECONDS": "0.5",
                "TRAINYARD_SCHEDULER_PASS_INTERVAL_SECONDS": "0.5",
                # The test sends each heartbeat once; nodes must not be declared lost.
                "TRAINYARD_SCHEDULER_NODE_TIMEOUT_SECONDS": "3600",
                "TRAINYARD_SCHEDULER_SHUTDOWN_GRACE_SECONDS": "10",
                "TRAINYARD_SCHEDULER_ADMIN_TOKEN": "race-test-operator-token",
            }
            log = tmp_path / f"scheduler-{i}.log"
            with log.open("wb") as out:
                process = await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    "trainyard_platform.services.scheduler",
                    cwd=ROOT,
                    env=env,
                    stdout=out,
                    stderr=out,
                )
            started.append(Replica(f"scheduler-{i}", process, port, log))
        yield started
    finally:
        for replica in started:
            if replica.process.returncode is None:
                replica.process.send_signal(signal.SIGTERM)
        for replica in started:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(replica.process.wait(), timeout=30)
            if replica.process.returncode is None:
                replica.process.kill()
                await replica.process.wait()


async def roles(http: httpx.AsyncClient, group: list[Replica]) -> list[str | None]:
    return [await r.role(http) for r in group]


def heartbeat(node_id: str) -> tuple[Payload, str]:
    beat = RunnerHeartbeat(
        node_id=node_id,
        hostname=f"{node_id}.local",
        gpu_flavor="cpu",
        gpu_count=GPUS_PER_NODE,
        sent_at=datetime.now(UTC),
    )
    return beat, node_id


def submission(i: int, rng: random.Random) -> tuple[Payload, str]:
    job_id = f"job-{i:03d}"
    spec = make_spec(gpus=rng.randint(1, GPUS_PER_NODE), team=f"team-{i % 3}")
    return JobSubmitted(job_id=job_id, spec=spec, submitted_at=datetime.now(UTC)), job_id


async def settled(pool: asyncpg.Pool) -> bool:
    """Every job known, each allocated or told why it waits, every event published."""
    row = await pool.fetchrow(
        """SELECT count(*) AS jobs,
                  count(*) FILTER (WHERE status = 'QUEUED' AND pending_reason IS NULL) AS unsaid,
                  (SELECT count(*) FROM outbox WHERE published_at IS NULL) AS unpublished
           FROM jobs"""
    )
    return bool(row["jobs"] == JOBS and row["unsaid"] == 0 and row["unpublished"] == 0)


async def test_the_follower_takes_over_and_nothing_is_lost_or_leased_twice(
    database_url: str, nats_settings: NatsSettings, tmp_path: Path
) -> None:
    rng = random.Random(7)
    seen: list[Envelope[Payload]] = []

    async def collect(msg: Any) -> None:
        seen.append(parse_envelope(msg.data))

    async with (
        replicas(database_url, nats_settings, tmp_path, 2) as group,
        httpx.AsyncClient(timeout=2) as http,
        Bus.connect(nats_settings, "race-test") as bus,
        open_pool(DatabaseSettings(url=database_url), NAME) as pool,
    ):

        async def one_leader() -> bool:
            for replica in group:
                assert replica.process.returncode is None, replica.log.read_text()
            found = await roles(http, group)
            return sorted(found, key=str) == ["follower", "leader"]

        await until(one_leader, timeout=90)
        leader, follower = sorted(group, key=lambda r: r.name)
        if (await roles(http, group))[0] != "leader":
            leader, follower = follower, leader
        await bus.nats.subscribe("trainyard.>", cb=collect)

        async def publish(payload: Payload, subject: str) -> None:
            await bus.publish(Envelope.wrap(payload, source=owner(payload), subject=subject))

        for n in range(1, 5):
            await publish(*heartbeat(f"n{n}"))
        for i in range(JOBS // 2):
            await publish(*submission(i, rng))

        # Kill the leader in the middle of the stream: some of it handled, some not.
        await until(lambda: pool.fetchval("SELECT count(*) >= 10 FROM jobs"), timeout=30)
        live_before = {
            r["allocation_id"]
            for r in await pool.fetch(
                "SELECT allocation_id FROM allocations WHERE released_at IS NULL"
            )
        }
        leader.process.send_signal(signal.SIGKILL)
        assert await asyncio.wait_for(leader.process.wait(), timeout=10) == -signal.SIGKILL

        for n in range(5, 9):
            await publish(*heartbeat(f"n{n}"))
        for i in range(JOBS // 2, JOBS):
            await publish(*submission(i, rng))

        async def follower_leads() -> bool:
            return await follower.role(http) == "leader"

        await until(follower_leads, timeout=20)
        await until(lambda: settled(pool), timeout=60)

        # No GPU was ever leased twice (the index forbids it; nothing even tried to go around).
        doubles = await pool.fetch(
            "SELECT node_id, gpu_index FROM gpu_leases WHERE released_at IS NULL "
            "GROUP BY node_id, gpu_index HAVING count(*) > 1"
        )
        assert doubles == []
        outside = await pool.fetchval(
            "SELECT count(*) FROM gpu_leases l JOIN nodes n USING (node_id) "
            "WHERE l.released_at IS NULL AND l.gpu_index >= n.gpu_count"
        )
        assert outside == 0
        # Every job exactly once; each allocated one holds exactly its GPUs in one gang.
        jobs = await pool.fetch("SELECT job_id, status, gpus FROM jobs ORDER BY job_id")
        assert [j["job_id"] for j in jobs] == [f"job-{i:03d}" for i in range(JOBS)]
        assert {j["status"] for j in jobs} <= {"ALLOCATED", "QUEUED"}
        held = {
            r["job_id"]: (r["gangs"], r["gpus"])
            for r in await pool.fetch(
                "SELECT job_id, count(DISTINCT gang_id) AS gangs, "
                "sum(cardinality(gpu_indices)) AS gpus FROM allocations "
                "WHERE released_at IS NULL GROUP BY job_id"
            )
        }
        allocated = {j["job_id"]: j["gpus"] for j in jobs if j["status"] == "ALLOCATED"}
        assert allocated, "nothing was placed"
        assert held == {job_id: (1, gpus) for job_id, gpus in allocated.items()}
        assert (
            await pool.fetchval("SELECT count(*) FROM allocations WHERE released_at IS NOT NULL")
            == 0
        )
        # The takeover lost nothing that was live.
        live_after = {
            r["allocation_id"]
            for r in await pool.fetch(
                "SELECT allocation_id FROM allocations WHERE released_at IS NULL"
            )
        }
        assert live_before <= live_after

        # Every allocation announced exactly once, and only those.
        await until(lambda: len({e.id for e in seen}) >= 1, timeout=5)

        async def all_heard() -> bool:
            granted = {e.data.allocation_id for e in seen if isinstance(e.data, AllocationGranted)}
            return granted == {str(a) for a in live_after}

        await until(all_heard, timeout=20)
        # Counted in the stream, not on the plain subscription: a relay that died between
        # publishing and marking re-publishes after the takeover, and core subscribers see
        # that copy, but JetStream drops it by its Nats-Msg-Id; consumers read the stream.
        stored = await stream_events(bus, "trainyard.allocation.granted.v1.>")
        grants = Counter(e.id for e in stored)
        assert set(grants.values()) == {1}
        per_allocation = Counter(
            e.data.allocation_id for e in stored if isinstance(e.data, AllocationGranted)
        )
        assert set(per_allocation.values()) == {1}
        assert set(per_allocation) == {str(a) for a in live_after}
        # Every waiting job was told why, with the reason the database holds.
        waiting = {
            r["job_id"]: r["pending_reason"]
            for r in await pool.fetch(
                "SELECT job_id, pending_reason FROM jobs WHERE status = 'QUEUED'"
            )
        }

        async def all_told() -> bool:
            told: dict[str, str] = {}
            for e in seen:
                if isinstance(e.data, JobPending):
                    told[e.data.job_id] = e.data.reason
            return all(told.get(job_id) == reason for job_id, reason in waiting.items())

        await until(all_told, timeout=20)
        assert follower.process.returncode is None, follower.log.read_text()


async def stream_events(bus: Bus, subject: str) -> list[Envelope[Payload]]:
    """Every event stored in the TRAINYARD stream on ``subject``, read by an ephemeral
    consumer."""
    sub = await bus.jetstream.pull_subscribe(subject, stream="TRAINYARD")
    found: list[Envelope[Payload]] = []
    try:
        while True:
            try:
                batch = await sub.fetch(256, timeout=1)
            except (TimeoutError, NatsTimeoutError):
                break
            for msg in batch:
                found.append(parse_envelope(msg.data))
                await msg.ack()
    finally:
        await sub.unsubscribe()
    return found

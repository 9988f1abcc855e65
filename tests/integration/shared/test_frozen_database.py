"""A PostgreSQL that takes connections but never answers (paused with SIGSTOP, as a hung
server or a stalled network path looks to a client): a service answers its requests that
need the database with 503 naming it, within its timeouts, says it is not ready, keeps the
events that came meanwhile (none dead-lettered), and works again once PostgreSQL resumes,
without a restart and with nothing lost.

The billing service runs as a process against a PostgreSQL of this module's own (its
timeouts set short, so the test is quick); every service opens its pool the same way
(``shared.db.open_pool``)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sys
import tempfile
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from tests.integration.billing.conftest import grant_of, release_event, until
from trainyard_platform.deploy.local.ports import free_port
from trainyard_platform.deploy.local.postgres import PostgresServer
from trainyard_platform.shared.bus import Bus, infrastructure_fault
from trainyard_platform.shared.db import migrate, open_pool
from trainyard_platform.shared.events import Envelope
from trainyard_platform.shared.events.payloads import AllocationReleased, JobCancelRequested
from trainyard_platform.shared.events.trust import SUBMISSION
from trainyard_platform.shared.outbox import enqueue
from trainyard_platform.shared.settings import DatabaseSettings, NatsSettings

pytestmark = pytest.mark.integration

EMPTY = Path(__file__).parent / "no-migrations"

ROOT = Path(__file__).resolve().parents[3]
TOKEN = {"Authorization": "Bearer op-token"}
T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


@pytest.fixture(scope="module")
def own_postgres() -> Iterator[PostgresServer]:
    """A PostgreSQL of this module's own, since its test pauses it."""
    folder = Path(tempfile.mkdtemp(prefix="trainyard-frozen-"))
    server = PostgresServer(folder / "pgdata")
    server.start()
    try:
        yield server
    finally:
        server.stop()  # resumes a paused server first
        shutil.rmtree(folder, ignore_errors=True)


def released(n: int) -> AllocationReleased:
    return AllocationReleased(
        allocation_id=f"a{n}",
        job_id=f"j{n}",
        node_id="node-1",
        team="nlp",
        user="ada",
        gpu_flavor="h100",
        gpus=1,
        granted_at=T0,
        released_at=T0 + timedelta(hours=1),
        outcome="succeeded",
    )


async def test_a_frozen_database_is_a_503_not_ready_and_nothing_is_lost(
    own_postgres: PostgresServer, nats_settings: NatsSettings, tmp_path: Path
) -> None:
    name = f"frozen_{uuid.uuid4().hex}"
    dsn = own_postgres.create_database(name)
    port = free_port()
    env = {
        **os.environ,
        "TRAINYARD_DATABASE_URL": dsn,
        "TRAINYARD_DATABASE_QUERY_TIMEOUT_SECONDS": "1",
        "TRAINYARD_DATABASE_ACQUIRE_TIMEOUT_SECONDS": "1",
        "TRAINYARD_DATABASE_CONNECT_TIMEOUT_SECONDS": "1",
        "TRAINYARD_NATS_URL": nats_settings.url,
        "TRAINYARD_NATS_OUTAGE_RETRY_MAX_SECONDS": "1",
        "TRAINYARD_BILLING_PORT": str(port),
        "TRAINYARD_BILLING_PRICES": json.dumps({"h100": 4.0}),
        "TRAINYARD_BILLING_ADMIN_TOKEN": "op-token",
    }
    log_path = tmp_path / "billing.log"
    with log_path.open("wb") as log:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "trainyard_platform.services.billing",
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=log,
        )
    paused = False
    try:
        # Far longer than the service needs (a statement's 1 s, and as long again for its
        # cancellation); without the timeouts the request never ended.
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=20) as http:

            async def ready() -> bool:
                assert process.returncode is None, log_path.read_text()
                try:
                    return (await http.get("/readyz")).status_code == 200
                except httpx.TransportError:
                    return False

            async def billed(*jobs: str) -> bool:
                response = await http.get("/v1/usage", params={"team": "nlp"}, headers=TOKEN)
                assert response.status_code == 200, response.text
                return sorted(j["job_id"] for j in response.json()["jobs"]) == list(jobs)

            await until(ready, timeout=60)
            async with Bus.connect(nats_settings, "frozen-test") as bus:
                await bus.publish(grant_of(released(1)))
                await bus.publish(release_event(released(1)))
                await until(lambda: billed("j1"), timeout=30)

                await asyncio.to_thread(own_postgres.send_signal, signal.SIGSTOP)
                paused = True
                await bus.publish(grant_of(released(2)))
                await bus.publish(release_event(released(2)))

                for _ in range(2):  # the first meets a pooled connection, the next a new one
                    response = await http.get("/v1/usage", params={"team": "nlp"}, headers=TOKEN)
                    assert response.status_code == 503, response.text
                    assert response.json() == {
                        "detail": "temporarily unavailable (the database is not answering), "
                        "try again",
                        "errors": [],
                    }
                    assert response.headers["Retry-After"] == "5"
                readyz = await http.get("/readyz")
                assert readyz.status_code == 503
                assert readyz.json()["checks"]["database"] is False

                await asyncio.to_thread(own_postgres.send_signal, signal.SIGCONT)
                paused = False
                await until(ready, timeout=30)
                await until(lambda: billed("j1", "j2"), timeout=30)
                dead = await bus.jetstream.stream_info(nats_settings.deadletter_stream)
                assert dead.state.messages == 0  # waited out, not dead-lettered
            assert process.returncode is None, log_path.read_text()
            assert "PostgreSQL not answering" in log_path.read_text()
    finally:
        if paused:
            await asyncio.to_thread(own_postgres.send_signal, signal.SIGCONT)
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(process.wait(), timeout=60)
        await asyncio.to_thread(own_postgres.drop_database, name)
    assert code == 0, log_path.read_text()


async def test_a_transaction_cut_short_by_the_timeout_leaves_nothing_behind(
    own_postgres: PostgresServer,
) -> None:
    """A decision and its outbox event are written in one transaction (the scheduler's
    leases, every handler's effects): one whose statement times out while PostgreSQL is
    paused is rolled back whole once it resumes, the half already written with it."""
    name = f"frozen_{uuid.uuid4().hex}"
    dsn = own_postgres.create_database(name)
    settings = DatabaseSettings(url=dsn, query_timeout_seconds=1, acquire_timeout_seconds=1)
    paused = False
    try:
        async with open_pool(settings, "t") as pool:
            await migrate(pool, "t", EMPTY)
            await pool.execute("CREATE TABLE decisions (job_id text NOT NULL)")
            event = Envelope.wrap(
                JobCancelRequested(job_id="j1", team="t", user="u"), source=SUBMISSION, subject="j1"
            )
            with pytest.raises(TimeoutError) as timed_out:
                async with pool.acquire() as conn, conn.transaction():
                    await conn.execute("INSERT INTO decisions VALUES ('j1')")
                    await enqueue(conn, event)
                    await asyncio.to_thread(own_postgres.send_signal, signal.SIGSTOP)
                    paused = True
                    await conn.execute("INSERT INTO decisions VALUES ('j2')")
            fault = infrastructure_fault(timed_out.value)
            assert fault is not None and fault.startswith("PostgreSQL not answering")

            await asyncio.to_thread(own_postgres.send_signal, signal.SIGCONT)
            paused = False
            assert await pool.fetchval("SELECT count(*) FROM decisions") == 0
            assert await pool.fetchval("SELECT count(*) FROM outbox") == 0
            async with pool.acquire() as conn, conn.transaction():  # and it works again
                await conn.execute("INSERT INTO decisions VALUES ('j3')")
                await enqueue(conn, event)
            assert await pool.fetchval("SELECT count(*) FROM outbox") == 1
    finally:
        if paused:
            await asyncio.to_thread(own_postgres.send_signal, signal.SIGCONT)
        await asyncio.to_thread(own_postgres.drop_database, name)

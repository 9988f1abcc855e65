"""``node.supplied`` with the real scheduler pieces on NATS and PostgreSQL: a node's supply is
said with a version kept in the scheduler's database, only when it changes, a node flipping
its claim at most once a minute, and every ready node's again at a leader's start (and
hourly) without a scheduling pass.

Before, each judgement was said, ordered by the scheduler's clock (``judged_at``: two leaders
or a clock step could have billing keep an older one), a node alternating its claim was said
at every heartbeat, and a node judged while billing could not hear it was never said again
until its claim, declaration or the inventory mode changed."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta

import asyncpg
import httpx
import pytest

from tests.fixtures.tcp_proxy import TcpProxy
from tests.integration.scheduler.conftest import Scheduler, Tuned, until
from tests.integration.scheduler.test_node_inventory import AUTH, CREATE, http
from trainyard_platform.services.scheduler.inventory import InventoryMode
from trainyard_platform.services.scheduler.node_supply import SupplyHerald
from trainyard_platform.shared.db import open_pool
from trainyard_platform.shared.events.payloads import NodeSupplied
from trainyard_platform.shared.settings import DatabaseSettings

pytestmark = pytest.mark.integration

__all__ = ["http"]  # the fixture


def failed_rounds(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage().startswith("saying node supplies failed")]


async def said_in_outbox(pool: asyncpg.Pool, node_id: str) -> int:
    count: int = await pool.fetchval(
        "SELECT count(*) FROM outbox WHERE subject = $1", f"trainyard.node.supplied.v1.{node_id}"
    )
    return count


async def declared(http: httpx.AsyncClient, node_id: str, gpus: int) -> None:
    assert (await http.put("/v1/admin/flavors/cpu", json={}, headers=AUTH)).is_success
    body = {"gpu_flavor": "cpu", "gpu_count": gpus}
    made = await http.put(f"/v1/admin/node-inventory/{node_id}", json=body, headers=CREATE)
    assert made.status_code == 201, made.text


async def a_minute_passes(scheduler: Scheduler, node_id: str) -> None:
    """As if the node's supply was last said two minutes ago (no test waits a minute)."""
    await scheduler.pool.execute(
        "UPDATE nodes SET supply_said_at = supply_said_at - interval '2 minutes' "
        "WHERE node_id = $1",
        node_id,
    )


async def test_a_supply_is_said_with_its_version_only_when_it_changes_and_a_flipping_claim_at_most_once_a_minute(
    scheduler_with: Tuned, http: httpx.AsyncClient
) -> None:
    scheduler = await scheduler_with(node_inventory=InventoryMode.REQUIRED)
    await declared(http, "n1", 8)
    await scheduler.heartbeat("n1", gpus=8)
    (first,) = await scheduler.wait_for(NodeSupplied)
    assert (first.gpu_flavor, first.gpu_count, first.sequence) == ("cpu", 8, 1)

    # Judged again (another claim), the same supply: the declaration caps it at 8.
    await scheduler.heartbeat("n1", gpus=16)
    # The node flips its claim: each a new version, none said within the minute.
    for gpus in (4, 8, 4):
        await scheduler.heartbeat("n1", gpus=gpus)
    assert await said_in_outbox(scheduler.pool, "n1") == 1
    version = await scheduler.pool.fetchval("SELECT supply_version FROM nodes WHERE node_id = 'n1'")
    assert version == 4

    # Once the minute is over, its next heartbeat (the same claim) says the latest.
    await a_minute_passes(scheduler, "n1")
    await scheduler.heartbeat("n1", gpus=4)
    said = await scheduler.wait_for(NodeSupplied, count=2)
    assert [(s.gpu_count, s.sequence) for s in said] == [(8, 1), (4, 4)]
    await scheduler.heartbeat("n1", gpus=4)
    assert await said_in_outbox(scheduler.pool, "n1") == 2

    # An operator's change is said at once, within the minute.
    changed = await http.put(
        "/v1/admin/node-inventory/n1",
        json={"gpu_flavor": "cpu", "gpu_count": 2},
        headers=AUTH,
    )
    assert changed.is_success, changed.text
    await scheduler.heartbeat("n1", gpus=4)
    said = await scheduler.wait_for(NodeSupplied, count=3)
    assert (said[-1].gpu_count, said[-1].sequence) == (2, 5)


async def test_the_herald_says_every_ready_judged_node_again_in_bounded_batches(
    scheduler: Scheduler,
) -> None:
    """Nodes judged (and said) while, say, billing was not yet listening are said again with
    the versions they have, a batch per transaction; a lost node, and one never judged (as
    after the scheduler's 0016), are not: the latter is judged and said at its next
    heartbeat. No pass is asked for: the herald has no way to ask."""
    for node in ("n1", "n2", "n3", "n4"):
        await scheduler.heartbeat(node, gpus=2)
    await scheduler.wait_for(NodeSupplied, count=4)
    await scheduler.pool.execute(
        "UPDATE nodes SET status = 'LOST', lost_at = now() WHERE node_id = 'n3'"
    )
    await scheduler.pool.execute("UPDATE nodes SET inventory_mode = NULL WHERE node_id = 'n4'")

    herald = SupplyHerald(scheduler.pool, batch=1)
    assert await herald.say_since(datetime.now(UTC)) == 2
    again = await scheduler.wait_for(NodeSupplied, count=6)
    assert sorted((s.node_id, s.sequence) for s in again[4:]) == [("n1", 1), ("n2", 1)]
    assert await herald.say_since(datetime.now(UTC) - timedelta(hours=1)) == 0

    # A clock stepped back a day: the round still ends, each node said once.
    behind = SupplyHerald(scheduler.pool, lambda: datetime.now(UTC) - timedelta(days=1), batch=1)
    assert await behind.say_since(datetime.now(UTC)) == 2


async def test_a_leader_says_at_its_start_the_supply_of_nodes_not_said_in_its_term(
    scheduler: Scheduler,
) -> None:
    await scheduler.heartbeat("n1", gpus=2)
    await scheduler.wait_for(NodeSupplied)
    stop = asyncio.Event()
    herald = SupplyHerald(scheduler.pool, interval_s=3600)
    run = asyncio.create_task(herald.run(stop))
    try:
        said = await scheduler.wait_for(NodeSupplied, count=2)
        assert [(s.node_id, s.sequence) for s in said] == [("n1", 1), ("n1", 1)]
    finally:
        stop.set()
        await run


async def test_a_leader_that_starts_in_a_database_outage_says_its_term_s_supplies_once_it_ends(
    scheduler: Scheduler, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The herald's first round fails while PostgreSQL is unreachable: it is tried again,
    still for every node not said in the term, as soon as the database answers, not an
    ``interval_s`` later."""
    await scheduler.heartbeat("n1", gpus=2)
    await scheduler.wait_for(NodeSupplied)
    async with TcpProxy.to_postgres(database_url) as proxy:
        settings = DatabaseSettings(
            url=proxy.postgres_url(database_url),
            pool_min_size=1,
            connect_timeout_seconds=5.0,
            acquire_timeout_seconds=5.0,
        )
        async with open_pool(settings, "scheduler") as pool:
            await proxy.cut()
            stop = asyncio.Event()
            run = asyncio.create_task(SupplyHerald(pool, interval_s=3600).run(stop))
            try:
                await until(lambda: failed_rounds(caplog))  # its first round met the outage
                assert failed_rounds(caplog)[0].levelno == logging.WARNING  # an outage
                assert not run.done()  # survived it
                proxy.restore()
                said = await scheduler.wait_for(NodeSupplied, count=2)
                assert [(s.node_id, s.sequence) for s in said] == [("n1", 1), ("n1", 1)]
            finally:
                stop.set()
                await run

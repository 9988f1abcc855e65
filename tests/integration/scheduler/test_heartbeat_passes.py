"""Which heartbeats ask for a scheduling pass, with the real scheduler pieces (leader work,
passes, admin API) on NATS and PostgreSQL: only one that changes what a pass reads of its
node (a new node, one back from lost, other GPUs, flavor or topology), and a capped claim is
warned of when the cap starts or what the node gets changes.

Before, every heartbeat whose claim differed from what the node was judged by, or whose
change of supply had waited a minute to be said, asked for a pass and logged its capped
fields: a node claiming 16 and 32 GPUs in turn against a declared 8 (placed on 8 each time)
cost a pass at every heartbeat, and the arrival fast path's kept pass with it."""

from __future__ import annotations

import logging

import httpx
import pytest

from tests.integration.scheduler.conftest import Scheduler, Tuned, until
from tests.integration.scheduler.test_metrics_queries import readings
from tests.integration.scheduler.test_node_inventory import AUTH, HANDLERS, http
from tests.integration.scheduler.test_node_supply_said import (
    a_minute_passes,
    declared,
    said_in_outbox,
)
from trainyard_platform.services.scheduler.loops import LeaderWork
from trainyard_platform.shared.events.payloads import NodeSupplied

pytestmark = pytest.mark.integration

__all__ = ["http"]  # the fixture


def capped_warnings(caplog: pytest.LogCaptureFixture, node_id: str) -> list[str]:
    """The warnings the scheduler logged of the node's capped fields, in order."""
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING
        and r.getMessage().startswith(f"node {node_id} capped by the node inventory")
    ]


async def settled(scheduler: Scheduler) -> LeaderWork:
    """The leader's work once no pass runs or is asked for, a settled one kept (the pass
    interval is long: every pass is one something asked for)."""
    work = scheduler.work
    assert work is not None
    await until(lambda: work.passes.idle_with_kept_pass)
    return work


async def heard_without_a_pass(scheduler: Scheduler, node_id: str, gpus: int) -> None:
    """A heartbeat that must ask for no pass: the kept pass is still current once it has
    been applied (one asked for is forgotten before the heartbeat commits)."""
    work = await settled(scheduler)
    passes = work.passes.passes
    await scheduler.heartbeat(node_id, gpus=gpus)
    assert work.passes.idle_with_kept_pass, f"a heartbeat claiming {gpus} GPUs asked for a pass"
    assert work.passes.passes == passes


async def heard_with_a_pass(scheduler: Scheduler, node_id: str, gpus: int) -> None:
    """A heartbeat that must ask for a pass: one runs after it."""
    work = await settled(scheduler)
    passes = work.passes.passes
    await scheduler.heartbeat(node_id, gpus=gpus)
    await until(lambda: work.passes.passes > passes)


async def test_a_claim_capped_the_same_at_every_heartbeat_asks_for_no_pass_and_is_warned_of_once(
    scheduler_with: Tuned, http: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=HANDLERS)
    await declared(http, "n1", 8)  # before the scheduler starts: no NOTIFY comes in between
    scheduler = await scheduler_with(pass_interval_s=60.0)
    await heard_with_a_pass(scheduler, "n1", 8)

    # Claiming 16 and 32 in turn against a declared 8: placed on 8 every time.
    for gpus in (16, 32, 16, 32, 16, 32):
        await heard_without_a_pass(scheduler, "n1", gpus)
    (warning,) = capped_warnings(caplog, "n1")  # when the cap started
    assert "(gpu_count): it claims 16 GPUs, declared 8: 8 are placed on" in warning
    capped = await readings(scheduler, "trainyard.scheduler.nodes.capped", "field")
    assert capped["gpu_count"] == 1  # still capped at each judgement
    assert await said_in_outbox(scheduler.pool, "n1") == 1  # its supply never changed

    # The figures of the cap change (a declaration of 6): a pass, and a warning again.
    work = await settled(scheduler)
    passes = work.passes.passes
    patched = await http.patch("/v1/admin/node-inventory/n1", json={"gpu_count": 6}, headers=AUTH)
    assert patched.status_code == 200, patched.text
    await until(lambda: work.passes.passes > passes)  # the pass its NOTIFY asks for
    await heard_with_a_pass(scheduler, "n1", 32)
    assert "claims 32 GPUs, declared 6: 6 are placed on" in capped_warnings(caplog, "n1")[-1]
    await heard_without_a_pass(scheduler, "n1", 16)

    # Fewer GPUs than declared: a pass, no cap; then capped again: a pass, warned again.
    await heard_with_a_pass(scheduler, "n1", 4)
    await heard_without_a_pass(scheduler, "n1", 4)
    await heard_with_a_pass(scheduler, "n1", 16)
    assert len(capped_warnings(caplog, "n1")) == 3
    assert "claims 16 GPUs, declared 6" in capped_warnings(caplog, "n1")[-1]


async def test_a_plain_heartbeat_asks_for_a_pass_only_when_the_node_changes(
    scheduler_with: Tuned,
) -> None:
    """No inventory (``optional``): the node is placed on as it claims."""
    scheduler = await scheduler_with(pass_interval_s=60.0)
    await heard_with_a_pass(scheduler, "n1", 4)
    await heard_without_a_pass(scheduler, "n1", 4)
    await heard_with_a_pass(scheduler, "n1", 8)  # other GPUs (said after the minute)
    await heard_without_a_pass(scheduler, "n1", 8)

    # The change held back is said at the first heartbeat after the minute: no pass.
    await a_minute_passes(scheduler, "n1")
    await heard_without_a_pass(scheduler, "n1", 8)
    said = await scheduler.wait_for(NodeSupplied, count=2)
    assert [(s.gpu_count, s.sequence) for s in said] == [(4, 1), (8, 2)]

    # Never judged (as after the scheduler's 0016): judged again, no pass.
    await scheduler.pool.execute("UPDATE nodes SET inventory_mode = NULL WHERE node_id = 'n1'")
    await heard_without_a_pass(scheduler, "n1", 8)
    judged = await scheduler.pool.fetchval("SELECT inventory_mode FROM nodes WHERE node_id = 'n1'")
    assert judged == "optional"

    # Back from lost, claiming as before: a pass places on it again.
    await scheduler.pool.execute(
        "UPDATE nodes SET status = 'LOST', lost_at = now() WHERE node_id = 'n1'"
    )
    await heard_with_a_pass(scheduler, "n1", 8)

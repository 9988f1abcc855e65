"""The node inventory with the real scheduler pieces (leader work, passes, admin API) on NATS
and PostgreSQL: a node's heartbeat gets no more than an operator declared for it
(``PUT /v1/admin/node-inventory/{node_id}``); with the inventory required, an undeclared
node gets nothing; the operator is told which node claimed what (its log, the node list,
the declaration's view, a gauge).

Before, a heartbeat's flavor and GPU count were taken at their word: a node that said more
GPUs than it had, or a dearer flavor, drew grants of other teams' jobs."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import httpx
import pytest
from pydantic import SecretStr

from tests.integration.scheduler.conftest import Tuned
from tests.integration.scheduler.test_metrics_queries import readings
from trainyard_platform.services.scheduler.api import create_app
from trainyard_platform.services.scheduler.inventory import InventoryMode
from trainyard_platform.shared.access import service_guard
from trainyard_platform.shared.events.payloads import AllocationGranted, JobPending, NodeSupplied

pytestmark = pytest.mark.integration

TOKEN = "op-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
CREATE = {**AUTH, "If-None-Match": "*"}
HANDLERS = "trainyard_platform.services.scheduler.handlers"


@pytest.fixture
async def http(pool: asyncpg.Pool) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=create_app(pool, service_guard(SecretStr(TOKEN))))
    async with httpx.AsyncClient(transport=transport, base_url="http://scheduler") as client:
        yield client


async def listed_node(http: httpx.AsyncClient, node_id: str) -> dict[str, Any]:
    response = await http.get("/v1/queue", headers=AUTH)
    assert response.status_code == 200, response.text
    (node,) = [n for n in response.json()["nodes"] if n["node_id"] == node_id]
    return dict(node)


def warned(caplog: pytest.LogCaptureFixture, node_id: str, field: str) -> bool:
    """Whether the scheduler logged a warning naming the node and the field capped."""
    return any(
        r.levelno == logging.WARNING
        and f"node {node_id} " in r.getMessage()
        and f"({field})" in r.getMessage()
        for r in caplog.records
    )


async def test_a_required_inventory_gives_undeclared_nodes_nothing_and_declared_ones_their_declaration(
    scheduler_with: Tuned, http: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=HANDLERS)
    scheduler = await scheduler_with(node_inventory=InventoryMode.REQUIRED)

    # Undeclared: heard, listed, but no GPU, and its flavor is not made a flavor for it.
    await scheduler.heartbeat("n1", gpus=4)
    await scheduler.submit("job-1", gpus=1)
    await scheduler.wait_for(JobPending, lambda p: p.job_id == "job-1")
    assert not scheduler.events(AllocationGranted)
    shown = await listed_node(http, "n1")
    assert (shown["gpu_count"], shown["free_gpus"], shown["capped"]) == (0, [], ["undeclared"])
    assert warned(caplog, "n1", "undeclared")
    assert (await http.get("/v1/admin/flavors/cpu", headers=AUTH)).status_code == 404
    assert await readings(scheduler, "trainyard.scheduler.nodes.capped", "field") == {
        "undeclared": 1,
        "gpu_flavor": 0,
        "gpu_count": 0,
        "topology": 0,
    }

    # A declaration names a flavor that exists.
    declaration = {"gpu_flavor": "cpu", "gpu_count": 2, "description": "rack 4, slot 2"}
    refused = await http.put("/v1/admin/node-inventory/n1", json=declaration, headers=CREATE)
    assert refused.status_code == 422, refused.text
    (error,) = refused.json()["errors"]
    assert error["field"] == "gpu_flavor" and "unknown flavor cpu" in error["message"]
    assert (await http.put("/v1/admin/flavors/cpu", json={}, headers=AUTH)).status_code == 201
    made = await http.put("/v1/admin/node-inventory/n1", json=declaration, headers=CREATE)
    assert made.status_code == 201, made.text
    view = made.json()
    assert (view["gpu_flavor"], view["gpu_count"], view["topology"]) == ("cpu", 2, None)
    assert view["reported"]["gpu_count"] == 4
    (capped,) = view["capped"]
    assert capped["field"] == "gpu_count" and "claims 4 GPUs, declared 2" in capped["message"]
    again = await http.put("/v1/admin/node-inventory/n1", json=declaration, headers=CREATE)
    assert again.status_code == 412, again.text

    # Its next heartbeat, claiming as before, is judged by the declaration: two GPUs.
    await scheduler.heartbeat("n1", gpus=4)
    await scheduler.wait_for(AllocationGranted)
    await scheduler.submit("job-2", gpus=1)
    await scheduler.wait_for(AllocationGranted, count=2)
    await scheduler.submit("job-3", gpus=1)
    await scheduler.wait_for(JobPending, lambda p: p.job_id == "job-3")
    grants = scheduler.events(AllocationGranted)
    assert sorted(g.job_id for g in grants) == ["job-1", "job-2"]
    assert {i for g in grants for i in g.gpu_indices} == {0, 1}
    shown = await listed_node(http, "n1")
    assert (shown["gpu_count"], shown["capped"]) == (2, ["gpu_count"])
    assert warned(caplog, "n1", "gpu_count")
    entries = (await http.get("/v1/audit", headers=AUTH)).json()
    assert [(e["action"], e["target"]) for e in entries if "node-inventory" in e["action"]] == [
        ("put node-inventory", "n1")
    ]

    # Forgotten again: from its next heartbeat, nothing new is placed on it.
    read = await http.get("/v1/admin/node-inventory/n1", headers=AUTH)
    gone = await http.delete(
        "/v1/admin/node-inventory/n1", headers={**AUTH, "If-Match": read.headers["ETag"]}
    )
    assert gone.status_code == 204, gone.text
    await scheduler.heartbeat("n1", gpus=4)
    assert (await listed_node(http, "n1"))["capped"] == ["undeclared"]
    assert (await listed_node(http, "n1"))["gpu_count"] == 0


async def test_a_declared_node_claiming_another_flavor_gets_nothing_and_an_undeclared_one_its_word(
    scheduler_with: Tuned, http: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    """The default mode (``optional``), the local stack's: declarations still cap."""
    caplog.set_level(logging.WARNING, logger=HANDLERS)
    scheduler = await scheduler_with()
    for flavor in ("a100", "h200"):
        assert (await http.put(f"/v1/admin/flavors/{flavor}", json={}, headers=AUTH)).is_success
    declared = {"gpu_flavor": "a100", "gpu_count": 8, "topology": "rack-1"}
    made = await http.put("/v1/admin/node-inventory/n1", json=declared, headers=CREATE)
    assert made.status_code == 201, made.text
    assert made.json()["reported"] is None and made.json()["capped"] == []

    await scheduler.heartbeat("n1", gpus=8, flavor="h200", topology="rack-9")
    await scheduler.heartbeat("n2", gpus=2, flavor="h200")  # undeclared: taken at its word
    await scheduler.submit("job-1", gpus=1, flavor="h200")
    (grant,) = await scheduler.wait_for(AllocationGranted)
    assert grant.node_id == "n2"

    shown = await listed_node(http, "n1")
    assert (shown["gpu_flavor"], shown["gpu_count"], shown["topology"]) == ("a100", 0, "rack-1")
    assert shown["capped"] == ["gpu_flavor", "topology"]
    assert (await listed_node(http, "n2"))["capped"] == []
    assert warned(caplog, "n1", "gpu_flavor") and warned(caplog, "n1", "topology")
    assert not any("node n2 " in r.getMessage() for r in caplog.records)
    view = (await http.get("/v1/admin/node-inventory/n1", headers=AUTH)).json()
    assert view["reported"]["gpu_flavor"] == "h200"
    assert [c["field"] for c in view["capped"]] == ["gpu_flavor", "topology"]
    assert "claims flavor h200, declared a100" in view["capped"][0]["message"]
    assert await readings(scheduler, "trainyard.scheduler.nodes.capped", "field") == {
        "undeclared": 0,
        "gpu_flavor": 1,
        "gpu_count": 0,
        "topology": 1,
    }

    # A flavor a declaration names stays; the operator fixes the declaration with a patch.
    kept = await http.delete("/v1/admin/flavors/a100", headers=AUTH)
    assert kept.status_code == 409 and "declarations of nodes n1" in kept.json()["detail"]
    fixed = await http.patch(
        "/v1/admin/node-inventory/n1", json={"gpu_flavor": "h200", "topology": None}, headers=AUTH
    )
    assert fixed.status_code == 200, fixed.text
    assert fixed.json()["capped"] == [] and fixed.json()["topology"] is None
    await scheduler.heartbeat("n1", gpus=8, flavor="h200", topology="rack-9")
    shown = await listed_node(http, "n1")
    assert (shown["gpu_flavor"], shown["gpu_count"], shown["capped"]) == ("h200", 8, [])


async def test_an_undeclared_node_in_a_required_inventory_has_no_flavor_of_its_choosing(
    scheduler_with: Tuned, http: httpx.AsyncClient
) -> None:
    """Before, it kept the flavor it claimed with no GPU: a name the node chose became a
    label of the GPU gauges, and a node of that flavor once an operator created it."""
    scheduler = await scheduler_with(node_inventory=InventoryMode.REQUIRED)
    await scheduler.heartbeat("n1", gpus=8, flavor="chosen-by-n1", topology="rack-9")

    shown = await listed_node(http, "n1")
    assert (shown["gpu_flavor"], shown["gpu_count"], shown["capped"]) == ("", 0, ["undeclared"])
    # What it claims stays in sight of operators.
    assert shown["reported"] == {"gpu_flavor": "chosen-by-n1", "gpu_count": 8, "topology": "rack-9"}
    for gauge in ("trainyard.scheduler.gpus", "trainyard.scheduler.allocations"):
        assert not set(await readings(scheduler, gauge)) & {"chosen-by-n1", ""}
    made = await http.put("/v1/admin/flavors/chosen-by-n1", json={}, headers=AUTH)
    assert made.status_code == 201, made.text
    assert (made.json()["nodes"], made.json()["gpus"]) == (0, 0)
    # Deleting the flavor is not refused for the node's sake either.
    assert (await http.delete("/v1/admin/flavors/chosen-by-n1", headers=AUTH)).status_code == 204


async def test_the_supply_of_a_node_is_said_each_time_it_is_judged(
    scheduler_with: Tuned, http: httpx.AsyncClient
) -> None:
    """``node.supplied`` says what the scheduler places on a node (billing counts a node's
    GPUs from it, not from the node's claim): said when the node is judged, not at every
    heartbeat."""
    scheduler = await scheduler_with(node_inventory=InventoryMode.REQUIRED)
    await scheduler.heartbeat("n1", gpus=64)
    (undeclared,) = await scheduler.wait_for(NodeSupplied)
    assert (undeclared.node_id, undeclared.gpu_flavor, undeclared.gpu_count) == ("n1", "", 0)

    assert (await http.put("/v1/admin/flavors/cpu", json={}, headers=AUTH)).is_success
    declared = {"gpu_flavor": "cpu", "gpu_count": 8}
    made = await http.put("/v1/admin/node-inventory/n1", json=declared, headers=CREATE)
    assert made.status_code == 201, made.text
    await scheduler.heartbeat("n1", gpus=64)
    await scheduler.heartbeat("n1", gpus=64)  # the same claim: judged once
    said = await scheduler.wait_for(NodeSupplied, count=2)
    assert [(s.gpu_flavor, s.gpu_count) for s in said] == [("", 0), ("cpu", 8)]
    assert said[1].judged_at >= said[0].judged_at
    assert (
        await scheduler.pool.fetchval(
            "SELECT count(*) FROM outbox WHERE subject LIKE 'trainyard.node.supplied.v1.%'"
        )
        == 2
    )


async def test_a_node_undeclared_after_its_grants_keeps_them_in_the_totals(
    scheduler_with: Tuned, http: httpx.AsyncClient
) -> None:
    """The allocation totals never go down (a counter that does reads as a reset): a node
    whose declaration is deleted has no flavor, and its past grants still count under the
    flavor they were granted on."""
    scheduler = await scheduler_with(node_inventory=InventoryMode.REQUIRED)
    assert (await http.put("/v1/admin/flavors/cpu", json={}, headers=AUTH)).is_success
    declared = {"gpu_flavor": "cpu", "gpu_count": 8}
    made = await http.put("/v1/admin/node-inventory/n1", json=declared, headers=CREATE)
    assert made.status_code == 201, made.text
    await scheduler.heartbeat("n1", gpus=8)
    await scheduler.submit("job-1", gpus=1)
    await scheduler.wait_for(AllocationGranted)
    assert await readings(scheduler, "trainyard.scheduler.allocations") == {"cpu": 1}

    read = await http.get("/v1/admin/node-inventory/n1", headers=AUTH)
    gone = await http.delete(
        "/v1/admin/node-inventory/n1", headers={**AUTH, "If-Match": read.headers["ETag"]}
    )
    assert gone.status_code == 204, gone.text
    await scheduler.heartbeat("n1", gpus=8)
    assert (await listed_node(http, "n1"))["gpu_flavor"] == ""

    assert await readings(scheduler, "trainyard.scheduler.allocations") == {"cpu": 1}
    assert await readings(scheduler, "trainyard.scheduler.preemptions") == {"cpu": 0}

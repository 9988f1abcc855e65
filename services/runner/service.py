"""The runner's composition root: ``serve(settings)`` runs one node agent until SIGTERM."""

from __future__ import annotations

import asyncio
import logging

from services.runner import handlers
from services.runner.agent import NodeAgent
from services.runner.app import create_app
from services.runner.config import Settings
from services.runner.gpus import discover_gpus
from shared.bus import Bus
from shared.events import nats_subject
from shared.events.payloads import AllocationGranted, AllocationRevoked
from shared.runtime import ServiceRuntime
from shared.storage import open_store

log = logging.getLogger(__name__)


async def serve(settings: Settings) -> int:
    async with ServiceRuntime("runner", settings) as rt:
        gpus = await asyncio.to_thread(discover_gpus, settings.virtual_gpus)
        log.info(
            "node %s: %d %s GPUs (%s): %s",
            settings.node_id,
            gpus.count,
            settings.gpu_flavor,
            gpus.source,
            ", ".join(gpus.names) or "none",
        )
        store = await asyncio.to_thread(open_store, settings.storage.uri, settings.storage)
        bus = await rt.resources.enter_async_context(
            Bus.connect(settings.nats, f"runner-{settings.node_id}")
        )
        rt.add_readiness_check("nats", bus.ping)
        agent = NodeAgent(settings, bus, store, gpus, rt.stopping)
        await agent.recover()
        rt.spawn(agent.heartbeats(), "heartbeats")
        rt.spawn(agent.drain_on(rt.stopping), "drain")
        rt.spawn(
            bus.consume(
                f"runner-{settings.node_id}",
                [
                    nats_subject(AllocationGranted, settings.node_id),
                    nats_subject(AllocationRevoked, settings.node_id),
                ],
                handlers.dispatcher(agent),
                rt.stopping,
            ),
            "allocations",
        )
        return await rt.run(create_app(rt, agent))

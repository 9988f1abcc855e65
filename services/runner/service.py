"""The runner's composition root: ``serve(settings)`` runs one node agent until SIGTERM."""

from __future__ import annotations

import asyncio
import ctypes
import logging
import sys
from collections.abc import Coroutine
from typing import Any

from trainyard_platform.services.runner import handlers
from trainyard_platform.services.runner.agent import NodeAgent
from trainyard_platform.services.runner.app import create_app
from trainyard_platform.services.runner.config import Settings
from trainyard_platform.services.runner.gpus import discover_gpus
from trainyard_platform.services.runner.sandbox import (
    can_switch_users,
    claim_job_uids,
    remember_job_uids,
    remembered_first,
)
from trainyard_platform.shared.access import guard_for
from trainyard_platform.shared.bus import Bus
from trainyard_platform.shared.deadletters import deadletter_routes
from trainyard_platform.shared.runtime import (
    ServiceRuntime,
    needed,
    open_service_store,
    store_answers,
)

log = logging.getLogger(__name__)

_PR_SET_DUMPABLE = 4


def protect_runner(settings: Settings) -> None:
    """Close the runner to its own jobs: its work folder may be passed through (a job
    reaches its sandbox) but not listed, the jobs' logs (``jobs/``) and the ledger are the
    runner's alone (set at every start: an older runner or a lax umask may have left them
    open), and the process is made non-dumpable, so its ``/proc/<pid>/environ`` (bus, store
    credentials) is unreadable even to a job that runs as the same user (a runner that is
    not root)."""
    settings.work_dir.mkdir(parents=True, exist_ok=True)
    settings.work_dir.chmod(0o711)
    for private in ("jobs", "ledger"):
        (settings.work_dir / private).mkdir(mode=0o700, exist_ok=True)
        (settings.work_dir / private).chmod(0o700)
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)


async def serve(settings: Settings) -> int:
    async with ServiceRuntime("runner", settings) as rt:
        with needed("the runner's work folder", "TRAINYARD_RUNNER_WORK_DIR"):
            protect_runner(settings)
        gpus = await asyncio.to_thread(discover_gpus, settings.virtual_gpus)
        log.info(
            "node %s: %d %s GPUs (%s): %s",
            settings.node_id,
            gpus.count,
            settings.gpu_flavor,
            gpus.source,
            ", ".join(gpus.names) or "none",
        )
        store = await open_service_store(settings.storage)
        bus = await rt.resources.enter_async_context(
            Bus.connect(settings.nats, f"runner-{settings.node_id}")
        )
        rt.add_readiness_check("nats", bus.ping)
        rt.add_readiness_check("storage", lambda: store_answers(store))
        if can_switch_users():
            record = settings.work_dir / "job-uids"
            choices = remembered_first(settings.job_uid_choices, record)
            uids = rt.resources.enter_context(claim_job_uids(choices))
            if uids != choices[0]:
                log.warning(
                    "job uids %d-%d are held by another runner on this host: this node's "
                    "jobs run as %d-%d",
                    choices[0].start,
                    choices[0].stop - 1,
                    uids.start,
                    uids.stop - 1,
                )
            remember_job_uids(record, uids)
            settings = settings.model_copy(update={"job_uid_base": uids.start})
        agent = NodeAgent(settings, bus, store, gpus, rt.stopping)
        rt.work_begins()  # a stop from here drains the jobs recovered
        await agent.recover()
        for name, loop in agent_loops(agent, bus, rt.stopping).items():
            rt.spawn(loop, name)
        rt.sample_metrics(bus, f"runner-{settings.node_id}")
        guard = await rt.resources.enter_async_context(guard_for(settings))
        dead_letters = deadletter_routes(bus, f"runner-{settings.node_id}")
        return await rt.run(create_app(rt, agent, guard, dead_letters))


def agent_loops(
    agent: NodeAgent, bus: Bus, stop: asyncio.Event
) -> dict[str, Coroutine[Any, Any, None]]:
    """The work of a recovered node agent until ``stop``, by name: heartbeats, the drain on
    stop, and the consumer of this node's grants and revocations. ``serve`` runs them, and
    so does anything that runs a runner in-process (tests, benchmarks)."""
    node = agent.node_id
    return {
        "heartbeats": agent.heartbeats(),
        "drain": agent.drain_on(stop),
        "allocations": bus.consume(
            f"runner-{node}",
            handlers.subjects(node),
            handlers.dispatcher(agent),
            stop,
            redrive=False,  # one filter: the form of consumer create its NATS user may use
            parse=handlers.parse_event,  # a grant of an invalid spec fails its job
        ),
    }

"""The runner's HTTP surface: health, readiness, and ``GET /v1/node`` for operators.

``/v1/node`` shows the node's GPUs, the uids its jobs run as (null where they run as the
runner's own user), the network a job on this node alone runs in (``job_network``:
``loopback``, a network of its own, or ``host``) and the jobs it runs now (job and allocation ids, pids):
operators only (403 for users). Authentication is the shared guard (``shared.access``): the
``admin_token`` setting or, with ``identity_url``, a user token.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from litestar import Litestar, get
from litestar.handlers import HTTPRouteHandler
from litestar.types import Guard

from trainyard_platform.services.runner.agent import NodeAgent
from trainyard_platform.shared.access import needs
from trainyard_platform.shared.http_app import service_app
from trainyard_platform.shared.identity import Role
from trainyard_platform.shared.runtime import ServiceRuntime


def create_app(
    runtime: ServiceRuntime,
    agent: NodeAgent,
    guard: Guard,
    extra_routes: Sequence[HTTPRouteHandler] = (),
) -> Litestar:
    @get("/v1/node", sync_to_thread=False, opt=needs(Role.OPERATOR))
    def node() -> dict[str, Any]:
        return {
            "node_id": agent.node_id,
            "gpu_flavor": agent.settings.gpu_flavor,
            "gpus": {"source": agent.gpus.source, "names": list(agent.gpus.names)},
            "job_uids": (
                {"first": agent.job_uids.start, "last": agent.job_uids.stop - 1}
                if agent.job_uids is not None
                else None
            ),
            "job_network": agent.job_network,
            "running": [
                {
                    "job_id": run.job.job_id,
                    "allocation_id": run.job.allocation_id,
                    "epoch": run.job.epoch,
                    "attempt": run.job.attempt,
                    "pid": run.pid,
                    "started_at": run.started_at.isoformat(),
                    "stopping": run.stop_request.reason if run.stop_request else None,
                }
                for run in agent.running()
            ],
        }

    return service_app("runner", [*runtime.health_handlers(), node, *extra_routes], guard)

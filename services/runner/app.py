"""The runner's HTTP surface: health, readiness, and ``GET /v1/node`` for operators.

``/v1/node`` shows the node's GPUs and the jobs it runs now (job and allocation ids, pids):
an operator endpoint. Like every route but the probes it requires
``Authorization: Bearer <admin_token>`` (the ``admin_token`` setting; ``shared.operator_auth``).
"""

from __future__ import annotations

from typing import Any

from litestar import Litestar, get

from services.runner.agent import NodeAgent
from shared.http_tracing import tracing_middleware
from shared.operator_auth import admin_guard
from shared.runtime import ServiceRuntime


def create_app(runtime: ServiceRuntime, agent: NodeAgent) -> Litestar:
    @get("/v1/node", sync_to_thread=False)
    def node() -> dict[str, Any]:
        return {
            "node_id": agent.node_id,
            "gpu_flavor": agent.settings.gpu_flavor,
            "gpus": {"source": agent.gpus.source, "names": list(agent.gpus.names)},
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

    return Litestar(
        route_handlers=[*runtime.health_handlers(), node],
        guards=[admin_guard(agent.settings.admin_token)],
        middleware=[tracing_middleware],
    )

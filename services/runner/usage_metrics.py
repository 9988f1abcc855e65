"""Allocated GPUs that do no work: ``trainyard.runner.allocated_gpus`` by state.

Each running job's supervisor samples its GPUs' utilisation through NVML
(``services.runner.gpus``) and records it here (``record``); a scrape reports the node's
allocated GPUs as ``busy`` or ``idle``, idle when the job's latest mean utilisation over
its GPUs is under ``IDLE_PERCENT``. A job stops counting when its sampling ends
(``forget``). Nodes without NVML sample nothing and report no series.
"""

from __future__ import annotations

from typing import Final

from trainyard_platform.shared.metrics import observe

IDLE_PERCENT: Final = 5.0
"""Mean GPU utilisation (%) under which a job's GPUs count as idle."""

_latest: dict[int, tuple[int, float]] = {}
"""By sampling owner (``id`` of a job's supervisor): its GPU count and latest utilisation."""


def record(owner: object, gpus: int, utilization: float) -> None:
    _latest[id(owner)] = (gpus, utilization)


def forget(owner: object) -> None:
    _latest.pop(id(owner), None)


def readings() -> list[tuple[float, dict[str, str]]]:
    """``(GPUs, {"state": "busy" | "idle"})``; nothing while no job is sampled."""
    if not _latest:
        return []
    idle = sum(gpus for gpus, used in _latest.values() if used < IDLE_PERCENT)
    busy = sum(gpus for gpus, used in _latest.values() if used >= IDLE_PERCENT)
    return [(float(busy), {"state": "busy"}), (float(idle), {"state": "idle"})]


observe("trainyard.runner.allocated_gpus", readings)

"""Free-GPU maps and all-or-nothing gang fitting shared by the baseline policies.

Contract: a free map lists, per node id in id order, the node's free GPU indices in ascending
order. ``first_fit`` places a gang exactly as the engine requires (``cluster.gang_shape``): up
to 8 GPUs on the first node with room, a bigger gang as ``gpus // per_node`` nodes each giving
``per_node`` GPUs, first nodes first; it returns ``None`` rather than a partial gang.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from bench.simulator.cluster import gang_shape
from trainyard_platform.services.scheduler.policy.model import Node, Snapshot

FreeMap = dict[str, list[int]]
Gpus = dict[str, tuple[int, ...]]


def free_map(snapshot: Snapshot) -> FreeMap:
    """The GPUs nobody holds now, node by node in id order."""
    return {n.node_id: _free(n) for n in sorted(snapshot.nodes, key=lambda n: n.node_id)}


def held_map(placements: Iterable[Mapping[str, tuple[int, ...]]], order: Iterable[str]) -> FreeMap:
    """The GPUs of ``placements`` as a map over the nodes of ``order``."""
    held: FreeMap = {node: [] for node in order}
    for placement in placements:
        for node, indices in placement.items():
            held[node].extend(indices)
    return {node: sorted(ix) for node, ix in held.items()}


def merge(*maps: Mapping[str, list[int]]) -> FreeMap:
    """The union of free maps over the same nodes (in the first map's order)."""
    first = maps[0]
    return {node: sorted(set().union(*(m.get(node, ()) for m in maps))) for node in first}


def first_fit(gpus: int, free: Mapping[str, list[int]]) -> Gpus | None:
    """The first gang of ``gpus`` GPUs that fits in ``free`` (see the module docstring)."""
    count, per_node = gang_shape(gpus)
    fits = [node for node, ix in free.items() if len(ix) >= per_node][:count]
    if len(fits) < count:
        return None
    return {node: tuple(free[node][:per_node]) for node in fits}


def take(free: FreeMap, gpus: Mapping[str, tuple[int, ...]]) -> None:
    """Remove ``gpus`` from ``free`` (GPUs not in it are ignored)."""
    for node, indices in gpus.items():
        if node in free:
            gone = set(indices)
            free[node] = [i for i in free[node] if i not in gone]


def count(free: Mapping[str, list[int]]) -> int:
    return sum(len(ix) for ix in free.values())


def _free(node: Node) -> list[int]:
    if not node.used:
        return list(range(node.gpu_count))
    return [i for i in range(node.gpu_count) if i not in node.used]

"""The simulated cluster: nodes of 8 GPUs in racks, and how a gang splits across nodes.

Contract:
- ``build_cluster(total)`` gives exactly ``total`` GPUs: ``total // 8`` nodes of 8 GPUs and, if
  ``total`` is not a multiple of 8, one last node with the remainder (500 V100s of the Philly
  trace = 62 nodes of 8 + one node of 4). Nodes are grouped into racks of ``nodes_per_rack``
  in id order; the rack is the topology label a policy may use.
- ``gang_shape(gpus)`` is the shape a job must take: up to 8 GPUs on one node; more than 8 on
  the fewest nodes that split it equally: ``k = ceil(gpus / 8)`` nodes of 8 when ``gpus`` is a
  multiple of 8 (16, 24, 32, 64 in the trace), else the smallest ``k' >= k`` dividing ``gpus``
  (12 = 2 x 6, 20 = 4 x 5, the only such sizes in the trace: 7 jobs of 15,264).
"""

from __future__ import annotations

from dataclasses import dataclass

GPUS_PER_NODE = 8
NODES_PER_RACK = 8
FLAVOR = "v100"


@dataclass(frozen=True)
class SimNode:
    node_id: str
    gpus: int
    rack: str


def build_cluster(
    total_gpus: int, gpus_per_node: int = GPUS_PER_NODE, nodes_per_rack: int = NODES_PER_RACK
) -> tuple[SimNode, ...]:
    """Nodes holding exactly ``total_gpus`` GPUs (see the module docstring)."""
    if total_gpus < 1 or gpus_per_node < 1 or nodes_per_rack < 1:
        raise ValueError("a cluster needs at least one GPU, node and rack")
    sizes = [gpus_per_node] * (total_gpus // gpus_per_node)
    if total_gpus % gpus_per_node:
        sizes.append(total_gpus % gpus_per_node)
    return tuple(
        SimNode(f"node-{i:04d}", size, f"rack-{i // nodes_per_rack:03d}")
        for i, size in enumerate(sizes)
    )


def gang_shape(gpus: int, gpus_per_node: int = GPUS_PER_NODE) -> tuple[int, int]:
    """(nodes, GPUs per node) a job of ``gpus`` GPUs must be placed as."""
    if gpus < 1:
        raise ValueError("a job needs at least one GPU")
    nodes = -(-gpus // gpus_per_node)
    while gpus % nodes:
        nodes += 1
    return nodes, gpus // nodes

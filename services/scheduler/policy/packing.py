"""Placement and packing: which free GPUs a gang gets, per flavor.

Contract:
- A ``FlavorPool`` holds the ready nodes of one flavor and the free GPU indices of each. It
  never hands out a GPU twice: ``take`` removes the indices it returns.
- A job's *shapes* are the ways it may be laid out: ``(nodes, gpus_per_node)`` with equal GPUs
  on every node (gang). A job that fits one node gets one node only; a bigger one is split over
  the fewest nodes possible, allowing up to twice that many nodes with smaller equal parts; an
  explicit ``gpus_per_node`` allows that shape only. Shapes are ordered fewest nodes first.
- ``find`` is best fit: a single-node gang goes to the node with the fewest free GPUs that
  still hold it, partly used nodes before whole free ones of the same free count, so whole
  nodes stay free for big jobs. A multi-node gang goes into one topology domain when one can
  hold it (the domain with the fewest suitable nodes, keeping larger free domains whole), else
  across the fewest domains; within a domain best fit again.
- Ties are broken by node id (nodes are indexed in id order), so results are deterministic.
- No per-GPU loops on the search path: nodes are bucketed by free count.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainyard_platform.services.scheduler.policy.backfill import Reservation

Shape = tuple[int, int]
"""(number of nodes, GPUs on each node)."""

NodeFilter = Callable[["NodeSlot", int], bool]
"""Extra admission test for a node that carries reservations: (node, gpus) -> allowed."""


class NodeSlot:
    """One node's free GPUs and what plans hang off it during a pass."""

    __slots__ = ("capacity", "free", "holders", "node_id", "releases", "reservations", "topology")

    def __init__(self, node_id: str, topology: str, capacity: int, used: Mapping[int, str]):
        self.node_id = node_id
        self.topology = topology
        self.capacity = capacity
        self.free: list[int] = [i for i in range(capacity) if i not in used]
        self.holders: dict[str, int] = {}
        """Job id -> GPUs it holds here."""
        for job_id in used.values():
            self.holders[job_id] = self.holders.get(job_id, 0) + 1
        self.releases: list[tuple[float, int]] = []
        """(declared end, GPUs) of the jobs holding GPUs here, ascending (see ``backfill``)."""
        self.reservations: list[Reservation] = []
        """Reservations of blocked jobs on this node (``backfill.Reservation``)."""

    @property
    def free_count(self) -> int:
        return len(self.free)

    def level(self) -> int:
        """Bucket index: free count first, partly used before whole free."""
        free = len(self.free)
        return 2 * free + (1 if free == self.capacity else 0)


def job_shapes(gpus: int, gpus_per_node: int | None, node_capacity: int) -> tuple[Shape, ...]:
    """The layouts a job may take on nodes of at most ``node_capacity`` GPUs (see module)."""
    if gpus < 1 or node_capacity < 1:
        return ()
    if gpus_per_node is not None:
        if gpus_per_node < 1 or gpus % gpus_per_node or gpus_per_node > node_capacity:
            return ()
        return ((gpus // gpus_per_node, gpus_per_node),)
    if gpus <= node_capacity:
        return ((1, gpus),)
    fewest = -(-gpus // node_capacity)
    shapes = []
    for per_node in range(node_capacity, 0, -1):
        nodes, rest = divmod(gpus, per_node)
        if rest == 0 and nodes <= 2 * fewest:
            shapes.append((nodes, per_node))
    return tuple(shapes)


class FlavorPool:
    """The ready nodes of one flavor, bucketed by free GPU count (see module docstring)."""

    def __init__(self, flavor: str, nodes: list[NodeSlot]):
        self.flavor = flavor
        self.nodes: dict[str, NodeSlot] = {n.node_id: n for n in sorted(nodes, key=_by_id)}
        self.capacity = max((n.capacity for n in nodes), default=0)
        self.total = sum(n.capacity for n in nodes)
        self.free_total = sum(n.free_count for n in nodes)
        size = 2 * self.capacity + 2
        self._levels: list[dict[str, NodeSlot]] = [{} for _ in range(size)]
        self._domains: dict[str, list[dict[str, NodeSlot]]] = {}
        # Nodes with at least g free GPUs, per g (in all, and per domain), kept with the
        # buckets: a gang search asks this of every domain, so it must not sum buckets.
        self._at_least: list[int] = [0] * (self.capacity + 1)
        self._domain_at_least: dict[str, list[int]] = {}
        self._sizes: dict[int, list[tuple[int, str]]] = {}
        self._roomiest: dict[int, list[tuple[int, str]]] = {}
        for node in self.nodes.values():
            self._insert(node)
        self.topologies = sorted(self._domains)
        self.version = 0
        """Bumped whenever a search's answer may change: GPUs taken (``take``), or a
        reservation placed on a node (``backfill.reserve``)."""
        self._capacities = sorted(n.capacity for n in nodes)

    def count_nodes_with(self, gpus: int) -> int:
        """How many nodes have at least ``gpus`` GPUs in all (free or not)."""
        return len(self._capacities) - bisect.bisect_left(self._capacities, gpus)

    # --- buckets -------------------------------------------------------------------------

    def _insert(self, node: NodeSlot) -> None:
        level = node.level()
        self._levels[level][node.node_id] = node
        domain = self._domains.get(node.topology)
        if domain is None:
            domain = self._domains[node.topology] = [{} for _ in range(len(self._levels))]
            self._domain_at_least[node.topology] = [0] * (self.capacity + 1)
        domain[level][node.node_id] = node
        self._count(node, 1)

    def _remove(self, node: NodeSlot) -> None:
        level = node.level()
        del self._levels[level][node.node_id]
        del self._domains[node.topology][level][node.node_id]
        self._count(node, -1)

    def _count(self, node: NodeSlot, sign: int) -> None:
        self._sizes.clear()
        self._roomiest.clear()
        totals, domain = self._at_least, self._domain_at_least[node.topology]
        for g in range(len(node.free) + 1):
            totals[g] += sign
            domain[g] += sign

    def with_free(self, gpus: int) -> Iterator[NodeSlot]:
        """The nodes with at least ``gpus`` free GPUs, from the buckets (no walk of the
        whole pool)."""
        for level in self._levels[2 * gpus :]:
            yield from level.values()

    def count_at_least(self, gpus: int, topology: str | None = None) -> int:
        """How many nodes (in ``topology``, or all) have at least ``gpus`` free."""
        counts = self._at_least if topology is None else self._domain_at_least[topology]
        if gpus >= len(counts):
            return 0
        return counts[max(gpus, 0)]

    def max_free(self) -> int:
        """The largest free block on one node."""
        for level in range(len(self._levels) - 1, -1, -1):
            if self._levels[level]:
                return level // 2
        return 0

    def roomiest(self, count: int, gpus: int) -> list[NodeSlot]:
        """Up to ``count`` nodes of at least ``gpus`` GPUs with the most free, most first."""
        found: list[NodeSlot] = []
        for level in range(len(self._levels) - 1, -1, -1):
            for node in self._levels[level].values():
                if node.capacity >= gpus:
                    found.append(node)
                    if len(found) == count:
                        return found
        return found

    def _best_fit(self, levels: list[dict[str, NodeSlot]], gpus: int) -> Iterator[NodeSlot]:
        for level in range(2 * gpus, len(levels)):
            yield from levels[level].values()

    # --- search --------------------------------------------------------------------------

    def find(self, shape: Shape, allow: NodeFilter | None = None) -> list[NodeSlot] | None:
        """Nodes for ``shape`` now (best fit, see module), or None. Nodes that carry
        reservations are only used where ``allow(node, gpus_per_node)`` says so."""
        count, per_node = shape
        if per_node > self.capacity or count * per_node > self.free_total:
            return None
        if self.count_at_least(per_node) < count:
            return None
        if count == 1:
            for node in self._best_fit(self._levels, per_node):
                if allow is None or not node.reservations or allow(node, per_node):
                    return [node]
            return None
        return self._find_gang(count, per_node, allow)

    def _find_gang(
        self, count: int, per_node: int, allow: NodeFilter | None
    ) -> list[NodeSlot] | None:
        sizes = self._domain_sizes(per_node)
        # One domain: the tightest that can hold the gang keeps bigger domains whole.
        for _, topology in sorted(s for s in sizes if s[0] >= count):
            picked = self._take_from(self._domains[topology], count, per_node, allow)
            if len(picked) == count:
                return picked
        # Across domains: the roomiest domains first, so the gang spans as few as possible.
        picked = []
        for size, topology in self._roomiest_domains(per_node):
            if size == 0:
                break
            picked += self._take_from(self._domains[topology], count - len(picked), per_node, allow)
            if len(picked) == count:
                return picked
        return None

    def _domain_sizes(self, per_node: int) -> list[tuple[int, str]]:
        """(nodes with ``per_node`` free, domain) for every domain; kept until ``take``
        changes a node, since gangs that do not fit ask again and again in one pass."""
        sizes = self._sizes.get(per_node)
        if sizes is None:
            sizes = [(self.count_at_least(per_node, t), t) for t in self.topologies]
            self._sizes[per_node] = sizes
        return sizes

    def _roomiest_domains(self, per_node: int) -> list[tuple[int, str]]:
        """``_domain_sizes`` most nodes first (then by domain), kept as long: a gang that
        spans domains and does not fit asks again and again in one pass, and sorting the
        ~375 domains of a 6,000-node pool each time cost more than the search."""
        roomiest = self._roomiest.get(per_node)
        if roomiest is None:
            sizes = self._domain_sizes(per_node)
            roomiest = self._roomiest[per_node] = sorted(sizes, key=lambda s: (-s[0], s[1]))
        return roomiest

    def _take_from(
        self, levels: list[dict[str, NodeSlot]], count: int, per_node: int, allow: NodeFilter | None
    ) -> list[NodeSlot]:
        picked: list[NodeSlot] = []
        for node in self._best_fit(levels, per_node):
            if allow is None or not node.reservations or allow(node, per_node):
                picked.append(node)
                if len(picked) == count:
                    break
        return picked

    # --- change --------------------------------------------------------------------------

    def take(self, nodes: list[NodeSlot], per_node: int, job_id: str) -> dict[str, tuple[int, ...]]:
        """Give ``job_id`` the lowest ``per_node`` free GPUs of each node; returns them."""
        placement: dict[str, tuple[int, ...]] = {}
        for node in sorted(nodes, key=_by_id):
            self._remove(node)
            placement[node.node_id] = tuple(node.free[:per_node])
            del node.free[:per_node]
            node.holders[job_id] = node.holders.get(job_id, 0) + per_node
            self._insert(node)
        self.free_total -= per_node * len(nodes)
        self.version += 1
        return placement


def _by_id(node: NodeSlot) -> str:
    return node.node_id

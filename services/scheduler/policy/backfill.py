"""Backfill and reservations: when GPUs free up, and what a later job may take without
delaying a blocked one.

Contract:
- A job holding GPUs is assumed to hold them until its declared end (``started_at +
  declared_runtime_s``; an overdue job ends "now"; a job under preemption notice at
  ``notice_at + grace``). The policy never sees true runtimes.
- ``reserve`` gives a blocked job the earliest start at which its gang fits on specific nodes,
  counting GPUs held by earlier reservations as busy until those end (conservative), and
  records how many GPUs each of those nodes can still spare at that start (*slack*).
- ``allows``/``commit``: a later job may start now on a node carrying reservations only if it
  ends before each reservation starts, or the reservation's slack on that node covers it; so
  backfill never delays a reserved job's start.
- ``FluidEstimate`` gives a cheap start estimate for the blocked jobs without a reservation:
  the flavor's GPUs as one pool that fills in queue order as releases come (it ignores
  fragmentation, so explanations present it as approximate).
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Iterable
from dataclasses import dataclass, field

from trainyard_platform.services.scheduler.policy.packing import FlavorPool, NodeSlot, Shape


@dataclass(slots=True)
class Reservation:
    """GPUs promised to a blocked job from ``start`` to ``end`` on ``nodes``."""

    job_id: str
    start: float
    end: float
    per_node: int
    nodes: tuple[str, ...]
    slack: dict[str, int] = field(default_factory=dict)
    """Node id -> GPUs still free on that node at ``start`` beyond what the job needs."""


def add_release(node: NodeSlot, end: float, gpus: int) -> None:
    """Record that ``gpus`` of ``node`` come free at ``end``."""
    bisect.insort(node.releases, (end, gpus))


def earliest(node: NodeSlot, gpus: int, now: float) -> float | None:
    """When ``node`` will have ``gpus`` free, counting reserved GPUs busy until their
    reservation ends; None if never."""
    if gpus > node.capacity:
        return None
    reserved = node.reservations
    free = node.free_count - sum(r.per_node for r in reserved)
    if free >= gpus:
        return now
    events = node.releases
    if reserved:
        events = sorted(events + [(r.end, r.per_node) for r in reserved])
    for at, count in events:
        free += count
        if free >= gpus:
            return max(at, now)
    return None


def free_at(node: NodeSlot, at: float) -> int:
    """GPUs of ``node`` free at ``at`` (reserved ones busy until their reservation ends)."""
    reserved = node.reservations
    free = node.free_count
    free += sum(g for end, g in node.releases if end <= at)
    free -= sum(r.per_node for r in reserved if r.end > at)
    return free


def reserve(
    pool: FlavorPool,
    job_id: str,
    shapes: tuple[Shape, ...],
    runtime: float,
    now: float,
    among: Iterable[NodeSlot] | None = None,
) -> Reservation | None:
    """Reserve the earliest start for a blocked gang (see module docstring) on the nodes of
    ``pool`` (only those ``among``, when given); None when no shape can ever fit there. A
    reservation made bumps ``pool.version``."""
    nodes = list(pool.nodes.values() if among is None else among)
    best: tuple[float, Shape, list[NodeSlot]] | None = None
    for shape in shapes:
        found = _earliest_nodes(pool, nodes, shape, now)
        if found is not None and (best is None or found[0] < best[0]):
            best = (found[0], shape, found[1])
    if best is None:
        return None
    start, (_, per_node), nodes = best
    reservation = Reservation(
        job_id, start, start + runtime, per_node, tuple(sorted(n.node_id for n in nodes))
    )
    for node in nodes:
        reservation.slack[node.node_id] = max(0, free_at(node, start) - per_node)
        node.reservations.append(reservation)
    pool.version += 1
    return reservation


def _earliest_nodes(
    pool: FlavorPool, nodes: list[NodeSlot], shape: Shape, now: float
) -> tuple[float, list[NodeSlot]] | None:
    count, per_node = shape
    times: dict[str, list[tuple[float, str]]] = {}
    # One node (most reservations): the least (start, domain, node id), which is what the
    # candidates below come to, without a list per domain (a call meets thousands of nodes).
    single: tuple[float, str, str] | None = None
    for node in nodes:
        at: float | None = None
        if node.reservations:
            at = earliest(node, per_node, now)
        elif per_node <= node.capacity:  # ``earliest`` without reservations, inlined
            free = len(node.free)
            if free >= per_node:
                at = now
            else:
                for released_at, released in node.releases:
                    free += released
                    if free >= per_node:
                        at = max(released_at, now)
                        break
        if at is None:
            continue
        if count == 1:
            if (
                single is None
                or at < single[0]
                or (at == single[0] and (node.topology, node.node_id) < single[1:])
            ):
                single = (at, node.topology, node.node_id)
        else:
            times.setdefault(node.topology, []).append((at, node.node_id))
    if count == 1:
        return None if single is None else (single[0], [pool.nodes[single[2]]])
    if sum(len(v) for v in times.values()) < count:
        return None
    candidates: list[tuple[float, int, str, list[str]]] = []
    for topology, found in times.items():
        if len(found) >= count:
            found.sort()
            chosen = found[:count]
            candidates.append((chosen[-1][0], 0, topology, [n for _, n in chosen]))
    spread = sorted(t for found in times.values() for t in found)[:count]  # across domains
    candidates.append((spread[-1][0], 1, "", [n for _, n in spread]))
    start, _, _, ids = min(candidates)
    return start, [pool.nodes[i] for i in ids]


def allows(node: NodeSlot, gpus: int, end: float) -> bool:
    """Whether a job taking ``gpus`` of ``node`` now until ``end`` delays no reservation."""
    # A loop, not ``any`` over a generator: a pass at 10,000 nodes asks 360,000 times.
    node_id = node.node_id
    for r in node.reservations:  # noqa: SIM110 - the loop is the point
        if end > r.start and r.slack[node_id] < gpus:
            return False
    return True


def commit(node: NodeSlot, gpus: int, end: float) -> None:
    """Account a job placed now on ``node`` until ``end`` against its reservations' slack."""
    for r in node.reservations:
        if end > r.start:
            r.slack[node.node_id] -= gpus


def conflicts(node: NodeSlot, gpus: int, end: float) -> list[Reservation]:
    """The reservations a job on ``node`` until ``end`` would delay."""
    found = []
    for r in node.reservations:
        if end > r.start and r.slack[node.node_id] < gpus:
            found.append(r)
    return found


class FluidEstimate:
    """Start estimates in queue order for one flavor's blocked jobs (see module docstring)."""

    def __init__(self, free: int, releases: list[tuple[float, int]], now: float):
        self._free = free
        # Releases come in time order from two sources: those known at the start, sorted
        # once and read with a cursor, and those of the jobs in line, in a heap, so most
        # pops are no walk down one deep heap of them all (at 10,000 nodes, 16,686 a100
        # releases and 22,040 jobs in line: 38-43 -> 34 ms). Equal entries are equal
        # tuples, so which source gives one first does not change any estimate.
        self._known = sorted(releases)
        self._cursor = 0
        self._added: list[tuple[float, int]] = []
        self._clock = now

    def next_start(self, gpus: int, runtime: float) -> float | None:
        """When ``gpus`` are free for the next job in line; None if never."""
        known, added = self._known, self._added
        while self._free < gpus:
            at: float
            count: int
            if self._cursor < len(known) and (not added or known[self._cursor] <= added[0]):
                at, count = known[self._cursor]
                self._cursor += 1
            elif added:
                at, count = heapq.heappop(added)
            else:
                return None
            self._free += count
            self._clock = max(self._clock, at)
        self._free -= gpus
        heapq.heappush(added, (self._clock + runtime, gpus))
        return self._clock

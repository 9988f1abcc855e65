"""The node inventory: what operators declare each node has, which its heartbeats cannot
exceed.

A runner's heartbeat (``RunnerHeartbeat``) says the node's flavor, GPU count and topology,
and the scheduler places other teams' jobs by them (billed at the job's flavor), so a node
that says more than it has would draw grants it then runs or fails. An operator declares a
node (``PUT /v1/admin/node-inventory/{node_id}``: its flavor, GPU count and, optionally,
topology); ``cap`` judges each heartbeat's claim against that declaration.

Contract of ``cap`` (what placement gets, the node's *supply*, from what it claims):
- A declared node gets the declared flavor; its GPUs are the fewer of what it claims and
  what is declared (a node may say fewer: a GPU gone bad). One that claims more GPUs is
  capped at the declared count (``gpu_count``). One that claims another flavor gets no GPU
  at all (``gpu_flavor``): its word is wrong, and neither figure can be trusted. With a
  declared topology, the node is placed in it whatever it claims (``topology``); without
  one, in the topology it claims.
- An undeclared node is taken at its word under ``InventoryMode.OPTIONAL`` (the default: the
  zero-configuration local stack) and gets no GPU under ``InventoryMode.REQUIRED``
  (``undeclared``) and no flavor either (``NO_FLAVOR``): a name the node chose is neither
  a flavor it is counted a node of, were an operator to create that flavor later, nor a
  label of the scheduler's gauges (a lying node would choose their series). What it
  claims stays in its ``reported_*`` columns, and the node list shows it.
- Each capped field comes with a line naming it, what the node claims and what it gets:
  the scheduler logs it when the field starts being capped, or a judgement changes the
  node's supply (a new node, one back, other GPUs, flavor or topology), not at every
  judgement that caps it the same; the inventory's admin view shows them.
- The heartbeat handler judges a node again when its claim, the mode or the declaration
  (its ``revision``) differs from what its supply was judged by, or a change of its supply
  has waited longer than ``SAY_MIN_INTERVAL`` to be said (``repository.touch_node``);
  a change of the inventory applies at the node's next heartbeat. Only a judgement that
  changes what a pass reads of the node (``repository.Judged.places_as``) asks for a pass:
  a claim capped to the same supply as before changes nothing to place. A judgement that
  changes the node's supply is said as ``node.supplied`` (``NodeSupplied``; ``node_supply``):
  billing counts a node's GPUs from it, not from the node's claim.

The hostname and the rendezvous address a heartbeat says are not capped: neither places nor
bills work.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import timedelta

UNDECLARED = "undeclared"
"""The capped "field" of a node the inventory does not declare (``InventoryMode.REQUIRED``)."""

NO_FLAVOR = ""
"""The flavor of a node the inventory does not declare (``InventoryMode.REQUIRED``): no
flavor's name (a flavor, as a heartbeat's, has at least one character)."""

SAY_MIN_INTERVAL = timedelta(seconds=60)
"""A change of a node's supply its own claim made is said at most this often
(``node_supply.say_judged``)."""

CAPPED_FIELDS = (UNDECLARED, "gpu_flavor", "gpu_count", "topology")
"""Every reason a node's supply is less than its claim (``trainyard.scheduler.nodes.capped``)."""


class InventoryMode(enum.StrEnum):
    """What the scheduler makes of a node the inventory does not declare
    (``TRAINYARD_SCHEDULER_NODE_INVENTORY``)."""

    OPTIONAL = "optional"
    """Taken at its word (a declared node is still capped by its declaration)."""
    REQUIRED = "required"
    """No GPU for it until an operator declares it."""


@dataclass(frozen=True)
class Claim:
    """What a heartbeat says of the node."""

    gpu_flavor: str
    gpu_count: int
    topology: str


@dataclass(frozen=True)
class Declared:
    """An operator's declaration of a node; ``topology`` None: as the node says."""

    gpu_flavor: str
    gpu_count: int
    topology: str | None = None
    revision: int = 0
    """Changes with every write of the declaration (what a supply was judged by)."""


@dataclass(frozen=True)
class Capped:
    """One field of a claim the inventory did not grant, and why."""

    field: str
    message: str


@dataclass(frozen=True)
class Supply:
    """What placement gets of a node, and what capped its claim (empty: nothing)."""

    gpu_flavor: str
    gpu_count: int
    topology: str
    capped: tuple[Capped, ...] = ()

    @property
    def capped_fields(self) -> list[str]:
        return [c.field for c in self.capped]


def cap(claim: Claim, declared: Declared | None, mode: InventoryMode) -> Supply:
    """The node's supply from its ``claim`` and its declaration (see the module docstring)."""
    if declared is None:
        if mode is InventoryMode.OPTIONAL:
            return Supply(claim.gpu_flavor, claim.gpu_count, claim.topology)
        undeclared = Capped(
            UNDECLARED,
            f"claims {claim.gpu_count} {claim.gpu_flavor} GPU(s), but the node inventory does "
            "not declare it: no GPU is placed on it until an operator declares it",
        )
        return Supply(NO_FLAVOR, 0, claim.topology, (undeclared,))
    capped: list[Capped] = []
    if claim.gpu_flavor != declared.gpu_flavor:
        count = 0
        capped.append(
            Capped(
                "gpu_flavor",
                f"claims flavor {claim.gpu_flavor}, declared {declared.gpu_flavor}: "
                "no GPU is placed on it",
            )
        )
    else:
        count = min(claim.gpu_count, declared.gpu_count)
        if claim.gpu_count > declared.gpu_count:
            capped.append(
                Capped(
                    "gpu_count",
                    f"claims {claim.gpu_count} GPUs, declared {declared.gpu_count}: "
                    f"{declared.gpu_count} are placed on",
                )
            )
    topology = claim.topology
    if declared.topology is not None and claim.topology != declared.topology:
        topology = declared.topology
        capped.append(
            Capped(
                "topology",
                f"claims topology {claim.topology}, declared {declared.topology}: "
                f"placed in {declared.topology}",
            )
        )
    return Supply(declared.gpu_flavor, count, topology, tuple(capped))

"""The runner's one event dispatch: allocations for this node, and their revocations.

What the bus cannot check, this does before anything runs (docs/security.md, "Bus"): a grant
or revocation names this node, and a grant's fencing epoch is one this node can believe.
Epochs come from one ascending sequence, so the node holds a grant to what it already knows
from its ledger: a grant at epoch 0 or below, a grant of a known allocation at another
epoch, or a grant of a job this node already ran at the same or a later epoch is stale or
forged. Such an event is rejected (dead-lettered with the reason) and changes nothing. A
grant of a known allocation at its own epoch is a redelivery (a stream made again after
NATS lost its store holds every grant again): the agent ignores it and says again what it
said about it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

from trainyard_platform.services.runner.agent import NodeAgent
from trainyard_platform.services.runner.ledger import LedgerEntry
from trainyard_platform.shared.bus import Handler, Reject
from trainyard_platform.shared.events import Envelope, Payload
from trainyard_platform.shared.events.payloads import AllocationGranted, AllocationRevoked
from trainyard_platform.shared.events.trust import node_subjects
from trainyard_platform.shared.logs import job_scope

log = logging.getLogger(__name__)


def subjects(node_id: str) -> list[str]:
    """The filter of the ``runner-<node_id>`` consumer: one subject, every allocation event
    routed to this node (the only consumer its NATS user may create)."""
    return [node_subjects(node_id)]


def grant_problem(
    node_id: str, grant: AllocationGranted, known: Iterable[LedgerEntry]
) -> str | None:
    """Why this node must not run ``grant``, given the allocations in its ledger (``known``)."""
    if grant.node_id != node_id:
        return f"allocation {grant.allocation_id} is for node {grant.node_id}, not {node_id}"
    if grant.epoch < 1:
        return f"allocation {grant.allocation_id}: epoch {grant.epoch} is no fencing epoch"
    known = list(known)
    for entry in known:
        if entry.allocation_id == grant.allocation_id:
            if entry.epoch != grant.epoch:
                return (
                    f"allocation {grant.allocation_id} is known here at epoch {entry.epoch}, "
                    f"not {grant.epoch}"
                )
            return None  # a redelivery, whatever came after it
    for entry in known:
        if (
            entry.job_id == grant.job_id
            and entry.allocation_id != grant.allocation_id
            and entry.epoch >= grant.epoch
        ):
            return (
                f"allocation {grant.allocation_id} of job {grant.job_id} at epoch "
                f"{grant.epoch} is stale: this node had the job at epoch {entry.epoch}"
            )
    return None


def dispatcher(agent: NodeAgent) -> Handler:
    """The bus handler of the ``runner-<node_id>`` consumer."""

    async def dispatch(envelope: Envelope[Payload]) -> None:
        match envelope.data:
            case AllocationGranted() as grant:
                # The job's work (its supervision, uploads and reports: tasks started here)
                # logs with its job id, though the grant's span is routed by node.
                with job_scope(grant.job_id):
                    known = await asyncio.to_thread(agent.ledger.entries)
                    problem = grant_problem(agent.node_id, grant, known)
                    if problem is not None:
                        raise Reject(problem)
                    await agent.on_granted(grant)
            case AllocationRevoked() as revoked:
                if revoked.node_id != agent.node_id:
                    raise Reject(
                        f"revocation of allocation {revoked.allocation_id} is for node "
                        f"{revoked.node_id}, not {agent.node_id}"
                    )
                with job_scope(revoked.job_id):
                    await agent.on_revoked(revoked)
            case _:
                log.debug("ignoring %s", envelope.type)

    return dispatch

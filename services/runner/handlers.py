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
from collections.abc import Iterable, Sequence

from pydantic import ValidationError

from trainyard_platform.services.runner.agent import NodeAgent
from trainyard_platform.services.runner.ledger import LedgerEntry
from trainyard_platform.shared.bus import Handler, Reject
from trainyard_platform.shared.events import Envelope, EventParseError, Payload, parse_envelope
from trainyard_platform.shared.events.envelope import envelope_model
from trainyard_platform.shared.events.payloads import (
    NOT_IN_A_NAME,
    AllocationGranted,
    AllocationRevoked,
    GrantOfInvalidSpec,
)
from trainyard_platform.shared.events.trust import node_subjects
from trainyard_platform.shared.http_errors import plain_message
from trainyard_platform.shared.logs import job_scope

log = logging.getLogger(__name__)


def subjects(node_id: str) -> list[str]:
    """The filter of the ``runner-<node_id>`` consumer: one subject, every allocation event
    routed to this node (the only consumer its NATS user may create)."""
    return [node_subjects(node_id)]


_SPEC_PROBLEMS_SAID = 5
"""The bad fields of a grant's spec named in its job's failure; the rest are counted."""


def parse_event(raw: bytes) -> Envelope[Payload]:
    """``parse_envelope``, but a grant whose only fault is its ``spec`` (a producer other
    than the submission API wrote it) is read as a ``GrantOfInvalidSpec`` naming the bad
    fields, so that its job fails as its own error (``NodeAgent.on_invalid_grant``) rather
    than the grant being dead-lettered unanswered. Raises ``EventParseError`` otherwise."""
    try:
        return parse_envelope(raw)
    except EventParseError as exc:
        cause = exc.__cause__
        errors = cause.errors() if isinstance(cause, ValidationError) else []
        if not errors or any(tuple(e["loc"][:2]) != ("data", "spec") for e in errors):
            raise
        try:
            envelope = envelope_model(GrantOfInvalidSpec).model_validate_json(raw)
        except ValidationError:
            raise exc from None
        if envelope.type != AllocationGranted.TYPE:
            raise
        problem = _spec_problem([(e["loc"][1:], plain_message(e)) for e in errors])
        data = envelope.data.model_copy(update={"problem": problem})
        return envelope.model_copy(update={"data": data})


def _spec_problem(errors: Sequence[tuple[tuple[int | str, ...], str]]) -> str:
    """Each bad field (``spec.command[1]``) and why, the field's path printable whatever
    keys the spec had (a key of control characters is escaped)."""
    said = []
    for loc, message in errors[:_SPEC_PROBLEMS_SAID]:
        path = ""
        for part in loc:
            if isinstance(part, int):
                path += f"[{part}]"
            else:
                shown = NOT_IN_A_NAME.sub(lambda m: f"\\u{ord(m.group()):04x}", part)
                path += f".{shown}" if path else shown
        said.append(f"{path}: {message}")
    if len(errors) > _SPEC_PROBLEMS_SAID:
        said.append(f"and {len(errors) - _SPEC_PROBLEMS_SAID} more")
    return "; ".join(said)


def grant_problem(
    node_id: str, grant: AllocationGranted | GrantOfInvalidSpec, known: Iterable[LedgerEntry]
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
            case AllocationGranted() | GrantOfInvalidSpec() as grant:
                # The job's work (its supervision, uploads and reports: tasks started here)
                # logs with its job id, though the grant's span is routed by node. A grant
                # whose spec is invalid passes the same checks before it is ended unrun.
                with job_scope(grant.job_id):
                    known = await asyncio.to_thread(agent.ledger.entries)
                    problem = grant_problem(agent.node_id, grant, known)
                    if problem is not None:
                        raise Reject(problem)
                    if isinstance(grant, AllocationGranted):
                        await agent.on_granted(grant)
                    else:
                        await agent.on_invalid_grant(grant)
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

"""The runner's one event dispatch: allocations for this node, and their revocations."""

from __future__ import annotations

import logging

from services.runner.agent import NodeAgent
from shared.bus import Handler
from shared.events import Envelope, Payload
from shared.events.payloads import AllocationGranted, AllocationRevoked

log = logging.getLogger(__name__)


def dispatcher(agent: NodeAgent) -> Handler:
    """The bus handler of the ``runner-<node_id>`` consumer."""

    async def dispatch(envelope: Envelope[Payload]) -> None:
        match envelope.data:
            case AllocationGranted() as grant:
                await agent.on_granted(grant)
            case AllocationRevoked() as revoked:
                await agent.on_revoked(revoked)
            case _:
                log.debug("ignoring %s", envelope.type)

    return dispatch

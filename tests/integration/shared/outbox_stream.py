"""What the outbox tests read back: an event to enqueue, the event ids the stream holds in
order (each checked to carry the bus's keyed ``Nats-Msg-Id``), and the outbox's rows not yet
published."""

from __future__ import annotations

import json

import asyncpg

from trainyard_platform.shared.bus import Bus
from trainyard_platform.shared.events import Envelope
from trainyard_platform.shared.events.payloads import JobCancelRequested
from trainyard_platform.shared.events.trust import SUBMISSION


def cancel_event(job_id: str) -> Envelope[JobCancelRequested]:
    return Envelope.wrap(
        JobCancelRequested(job_id=job_id, team="t", user="u"), source=SUBMISSION, subject=job_id
    )


async def stream_ids(bus: Bus) -> list[str]:
    """The ids of the events in the stream ``TRAINYARD``, in stream order."""
    info = await bus.jetstream.stream_info("TRAINYARD")
    if not info.state.messages:
        return []
    ids = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        msg = await bus.jetstream.get_msg("TRAINYARD", seq)
        assert msg.headers is not None and msg.data is not None
        event_id = json.loads(msg.data)["id"]
        assert msg.headers["Nats-Msg-Id"] == bus.msg_id(msg.subject, event_id)
        ids.append(event_id)
    return ids


async def unpublished(pool: asyncpg.Pool) -> list[str]:
    """The event ids of the outbox's unpublished rows, in order."""
    rows = await pool.fetch("SELECT event_id FROM outbox WHERE published_at IS NULL ORDER BY seq")
    return [r["event_id"] for r in rows]

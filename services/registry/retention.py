"""The registry's retention: ``shared.retention.Retention`` (the inbox and published outbox
rows older than the event stream's horizon), and the ends of jobs kept in
``jobs_ended_unheard`` (``job_inputs.ended``) for longer than that horizon.

A kept end lets an event naming the job's parent, handled after the job's end, record that
parent ended (``job_inputs.record_parent``). Such an event was published before the job
ended, so once the end was kept for longer than the stream keeps an event, none is left to
deliver: the row can go. One case escapes, as for the inbox: a publisher's relay down for
longer than the horizon publishes its events late, and a parent recorded from one after its
job's kept end was pruned is recorded not ended (its version kept from deletion).

Contract: ``prune_once(cutoff)`` deletes what ``Retention.prune_once`` does, and the kept
ends kept before ``cutoff`` (``Pruned.ended_unheard``), in bounded batches; ``run`` prunes
every ``interval_s`` as ``Retention`` does.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from trainyard_platform.shared.retention import Pruned, Retention

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RegistryPruned(Pruned):
    ended_unheard: int = 0


class RegistryRetention(Retention):
    """``Retention``, with the registry's kept ends of jobs (module docstring)."""

    async def prune_once(self, cutoff: datetime) -> RegistryPruned:
        pruned = await super().prune_once(cutoff)
        ended_unheard = await self._drain(
            "DELETE FROM jobs_ended_unheard WHERE job_id = ANY(ARRAY("
            "  SELECT job_id FROM jobs_ended_unheard WHERE kept_at < $1 LIMIT $2))",
            cutoff,
        )
        if ended_unheard:
            log.info("retention: deleted %d kept ends of jobs (jobs_ended_unheard)", ended_unheard)
        return RegistryPruned(pruned.inbox, pruned.outbox, pruned.audit, ended_unheard)

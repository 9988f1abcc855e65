"""The arrival fast path: a newly queued job decided against the last settled pass, kept in
memory, instead of a pass that reloads the whole cluster.

Contract:
- ``Kept`` holds a settled pass (one that placed and preempted nothing: a pass over the
  same state would decide exactly the same) as a ``policy.incremental.Incremental`` and the
  rows it was built from. The leader (``loops.PassLoop``) keeps the latest one and forgets
  it as soon as anything but arrivals changes what a pass would read: any change that asks
  for a pass, a checkpoint (victims are chosen by it), the cancel of a running job, a
  lost node, an admin change, the end of a leadership term, and any failure of the fast
  path. It is also void from ``valid_until``: the pass's clock plus the pass interval
  (the timer pass, the safety net, re-decides everything at a new clock by then), the first preemption notice to run out, the first job backing off to become
  eligible, the next UTC month while a budget holds jobs (it releases them) or lowers new
  jobs (their explanations stop saying so), or the first automatic cordon of a node to run out -- a pass would act on
  those.
- ``decide_arrivals(conn, kept, job_ids, now)`` decides jobs just queued, in order, with
  ``Incremental.arrive``, when each provably changes nothing else the pass decided
  (``Incremental.arrival_is_isolated``: it can only wait). The decisions then equal those
  of a full pass over the kept state with the new jobs (at the kept pass's clock); the job's
  ``JobPending`` and the moved positions of the jobs behind it in its queue are published
  when news (``convert.note_changed``), as a pass publishes them. It returns False when any
  of them needs a whole pass (not isolated, an unknown queue or priority class, a queue
  with jobs held back from the policy, a job a spent budget holds, a job of a budget that
  reserves that would wait for it or change what another of its team's jobs waits for:
  the pass's reservation step, ``convert.BudgetFit``, is run again at the kept clock over
  its team's queued jobs with it, and must hold exactly those it held): nothing is published
  then and ``kept`` must be
  forgotten (it may hold some of the jobs); the caller runs a pass. A note of a job a
  spent budget lowered says so first, worded as a pass words it (``convert.lowered_note``,
  at the kept pass's clock). Every ``YIELD_EVERY``
  jobs it lets the event loop run the leader's other tasks: the caller holds the scheduling
  lock in its transaction, so no pass or other batch can change ``kept`` meanwhile.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

import asyncpg

from trainyard_platform.services.scheduler import repository as repo
from trainyard_platform.services.scheduler.budget_holds import hold_of, next_month, reserves_for
from trainyard_platform.services.scheduler.convert import (
    PendingNote,
    Row,
    from_epoch,
    lowered_note,
    note_changed,
    pending_job,
)
from trainyard_platform.services.scheduler.policy.incremental import Incremental
from trainyard_platform.services.scheduler.policy.model import PendingJob, PolicyConfig
from trainyard_platform.services.scheduler.scheduling import PassResult, publish_notes

YIELD_EVERY = 64
"""Arrivals decided between two turns of the event loop. A batch holds up to 1,024 new jobs,
each decided in 2-9 ms at 10,000 nodes and 100,000 waiting (BENCHMARKS.md, "The arrival fast
path in the service"): seconds in which the leader's lease, the node watch's hearing and the
admin API would otherwise wait."""


@dataclass
class Kept:
    """A settled pass kept in memory (see the module docstring)."""

    incremental: Incremental
    result: PassResult
    valid_until: datetime
    published: dict[str, PendingNote] = field(default_factory=dict)
    """The last note published for each job whose note changed since ``result.built``'s
    rows were read (the pass's news, then the fast path's)."""
    arrivals: int = 0
    """Jobs this kept pass decided (``decide_arrivals``)."""
    weighed: list[Row] = field(default_factory=list)
    """The rows of the jobs of budgets that reserve this kept pass decided: with the pass's
    own candidates (``result.built.candidates``), what the next such arrival is weighed
    with (``_fits_as_before``)."""
    rows: dict[str, Row] = field(default_factory=dict)
    """While a spent budget lowers new jobs, the rows of the jobs this kept pass decided, read
    at their arrival: with the pass's own (``result.built.pending``), what a note of a
    lowered job is worded from."""

    @classmethod
    def of(
        cls,
        result: PassResult,
        config: PolicyConfig,
        interval_s: float,
        due_at: datetime | None = None,
    ) -> Kept:
        """``result`` kept until ``valid_until`` (the module docstring); ``due_at``: when
        something else a pass acts on comes due (an automatic cordon running out)."""
        built = result.built
        snapshot = built.snapshot
        ends = [snapshot.now + interval_s]
        if due_at is not None:
            ends.append(due_at.timestamp())
        ends += [r.notice_at + config.grace_s for r in snapshot.running if r.notice_at is not None]
        ends += [row["eligible_at"].timestamp() for row in built.backing_off]
        if built.holds or built.lowers or built.reserves:  # the next UTC month ends them
            ends.append(next_month(datetime.fromtimestamp(snapshot.now, UTC)).timestamp())
        until = from_epoch(min(ends)) or datetime.fromtimestamp(snapshot.now, UTC)
        incremental = Incremental(snapshot, config, result.state, result.decisions)
        return cls(incremental, result, until, dict(result.published))

    def note_before(self, job_id: str) -> PendingNote | None:
        """The note last published for ``job_id`` (None: none yet)."""
        if job_id in self.published:
            return self.published[job_id]
        row = self.result.built.pending.get(job_id)
        return PendingNote.from_row(row) if row is not None else None


def decide(kept: Kept, job: PendingJob) -> dict[str, PendingNote] | None:
    """The notes of ``job`` and of the jobs behind it in its queue once ``job`` (new to
    ``kept``) is decided alone; None, and ``kept`` unchanged, when a pass must decide it."""
    incremental = kept.incremental
    if incremental.arrival_is_isolated(job) is None:
        return None
    decisions = incremental.arrive(job)
    return {
        changed: PendingNote.from_explanation(decisions.explanations[changed])
        for changed in incremental.changed
    }


async def decide_arrivals(
    conn: asyncpg.Connection, kept: Kept, job_ids: Sequence[str], now: datetime
) -> bool:
    """Decide ``job_ids`` (just queued) against ``kept`` (see the module docstring)."""
    if now >= kept.valid_until:
        return False
    built = kept.result.built
    held = {row["queue"] for row in (*built.held_back, *built.backing_off, *built.budget_held)}
    classes = set(built.class_names)
    rows = await repo.queued_rows(conn, job_ids)
    notes: dict[str, PendingNote] = {}
    for index, job_id in enumerate(job_ids):
        if index and index % YIELD_EVERY == 0:
            await asyncio.sleep(0)  # the leader's other tasks (YIELD_EVERY)
        row = rows.get(job_id)
        if row is None or kept.incremental.knows(job_id):
            continue  # not queued (cancelled since), or a pass since then decided it
        job = pending_job(row)
        if row["priority_class"] not in classes or job.queue in held:
            return False
        if built.holds and hold_of(row["team"], row["project"], built.holds) is not None:
            return False  # a spent budget holds it: a pass tells it so
        reserved = bool(
            built.reserves and reserves_for(row["team"], row["project"], built.reserves)
        )
        if reserved and not _fits_as_before(kept, row):
            return False  # it waits for its budget, or moves what others wait for: a pass
        told = decide(kept, job) if row["eligible_at"] is None else None
        if told is None:
            return False
        if reserved:
            kept.weighed.append(row)
        if built.lowers:
            kept.rows[job_id] = row
            if not _say_lowered(kept, told):
                return False
        notes.update(told)
    news = [
        (job_id, note)
        for job_id, note in sorted(notes.items())
        if note_changed(kept.note_before(job_id), note, now)
    ]
    await publish_notes(conn, news)
    kept.published.update(news)
    kept.arrivals += len(job_ids)
    return True


def _fits_as_before(kept: Kept, row: Row) -> bool:
    """Whether ``row``, an arrival of a team whose budget reserves, leaves the pass's
    reservations as they were: the reservation step (``convert.BudgetFit``) run again at the
    kept pass's clock over its team's candidates (the pass's and those decided since) with
    ``row`` holds none of them but those it held, each for the same reason, and not
    ``row``. A pass would then give the policy the same jobs and ``row``, so ``decide`` is
    exact for it. Budgets are a team's (its own and its projects'): other teams' jobs weigh
    nothing here."""
    built = kept.result.built
    if built.fitting is None:
        return False
    team = row["team"]
    mates = [c for c in (*built.candidates, *kept.weighed) if c.get("team", "") == team]
    before = {i: u for i, u in built.unfit.items() if built.pending[i].get("team", "") == team}
    return built.fitting.unfit([*mates, row]) == before


def _say_lowered(kept: Kept, notes: dict[str, PendingNote]) -> bool:
    """Word ``notes`` (in place) as ``convert.pending_notes`` does while a spent budget
    lowers new jobs: each lowered job's says so first. False when a job's row is unknown
    (the caller then runs a pass, which has them all)."""
    built = kept.result.built
    clock = from_epoch(built.snapshot.now) or datetime.now(UTC)
    for job_id, note in notes.items():
        row = kept.rows.get(job_id) or built.pending.get(job_id)
        if row is None:
            return False
        notes[job_id] = lowered_note(note, row, built.lowers, clock)
    return True


__all__ = ["Kept", "decide", "decide_arrivals"]

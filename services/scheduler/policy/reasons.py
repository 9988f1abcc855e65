"""Turn a pass's waiting jobs into ``Explanation``s: reason, holders, suggestion, estimate.

Contract:
- Explanations describe the state at the end of the pass (after this pass's placements and
  preemptions), so the holders they name are the ones the user would find.
- Estimated starts: a reserved job starts at its reservation; one waiting on preemption when
  its victims' grace ends; a quota-blocked job when enough of the jobs holding that quota reach
  their declared ends (or, for reclaim, can be preempted: for a borrowed job that the
  waiting job may not take, since it would stand before it once re-queued, its declared end
  too; the borrowed jobs counted as preempted are judged together, as the engine judges a
  victim set, ``Preemptor.admits``); any other capacity-blocked job by a
  fluid estimate of its flavor in queue order (``backfill.FluidEstimate``). None when nothing
  bounds it.
- A suggestion is given only when it would let the job start now: fewer GPUs (within the
  quota headroom and the largest free block) or, when reserved GPUs are all that stand in its
  way, a shorter declared runtime.
- Work per job is constant apart from cached per-(queue, flavor) and per-(flavor, shape)
  figures, so explaining 10,000 jobs stays cheap.
- An explanation is read by the waiting job's team, so it names another team's job by its
  team only (``a team-b job``; in ``blocking``, ``team-b``): ids of other teams' jobs never
  reach a user. Jobs of the waiting job's own team are named by id.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import operator
import re
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from trainyard_platform.services.scheduler.policy import explain
from trainyard_platform.services.scheduler.policy.backfill import FluidEstimate
from trainyard_platform.services.scheduler.policy.model import (
    Explanation,
    PendingJob,
)
from trainyard_platform.services.scheduler.policy.packing import Shape
from trainyard_platform.services.scheduler.policy.preemption import (
    Candidate,
    Preemptor,
    first_tier_again,
    oversize_until,
    protected_until,
    victim_key,
)
from trainyard_platform.services.scheduler.policy.quota import Verdict
from trainyard_platform.shared.waits import duration

if TYPE_CHECKING:
    from trainyard_platform.services.scheduler.policy.engine import PolicyState, Waiting


def explain_all(
    state: PolicyState,
    waiting: list[Waiting],
    quick: bool = False,
    team_of: Mapping[str, str] | None = None,
) -> dict[str, Explanation]:
    """Explanations for ``waiting`` (in pass order); ``quick`` skips fluid estimates.
    ``team_of`` (job id -> team, for naming other teams' jobs) defaults to the state's
    running and placed jobs and ``waiting``; ``readers_team_of`` gives that of a whole pass."""
    return _Explainer(state, quick).run(waiting, team_of)


def readers_team_of(state: PolicyState, waiting: list[Waiting]) -> dict[str, str]:
    """Job id -> team of every job ``state`` holds or places and of ``waiting``."""
    teams = {name: q.team for name, q in state.quota.queues.items()}
    team_of = dict(state.team_of_job)
    team_of.update({w.job.job_id: teams[w.job.queue] for w in waiting if w.job.queue in teams})
    return team_of


_NONE: frozenset[str] = frozenset()

Parts = tuple[str, str, str | None, float | None]
"""An explanation but for its position: reason, blocking, suggestion, estimated start."""


class _Explainer:
    def __init__(self, state: PolicyState, quick: bool):
        self.state = state
        self.now = state.now
        self.quick = quick
        self._fluid: dict[str, FluidEstimate] = {}
        self._capacity: dict[tuple[str, Shape], tuple[int, str, list[str]]] = {}
        self._headroom: dict[tuple[str, str, bool], int] = {}
        self._hints: dict[tuple[str, str, int, bool], str | None] = {}
        self._borrowing: dict[tuple[str, str], list[tuple[str, int]]] = {}
        self._holders: dict[tuple[str, str], list[str]] = {}
        self._cohort_users: dict[tuple[str, str], list[tuple[int, str]]] = {}
        self._users_named: dict[tuple[str, str], list[tuple[str, str, str]]] = {}
        self._quota: dict[tuple[str, str, int, bool], tuple[str, str, float | None]] = {}
        self._timelines: dict[tuple[tuple[str, ...], str, bool, frozenset[str]], _Timeline] = {}
        self._heads: dict[tuple[str, str, str | None], tuple[str, str]] = {}
        self._tails: dict[tuple[str, str | None], str] = {}
        self._named: dict[str, frozenset[str]] = {}
        """Text -> the teams of the jobs its words name (``team_of`` is fixed for a run)."""
        self._named_items: dict[str, frozenset[str]] = {}
        """``blocking`` -> the teams of the jobs its items name."""
        self._blockings: dict[tuple[str, str | None], str] = {}
        self._reserved: dict[tuple[str, ...], tuple[str, str, str | None]] = {}
        self._etas: dict[float | None, str] = {}
        self._texts: dict[tuple[str, str], str] = {}
        """(head, estimate) -> the reason of a reserved job."""
        self._cohort_heads: dict[tuple[str, str, int, int], tuple[str, str]] = {}
        self._members: dict[str, tuple[str, ...]] = {}
        self._reclaims: dict[
            tuple[str, str, int, int], tuple[str, tuple[str, ...], list[tuple[str, int]]]
        ] = {}
        self._walks: dict[tuple[tuple[str, ...], str], list[_Leaving]] = {}
        """(lenders, flavor) -> when their jobs leave, by preemption or at their ends
        (``_walk``)."""
        self._judged: dict[tuple[tuple[str, ...], str, int], bool] = {}
        """(lenders, flavor, GPUs needed) -> whether the jobs reclaimed until those GPUs have
        left could stand before a job reclaiming (``_to_judge``)."""
        self._reclaiming: dict[tuple[str, str, int], tuple[Verdict, list[_Leaving]]] = {}
        """(queue, flavor, GPUs) of jobs waiting for reclaim whose lenders' jobs may stand
        before them once reclaimed together -> their verdict and ``_walk``."""
        self._preempted: dict[tuple[tuple[str, ...], str, frozenset[str]], _Timeline] = {}
        """(lenders, flavor, spared) -> when their jobs leave by preemption alone."""
        self._spares: dict[str, frozenset[str]] = {}
        """Job id -> ``_spared`` (the same for the whole run)."""

    def run(
        self, waiting: list[Waiting], team_of: Mapping[str, str] | None
    ) -> dict[str, Explanation]:
        queues = self.state.quota.queues
        if team_of is None:
            team_of = readers_team_of(self.state, waiting)
        out: dict[str, Explanation] = {}
        # Most waiting jobs share their reason with many others (same queue, flavor, size).
        # Rewriting a text for a team depends only on the text, ``team_of`` (fixed for this
        # call) and whether the team is one of those whose jobs the text names: for every
        # other team it reads the same. So each distinct text is rewritten once for "any
        # other team" (``None``), and again only for a team it names (its own jobs keep
        # their ids). At 100,000 waiting jobs in 500 teams that is ~4,000 rewrites, not
        # ~27,000 (one per text and reading team).
        generic: dict[tuple[str, str], tuple[frozenset[str], str, str]] = {}
        seen: dict[tuple[str, str, str], tuple[str, str]] = {}
        # A job waiting for quota is explained by its request alone (``quota_request``), so
        # the finished explanation is too, but for its position -- unless it is the one
        # whose try to preempt reservations stopped (``reserved_ahead``).
        by_request: dict[Hashable, Parts] = {}
        # A held job is explained by its holder alone (``parts``): the holder is of its queue
        # and flavor, so of its team, and its estimate is the holder's quota estimate, which
        # ``quota`` records once per request and never changes. Once that is recorded, every
        # job one holder holds gets the same finished explanation but for its position (at
        # 10,000 nodes, 56,836 held jobs behind 950 holders).
        by_holder: dict[str, Parts] = {}
        reclaiming = self._reclaiming  # (filled as jobs waiting for reclaim are explained)
        for w in waiting:
            job = w.job
            holder = w.holder if w.kind == "held" and not w.reserved_ahead else None
            if holder is not None:
                done = by_holder.get(holder.job_id)
                if done is not None:
                    out[job.job_id] = Explanation(w.position, *done)
                    continue
            # (What a job may not reclaim depends on the job, not on its request alone:
            # ``_spared``, asked only of a request in ``reclaiming``.)
            request = (job.queue, job.flavor, job.gpus)
            alone = (
                w.kind == "quota"
                and not w.reserved_ahead
                and (request not in reclaiming or not self._spared(job))
            )
            if alone:
                shared = self.quota_request(job)
                done = by_request.get(shared)
                if done is not None:
                    out[job.job_id] = Explanation(w.position, *done)
                    continue
            own = queues[job.queue].team if job.queue in queues else None
            reason, blocking, suggestion, start = self.parts(w)
            text = (reason, blocking)
            known = generic.get(text)
            if known is None:
                named = self._teams_named(reason, blocking, team_of)
                known = generic[text] = (named, *self._seen_by(reason, blocking, None, team_of))
            shown = known[1], known[2]
            if own in known[0]:
                assert own is not None  # (``known[0]`` holds teams only)
                key = (reason, blocking, own)
                shown = seen.get(key) or seen.setdefault(
                    key, self._seen_by(reason, blocking, own, team_of)
                )
            # (Made once, with the texts as its reader sees them.)
            out[job.job_id] = Explanation(w.position, shown[0], shown[1], suggestion, start)
            if alone and not self._spared(job):  # (known once its request was explained)
                by_request[shared] = (shown[0], shown[1], suggestion, start)
            elif holder is not None and self._holder_estimated(holder):
                by_holder[holder.job_id] = (shown[0], shown[1], suggestion, start)
        return out

    def quota_request(self, job: PendingJob) -> Hashable:
        """What the explanation of ``job``'s wait for quota depends on, its position apart:
        its queue, flavor and GPUs, and whether it may borrow (``quota`` caches per those;
        a job that never borrows is told so, and its estimate counts no loan). Jobs with
        the same request share one explanation in ``run``."""
        return (job.queue, job.flavor, job.gpus, self.state.borrows(job))

    def _holder_estimated(self, holder: PendingJob) -> bool:
        """Whether ``holder``'s quota estimate is recorded (``quota``), as a job it holds
        reads it (``parts``)."""
        borrows = self.state.borrows(holder)
        return (holder.queue, holder.flavor, holder.gpus, borrows) in self._quota

    def _seen_by(
        self, reason: str, blocking: str, own: str | None, team_of: Mapping[str, str]
    ) -> tuple[str, str]:
        """``_as_seen_by``, with what follows a reason's last "; " (an estimate such as
        "expected start in ~2.5 h", which differs from job to job) rewritten on its own:
        "; " holds no word, so rewriting the two parts apart gives the same text."""
        head, sep, tail = reason.rpartition("; ")
        if not sep:
            return self._reason_seen(reason, own, team_of), self._blocking_seen(
                blocking, own, team_of
            )
        shown = self._heads.get((head, blocking, own))
        if shown is None:
            shown = self._heads[(head, blocking, own)] = (
                self._reason_seen(head, own, team_of),
                self._blocking_seen(blocking, own, team_of),
            )
        rest = self._tails.get((tail, own))
        if rest is None:
            rest = self._tails[(tail, own)] = self._reason_seen(tail, own, team_of)
        return shown[0] + sep + rest, shown[1]

    def _reason_seen(self, text: str, own: str | None, team_of: Mapping[str, str]) -> str:
        """``_reason_seen_by``; a text none of whose words is a job id in ``team_of`` reads
        the same for every team, which is found once per text (``team_of`` is fixed for
        this explainer's run) rather than once per text and team."""
        return _reason_seen_by(text, own, team_of) if self._named_by(text, team_of) else text

    def _named_by(self, text: str, team_of: Mapping[str, str]) -> frozenset[str]:
        """The teams of the jobs ``text``'s words name (cached per text)."""
        named = self._named.get(text)
        if named is None:
            named = self._named[text] = frozenset(
                team_of[m.group(2)] for m in _WORD.finditer(text) if m.group(2) in team_of
            )
        return named

    def _teams_named(
        self, reason: str, blocking: str, team_of: Mapping[str, str]
    ) -> frozenset[str]:
        """The teams of the jobs ``reason`` and ``blocking`` name (words and items that are
        job ids in ``team_of``): ``_as_seen_by`` reads the team only to compare it with
        these, so for any team outside them it gives what it gives for ``None``. Found per
        part of the reason around its last "; " (as ``_seen_by`` rewrites it; "; " holds no
        word) and per ``blocking``, which repeat far more than whole reasons do."""
        head, _, tail = reason.rpartition("; ")
        items = self._named_items.get(blocking)
        if items is None:
            parts = (i.strip() for i in blocking.split(","))
            items = self._named_items[blocking] = frozenset(
                team_of[i] for i in parts if i in team_of
            )
        return self._named_by(head, team_of) | self._named_by(tail, team_of) | items

    def _blocking_seen(self, blocking: str, own: str | None, team_of: Mapping[str, str]) -> str:
        shown = self._blockings.get((blocking, own))
        if shown is None:
            shown = self._blockings[(blocking, own)] = _blocking_seen_by(blocking, own, team_of)
        return shown

    def parts(self, w: Waiting) -> Parts:
        """``w``'s explanation but for its position (``Parts``), with its texts as written,
        before ``run`` rewrites them for their reader."""
        job = w.job
        if w.kind == "invalid":
            return w.text, w.blocking, w.suggestion, None
        if w.kind == "preempting":
            text = explain.preempting(w.victims, w.victim_kind, duration(self.state.config.grace_s))
            return text, ", ".join(w.victims), None, w.start
        if w.reserved_ahead:
            return self.reserved_ahead(w)
        if w.kind == "quota":
            return self.quota(w)
        if w.kind == "held":
            assert w.holder is not None
            holder = w.holder
            waited = duration(self.now - holder.submitted_at)
            text = explain.held(holder.job_id, job.queue, job.flavor, waited)
            borrows = self.state.borrows(holder)
            cached = self._quota.get((holder.queue, holder.flavor, holder.gpus, borrows))
            start = cached[2] if cached is not None else None
            return text, holder.job_id, None, start
        start = self.fluid(job)
        if w.reservation is not None and w.reservation.job_id == job.job_id:
            start = w.reservation.start
        if w.kind == "reserved":
            # All but the estimate depends on the flavor and the reservations alone.
            ids = (job.flavor, *map(_job_id, w.conflicts))
            known = self._reserved.get(ids)
            if known is None:
                holders = [f"job {r.job_id}" for r in w.conflicts]
                first = min((r.start for r in w.conflicts), default=self.now)
                known = self._reserved[ids] = (
                    explain.reserved_for(job.flavor, holders),
                    ", ".join(ids[1:]),
                    explain.shorter_runtime(first - self.now) if first > self.now else None,
                )
            head, blocking, hint = known
            # Jobs in line share fluid estimates and their coarse texts ("~2.5 h"): at
            # 10,000 nodes, 33,634 reserved jobs had 5,195 starts and 3,851 reasons. One
            # string per reason also makes ``run``'s lookups by it cheap (a string keeps its
            # hash).
            eta = self._eta(start)
            reason = self._texts.get((head, eta))
            if reason is None:
                reason = self._texts[(head, eta)] = f"{head}; {eta}"
            return reason, blocking, hint, start
        if w.kind == "behind":
            assert w.reservation is not None
            text = explain.behind(w.reservation.job_id)
            return text, w.reservation.job_id, None, start
        largest, where, holders = self.capacity(job.flavor, w.shape)
        text = explain.capacity(job.gpus, job.flavor, w.shape, largest, where, holders)
        blocking = _ids([h.split(" ", 1)[0] for h in holders]) or f"{job.flavor} nodes"
        text = f"{text}; {explain.eta(start, self.now)}"
        return text, blocking, self.fewer(job), start

    def reserved_ahead(self, w: Waiting) -> Parts:
        """A job that did not preempt because what it would free is reserved for jobs ahead
        (``Waiting.reserved_ahead``): it starts at its own reservation when it has one, else not
        before those reservations have ended."""
        job = w.job
        if w.reservation is not None and w.reservation.job_id == job.job_id:
            start: float | None = w.reservation.start
        else:
            start = max(r.end for r in w.reserved_ahead)
        holders = [f"job {r.job_id}" for r in w.reserved_ahead]
        text = f"{explain.reserved_ahead(job.flavor, holders)}; {self._eta(start)}"
        return text, ", ".join(map(_job_id, w.reserved_ahead)), None, start

    def _eta(self, start: float | None) -> str:
        """``explain.eta`` of ``start`` (cached per start)."""
        eta = self._etas.get(start)
        if eta is None:
            eta = self._etas[start] = explain.eta(start, self.now)
        return eta

    # --- quota ---------------------------------------------------------------------------

    def quota(self, w: Waiting) -> Parts:
        job = w.job
        borrows = self.state.borrows(job)
        key = (job.queue, job.flavor, job.gpus, borrows)
        if key not in self._quota:
            verdict = self.state.quota.check(job.queue, job.flavor, job.gpus, borrows=borrows)
            if verdict.ok:  # only in the arrival path, where nothing changed since
                assert w.verdict is not None
                verdict = w.verdict
            self._quota[key] = self._quota_text(job, verdict, borrows)
        text, blocking, start = self._quota[key]
        spared = self._spared(job)
        if spared:
            reclaiming = self._reclaiming[key[:3]][0]
            text, blocking, start = self._reclaim_text(job, reclaiming, spared)
        return text, blocking, self.fewer(job), start

    def _spared(self, job: PendingJob) -> frozenset[str]:
        """The running jobs ``job``, waiting for reclaim, may not take because they would
        stand before it once re-queued (``preemption``, rule 6): they leave at their
        declared ends, not when reclaimable. The lenders' jobs are walked in the order they
        leave (``_walk``) until enough GPUs have; each job reclaim would take joins the set
        counted as gone unless ``Preemptor.admits`` refuses the set with it, as the engine's
        ``select`` skips it (so no job is told it can reclaim a set the engine would
        refuse); a job that ends by itself joins it when it ends, as one that is not
        re-queued. Empty for any other job, and where no job of that set could stand before
        any job reclaiming (most of the time: ``_to_judge``)."""
        if not self._reclaiming:
            return _NONE
        known = self._reclaiming.get((job.queue, job.flavor, job.gpus))
        if known is None:
            return _NONE
        spared = self._spares.get(job.job_id)
        if spared is not None:
            return spared
        verdict, walk = known
        preemptor, quota = self._preemptor(job), self.state.quota
        gone: list[Candidate] = []
        refused: list[str] = []
        later: list[tuple[float, int, Candidate]] = []  # refused jobs by their ends
        freed = 0
        for leaving in walk:
            while later and later[0][0] <= leaving.at:
                _, _, ended = heapq.heappop(later)
                gone.append(ended)
                freed += ended.job.gpus
            if freed >= verdict.excess:
                break
            c = leaving.job
            if leaving.preempted:
                assert c is not None
                if not preemptor.admits(quota, [*gone, c]):
                    refused.append(c.job.job_id)
                    ended = replace(c, order=None)  # (gone, not re-queued)
                    heapq.heappush(later, (leaving.end, len(refused), ended))
                    continue
            if c is not None:
                gone.append(c)
            freed += leaving.gpus
        spared = self._spares[job.job_id] = frozenset(refused) if refused else _NONE
        return spared

    def _walk(self, job: PendingJob, lenders: tuple[str, ...]) -> list[_Leaving]:
        """The running jobs of ``lenders`` (of ``job``'s flavor) by when they leave for a job
        reclaiming: at the end of their notice, when reclaim may take them and their notice
        has run (``preempted``), or at their declared end, whichever comes first; each but
        those under notice (already out of ``Candidate.rest``) as a reclaim victim with what
        ``Preemptor.admits`` needs, its order tested only if it is preempted (cached). A job
        claimed in the pass (a victim, given notice in it or before) is left out: a job
        decided before counts on its GPUs, as the engine leaves it out of every later try;
        what a lender borrows is what the pass counted for reclaim (``PolicyState.outgoing``)."""
        flavor = job.flavor
        key = (lenders, flavor)
        walk = self._walks.get(key)
        if walk is None:
            state = self.state
            grace = state.config.grace_s
            walk = self._walks[key] = []
            ordering = self._preemptor(job)  # (a victim's place depends on it alone)
            claimed = state.claimed
            for name in lenders:
                nominal = state.quota.nominal(name, flavor)
                rest = state.quota.used(name, flavor) - state.outgoing.get((name, flavor), 0)
                borrowed = max(0, rest - nominal)
                theirs = state.running.get((name, flavor), ())
                ordered = nominal > 0
                for r in theirs:
                    end = max(self.now, r.started_at + r.declared_runtime_s)
                    if r.job_id in claimed:
                        continue
                    if r.notice_at is not None:
                        walk.append(_Leaving(min(end, r.notice_at + grace), r.gpus, end, None))
                        continue
                    at, order = end, None
                    cls = state.priority(r.priority)
                    if state.config.preemption:
                        protected = protected_until(r, cls, state.config)
                        if r.gpus > borrowed:  # spared a while (``preemption``)
                            protected = max(protected, oversize_until(r, state.config))
                        if max(self.now, protected) + grace < end:
                            at = max(self.now, protected) + grace
                            order = ordering.order(r) if ordered else None
                    c = Candidate(r, "reclaim", victim_key(r, cls.value, self.now), order, rest)
                    walk.append(_Leaving(at, r.gpus, end, c, at < end))
            walk.sort(key=_at)
        return walk

    def _to_judge(self, job: PendingJob, lenders: tuple[str, ...], gpus: int) -> bool:
        """Whether a job reclaiming ``gpus`` of ``lenders`` must be judged on its own
        (``_spared``): whether a job the walk takes before they have left could be in the
        first tier once re-queued with the others taken. If none could, ``Preemptor.admits``
        admits every set of them for any waiting job (only such a job is ever refused)."""
        key = (lenders, job.flavor, gpus)
        known = self._judged.get(key)
        if known is None:
            taken: list[Candidate] = []
            freed = 0
            for leaving in self._walk(job, lenders):
                if freed >= gpus:
                    break
                if leaving.job is not None:
                    taken.append(leaving.job)
                freed += leaving.gpus
            first = first_tier_again(self.state.quota, taken)
            known = self._judged[key] = next(first, None) is not None
        return known

    def _preemptor(self, job: PendingJob) -> Preemptor:
        state = self.state
        return Preemptor(job, state.level, state.fair, max(state.config.ageing_s, 1e-9))

    def _quota_text(
        self, job: PendingJob, verdict: Verdict, borrows: bool = True
    ) -> tuple[str, str, float | None]:
        q = self.state.quota
        queue = q.queues[job.queue]
        if verdict.kind in ("no_quota", "nominal_full", "borrow_limit"):
            start = self._released((job.queue,), job.flavor, verdict.excess)
            if verdict.kind == "borrow_limit":
                limit = q.borrowing_limit(job.queue, job.flavor)
                text = explain.borrow_limit(
                    job.queue, job.flavor, verdict.used - verdict.nominal, limit
                )
            else:
                ids = self._holding_ids(job.queue, job.flavor)
                text = explain.nominal_full(
                    job.queue, job.flavor, verdict.used, verdict.nominal, ids
                )
                if not borrows and queue.cohort is not None:
                    text = f"{text} ({explain.NOT_BORROWING})"
            text = f"{text}; {explain.eta(start, self.now)}"
            blocking = _ids(self._holding_ids(job.queue, job.flavor)) or f"queue {job.queue} quota"
            return text, blocking, start
        assert queue.cohort is not None
        if verdict.kind == "reclaim":
            return self._reclaim_text(job, verdict, frozenset())
        # The text but for its estimate depends on the queue, flavor and these figures only.
        head_key = (job.queue, job.flavor, verdict.used, verdict.nominal)
        head = self._cohort_heads.get(head_key)
        if head is None:
            size, used = q.pool(queue.cohort, job.flavor)
            users = self._named_users(queue.cohort, job.flavor)
            holders = [h for name, h, _ in users if name != job.queue]
            text = explain.cohort_full(
                job.queue, job.flavor, verdict.used, verdict.nominal, max(0, size - used), holders
            )
            first = [word for name, _, word in users if name != job.queue]
            blocking = _ids(first) or f"cohort {queue.cohort}"
            head = self._cohort_heads[head_key] = (text, blocking)
        text, blocking = head
        members = self._members.get(queue.cohort)
        if members is None:
            members = self._members[queue.cohort] = tuple(q.members[queue.cohort])
        start = self._released(members, job.flavor, verdict.excess)
        text = f"{text}; {explain.eta(start, self.now)}"
        return text, blocking, start

    def _holding_ids(self, queue: str, flavor: str) -> list[str]:
        """Ids of the jobs holding ``queue``'s ``flavor`` quota, sorted (cached)."""
        key = (queue, flavor)
        ids = self._holders.get(key)
        if ids is None:
            holding = self.state.holding.get(key, [])
            ids = self._holders[key] = sorted(j for _, _, j in holding)
        return ids

    def _users(self, cohort: str, flavor: str) -> list[tuple[int, str]]:
        """(GPUs used, queue) of the cohort's queues, most first (cached)."""
        key = (cohort, flavor)
        users = self._cohort_users.get(key)
        if users is None:
            q = self.state.quota
            users = self._cohort_users[key] = sorted(
                ((q.used(name, flavor), name) for name in q.members[cohort]),
                key=lambda u: (-u[0], u[1]),
            )
        return users

    def _named_users(self, cohort: str, flavor: str) -> list[tuple[str, str, str]]:
        """The cohort's queues using ``flavor``, in ``_users`` order, each with its holder's
        text ("queue with n") and that text's first word (cached: made once per cohort, not
        once per queue of it)."""
        key = (cohort, flavor)
        named = self._users_named.get(key)
        if named is None:
            named = self._users_named[key] = []
            for n, name in self._users(cohort, flavor):
                if n > 0:
                    text = f"{name} with {n}"
                    named.append((name, text, text.split(" ", 1)[0]))
        return named

    def _reclaim_text(
        self, job: PendingJob, verdict: Verdict, spared: frozenset[str]
    ) -> tuple[str, str, float | None]:
        """``_quota_text`` of a job waiting for reclaim, ``spared`` the lenders' jobs it may
        not take (``_spared``)."""
        q = self.state.quota
        queue = q.queues[job.queue]
        assert queue.cohort is not None
        known_key = (job.queue, job.flavor, verdict.used, verdict.nominal)
        known = self._reclaims.get(known_key)
        if known is None:
            borrowers = [b for b in self._borrowers(queue.cohort, job.flavor) if b[0] != job.queue]
            teams = [(q.queues[name].team, n) for name, n in borrowers]
            idle = max(0, verdict.nominal - verdict.used)
            shares: list[tuple[str, int]] = []
            for team, n in teams:
                share = min(n, idle - sum(t for _, t in shares))
                if share > 0:
                    shares.append((team, share))
            known = self._reclaims[known_key] = (
                _ids([name for name, _ in borrowers]) or f"cohort {queue.cohort}",
                tuple(n for n, _ in borrowers),
                shares,
            )
        blocking, lenders, taken = known
        if self._to_judge(job, lenders, verdict.excess):
            walk = self._walk(job, lenders)
            self._reclaiming[(job.queue, job.flavor, job.gpus)] = (verdict, walk)
        start = self._reclaimed(job, lenders, verdict.excess, spared)
        preempting = start is not None and self._by_preemption(
            job, lenders, verdict.excess, spared, start
        )
        text = explain.reclaim(job.flavor, verdict.nominal, taken, start, self.now, preempting)
        return text, blocking, start

    def _borrowers(self, cohort: str, flavor: str) -> list[tuple[str, int]]:
        """``QuotaBook.borrowers``, each queue's borrowed GPUs as the pass counted them for
        reclaim (``PolicyState.outgoing``): none once its victims have left."""
        key = (cohort, flavor)
        if key not in self._borrowing:
            quota, outgoing = self.state.quota, self.state.outgoing
            found = []
            for name, borrowed in quota.borrowers(cohort, flavor):
                borrowed -= outgoing.get((name, flavor), 0)
                if borrowed > 0:
                    found.append((name, borrowed))
            self._borrowing[key] = sorted(found, key=lambda b: (-b[1], b[0]))
        return self._borrowing[key]

    def _released(self, queues: tuple[str, ...], flavor: str, gpus: int) -> float | None:
        """When ``gpus`` held by ``queues`` will have reached their declared ends."""
        key = (queues, flavor, False, frozenset[str]())
        if key not in self._timelines:
            holding = self.state.holding
            ends = [(end, n) for name in queues for end, n, _ in holding.get((name, flavor), ())]
            self._timelines[key] = _Timeline(ends)
        return self._timelines[key].when(gpus, self.now)

    def _reclaimed(
        self, job: PendingJob, queues: tuple[str, ...], gpus: int, spared: frozenset[str]
    ) -> float | None:
        """When ``gpus`` of ``queues``' jobs (of ``job``'s flavor) can be preempted (and
        have left) or end; those in ``spared`` only end (``_spared``)."""
        key = (queues, job.flavor, True, spared)
        if key not in self._timelines:
            ends = [
                (
                    leaving.end
                    if leaving.job is not None and leaving.job.job.job_id in spared
                    else leaving.at,
                    leaving.gpus,
                )
                for leaving in self._walk(job, queues)
            ]
            self._timelines[key] = _Timeline(ends)
        return self._timelines[key].when(gpus, self.now)

    def _by_preemption(
        self,
        job: PendingJob,
        queues: tuple[str, ...],
        gpus: int,
        spared: frozenset[str],
        start: float,
    ) -> bool:
        """Whether ``gpus`` of ``queues``' jobs are back by ``start`` (``_reclaimed``) through
        preemption alone: jobs under notice or preempted once protected, none of ``spared``.
        False when the estimate waits for a job to end by itself."""
        key = (queues, job.flavor, spared)
        timeline = self._preempted.get(key)
        if timeline is None:
            timeline = self._preempted[key] = _Timeline(
                [
                    (leaving.at, leaving.gpus)
                    for leaving in self._walk(job, queues)
                    if leaving.job is None
                    or (leaving.preempted and leaving.job.job.job_id not in spared)
                ]
            )
        reclaimed = timeline.when(gpus, self.now)
        return reclaimed is not None and reclaimed <= start

    # --- capacity ------------------------------------------------------------------------

    def capacity(self, flavor: str, shape: Shape) -> tuple[int, str, list[str]]:
        """(largest free block, node(s) holding it, holders of those nodes), cached."""
        key = (flavor, shape)
        if key not in self._capacity:
            pool = self.state.pools[flavor]
            count, per_node = shape
            nodes = pool.roomiest(count, per_node)
            largest = nodes[0].free_count if nodes else 0
            where = nodes[0].node_id if nodes and largest else ""
            holders = sorted({j for n in nodes for j in n.holders})
            self._capacity[key] = (largest, where, holders)
        return self._capacity[key]

    def fluid(self, job: PendingJob) -> float | None:
        if self.quick:
            return None
        estimate = self._fluid.get(job.flavor)
        if estimate is None:
            pool = self.state.pools[job.flavor]
            releases = [r for n in pool.nodes.values() for r in n.releases]
            estimate = self._fluid[job.flavor] = FluidEstimate(pool.free_total, releases, self.now)
        return estimate.next_start(job.gpus, job.declared_runtime_s)

    def fewer(self, job: PendingJob) -> str | None:
        """'asking for n GPUs would let it start now' when a smaller gang fits now."""
        borrows = self.state.borrows(job)
        key = (job.queue, job.flavor, borrows)
        if key not in self._headroom:
            self._headroom[key] = self._fits_now(job, borrows)
        hint_key = (job.queue, job.flavor, job.gpus, borrows)
        if hint_key not in self._hints:
            room = min(self._headroom[key], job.gpus - 1)
            pool = self.state.pools[job.flavor]
            whole = min(room, pool.count_at_least(pool.capacity) * pool.capacity)
            n = max(min(room, pool.max_free()), whole - whole % pool.capacity)
            self._hints[hint_key] = explain.fewer_gpus(n) if n >= 1 else None
        return self._hints[hint_key]

    def _fits_now(self, job: PendingJob, borrows: bool) -> int:
        """The most GPUs a job of this queue, flavor and kind (``borrows``) could start
        with now."""
        quota = self.state.quota
        low, high = 0, quota.ceiling(job.queue, job.flavor, borrows)
        while low < high:  # largest n with quota room: check() is monotone in n
            mid = (low + high + 1) // 2
            if quota.check(job.queue, job.flavor, mid, borrows=borrows).ok:
                low = mid
            else:
                high = mid - 1
        return low


@dataclass(frozen=True, slots=True)
class _Leaving:
    """A lender's running job as a job reclaiming counts it (``_Explainer._walk``)."""

    at: float
    gpus: int
    end: float
    """Its declared end (or now), when it leaves if not preempted."""
    job: Candidate | None
    """The job as a reclaim victim (``Candidate.order`` None unless ``preempted``); None
    for a job under notice."""
    preempted: bool = False
    """Whether it leaves by preemption at ``at`` (before its end)."""


_at = operator.attrgetter("at")


class _Timeline:
    """GPUs coming free over time: when will ``n`` have come free?"""

    def __init__(self, ends: list[tuple[float, int]]):
        ends.sort()
        self._times = [t for t, _ in ends]
        self._freed = list(itertools.accumulate(n for _, n in ends))

    def when(self, gpus: int, now: float) -> float | None:
        if gpus <= 0:
            return now
        i = bisect.bisect_left(self._freed, gpus)
        return max(now, self._times[i]) if i < len(self._times) else None


_job_id = operator.attrgetter("job_id")

_WORD = re.compile(r"(job )?([A-Za-z0-9][\w.:-]*)")


def for_team(e: Explanation, team: str | None, team_of: Mapping[str, str]) -> Explanation:
    """``e`` as ``team`` may read it: each job of another team named by its team only."""
    reason, blocking = _as_seen_by(e.reason, e.blocking, team, team_of)
    return replace(e, reason=reason, blocking=blocking)


def _as_seen_by(
    reason: str, blocking: str, team: str | None, team_of: Mapping[str, str]
) -> tuple[str, str]:
    """``reason`` and ``blocking`` with other teams' job ids replaced (see ``for_team``)."""
    return _reason_seen_by(reason, team, team_of), _blocking_seen_by(blocking, team, team_of)


def _reason_seen_by(reason: str, team: str | None, team_of: Mapping[str, str]) -> str:
    """``reason`` with every word that is another team's job id replaced."""

    def in_reason(m: re.Match[str]) -> str:
        other = team_of.get(m.group(2))
        return m.group(0) if other is None or other == team else f"a {other} job"

    return _counted(_WORD.sub(in_reason, reason))


_ITEM = r"(?:a [\w.:-]+ job|[\w.:-]+)"
_LIST = re.compile(rf"{_ITEM}(?:, {_ITEM})*(?: and (?:{_ITEM}|\d+ more))+")
_TEAM_JOB = re.compile(r"a ([\w.:-]+) job")


def _counted(reason: str) -> str:
    """``reason`` with each list (as ``explain.names`` writes it) that names several jobs of
    one other team counting them: 'a team-b job, 2 team-c jobs and 1 more', not 'a team-b
    job, a team-c job, a team-c job and 1 more' (what naming each by its team gave)."""
    if reason.count(" job") < 2:
        return reason

    def count(m: re.Match[str]) -> str:
        text = m.group(0)
        more = ""
        if re.search(r" and \d+ more$", text):
            text, _, more = text.rpartition(" and ")
        items = re.split(r", | and ", text)
        teams = [_team_of_item(i) for i in items]
        if all(teams.count(t) < 2 for t in teams if t is not None):
            return m.group(0)
        shown: list[str] = []
        seen: set[str] = set()
        for item, t in zip(items, teams, strict=True):
            if t is None:
                shown.append(item)
            elif t not in seen:
                seen.add(t)
                n = teams.count(t)
                shown.append(item if n == 1 else f"{n} {t} jobs")
        if more:
            return f"{', '.join(shown)} and {more}"
        return shown[0] if len(shown) == 1 else f"{', '.join(shown[:-1])} and {shown[-1]}"

    return _LIST.sub(count, reason)


def _team_of_item(item: str) -> str | None:
    """The team of a list item 'a <team> job'; None for any other item."""
    found = _TEAM_JOB.fullmatch(item)
    return found.group(1) if found else None


def _blocking_seen_by(blocking: str, team: str | None, team_of: Mapping[str, str]) -> str:
    """``blocking`` with each item that is another team's job id replaced by that team,
    repeats dropped."""
    shown_items: list[str] = []
    for item in (i.strip() for i in blocking.split(",")):
        other = team_of.get(item)
        shown = other if other is not None and other != team and other else item
        if shown not in shown_items:
            shown_items.append(shown)
    return ", ".join(shown_items)


def _ids(items: list[str], limit: int = 10) -> str:
    """Comma-separated, at most ``limit`` shown."""
    shown = ", ".join(items[:limit])
    return shown if len(items) <= limit else f"{shown}, +{len(items) - limit} more"

"""Quota accounting: nominal quota per queue and flavor, cohorts, borrowing and lending.

Contract (per flavor ``f``; Kueue's ClusterQueue/cohort model):
- ``lendable(q) = min(lending_limit(q), nominal(q))`` (all of the nominal when no limit is
  set) goes into its cohort's pool; ``guaranteed(q) = nominal(q) - lendable(q)`` is never lent.
- A queue's use beyond its guaranteed part draws on the pool:
  ``pool_used = sum(max(0, used(p) - guaranteed(p)))`` over the cohort, and it must stay at or
  below ``pool = sum(lendable(p))``.
- A queue *borrows* what it uses beyond its nominal; that may never exceed its borrowing
  limit (no limit when none is set). A queue without a cohort never borrows.
- A job that keeps its queue within the nominal quota but finds the pool used up is entitled
  to *reclaim*: borrowers (queues above their nominal) may be preempted for it.
- A job that may never be preempted (``borrows=False``: its priority class is not
  preemptible) never borrows: borrowed GPUs must come back to their lender by reclaim, which
  could never take such a job, so a tenant choosing such a class could otherwise hold
  another team's quota for the whole of its runtime. Its queue's nominal quota is its limit.
- ``check`` changes no figure (it only keeps its last verdicts); ``add``/``remove`` keep
  ``used`` and ``pool_used`` in step.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from trainyard_platform.services.scheduler.policy.model import Queue

UNLIMITED = 1 << 40

VerdictKind = Literal["ok", "no_quota", "nominal_full", "borrow_limit", "cohort_full", "reclaim"]


@dataclass(frozen=True, slots=True)
class Verdict:
    """Whether ``n`` more GPUs fit the quota, and if not, by how much they miss."""

    kind: VerdictKind
    used: int
    """The queue's use of the flavor before the job."""
    nominal: int
    borrowing: bool = False
    """(ok) the job takes quota beyond the queue's nominal."""
    excess: int = 0
    """(not ok) how many GPUs too many: over the nominal, over the borrowing limit, or over
    what the cohort's pool has left."""

    @property
    def ok(self) -> bool:
        return self.kind == "ok"


@dataclass(frozen=True, slots=True)
class Terms:
    """A queue's fixed quota figures for one flavor."""

    nominal: int
    guaranteed: int
    """The part of the nominal quota it never lends."""
    limit: int
    """The most it may borrow beyond its nominal (0 without a cohort)."""
    cohort: str | None


class QuotaBook:
    """Used quota per (queue, flavor) and per (cohort, flavor); see the module docstring."""

    def __init__(self, queues: Iterable[Queue]):
        self.queues: dict[str, Queue] = {q.name: q for q in sorted(queues, key=lambda q: q.name)}
        self.members: dict[str, list[str]] = {}
        for q in self.queues.values():
            if q.cohort is not None:
                self.members.setdefault(q.cohort, []).append(q.name)
        self._terms: dict[tuple[str, str], Terms] = {}
        self._used: dict[tuple[str, str], int] = {}
        self._pool: dict[tuple[str, str], int] = {}
        self._pool_used: dict[tuple[str, str], int] = {}
        self._verdicts: dict[tuple[str, str, int, bool], tuple[int, int, Verdict]] = {}
        """(queue, flavor, gpus, borrows) -> the queue's use and its cohort's pool use at the last
        ``check`` without ``freed``, and its verdict (see ``check``)."""
        for q in self.queues.values():
            if q.cohort is not None:
                for flavor in q.nominal:
                    key = (q.cohort, flavor)
                    self._pool[key] = self._pool.get(key, 0) + self.lendable(q.name, flavor)

    # --- per queue figures ---------------------------------------------------------------

    def terms(self, queue: str, flavor: str) -> Terms:
        """The queue's fixed quota figures for ``flavor`` (cached)."""
        key = (queue, flavor)
        terms = self._terms.get(key)
        if terms is None:
            q = self.queues[queue]
            nominal = max(0, q.nominal.get(flavor, 0))
            lendable = max(0, min(q.lending_limit.get(flavor, nominal), nominal))
            limit = 0 if q.cohort is None else max(0, q.borrowing_limit.get(flavor, UNLIMITED))
            terms = self._terms[key] = Terms(nominal, nominal - lendable, limit, q.cohort)
        return terms

    def nominal(self, queue: str, flavor: str) -> int:
        return self.terms(queue, flavor).nominal

    def lendable(self, queue: str, flavor: str) -> int:
        t = self.terms(queue, flavor)
        return t.nominal - t.guaranteed

    def guaranteed(self, queue: str, flavor: str) -> int:
        return self.terms(queue, flavor).guaranteed

    def borrowing_limit(self, queue: str, flavor: str) -> int:
        return self.terms(queue, flavor).limit

    def used(self, queue: str, flavor: str) -> int:
        return self._used.get((queue, flavor), 0)

    def borrowed(self, queue: str, flavor: str) -> int:
        return max(0, self.used(queue, flavor) - self.nominal(queue, flavor))

    def pool(self, cohort: str, flavor: str) -> tuple[int, int]:
        """(size, used) of a cohort's pool of lendable quota."""
        key = (cohort, flavor)
        return self._pool.get(key, 0), self._pool_used.get(key, 0)

    def ceiling(self, queue: str, flavor: str, borrows: bool = True) -> int:
        """The most GPUs the queue could ever hold at once (everyone else idle), for jobs
        that borrow or (``borrows=False``) that do not."""
        t = self.terms(queue, flavor)
        if t.cohort is None or not borrows:
            return t.nominal
        reach = t.guaranteed + self.pool(t.cohort, flavor)[0]
        return min(t.nominal + t.limit, max(t.nominal, reach))

    def borrowers(self, cohort: str, flavor: str, exclude: str = "") -> list[tuple[str, int]]:
        """(queue, GPUs borrowed) of the cohort's queues above their nominal, most first."""
        found = []
        used, terms = self._used, self._terms
        for name in self.members.get(cohort, ()):
            if name != exclude:
                # = ``borrowed``, inlined: a try to preempt asks this of a whole cohort
                key = (name, flavor)
                t = terms.get(key) or self.terms(name, flavor)
                borrowed = used.get(key, 0) - t.nominal
                if borrowed > 0:
                    found.append((name, borrowed))
        return sorted(found, key=lambda b: (-b[1], b[0]))

    # --- decisions -----------------------------------------------------------------------

    def within_nominal(self, queue: str, flavor: str, gpus: int) -> bool:
        key = (queue, flavor)
        terms = self._terms.get(key) or self.terms(queue, flavor)
        return self._used.get(key, 0) + gpus <= terms.nominal

    def first_tier(self, queue: str, flavor: str, gpus: int) -> bool:
        """Whether a job of ``gpus`` GPUs of ``queue`` and ``flavor`` is ordered among the
        first tier (engine: before every borrower): it stays within its queue's nominal quota,
        or it is larger than the whole nominal quota and its queue holds none of the flavor.

        The second case is the idle team's gang bigger than its quota: it can never stay
        within its quota, so without it such a gang would wait behind every other team's
        jobs that do, however little its team has used. A queue's use only grows during a
        pass, so a job leaves the first tier during a pass and never enters it."""
        key = (queue, flavor)
        terms = self._terms.get(key) or self.terms(queue, flavor)
        used = self._used.get(key, 0)
        return used + gpus <= terms.nominal or (used == 0 and terms.nominal > 0)

    def check(
        self,
        queue: str,
        flavor: str,
        gpus: int,
        freed: Mapping[str, int] | None = None,
        borrows: bool = True,
    ) -> Verdict:
        """Whether ``gpus`` more fit ``queue``'s quota, as if ``freed`` (queue -> GPUs of
        this flavor) had been released first, for a job that may borrow or (``borrows=False``)
        may not: beyond the nominal, such a job's verdict is ``nominal_full``.

        Without ``freed`` the last verdict for (queue, flavor, gpus, borrows) is kept with
        the queue's use and its cohort's pool use it was made from: all else it reads
        (terms, pool sizes) is fixed once built, so while those two are unchanged the
        verdict is too."""
        key = (queue, flavor)
        t = self._terms.get(key) or self.terms(queue, flavor)
        current = self._used.get(key, 0)
        if freed:
            return self._check(t, queue, flavor, gpus, current, freed, borrows)
        pooled = self._pool_used.get((t.cohort, flavor), 0) if t.cohort is not None else 0
        memo = (queue, flavor, gpus, borrows)
        kept = self._verdicts.get(memo)
        if kept is not None and kept[0] == current and kept[1] == pooled:
            return kept[2]
        verdict = self._check(t, queue, flavor, gpus, current, None, borrows)
        self._verdicts[memo] = (current, pooled, verdict)
        return verdict

    def _check(
        self,
        t: Terms,
        queue: str,
        flavor: str,
        gpus: int,
        current: int,
        freed: Mapping[str, int] | None,
        borrows: bool,
    ) -> Verdict:
        used = current - freed.get(queue, 0) if freed else current
        after = used + gpus
        nominal = t.nominal
        if t.cohort is None or (not borrows and after > nominal):
            if after <= nominal:
                return Verdict("ok", used, nominal)
            kind: VerdictKind = "no_quota" if nominal == 0 else "nominal_full"
            return Verdict(kind, used, nominal, excess=after - nominal)
        borrow = after - nominal if after > nominal else 0
        if borrow > t.limit:
            kind = "no_quota" if nominal == 0 and t.limit == 0 else "borrow_limit"
            return Verdict(kind, used, nominal, excess=borrow - t.limit)
        key = (t.cohort, flavor)
        size = self._pool.get(key, 0)
        pool_used = self._pool_used.get(key, 0)
        if freed:
            for other, gone in freed.items():
                # Only the cohort's own members draw on its pool.
                member = self.queues.get(other)
                if other != queue and gone and member is not None and member.cohort == t.cohort:
                    before = self.used(other, flavor)
                    pool_used += self._draw(other, flavor, before - gone) - self._draw(
                        other, flavor, before
                    )
        g = t.guaranteed
        pool_used += max(0, after - g) - max(0, current - g)
        if pool_used <= size:
            return Verdict("ok", used, nominal, borrowing=borrow > 0)
        kind = "reclaim" if after <= nominal else "cohort_full"
        return Verdict(kind, used, nominal, excess=pool_used - size)

    def _draw(self, queue: str, flavor: str, used: int) -> int:
        """What a queue using ``used`` GPUs draws from its cohort's pool."""
        return max(0, used - self.terms(queue, flavor).guaranteed)

    def add(self, queue: str, flavor: str, gpus: int) -> None:
        self._change(queue, flavor, gpus)

    def remove(self, queue: str, flavor: str, gpus: int) -> None:
        self._change(queue, flavor, -gpus)

    def _change(self, queue: str, flavor: str, delta: int) -> None:
        q = self.queues.get(queue)
        if q is None:
            return
        before = self.used(queue, flavor)
        self._used[(queue, flavor)] = before + delta
        if q.cohort is not None:
            key = (q.cohort, flavor)
            draw = self._draw(queue, flavor, before + delta) - self._draw(queue, flavor, before)
            self._pool_used[key] = self._pool_used.get(key, 0) + draw

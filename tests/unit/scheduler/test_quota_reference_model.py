"""``QuotaBook`` against an independent reference model of the quota rules.

The reference model below restates the rules of ``services.scheduler.policy.quota`` (Kueue's
ClusterQueue/cohort model) from scratch: every figure is recomputed from the queues and the
GPUs each queue uses, with no incremental bookkeeping and nothing imported from the
production module. Random queues and random sequences of ``check``/``add``/``remove`` must
give the same verdicts (kind, excess, borrowing) and the same figures (used, borrowed, pool,
ceiling, borrowers) in both.

The requests are steered to the boundaries that matter: for each check the reference model
works out the largest request that still fits (``room``) and the request is mostly ``room``,
``room + 1`` or ``room - 1``; some checks free GPUs first (``freed``, as preemption asks).
The run is derandomized with a fixed number of examples, and counts what it reached: the
test fails if any interesting case (an exact fit of the cohort's pool, one GPU over it, a
borrow at its limit, a reclaim, ...) was not reached, so a change to the strategies cannot
silently stop testing them.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from hypothesis import HealthCheck, event, given, settings, target
from hypothesis import strategies as st

from trainyard_platform.services.scheduler.policy.model import Queue
from trainyard_platform.services.scheduler.policy.quota import QuotaBook

FLAVORS = ("a100", "h100")

# --- the reference model -----------------------------------------------------------------


@dataclass(frozen=True)
class RefTerms:
    nominal: int
    lendable: int
    guaranteed: int
    limit: float
    """How much it may borrow beyond its nominal: 0 outside a cohort, ``math.inf`` when no
    limit is set."""
    cohort: str | None


def ref_terms(q: Queue, flavor: str) -> RefTerms:
    nominal = max(0, q.nominal.get(flavor, 0))
    lend = q.lending_limit.get(flavor)
    lendable = nominal if lend is None else max(0, min(lend, nominal))
    if q.cohort is None:
        limit: float = 0
    else:
        borrow = q.borrowing_limit.get(flavor)
        limit = math.inf if borrow is None else max(0, borrow)
    return RefTerms(nominal, lendable, nominal - lendable, limit, q.cohort)


@dataclass(frozen=True)
class RefVerdict:
    kind: str
    used: int
    nominal: int
    borrowing: bool
    excess: int


class Reference:
    """The quota rules, recomputed from scratch from ``used`` at every question."""

    def __init__(self, queues: list[Queue]) -> None:
        self.queues = {q.name: q for q in queues}
        self.used: Counter[tuple[str, str]] = Counter()
        self._terms = {(q.name, f): ref_terms(q, f) for q in queues for f in FLAVORS}

    def terms(self, queue: str, flavor: str) -> RefTerms:
        return self._terms[(queue, flavor)]

    def members(self, cohort: str) -> list[str]:
        return sorted(n for n, q in self.queues.items() if q.cohort == cohort)

    def pool_size(self, cohort: str, flavor: str) -> int:
        return sum(self.terms(m, flavor).lendable for m in self.members(cohort))

    def pool_used(self, cohort: str, flavor: str, uses: Mapping[str, int]) -> int:
        """What the cohort's members draw from its pool when each uses ``uses[member]``."""
        return sum(max(0, uses[m] - self.terms(m, flavor).guaranteed) for m in self.members(cohort))

    def check(
        self, queue: str, flavor: str, gpus: int, freed: Mapping[str, int] | None = None
    ) -> RefVerdict:
        freed = freed or {}
        t = self.terms(queue, flavor)
        uses = {name: self.used[(name, flavor)] - freed.get(name, 0) for name in self.queues}
        used = uses[queue]
        after = used + gpus
        if t.cohort is None:
            if after <= t.nominal:
                return RefVerdict("ok", used, t.nominal, False, 0)
            kind = "no_quota" if t.nominal == 0 else "nominal_full"
            return RefVerdict(kind, used, t.nominal, False, after - t.nominal)
        borrow = max(0, after - t.nominal)
        if borrow > t.limit:
            kind = "no_quota" if t.nominal == 0 and t.limit == 0 else "borrow_limit"
            return RefVerdict(kind, used, t.nominal, False, int(borrow - t.limit))
        uses[queue] = after
        drawn = self.pool_used(t.cohort, flavor, uses)
        size = self.pool_size(t.cohort, flavor)
        if drawn <= size:
            return RefVerdict("ok", used, t.nominal, borrow > 0, 0)
        kind = "reclaim" if after <= t.nominal else "cohort_full"
        return RefVerdict(kind, used, t.nominal, False, drawn - size)

    def room(self, queue: str, flavor: str, freed: Mapping[str, int] | None = None) -> int:
        """The largest request that fits now (-1: not even 0 GPUs fit)."""
        n = -1
        while n < 40 and self.check(queue, flavor, n + 1, freed).kind == "ok":
            n += 1
        return n

    def ceiling(self, queue: str, flavor: str) -> int:
        """The most the queue could hold with every other queue idle, by trying."""
        alone = Reference(list(self.queues.values()))
        return alone.room(queue, flavor)

    def borrowed(self, queue: str, flavor: str) -> int:
        return max(0, self.used[(queue, flavor)] - self.terms(queue, flavor).nominal)

    def borrowers(self, cohort: str, flavor: str, exclude: str) -> list[tuple[str, int]]:
        found = [
            (m, self.borrowed(m, flavor))
            for m in self.members(cohort)
            if m != exclude and self.borrowed(m, flavor) > 0
        ]
        return sorted(found, key=lambda b: (-b[1], b[0]))


# --- strategies ----------------------------------------------------------------------------


@st.composite
def queue_sets(draw: st.DrawFn) -> list[Queue]:
    queues = []
    for i in range(draw(st.integers(2, 5))):
        cohort = draw(st.sampled_from(["c1", "c1", "c2", None]))
        # Mostly some quota of each flavor; sometimes none, or the flavor left out.
        nominal = {
            f: draw(st.one_of(st.integers(1, 6), st.just(0)))
            for f in FLAVORS
            if draw(st.sampled_from([True, True, True, False]))
        }
        borrow = {f: draw(st.integers(-1, 6)) for f in FLAVORS if draw(st.booleans())}
        lend = {f: draw(st.integers(-1, 6)) for f in FLAVORS if draw(st.booleans())}
        queues.append(Queue(f"q{i}", f"team{i}", cohort, nominal, borrow, lend))
    return queues


REACHED: Counter[str] = Counter()


def _reached(what: str) -> None:
    REACHED[what] += 1
    event(what)


def _classify(ref: Reference, verdict: RefVerdict, queue: str, flavor: str, gpus: int) -> None:
    t = ref.terms(queue, flavor)
    _reached(f"verdict {verdict.kind}")
    if verdict.kind == "ok" and verdict.borrowing:
        _reached("ok while borrowing")
    if verdict.kind != "ok" and verdict.excess == 1:
        _reached(f"{verdict.kind} by exactly one GPU")
    if verdict.kind == "ok" and t.cohort is not None:
        uses = {n: ref.used[(n, flavor)] for n in ref.queues}
        uses[queue] += gpus
        if gpus > 0 and ref.pool_used(t.cohort, flavor, uses) == ref.pool_size(t.cohort, flavor):
            _reached("ok filling the cohort's pool exactly")
        if gpus > 0 and verdict.borrowing and verdict.used + gpus - t.nominal == t.limit:
            _reached("ok borrowing exactly up to the limit")


def _compare_figures(book: QuotaBook, ref: Reference, ceilings: bool = False) -> None:
    for name, q in ref.queues.items():
        for f in FLAVORS:
            t = ref.terms(name, f)
            assert book.used(name, f) == ref.used[(name, f)]
            assert book.nominal(name, f) == t.nominal
            assert book.lendable(name, f) == t.lendable
            assert book.guaranteed(name, f) == t.guaranteed
            assert book.borrowed(name, f) == ref.borrowed(name, f)
            limit = book.borrowing_limit(name, f)
            assert limit >= 2**40 if math.isinf(t.limit) else limit == t.limit
            if ceilings:
                assert book.ceiling(name, f) == ref.ceiling(name, f), (name, f)
            for n in (0, 1, 3):
                inside = ref.used[(name, f)] + n <= t.nominal
                assert book.within_nominal(name, f, n) == inside
            if q.cohort is not None:
                uses = {m: ref.used[(m, f)] for m in ref.queues}
                expected = (ref.pool_size(q.cohort, f), ref.pool_used(q.cohort, f, uses))
                assert book.pool(q.cohort, f) == expected
                assert book.borrowers(q.cohort, f, exclude=name) == ref.borrowers(q.cohort, f, name)
                assert book.borrowers(q.cohort, f) == ref.borrowers(q.cohort, f, "")
                if len(ref.borrowers(q.cohort, f, "")) > 1:
                    _reached("two queues of a cohort borrow at once")


def _same(book: QuotaBook, ref: Reference, queue: str, flavor: str, gpus: int, freed=None) -> None:  # type: ignore[no-untyped-def]
    got = book.check(queue, flavor, gpus, freed)
    want = ref.check(queue, flavor, gpus, freed)
    assert (got.kind, got.used, got.nominal, got.excess) == (
        want.kind,
        want.used,
        want.nominal,
        want.excess,
    ), (queue, flavor, gpus, freed)
    assert got.ok == (want.kind == "ok")
    if want.kind == "ok":
        assert got.borrowing == want.borrowing


@settings(
    max_examples=300,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(queues=queue_sets(), data=st.data())
def _book_matches_the_reference(queues: list[Queue], data: st.DataObject) -> None:
    book = QuotaBook(queues)
    ref = Reference(queues)
    names = [q.name for q in queues]
    kinds: Counter[str] = Counter()
    for _ in range(data.draw(st.integers(8, 30), label="steps")):
        queue = data.draw(st.sampled_from(names), label="queue")
        flavor = data.draw(st.sampled_from(FLAVORS), label="flavor")
        freed: dict[str, int] | None = None
        if data.draw(st.integers(0, 3), label="free first?") == 0:
            # As preemption asks: what if these were released first? Any queue, of any
            # cohort, up to what it uses.
            freed = {}
            for name in names:
                held = ref.used[(name, flavor)]
                if held and data.draw(st.booleans(), label=f"free from {name}"):
                    freed[name] = data.draw(st.integers(1, held), label=f"freed {name}")
            if freed:
                _reached("checks with GPUs freed first")
                cohort = ref.queues[queue].cohort
                for name in freed:
                    other = ref.queues[name]
                    keeps = ref.terms(name, flavor).guaranteed
                    if name != queue and other.cohort == cohort is not None and keeps:
                        _reached("GPUs freed from a member that keeps some quota back")
        room = ref.room(queue, flavor, freed)
        gpus = data.draw(
            st.one_of(
                st.sampled_from([room, room + 1, room - 1, room + 2]).filter(lambda n: n >= 0),
                st.integers(0, 12),
            ),
            label="gpus",
        )
        _same(book, ref, queue, flavor, gpus, freed)
        verdict = ref.check(queue, flavor, gpus, freed)
        kinds[verdict.kind] += 1
        if freed is None:
            _classify(ref, verdict, queue, flavor, gpus)
        elif verdict.kind == "ok" and ref.check(queue, flavor, gpus).kind != "ok":
            _reached("ok only once GPUs are freed")
        action = data.draw(st.sampled_from(["add", "fill", "remove", "none"]), label="action")
        if action == "fill":  # take all the room there is (borrow what the cohort lends)
            gpus, freed = max(0, ref.room(queue, flavor)), None
            action = "add"
        if action == "add" and freed is None and ref.check(queue, flavor, gpus).kind == "ok":
            book.add(queue, flavor, gpus)
            ref.used[(queue, flavor)] += gpus
        elif action == "remove" and ref.used[(queue, flavor)]:
            gone = data.draw(st.integers(1, ref.used[(queue, flavor)]), label="remove")
            book.remove(queue, flavor, gone)
            ref.used[(queue, flavor)] -= gone
            _reached("removed GPUs")
        _compare_figures(book, ref)
    _compare_figures(book, ref, ceilings=True)
    # Steer towards examples that meet many kinds of verdict, and reclaims.
    target(float(len(kinds)), label="distinct verdict kinds")
    target(float(kinds["reclaim"]), label="reclaim verdicts")


def test_quota_book_matches_the_reference_model() -> None:
    REACHED.clear()
    _book_matches_the_reference()
    # Every interesting case is reached on every run (the run is derandomized; these guard
    # against strategies that drift away from them).
    for what in (
        "verdict ok",
        "verdict reclaim",
        "verdict cohort_full",
        "verdict borrow_limit",
        "verdict nominal_full",
        "verdict no_quota",
        "ok while borrowing",
        "ok filling the cohort's pool exactly",
        "ok borrowing exactly up to the limit",
        "cohort_full by exactly one GPU",
        "reclaim by exactly one GPU",
        "borrow_limit by exactly one GPU",
        "nominal_full by exactly one GPU",
        "checks with GPUs freed first",
        "ok only once GPUs are freed",
        "removed GPUs",
        "two queues of a cohort borrow at once",
        "GPUs freed from a member that keeps some quota back",
    ):
        assert REACHED[what] >= 5, f"{what!r} reached {REACHED[what]} times: {dict(REACHED)}"


def test_changes_to_queues_the_book_does_not_know_are_ignored() -> None:
    book = QuotaBook([Queue("q0", "t", "c1", {"a100": 2})])
    book.add("ghost", "a100", 3)
    book.remove("ghost", "a100", 1)
    assert book.used("ghost", "a100") == 0 and book.pool("c1", "a100") == (2, 0)


def test_borrowers_most_first_then_by_name() -> None:
    queues = [
        Queue("lender", "t0", "c1", {"a100": 12}),
        Queue("b", "t1", "c1", {"a100": 1}),
        Queue("c", "t2", "c1", {"a100": 1}),
        Queue("a", "t3", "c1", {"a100": 1}),
    ]
    book = QuotaBook(queues)
    for name, gpus in (("a", 3), ("b", 4), ("c", 4), ("lender", 2)):
        book.add(name, "a100", gpus)
    assert book.borrowers("c1", "a100") == [("b", 3), ("c", 3), ("a", 2)]
    assert book.borrowers("c1", "a100", exclude="b") == [("c", 3), ("a", 2)]
    assert book.borrowers("no-such-cohort", "a100") == []


def test_freeing_gpus_of_a_member_that_keeps_quota_back_returns_only_what_it_drew() -> None:
    # q0 keeps 3 of its 4 back (lends 1) and uses 4: it draws 1 from the pool of 3. Freeing
    # 2 of its GPUs returns that 1, not 2; q1 (lends all its 2, uses 2) may then take one.
    queues = [
        Queue("q0", "t0", "c1", {"a100": 4}, {}, {"a100": 1}),
        Queue("q1", "t1", "c1", {"a100": 2}),
    ]
    book, ref = QuotaBook(queues), Reference(queues)
    for name, gpus in (("q0", 4), ("q1", 2)):
        book.add(name, "a100", gpus)
        ref.used[(name, "a100")] += gpus
    assert book.pool("c1", "a100") == (3, 3)
    for freed in ({"q0": 2}, {"q0": 1}, {"q0": 4}):
        _same(book, ref, "q1", "a100", 1, freed)
        _same(book, ref, "q1", "a100", 2, freed)
    assert book.check("q1", "a100", 1, {"q0": 2}).ok
    assert not book.check("q1", "a100", 2, {"q0": 2}).ok

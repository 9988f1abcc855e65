"""Incremental decisions (``policy.incremental``): after every event they equal a full pass.

The property test keeps its own copy of the cluster (nodes, pending and running jobs), applies
each event to it independently of ``Incremental``, and checks ``Incremental``'s decisions
against ``schedule`` over a snapshot it builds itself: the independent check is a full pass
on the same state. A second ``Incremental``, built from a shuffled snapshot (and from a pass
already run over it, as the scheduler's fast path keeps its pass) and fed the same events,
must give equal decisions (determinism). Worlds come from the pass property tests;
the events mix arrivals (some large, long and of low priority, so that they queue last and
take the isolated path), jobs ending, and nodes joining and leaving. The run counts how
often each path was taken and fails if either was reached too rarely.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainyard_platform.services.scheduler.policy import PolicyState, schedule
from trainyard_platform.services.scheduler.policy.incremental import Explained, Incremental
from trainyard_platform.services.scheduler.policy.model import (
    Decisions,
    Node,
    PendingJob,
    PolicyConfig,
    RunningJob,
    Snapshot,
)

from .builders import CLASSES, HOUR, NOW, node, pending, queue, running, snap
from .test_properties import FLAVORS, World, shuffled, worlds

START = 1000.0
REACHED: Counter[str] = Counter()


class Model:
    """The test's own copy of the cluster, changed by events as the service would see them."""

    def __init__(self, world: World, config: PolicyConfig):
        self.queues = tuple(world.queues)
        self.nodes = {n.node_id: n for n in world.nodes}
        self.pending = {
            j.job_id: replace(j, submitted_at=min(j.submitted_at, START))
            for j in world.jobs[: len(world.jobs) // 2]
        }
        self.running: dict[str, RunningJob] = {}
        # Start from a busy cluster: what a first pass placed is running, long enough that
        # its protection against preemption is over.
        for p in schedule(self.snapshot(), config).placements:
            job = self.pending.pop(p.job_id)
            self.running[job.job_id] = RunningJob(
                job.job_id,
                job.queue,
                job.flavor,
                job.gpus,
                job.priority,
                START - 3600.0,
                job.declared_runtime_s + 3600.0,
                dict(p.gpus),
            )
            for node_id, indices in p.gpus.items():
                n = self.nodes[node_id]
                self.nodes[node_id] = replace(
                    n, used={**n.used, **dict.fromkeys(indices, job.job_id)}
                )

    def snapshot(self) -> Snapshot:
        return Snapshot(
            START,
            tuple(self.nodes.values()),
            self.queues,
            CLASSES,
            tuple(self.pending.values()),
            tuple(self.running.values()),
            {},
        )

    def end(self, job_id: str) -> None:
        job = self.running.pop(job_id)
        for node_id, indices in job.placement.items():
            if node_id in self.nodes:
                n = self.nodes[node_id]
                used = {i: j for i, j in n.used.items() if i not in indices}
                self.nodes[node_id] = replace(n, used=used)


@st.composite
def late_jobs(draw: st.DrawFn, world: World, seq: int) -> PendingJob:
    """A job submitted now that queues last in its queue (large, long, low priority)."""
    return PendingJob(
        f"late{seq}",
        draw(st.sampled_from([q.name for q in world.queues])),
        draw(st.sampled_from(FLAVORS)),
        draw(st.sampled_from([2, 4, 8, 16])),
        "low",
        START,
        draw(st.sampled_from([12 * 3600.0, 24 * 3600.0])),
        10_000 + seq,
    )


@st.composite
def runs(draw: st.DrawFn) -> tuple[World, PolicyConfig, list[tuple[str, object]]]:
    world = draw(worlds())
    # Few reservations per flavor, so that they run out during a pass (or never exist).
    config = PolicyConfig(min_runtime_s=60.0, reservations=draw(st.sampled_from([0, 1, 2, 8])))
    later = world.jobs[len(world.jobs) // 2 :]
    events: list[tuple[str, object]] = []
    for i in range(draw(st.integers(1, 12))):
        kind = draw(st.sampled_from(["arrive", "late", "late", "late", "end", "join", "leave"]))
        if kind == "arrive" and later:
            events.append(("arrive", later.pop(0)))
        elif kind in ("arrive", "late"):
            events.append(("arrive", draw(late_jobs(world, i))))
        elif kind == "join":
            size = draw(st.sampled_from([2, 4, 8]))
            events.append(("join", Node(f"new{i}", draw(st.sampled_from(FLAVORS)), size, "t9")))
        else:
            events.append((kind, draw(st.integers(0, 1 << 16))))
    return world, config, events


INCREMENTAL_SETTINGS = settings(
    max_examples=300,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
"""Streams of events, each checked against a full pass: reproducible, no time limit."""


@INCREMENTAL_SETTINGS
@given(runs())
def incremental_runs(run: tuple[World, PolicyConfig, list[tuple[str, object]]]) -> None:
    world, config, events = run
    model = Model(world, config)
    rng = random.Random(0)
    inc = Incremental(model.snapshot(), config)
    # The twin starts as the scheduler keeps its pass: from the pass's own state.
    other = shuffled(model.snapshot(), rng)
    kept = PolicyState(other, config)
    twin = Incremental(other, config, kept, kept.run())
    assert twin.full_passes == 1 and twin.decisions == inc.decisions
    # A third one is fed the same events and read only at the end: what an event returns
    # (its explanations made at their first read, isolated arrivals on top of a pass not
    # yet explained) must still be what a full pass gave at that event.
    unread = Incremental(model.snapshot(), config)
    returned: list[tuple[Decisions, Decisions, tuple[str, ...], tuple[str, ...], str]] = []
    for kind, what in events:
        if kind == "arrive":
            assert isinstance(what, PendingJob)
            if what.job_id in model.pending or what.job_id in model.running:
                continue
            model.pending[what.job_id] = what
            before = inc.isolated
            explained = unread.decisions.explanations
            decisions, again = inc.arrive(what), twin.arrive(what)
            late = unread.arrive(what)
            REACHED["isolated arrival" if inc.isolated > before else "arrival passed"] += 1
            if inc.isolated > before and isinstance(explained, Explained) and not explained.read:
                REACHED["isolated arrival on a pass not yet explained"] += 1
        elif kind == "end":
            if not model.running:
                continue
            assert isinstance(what, int)
            job_id = sorted(model.running)[what % len(model.running)]
            model.end(job_id)
            decisions, again, late = inc.end(job_id), twin.end(job_id), unread.end(job_id)
            REACHED["end"] += 1
        elif kind == "join":
            assert isinstance(what, Node)
            if what.node_id in model.nodes:
                continue
            model.nodes[what.node_id] = what
            decisions, again = inc.node_joined(what), twin.node_joined(what)
            late = unread.node_joined(what)
            REACHED["join"] += 1
        else:
            if not model.nodes:
                continue
            assert isinstance(what, int)
            node_id = sorted(model.nodes)[what % len(model.nodes)]
            del model.nodes[node_id]
            decisions, again = inc.node_left(node_id), twin.node_left(node_id)
            late = unread.node_left(node_id)
            REACHED["leave"] += 1
        expected = schedule(model.snapshot(), config)
        assert decisions == expected, f"after {kind} {what}"
        assert again == decisions, "deterministic"
        returned.append((late, decisions, unread.changed, inc.changed, f"{kind} {what}"))
    for late, read, changed, read_changed, event in returned:
        assert late == read, f"read after the last event: after {event}"
        assert list(late.explanations) == list(read.explanations), event
        assert changed == read_changed, event


def test_incremental_decisions_equal_a_full_pass_and_are_deterministic() -> None:
    REACHED.clear()
    incremental_runs()
    assert REACHED["isolated arrival"] >= 50, REACHED
    assert REACHED["arrival passed"] >= 50, REACHED
    assert REACHED["isolated arrival on a pass not yet explained"] >= 50, REACHED
    for kind in ("end", "join", "leave"):
        assert REACHED[kind] >= 20, REACHED


def test_a_low_priority_job_behind_a_full_queue_is_decided_alone() -> None:
    # q's own quota (4, no cohort) is used up by r, and its queue already tried to preempt
    # (for "head"): a later, larger, lower job can only wait, and changes nothing else.
    state = snap(
        (node("n1", 8),),
        (queue("q", 4),),
        (pending("head", "q", 2),),
        (running("r", "q", {"n1": 4}),),
    )
    inc = Incremental(state)
    late = pending("late", "q", 4, priority="low", at=state.now, runtime=24 * 3600.0, seq=9)
    decisions = inc.arrive(late)
    assert (inc.isolated, inc.full_passes) == (1, 1)
    assert decisions == schedule(replace(state, pending=(*state.pending, late)))
    assert decisions.explanations["late"].position == 2


def test_changed_names_the_arrival_and_the_jobs_behind_it() -> None:
    # "late" (normal) goes between "head" and "last" (low) in q's order; "last" moves down.
    state = snap(
        (node("n1", 8),),
        (queue("q", 4),),
        (
            pending("head", "q", 2),
            pending("last", "q", 4, priority="low", at=NOW, runtime=24 * HOUR, seq=8),
        ),
        (running("r", "q", {"n1": 4}),),
    )
    inc = Incremental(state)
    assert set(inc.changed) == {"head", "last"}
    late = pending("late", "q", 4, at=NOW, runtime=24 * HOUR, seq=9)
    decisions = inc.arrive(late)
    assert inc.isolated == 1 and inc.knows("late")
    assert inc.changed == ("late", "last")
    assert decisions == schedule(replace(state, pending=(*state.pending, late)))
    assert [decisions.explanations[j].position for j in ("head", "late", "last")] == [1, 2, 3]


def test_an_arrival_that_would_reclaim_quota_gets_a_pass() -> None:
    # qa lends its 4 GPUs to qb, which uses all 8; qa's only other job asks for h100s (no
    # such node: it never tries to preempt). A job of qa within its nominal quota may take
    # the lent quota back, so its arrival is not isolated: the pass preempts rb for it.
    state = snap(
        (node("n1", 8),),
        (queue("qa", 4, cohort="c"), queue("qb", 4, cohort="c")),
        (pending("other", "qa", 1, flavor="h100"),),
        (running("rb", "qb", {"n1": 8}, started=NOW - 5 * HOUR),),  # past its 4 h spare
    )
    inc = Incremental(state, PolicyConfig(reservations=0))
    late = pending("late", "qa", 4, priority="low", at=state.now, runtime=24 * HOUR, seq=9)
    decisions = inc.arrive(late)
    assert [p.job_id for p in decisions.preemptions] == ["rb"]
    full = schedule(replace(state, pending=(*state.pending, late)), PolicyConfig(reservations=0))
    assert decisions == full
    assert (inc.isolated, inc.full_passes) == (0, 2)


def test_an_arrival_that_would_take_a_reservation_gets_a_pass() -> None:
    # Cohort c lends qa 1 GPU at most and its pool is nearly used up (ra, rb); p (qa) is over
    # qa's borrowing limit and tried to preempt (pinned jobs: nobody to take); w (cohort c2)
    # starts on n1's 2 free GPUs. "late" needs c's full pool, so it would reserve those two
    # GPUs now, and w may no longer start: a whole pass decides.
    state = snap(
        (node("n1", 5),),
        (
            queue("qa", 2, cohort="c", borrowing_limit=1),
            queue("qb", 2, cohort="c"),
            queue("qd", 0, cohort="c2"),
            queue("qe", 4, cohort="c2"),
        ),
        (
            pending("p", "qa", 3, priority="high", at=NOW - 1800.0),
            pending("w", "qd", 2, priority="low", at=NOW - 600.0, runtime=6 * HOUR),
        ),
        (
            running("ra", "qa", {"n1": 1}, priority="pinned"),
            running("rb", "qb", {"n1": 2}, priority="pinned", runtime=2 * HOUR),
        ),
    )
    assert [p.job_id for p in schedule(state).placements] == ["w"]
    inc = Incremental(state)
    late = pending("late", "qa", 2, priority="high", at=NOW, runtime=4 * HOUR, seq=9)
    decisions = inc.arrive(late)
    assert decisions.placements == ()
    assert decisions == schedule(replace(state, pending=(*state.pending, late)))
    assert (inc.isolated, inc.full_passes) == (0, 2)


def test_an_arrival_its_successor_would_overtake_across_queues_gets_a_pass() -> None:
    # In qa (no cohort, 2 of its 4 GPUs held), s fits qa's nominal quota, so after p it goes
    # ahead of y (borrowing in c2) and takes n1's 2 free GPUs. "late" comes between p and s
    # in qa's order but is over qa's quota: while it waits at qa's head, y goes first and
    # takes the GPUs s would have had. A whole pass decides.
    state = snap(
        (node("n1", 4),),
        (queue("qa", 4), queue("qy", 0, cohort="c2"), queue("qz", 8, cohort="c2")),
        (
            pending("p", "qa", 4, priority="high", at=NOW - 1800.0, runtime=600.0),
            pending("s", "qa", 2, priority="low", runtime=6 * HOUR),
            pending("y", "qy", 2, priority="high", at=NOW),
        ),
        (running("ra", "qa", {"n1": 2}, priority="pinned"),),
    )
    assert [p.job_id for p in schedule(state).placements] == ["s"]
    inc = Incremental(state)
    late = pending("late", "qa", 3, priority="high", at=NOW, seq=9)
    decisions = inc.arrive(late)
    assert [p.job_id for p in decisions.placements] == ["y"]
    assert decisions == schedule(replace(state, pending=(*state.pending, late)))
    assert (inc.isolated, inc.full_passes) == (0, 2)


def test_an_arrival_that_would_hold_its_queues_quota_gets_a_pass() -> None:
    # qa may borrow 1 GPU of cohort c and holds 2 (ra). "late" waited two hours, past
    # ageing_s, for qa's own quota: it holds that quota against the later jobs of qa, so s,
    # which would start on a borrowed GPU, waits behind it. A whole pass decides.
    state = snap(
        (node("n1", 4),),
        (queue("qa", 2, cohort="c", borrowing_limit=1), queue("qb", 4, cohort="c")),
        (
            pending("p", "qa", 3, priority="high", at=NOW - 1800.0, runtime=600.0),
            pending("s", "qa", 1, priority="low", at=NOW, runtime=24 * HOUR),
        ),
        (running("ra", "qa", {"n1": 2}, priority="pinned"),),
    )
    assert [p.job_id for p in schedule(state).placements] == ["s"]
    inc = Incremental(state)
    late = pending("late", "qa", 2, priority="low", at=NOW - 2 * HOUR, seq=9)
    decisions = inc.arrive(late)
    assert decisions.placements == ()
    assert decisions == schedule(replace(state, pending=(*state.pending, late)))
    assert (inc.isolated, inc.full_passes) == (0, 2)


def test_bad_events_name_the_field() -> None:
    inc = Incremental(snap((node("n1", 8),), (queue("q", 8),), (pending("a", "q", 1),)))
    with pytest.raises(ValueError, match="job_id"):
        inc.arrive(pending("a", "q", 1))
    with pytest.raises(ValueError, match="job_id"):
        inc.end("nobody")
    with pytest.raises(ValueError, match="node_id"):
        inc.node_joined(node("n1", 8))
    with pytest.raises(ValueError, match="node_id"):
        inc.node_left("n9")

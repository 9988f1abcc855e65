"""Engine invariants on tiny clusters: capacity, completion, FIFO order, checkpoints, usage."""

from __future__ import annotations

import itertools
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.simulator.engine import Policy, SimConfig, SimulationError
from bench.simulator.policies import fifo
from tests.unit.simulator.helpers import job, run
from trainyard_platform.services.scheduler.policy.model import (
    Decisions,
    Placement,
    Preemption,
    Snapshot,
)

NEVER = SimConfig(checkpoint_s=math.inf, grace_s=0.0)


class Recorder:
    """Wraps a policy, keeps every snapshot and checks it never shows an over-allocation."""

    def __init__(self, policy: Policy = fifo, preempt: dict[float, str] | None = None) -> None:
        self.policy = policy
        self.preempt = preempt or {}
        self.snapshots: list[Snapshot] = []

    def __call__(self, snapshot: Snapshot) -> Decisions:
        self.snapshots.append(snapshot)
        held: dict[str, set[int]] = {}
        for r in snapshot.running:
            for node, indices in r.placement.items():
                assert not held.setdefault(node, set()) & set(indices)
                held[node].update(indices)
        for n in snapshot.nodes:
            assert set(n.used) == held.get(n.node_id, set())
            assert all(0 <= i < n.gpu_count for i in n.used)
        decided = self.policy(snapshot)
        victim = self.preempt.get(snapshot.now)
        running = {r.job_id: r for r in snapshot.running}
        if victim in running and running[victim].notice_at is None:
            kill = Preemption(victim, "test", "priority", "test")
            return Decisions(decided.placements, (kill,), decided.explanations)
        return decided


def test_every_job_completes_after_running_its_duration() -> None:
    jobs = [job("a", 0, 8, 100), job("b", 5, 16, 50), job("c", 6, 1, 10), job("d", 6, 4, 30)]
    result = run(jobs, Recorder(), config=NEVER)
    assert result.unfinished == []
    assert [o.job_id for o in result.outcomes] == ["a", "b", "c", "d"]
    for o in result.outcomes:
        assert o.completion - o.first_start == pytest.approx(o.duration)
    assert result.busy_gpu_s == pytest.approx(sum(j.gpus * j.duration for j in jobs))


def test_fifo_blocks_behind_the_head_of_the_line() -> None:
    # b needs both nodes; c fits on the free node at once but must not pass b under FIFO,
    # and b then holds the whole cluster until 110.
    jobs = [job("a", 0, 8, 100), job("b", 1, 16, 10), job("c", 2, 1, 10)]
    starts = {o.job_id: o.first_start for o in run(jobs, fifo, config=NEVER).outcomes}
    assert starts == {"a": 0, "b": 100, "c": 110}


def test_fifo_starts_jobs_in_arrival_order_on_a_random_stream() -> None:
    rng = random.Random(7)
    jobs = [
        job(f"j{i:03d}", float(i * 3), rng.choice([1, 2, 4, 8, 16]), float(rng.randint(1, 200)))
        for i in range(120)
    ]
    result = run(jobs, Recorder(), config=NEVER)
    starts = [o.first_start for o in result.outcomes]  # outcomes are in arrival order
    assert starts == sorted(starts)
    assert result.unfinished == []


def test_a_preempted_job_resumes_from_its_checkpoint_and_loses_only_the_rest() -> None:
    # a (8 GPUs, 200 s of work) checkpoints every 30 s; preempted at t=100 it keeps 90 s.
    recorder = Recorder(preempt={100.0: "a"})
    config = SimConfig(checkpoint_s=30.0, grace_s=0.0)
    jobs = [job("a", 0, 8, 200, declared=400), job("b", 100, 8, 50)]
    result = run(jobs, recorder, gpus=8, config=config)
    a, b = result.outcomes
    assert a.preemptions == 1 and result.preemptions == 1
    assert a.lost_gpu_s == pytest.approx(10 * 8)
    assert a.completion == pytest.approx(100 + (200 - 90))  # FIFO puts a (older) back first
    assert b.first_start == pytest.approx(a.completion)
    seen = next(s for s in recorder.snapshots if s.now == 100 and s.running)
    assert seen.running[0].last_checkpoint_at == pytest.approx(90)
    requeued = next(s for s in recorder.snapshots if s.now == 100 and not s.running)
    (pending_a,) = [p for p in requeued.pending if p.job_id == "a"]
    assert pending_a.declared_runtime_s == pytest.approx(400 - 90)
    assert result.busy_gpu_s == pytest.approx(8 * (100 + 110 + 50))


def test_the_grace_period_keeps_the_gpus_and_the_work_done_in_it() -> None:
    recorder = Recorder(preempt={100.0: "a"})
    config = SimConfig(checkpoint_s=30.0, grace_s=20.0)
    result = run([job("a", 0, 8, 200), job("b", 100, 8, 50)], recorder, gpus=8, config=config)
    a, b = result.outcomes
    # Notice at 100, revoked at 120 = 4 checkpoints: nothing lost, 80 s left.
    assert a.lost_gpu_s == pytest.approx(0)
    assert a.completion == pytest.approx(120 + 80)
    assert b.first_start == pytest.approx(200)
    revoked = next(s for s in recorder.snapshots if s.now == 120)
    assert revoked.running == () and {p.job_id for p in revoked.pending} == {"a", "b"}


def test_a_job_that_finishes_during_its_grace_period_just_completes() -> None:
    recorder = Recorder(preempt={100.0: "a"})
    config = SimConfig(checkpoint_s=30.0, grace_s=50.0)
    result = run([job("a", 0, 8, 110), job("b", 100, 8, 50)], recorder, gpus=8, config=config)
    a, b = result.outcomes
    assert a.completion == pytest.approx(110) and a.preemptions == 0 and a.lost_gpu_s == 0
    assert b.first_start == pytest.approx(110)


def test_team_usage_is_the_decayed_integral_of_held_gpus() -> None:
    recorder = Recorder()
    half_life = 100.0
    config = SimConfig(checkpoint_s=math.inf, half_life_s=half_life)
    run([job("a", 0, 4, 100, team="x"), job("b", 100, 1, 10, team="y")], recorder, config=config)
    at_100 = next(s for s in recorder.snapshots if s.now == 100)
    expected = 4 * half_life / math.log(2) * (1 - 0.5)
    assert at_100.usage["x"] == pytest.approx(expected)
    assert at_100.usage.get("y", 0.0) == 0.0


def test_the_engine_rejects_a_placement_on_a_taken_gpu() -> None:
    def greedy(snapshot: Snapshot) -> Decisions:
        return Decisions(tuple(Placement(p.job_id, {"node-0000": (0,)}) for p in snapshot.pending))

    with pytest.raises(SimulationError, match="not free"):
        run([job("a", 0, 1, 100), job("b", 1, 1, 100)], greedy, config=NEVER)


def test_the_engine_rejects_a_gang_of_the_wrong_shape() -> None:
    def split(snapshot: Snapshot) -> Decisions:
        (p,) = snapshot.pending
        return Decisions((Placement(p.job_id, {"node-0000": (0, 1), "node-0001": (0, 1)}),))

    with pytest.raises(SimulationError, match="needs 1x4"):
        run([job("a", 0, 4, 100)], split, config=NEVER)


def test_a_policy_that_never_places_leaves_jobs_unfinished() -> None:
    result = run([job("a", 0, 1, 10)], lambda s: Decisions(), config=NEVER)
    assert result.unfinished == ["a"] and result.outcomes == []


streams = st.lists(
    st.tuples(
        st.integers(0, 500),
        st.sampled_from([1, 2, 4, 8, 16]),
        st.integers(1, 300),
        st.integers(0, 2),
    ),
    min_size=1,
    max_size=25,
)


@settings(max_examples=30, deadline=None)
@given(streams, st.sampled_from([0.0, 15.0]))
def test_random_streams_complete_without_over_allocation(
    stream: list[tuple[int, int, int, int]], grace: float
) -> None:
    jobs = [
        job(f"j{i:02d}", float(at), gpus, float(d), team=f"t{team}")
        for i, (at, gpus, d, team) in enumerate(stream)
    ]
    victims = {float(at): f"j{i:02d}" for i, (at, *_rest) in enumerate(stream) if i % 3 == 0}
    recorder = Recorder(preempt=victims)
    result = run(jobs, recorder, config=SimConfig(checkpoint_s=20.0, grace_s=grace))
    assert result.unfinished == []
    assert len(result.outcomes) == len(jobs)
    for o in result.outcomes:
        assert o.completion - o.first_start >= o.duration - 1e-6


def test_passes_are_at_least_the_minimum_interval_apart() -> None:
    recorder = Recorder()
    jobs = [job(f"j{i}", float(i * 7), 1, 50.0) for i in range(20)]
    result = run(jobs, recorder, config=SimConfig(checkpoint_s=math.inf, min_pass_interval_s=30))
    times = [s.now for s in recorder.snapshots]
    assert all(b - a >= 30 for a, b in itertools.pairwise(times))
    assert result.unfinished == [] and len(times) < 20


def test_a_wake_up_on_an_inexact_due_time_still_runs_the_pass() -> None:
    # (0.7 + 0.1) - 0.7 < 0.1 in floating point: the pass due at 0.7 + 0.1 must still run.
    recorder = Recorder()
    jobs = [job("a", 0.7, 16, 1.0), job("b", 0.75, 1, 1.0)]
    config = SimConfig(checkpoint_s=math.inf, min_pass_interval_s=0.1)
    result = run(jobs, recorder, config=config)
    assert result.unfinished == []
    assert [s.now for s in recorder.snapshots][:2] == [0.7, 0.7 + 0.1]


def test_a_checkpoint_due_on_an_inexact_time_is_seen_and_the_next_one_planned() -> None:
    # (0.7 + 0.1 - 0.7) / 0.1 floors to 0 although the checkpoint at 0.7 + 0.1 is taken.
    recorder = Recorder()
    jobs = [job("a", 0.7, 1, 10.0), job("b", 0.7 + 0.1, 1, 1.0)]
    result = run(jobs, recorder, config=SimConfig(checkpoint_s=0.1, grace_s=0.0))
    assert result.unfinished == []
    at_b = next(s for s in recorder.snapshots if s.now == 0.7 + 0.1)
    assert at_b.running[0].last_checkpoint_at == 0.7 + 0.1


def test_a_job_needing_more_than_it_declared_is_stopped_at_its_limit_and_resubmitted() -> None:
    # One GPU. "a" needs 100 s but declares 50 s; it checkpoints every 30 s. "b" arrives at
    # 10 s and waits. At 50 s the runner stops "a" (the 30 s up to its checkpoint kept, 20 s
    # lost); its user resubmits it then, declaring 100 s, so it waits behind "b" (10 s of
    # work, 50-60 s) and runs its last 70 s from 60 s: it completes at 130 s.
    jobs = [job("a", 0, 1, 100.0, declared=50.0), job("b", 10, 1, 10.0)]
    config = SimConfig(checkpoint_s=30.0, grace_s=0.0, min_pass_interval_s=0.0)
    result = run(jobs, fifo, gpus=1, config=config)
    by_id = {o.job_id: o for o in result.outcomes}
    a, b = by_id["a"], by_id["b"]
    assert (b.first_start, b.completion) == (50.0, 60.0)
    assert (a.arrival, a.first_start, a.completion) == (0.0, 0.0, 130.0)
    assert (a.limit_kills, a.limit_lost_gpu_s) == (1, 20.0)
    assert (a.preemptions, a.lost_gpu_s) == (0, 0.0)
    assert result.busy_gpu_s == 50.0 + 10.0 + 70.0


def test_the_declared_limit_is_what_the_policy_sees_after_a_resubmission() -> None:
    seen: list[tuple[float, float, float]] = []

    def watching(snapshot: Snapshot) -> Decisions:
        seen.extend((snapshot.now, p.submitted_at, p.declared_runtime_s) for p in snapshot.pending)
        return fifo(snapshot)

    jobs = [job("a", 0, 1, 100.0, declared=40.0)]
    config = SimConfig(checkpoint_s=30.0, grace_s=0.0, min_pass_interval_s=0.0)
    run(jobs, watching, gpus=1, config=config)
    # Stopped at 40 s with 30 s kept: resubmitted at 40 s declaring 80 s, 50 s of it left;
    # the remaining 70 s of work exceed that, so it is stopped again at 90 s with 30 s more
    # kept (60 s in all): resubmitted declaring 160 s, 100 s left, enough for the last 40 s.
    assert seen == [(0.0, 0.0, 40.0), (40.0, 40.0, 50.0), (90.0, 90.0, 100.0)]


@pytest.mark.parametrize("grace", [30.0, 10.0])
def test_a_job_under_notice_reaching_its_limit_is_stopped_at_the_limit_not_preempted(
    grace: float,
) -> None:
    # "a" needs 100 s, declares 50 s, checkpoints every 30 s; "b"'s arrival at 40 s brings a
    # pass, which sends "a" a notice. Its limit (50 s) comes before the notice ends (70 s) or
    # at the same instant (50 s): it is stopped at the limit, resubmitted, and restarts at
    # once with 70 s left; the notice's end is stale and stops nothing, nor counts.
    jobs = [job("a", 0, 1, 100.0, declared=50.0), job("b", 40, 1, 10.0)]
    config = SimConfig(checkpoint_s=30.0, grace_s=grace, min_pass_interval_s=0.0)
    result = run(jobs, Recorder(preempt={40.0: "a"}), gpus=2, config=config)
    a = next(o for o in result.outcomes if o.job_id == "a")
    assert (a.limit_kills, a.limit_lost_gpu_s, a.preemptions, a.lost_gpu_s) == (1, 20.0, 0, 0.0)
    assert a.completion == 120.0 and result.preemptions == 0

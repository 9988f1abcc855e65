"""The shared pass of the preemptive baselines, on hand-made snapshots."""

from __future__ import annotations

from bench.simulator import gangs
from bench.simulator.cluster import FLAVOR
from bench.simulator.preemptive import PreemptivePass
from trainyard_platform.services.scheduler.policy.model import (
    Node,
    PendingJob,
    RunningJob,
    Snapshot,
)


def _running(job_id: str, node: str, gpus: int, notice: float | None = None) -> RunningJob:
    return RunningJob(
        job_id=job_id,
        queue="t",
        flavor=FLAVOR,
        gpus=gpus,
        priority="default",
        started_at=0.0,
        declared_runtime_s=100.0,
        placement={node: tuple(range(gpus))},
        notice_at=notice,
    )


def _pending(job_id: str, gpus: int, seq: int) -> PendingJob:
    return PendingJob(job_id, "t", FLAVOR, gpus, "default", 0.0, 100.0, seq)


def _snapshot(running: tuple[RunningJob, ...], pending: tuple[PendingJob, ...]) -> Snapshot:
    used = {n: {i: r.job_id for r in running for i in r.placement.get(n, ())} for n in "ab"}
    nodes = tuple(Node(n, FLAVOR, 8, "", used[n]) for n in "ab")
    return Snapshot(10.0, nodes, (), (), pending, running)


def test_a_job_waits_for_gpus_under_notice_instead_of_naming_new_victims() -> None:
    snap = _snapshot((_running("old", "a", 8, notice=5.0), _running("x", "b", 8)), ())
    p = PreemptivePass(snap, lambda r: (0.0,))
    outcome, victims = p.start(_pending("new", 8, 0), lambda v: True, "test")
    assert (outcome, victims) == ("claimed", [])
    assert p.decisions().preemptions == ()
    # The claimed GPUs are gone for later jobs of the pass, which must now name a victim.
    outcome, victims = p.start(_pending("next", 8, 1), lambda v: True, "test")
    assert outcome == "claimed" and [v.job_id for v in victims] == ["x"]


def test_only_victims_whose_gpus_the_gang_uses_get_a_notice() -> None:
    running = (_running("a4", "a", 4), _running("b8", "b", 8))
    p = PreemptivePass(_snapshot(running, ()), lambda r: (-r.gpus,))
    # Victim order tries b8 first: 8 GPUs on node b are enough, a4 is never touched.
    outcome, victims = p.start(_pending("gang", 8, 0), lambda v: True, "test")
    assert outcome == "claimed" and [v.job_id for v in victims] == ["b8"]


def test_blocked_when_the_allowed_victims_are_not_enough() -> None:
    running = (_running("a8", "a", 8), _running("b8", "b", 8))
    p = PreemptivePass(_snapshot(running, ()), lambda r: (0.0,))
    outcome, victims = p.start(_pending("big", 16, 0), lambda v: v.job_id == "a8", "t", "k")
    assert (outcome, victims) == ("blocked", [])
    assert p.decisions().preemptions == ()
    assert "k" in p.failed


def test_first_fit_is_all_or_nothing() -> None:
    free = {"a": [0, 1, 2, 3, 4, 5, 6, 7], "b": [0, 1, 2]}
    assert gangs.first_fit(16, free) is None
    assert gangs.first_fit(3, {"a": [], "b": [0, 1, 2]}) == {"b": (0, 1, 2)}
    assert gangs.first_fit(12, {"a": list(range(6)), "b": list(range(8))}) == {
        "a": tuple(range(6)),
        "b": tuple(range(6)),
    }

"""A job that preempts holds the GPUs it counted on: no later job takes them meanwhile.

Seen on a local stack (2 GPUs): a 2-GPU high-priority job preempted two 1-GPU jobs; when the
first victim left, the pass gave its freed GPU straight back to that same victim (re-queued,
1 GPU, it fitted), and again when the second left. The high job waited until a victim
finished on its own, about 6 minutes, and each victim lost its work for nothing.
"""

from __future__ import annotations

from trainyard_platform.services.scheduler.policy import schedule
from trainyard_platform.services.scheduler.policy.model import PolicyConfig

from .builders import HOUR, NOW, node, pending, queue, running, snap

QUEUES = (queue("a", nominal=2),)
GRACE = PolicyConfig().grace_s


def test_a_freed_gpu_waits_for_the_preemptor_still_waiting_on_a_victim() -> None:
    """One victim left (re-queued), the other is still under notice: the free GPU is the
    preemptor's, not the re-queued victim's."""
    nodes = (node("n1", gpus=2),)
    run = (running("low-2", "a", {"n1": 1}, priority="low", notice=NOW - 10),)
    pend = (
        pending("high", "a", gpus=2, priority="high", at=NOW - 120),
        pending("low-1", "a", gpus=1, priority="low", at=NOW - 600),
    )
    d = schedule(snap(nodes, QUEUES, pend, run))
    assert [p.job_id for p in d.placements] == []
    high = d.explanations["high"]
    assert high.estimated_start == NOW - 10 + GRACE
    assert "low-1" in d.explanations


def test_victims_chosen_in_this_pass_are_not_refilled_in_the_same_pass() -> None:
    """The preemptor counted one free GPU and one victim's: a later job in the same pass
    (lower priority, same queue) must not take the free one."""
    nodes = (node("n1", gpus=2),)
    run = (running("low-2", "a", {"n1": 1}, priority="low", started=NOW - HOUR),)
    pend = (
        pending("high", "a", gpus=2, priority="high", at=NOW - 120),
        pending("low-1", "a", gpus=1, priority="low", at=NOW - 600),
    )
    d = schedule(snap(nodes, QUEUES, pend, run))
    assert [p.job_id for p in d.preemptions] == ["low-2"]
    assert [p.job_id for p in d.placements] == []


def test_a_short_job_may_still_use_the_gpus_until_the_preemptor_can_start() -> None:
    """Backfill is still allowed where it delays nothing: a job that ends before the
    victim's notice runs out may use the free GPU."""
    nodes = (node("n1", gpus=2),)
    run = (running("low-2", "a", {"n1": 1}, priority="low", notice=NOW - 10),)
    pend = (
        pending("high", "a", gpus=2, priority="high", at=NOW - 120),
        pending("quick", "a", gpus=1, priority="low", at=NOW - 600, runtime=30),
    )
    d = schedule(snap(nodes, QUEUES, pend, run))
    assert [p.job_id for p in d.placements] == ["quick"]

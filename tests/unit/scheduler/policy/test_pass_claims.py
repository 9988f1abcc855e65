"""Victims chosen earlier in a pass, and victims of the waiting job's own team.

The quota book counts what each queue holds now until the pass is applied. Reclaim counts
what a lender borrows once the pass's preemptions are played out (``PolicyState.outgoing``):
without its jobs under notice and the victims given notice earlier in the pass, with its
own jobs that preempted. Counted from the quota book, a lender whose borrowed GPUs one job
had reclaimed still "borrowed" them for the next job of the pass, which then took the
lender's own quota: a gang spared as larger than what its queue borrows (rule 5 of
docs/scheduling.md), or one that, re-queued, would stand before it (rule 6).

Rule 6 judges the waiting job, too, with the set's GPUs of its team gone: a victim of its
own team leaves its team's share as it leaves the victim's.
"""

from __future__ import annotations

from dataclasses import replace

from trainyard_platform.services.scheduler.policy import schedule
from trainyard_platform.services.scheduler.policy.model import (
    PolicyConfig,
    RunningJob,
    Snapshot,
)

from .builders import HOUR, NOW, node, pending, queue, running, snap

CONFIG = PolicyConfig()
HEAVY = 500.0 * 8 * 24 * HOUR
"""GPU-seconds: a team that kept the cluster busy for weeks."""


def gang(name: str, seq: int, started: float, notice: float | None = None) -> RunningJob:
    """A 3-GPU gang of queue b, submitted a minute before it started, declaring 10 h."""
    job = running(name, "b", {"n1": 3}, priority="low", started=started, notice=notice)
    return replace(job, submitted_at=started - 60, seq=seq)


def three_queues(started: float, usage_d: float = 0.0, notice_g1: float | None = None) -> Snapshot:
    """One 8-GPU node; queue b (nominal 2) runs two 3-GPU gangs, so it borrows 4; queues a
    and d (nominal 3 each, same cohort) wait with one 3-GPU job each (a's first: same
    submit time, lower sequence). The cohort's pool (8) is full: each waiting job stays
    within its nominal quota and may reclaim."""
    queues = (queue("a", 3, cohort="c"), queue("b", 2, cohort="c"), queue("d", 3, cohort="c"))
    gangs = (gang("g1", 1, started, notice_g1), gang("g2", 2, started))
    jobs = (
        pending("pa", "a", 3, priority="low", seq=10),
        pending("pd", "d", 3, priority="low", seq=11),
    )
    return snap((node("n1", 8),), queues, jobs, gangs, {"team-d": usage_d})


def preempted(snapshot: Snapshot) -> list[tuple[str, str]]:
    return [(p.job_id, p.for_job_id) for p in schedule(snapshot, CONFIG).preemptions]


def test_a_lender_reclaimed_for_one_job_borrows_less_for_the_next() -> None:
    """a's job reclaims g1 (3 GPUs); b then holds 3 of its nominal 2, so it borrows 1, and
    g2 (3 GPUs) is larger than that: spared for its first 4 hours (rule 5). d's job waits
    and is told so. Before, b still "borrowed" 4 for d's job, which reclaimed g2 too: b lost
    6 GPUs though it borrowed 4."""
    started = NOW - HOUR
    decisions = schedule(three_queues(started), CONFIG)
    assert [(p.job_id, p.for_job_id, p.kind) for p in decisions.preemptions] == [
        ("g1", "pa", "reclaim")
    ]
    told = decisions.explanations["pd"]
    assert told.estimated_start == started + CONFIG.oversize_protection_s + CONFIG.grace_s
    assert "team-b borrows 1 of your 3" in told.reason


def test_the_next_job_judges_a_lenders_gang_by_what_the_lender_still_holds() -> None:
    """Past its spare, g2 may be reclaimed -- by a job that stands before it once re-queued
    (rule 6). b holds nothing once g1 and g2 have left, so g2 re-queued is in the first tier:
    with d's team the heavy user, g2 stands before d's job, which may not take it. Before, b
    was counted with g1 still held, g2 re-queued "borrowed" again and was never tested.
    With d's team light, d's job stands first and takes g2."""
    old = NOW - 4.5 * HOUR
    assert preempted(three_queues(old, usage_d=HEAVY)) == [("g1", "pa")]
    assert preempted(three_queues(old)) == [("g1", "pa"), ("g2", "pd")]


def test_a_gang_under_notice_no_longer_counts_as_borrowed() -> None:
    """The next pass, with g1 under notice (for a's job, which counts on it again): b
    borrows 1 once g1 has left, and d's job may not take g2 (spared, as above). Before,
    b's use still counted g1 and d's job reclaimed g2."""
    started = NOW - HOUR
    snapshot = three_queues(started, notice_g1=NOW - 60)
    decisions = schedule(snapshot, CONFIG)
    assert decisions.preemptions == ()
    assert decisions.explanations["pa"].estimated_start == NOW - 60 + CONFIG.grace_s
    told = decisions.explanations["pd"]
    assert told.estimated_start == started + CONFIG.oversize_protection_s + CONFIG.grace_s


def same_team(pa_submitted: float) -> Snapshot:
    """Team t has two queues of one cohort: a (nominal 3) waits with a 3-GPU job, a2
    (nominal 2) runs a 3-GPU gang g (borrowing 1) past every protection, submitted 4.8 h
    ago, on a 5-GPU node. The pool (5) is full for a's job: it may reclaim g. Once g has
    left, a2 holds nothing, so g re-queued is in the first tier and rule 6 tests it."""
    queues = (queue("a", 3, cohort="c", team="t"), queue("a2", 2, cohort="c", team="t"))
    g = replace(
        running("g", "a2", {"n1": 3}, priority="low", started=NOW - 4.5 * HOUR),
        submitted_at=NOW - 4.8 * HOUR,
        seq=1,
    )
    pa = pending("pa", "a", 3, priority="low", at=pa_submitted, runtime=10 * HOUR, seq=2)
    return snap((node("n1", 5),), queues, (pa,), (g,))


def test_a_victim_of_the_waiting_jobs_own_team_leaves_its_share_too() -> None:
    """a's job is older than g (5 h against 4.8 h, the same size and priority): with both of
    one team, and g's 3 GPUs gone from that team's share for both, a's job stands first
    and reclaims g. Before, its own share still counted g's GPUs (0.6 of a share here,
    more than 0.2 h of waiting): refused, it waited for g's end though no job would start
    before it. Submitted after g, it stands after g re-queued and may not take it."""
    assert preempted(same_team(NOW - 5 * HOUR)) == [("g", "pa")]
    assert preempted(same_team(NOW - 4.7 * HOUR)) == []

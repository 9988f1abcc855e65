"""Rule 6 of docs/scheduling.md for victims taken together.

A waiting job may take a set of victims only if it stands before each of them once all of
them have left and are re-queued. Judged one by one (as until this rule covered sets), each
of a lender's jobs was tested as if it alone left: when the lender's queue lends through
several jobs and all of them are taken at once, the queue may be back in the first tier
(holding nothing) once they have left, and the first of them re-queued stands before the
preemptor: it starts again and the preemptor still waits -- the thrash rule 6 exists to
stop. Each test here fails with the set judged victim by victim.

A set of priority victims cannot turn this way: they are of the waiting job's own queue,
whose order does not depend on what the queue holds, so each is judged as alone.
"""

from __future__ import annotations

from dataclasses import replace

from trainyard_platform.services.scheduler.policy import schedule
from trainyard_platform.services.scheduler.policy.model import (
    Decisions,
    PolicyConfig,
    RunningJob,
    Snapshot,
)

from .builders import HOUR, NOW, node, pending, queue, running, snap

CONFIG = PolicyConfig()
HEAVY = 500.0 * 8 * 24 * HOUR
"""GPU-seconds: team a kept the cluster busy for weeks; team b used nothing."""


def gang(
    name: str, queue_name: str, gpus: int, seq: int, started: float = NOW - 4.5 * HOUR
) -> RunningJob:
    """A job running 4.5 h (past every protection), submitted 5 h ago, declaring 10 h."""
    return replace(
        running(name, queue_name, {"n1": gpus}, priority="low", started=started),
        submitted_at=NOW - 5 * HOUR,
        seq=seq,
    )


def two_gangs(usage_b: float = 0.0, started: float = NOW - 4.5 * HOUR) -> Snapshot:
    """Queue a (nominal 6) waits with a 6-GPU job; queue b (nominal 2) runs two 3-GPU gangs
    on the one 8-GPU node, each past its protections (started 4.5 h ago)."""
    queues = (queue("a", 6, cohort="c"), queue("b", 2, cohort="c"))
    gangs = (gang("g1", "b", 3, 1, started), gang("g2", "b", 3, 2, started))
    p = pending("p", "a", 6, priority="low", at=NOW - 60, seq=10)
    return snap((node("n1", 8),), queues, (p,), gangs, {"team-a": HEAVY, "team-b": usage_b})


def when_notices_end(before: Snapshot, decisions: Decisions) -> list[str]:
    """The jobs the next pass places once ``decisions``' victims have left and wait again
    (their submit times and sequences kept), nothing else having changed."""
    victims = {p.job_id for p in decisions.preemptions}
    gone = tuple(j for j in before.running if j.job_id in victims)
    left = tuple(j for j in before.running if j.job_id not in victims)
    requeued = tuple(
        pending(
            j.job_id,
            j.queue,
            j.gpus,
            priority=j.priority,
            at=j.submitted_at or NOW,
            runtime=j.declared_runtime_s,
            seq=j.seq,
        )
        for j in gone
    )
    held = {(n, g) for j in left for n, gpus in j.placement.items() for g in gpus}
    after = replace(
        before,
        now=before.now + CONFIG.grace_s,
        nodes=tuple(
            replace(n, used={g: u for g, u in n.used.items() if (n.node_id, g) in held})
            for n in before.nodes
        ),
        pending=(*before.pending, *requeued),
        running=left,
    )
    return [p.job_id for p in schedule(after, CONFIG).placements]


def test_victims_taken_together_do_not_start_again_before_their_preemptor() -> None:
    before = two_gangs()
    decisions = schedule(before, CONFIG)
    victims = {p.job_id for p in decisions.preemptions}
    if not victims:
        return  # a's job waits for the gangs' ends without preempting: no thrash
    placed = when_notices_end(before, decisions)
    assert "p" in placed, f"victims {sorted(victims)} left; then placed {placed}, not p"


def test_a_waiting_job_is_not_told_it_can_reclaim_a_set_it_may_not_take() -> None:
    """a's job may take g1 alone (b, holding g2 still, borrows once g1 is re-queued) but not
    both gangs: it is told it starts when g2 ends (5.5 h), not when both could be
    reclaimed (at once, then the grace); so too while the gangs are still protected (no
    preemption either way: the estimate alone follows the rule). With b's team the heavy
    user, both gangs re-queued stand after a's job: it takes both, and the estimate says
    so."""
    g2 = two_gangs().running[1]
    explained = schedule(two_gangs(), CONFIG).explanations["p"]
    assert explained.estimated_start == g2.started_at + g2.declared_runtime_s
    assert explained.reason.endswith("it returns as their jobs end, expected in ~5.5 h")
    young = two_gangs(started=NOW - 30)
    decisions = schedule(young, CONFIG)
    assert decisions.preemptions == ()
    assert decisions.explanations["p"].estimated_start == NOW - 30 + 10 * HOUR
    taken = schedule(two_gangs(usage_b=10 * HEAVY), CONFIG)
    assert sorted(p.job_id for p in taken.preemptions) == ["g1", "g2"]
    assert taken.explanations["p"].estimated_start == NOW + CONFIG.grace_s


def test_a_refused_victim_gives_way_to_the_next_candidate() -> None:
    """a's job (5 GPUs) needs 5 GPUs of the full 8-GPU node, where b (nominal 2) runs two
    3-GPU gangs and c (nominal 0) a 2-GPU job. The gangs lose the least work (a checkpoint
    a minute ago) and are tried first, but taken together b holds nothing and g1 re-queued
    would stand before a's job; g2 is skipped and c's job taken with g1 instead.
    Re-queued, g1 borrows (b still holds g2) and so does c's job: a's job starts."""
    queues = (queue("a", 6, cohort="c"), queue("b", 2, cohort="c"), queue("c", 0, cohort="c"))
    fresh = NOW - 60
    g1 = replace(gang("g1", "b", 3, 1), last_checkpoint_at=fresh)
    g2 = replace(gang("g2", "b", 3, 2), last_checkpoint_at=fresh)
    c = replace(gang("c1", "c", 2, 3), submitted_at=NOW - 4.6 * HOUR)
    p = pending("p", "a", 5, priority="low", at=NOW - 60, seq=10)
    usage = {"team-a": HEAVY, "team-b": 0.0, "team-c": HEAVY}
    before = snap((node("n1", 8),), queues, (p,), (g1, g2, c), usage)
    decisions = schedule(before, CONFIG)
    assert sorted(v.job_id for v in decisions.preemptions) == ["c1", "g1"]
    assert when_notices_end(before, decisions) == ["p"]

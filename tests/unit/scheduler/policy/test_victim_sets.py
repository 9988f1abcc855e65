"""Rule 6 of docs/scheduling.md for victims taken together: a known gap, marked.

Each reclaim victim is judged as if it left alone. When a lender's queue lends through
several jobs and all of them are taken at once, the queue may be back in the first tier
(holding nothing) once they have left, and the first of them re-queued stands before the
preemptor: it starts again and the preemptor still waits -- the thrash rule 6 exists to
stop. The fix needs the whole victim set checked against each lender's queue order inside
victim selection; it changes decisions and the simulator's figures, so it is left for its
own change, and this strict xfail will flag it.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from trainyard_platform.services.scheduler.policy import schedule
from trainyard_platform.services.scheduler.policy.model import PolicyConfig, Snapshot

from .builders import HOUR, NOW, node, pending, queue, running, snap

CONFIG = PolicyConfig()
HEAVY = 500.0 * 8 * 24 * HOUR
"""GPU-seconds: team a kept the cluster busy for weeks; team b used nothing."""


def two_gangs() -> Snapshot:
    """Queue a (nominal 6) waits with a 6-GPU job; queue b (nominal 2) runs two 3-GPU gangs
    on the one 8-GPU node, each past its protections."""
    queues = (queue("a", 6, cohort="c"), queue("b", 2, cohort="c"))
    gangs = tuple(
        replace(
            running(name, "b", {"n1": 3}, priority="low", started=NOW - 4.5 * HOUR),
            submitted_at=NOW - 5 * HOUR,
            seq=seq,
        )
        for seq, name in enumerate(("g1", "g2"), start=1)
    )
    p = pending("p", "a", 6, priority="low", at=NOW - 60, seq=10)
    return snap((node("n1", 8),), queues, (p,), gangs, {"team-a": HEAVY, "team-b": 0.0})


@pytest.mark.xfail(strict=True, reason="rule 6 judges each reclaim victim alone")
def test_victims_taken_together_do_not_start_again_before_their_preemptor() -> None:
    before = two_gangs()
    decisions = schedule(before, CONFIG)
    victims = {p.job_id for p in decisions.preemptions}
    if not victims:
        return  # a's job waits for the gangs' ends without preempting: no thrash
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
    held = {g for j in left for g in j.placement.get("n1", ())}
    after = replace(
        before,
        now=before.now + CONFIG.grace_s,
        nodes=tuple(
            replace(n, used={g: u for g, u in n.used.items() if g in held}) for n in before.nodes
        ),
        pending=(*before.pending, *requeued),
        running=left,
    )
    placed = [p.job_id for p in schedule(after, CONFIG).placements]
    assert "p" in placed, f"victims {sorted(victims)} left; then placed {placed}, not p"

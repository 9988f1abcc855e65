"""What a pass keeps between decisions stays right when its state changes after ``run()``:
arrivals decided on the kept state (``decide_arrival``) read caches the pass filled (the
reservations a job would delay, per pool version; quota verdicts, per the use they were
made from), and a placement by an arrival or another queue's use of a cohort's pool must
void them. Each test fails when that cache is kept past such a change."""

from __future__ import annotations

from trainyard_platform.services.scheduler.policy import PolicyState, decide_arrival

from .builders import HOUR, NOW, node, pending, queue, running, snap


def test_an_arrival_placed_on_the_kept_state_moves_the_next_ones_conflicts() -> None:
    # Two reservations from the pass, one per node (h1 on n1 at 2 h, h2 on n2 at 2.5 h).
    nodes = (node("n1"), node("n2"))
    run = (
        running("r1", "b", {"n1": 4}, started=NOW - HOUR, runtime=3 * HOUR),
        running("r2", "b", {"n2": 4}, started=NOW - HOUR, runtime=3.5 * HOUR),
    )
    blocked = (pending("h1", "a", 8), pending("h2", "a", 8, seq=1))
    state = PolicyState(snap(nodes, (queue("a", 100), queue("b", 100)), blocked, run))
    state.run()
    assert [(r.job_id, r.nodes) for r in state.reservations["a100"]] == [
        ("h1", ("n1",)),
        ("h2", ("n2",)),
    ]
    first = decide_arrival(state, pending("w", "a", 4, runtime=20 * HOUR, seq=2))
    assert first.explanations["w"].blocking == "h1"  # it fits on n1 but for h1's reservation
    quick = decide_arrival(state, pending("x", "a", 4, runtime=60, seq=3))
    assert [list(p.gpus) for p in quick.placements] == [["n1"]]  # done before h1 starts
    # n1 is full now: a job like w fits on n2 only, where it would delay h2.
    second = decide_arrival(state, pending("y", "a", 4, runtime=20 * HOUR, seq=4))
    assert second.explanations["y"].blocking == "h2"


def test_another_queues_use_of_the_cohort_pool_changes_a_kept_verdict() -> None:
    # Queues a and b lend all their 4 GPUs to cohort c (a pool of 8); b uses its 4.
    queues = (queue("a", 4, cohort="c"), queue("b", 4, cohort="c"))
    nodes = (node("n1", 4), node("n2", 4))
    run = (running("r1", "b", {"n1": 2}), running("r2", "b", {"n2": 2}))
    state = PolicyState(snap(nodes, queues, (), run))
    state.run()
    # Within a's quota (the pool has 4 left), but no node has 4 free GPUs.
    first = decide_arrival(state, pending("x", "a", 4, per_node=4))
    assert first.placements == () and "cohort" not in first.explanations["x"].reason
    # b borrows 2 of the pool's last 4 ...
    borrowed = decide_arrival(state, pending("y", "b", 2, seq=1))
    assert [p.borrowed for p in borrowed.placements] == [True]
    # ... so the same request of a now needs quota back from b, whatever the GPUs.
    second = decide_arrival(state, pending("z", "a", 4, per_node=4, seq=2))
    assert second.placements == ()
    assert second.explanations["z"].blocking == "b"

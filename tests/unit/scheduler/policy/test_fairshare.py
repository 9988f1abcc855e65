"""Fair share among the teams of a cohort, decay of past usage, and ageing."""

from __future__ import annotations

import pytest

from trainyard_platform.services.scheduler.policy import decay_usage, schedule
from trainyard_platform.services.scheduler.policy.fairshare import charge
from trainyard_platform.services.scheduler.policy.model import PolicyConfig

from .builders import HOUR, NOW, node, pending, queue, running, snap

DAY = 24 * HOUR
COHORT = (queue("a", nominal=4, cohort="c"), queue("b", nominal=4, cohort="c"))


def test_decay_halves_usage_every_half_life() -> None:
    assert decay_usage({"a": 8.0, "b": 2.0}, 10.0, 10.0) == {"a": 4.0, "b": 1.0}
    assert decay_usage({"a": 8.0}, 30.0, 10.0) == {"a": 1.0}
    assert decay_usage({"a": 8.0}, 0.0, 10.0) == {"a": 8.0}
    assert decay_usage({"a": 8.0}, 5.0, 0.0) == {"a": 0.0}
    assert charge({"a": 1.0}, "b", 2.5) == {"a": 1.0, "b": 2.5}


def test_team_with_less_recent_usage_goes_first() -> None:
    jobs = (pending("a1", "a", 4, at=NOW - 100), pending("b1", "b", 4, at=NOW - 50))
    d = schedule(snap((node("n1", 4),), COHORT, jobs, usage={"team-a": 4 * DAY}))
    assert [p.job_id for p in d.placements] == ["b1"]


def test_past_usage_decays_so_a_bursty_team_is_not_punished_forever() -> None:
    jobs = (pending("a1", "a", 4, at=NOW - 100), pending("b1", "b", 4, at=NOW - 50))
    half_life = PolicyConfig().half_life_s
    usage = decay_usage({"team-a": 4 * DAY}, 20 * half_life, half_life)
    d = schedule(snap((node("n1", 4),), COHORT, jobs, usage=usage))
    assert [p.job_id for p in d.placements] == ["a1"]  # back to submit order


def test_teams_take_turns_within_a_pass() -> None:
    jobs = tuple(pending(f"a{i}", "a", 1, at=NOW - 100 + i, seq=i) for i in range(4)) + tuple(
        pending(f"b{i}", "b", 1, at=NOW - 50 + i, seq=10 + i) for i in range(4)
    )
    d = schedule(snap((node("n1", 4),), COHORT, jobs))
    assert [p.job_id for p in d.placements] == ["a0", "b0", "a1", "b1"]


def test_weights_split_the_cohort() -> None:
    queues = (queue("a", 4, cohort="c", weight=3.0), queue("b", 4, cohort="c", weight=1.0))
    jobs = tuple(pending(f"a{i}", "a", 1, at=NOW - 100 + i, seq=i) for i in range(4)) + tuple(
        pending(f"b{i}", "b", 1, at=NOW - 100 + i, seq=10 + i) for i in range(4)
    )
    d = schedule(snap((node("n1", 4),), queues, jobs))
    assert sorted(p.job_id for p in d.placements) == ["a0", "a1", "a2", "b0"]


def test_fair_share_can_be_switched_off() -> None:
    jobs = (pending("a1", "a", 4, at=NOW - 100), pending("b1", "b", 4, at=NOW - 50))
    s = snap((node("n1", 4),), COHORT, jobs, usage={"team-a": 4 * DAY})
    d = schedule(s, PolicyConfig(fair_share=False))
    assert [p.job_id for p in d.placements] == ["a1"]


def test_jobs_within_nominal_quota_go_before_borrowers() -> None:
    queues = (queue("a", 4, cohort="c"), queue("b", 4, cohort="c"))
    # a already runs 2 GPUs, so its 4-GPU job would borrow; b's is within its nominal even
    # though it came later.
    busy = running("a-run", "a", {"n0": 2})
    jobs = (pending("a-borrow", "a", 4, at=NOW - 500), pending("b-own", "b", 4, at=NOW - 10))
    d = schedule(snap((node("n0", 2), node("n1", 4)), queues, jobs, (busy,)))
    assert [p.job_id for p in d.placements] == ["b-own"]


def test_an_idle_teams_gang_larger_than_its_quota_is_not_a_borrower_in_the_order() -> None:
    # a's 4-GPU gang is larger than a's whole quota of 2, so it can never stay within it;
    # a holds nothing, so the gang is ordered with the jobs within their quota (by fair share
    # and waiting: it came first) rather than behind every one of them.
    queues = (queue("a", 2, cohort="c"), queue("b", 4, cohort="c"))
    jobs = (pending("a-gang", "a", 4, at=NOW - 500), pending("b-own", "b", 4, at=NOW - 10))
    d = schedule(snap((node("n1", 4),), queues, jobs))
    assert [p.job_id for p in d.placements] == ["a-gang"]
    # Once a holds anything, its next gang is a borrower again.
    busy = running("a-run", "a", {"n0": 1})
    d = schedule(snap((node("n0", 1), node("n1", 4)), queues, jobs, (busy,)))
    assert [p.job_id for p in d.placements] == ["b-own"]


@pytest.mark.parametrize(("waited_h", "first"), [(2, "fresh-high"), (4, "old-low")])
def test_ageing_lifts_a_low_priority_job_over_fresh_high_ones(waited_h: int, first: str) -> None:
    # low -> high is 3 priority levels (low, guarded, normal, high); each is one ageing_s (1 h).
    jobs = (
        pending("old-low", "a", 4, priority="low", at=NOW - waited_h * HOUR),
        pending("fresh-high", "a", 4, priority="high", at=NOW - 60, seq=1),
    )
    d = schedule(snap((node("n1", 4),), (queue("a", 4),), jobs))
    assert [p.job_id for p in d.placements] == [first]


def test_ageing_overcomes_a_heavy_users_fair_share() -> None:
    usage = {"team-a": 240 * DAY}  # ~24 GPUs on average recently: ~6 fair shares of 4
    old = pending("old", "a", 4, at=NOW - 8 * HOUR)
    fresh = pending("fresh", "b", 4, at=NOW - 60)
    d = schedule(snap((node("n1", 4),), COHORT, (old, fresh), usage=usage))
    assert [p.job_id for p in d.placements] == ["old"]
    young = pending("old", "a", 4, at=NOW - 2 * HOUR)
    d = schedule(snap((node("n1", 4),), COHORT, (young, fresh), usage=usage))
    assert [p.job_id for p in d.placements] == ["fresh"]


def test_no_job_starves_under_a_stream_of_higher_priority_work() -> None:
    # One GPU; every hour a fresh high-priority job arrives and the running one ends.
    # The low-priority job must get the GPU within a bounded number of hours.
    starving = pending("starving", "a", 1, priority="low", at=NOW)
    for hour in range(1, 20):
        now = NOW + hour * HOUR
        fresh = pending(f"hi{hour}", "a", 1, priority="high", at=now - 1, seq=hour)
        d = schedule(snap((node("n1", 1),), (queue("a", 1),), (starving, fresh), now=now))
        if [p.job_id for p in d.placements] == ["starving"]:
            assert hour <= 4
            return
    pytest.fail("the low-priority job starved")


def test_a_job_starving_for_quota_keeps_later_small_jobs_from_taking_it() -> None:
    run = (running("r", "a", {"n1": 6}, started=NOW - HOUR, runtime=2 * HOUR),)
    big = pending("big", "a", 4, at=NOW - 2 * HOUR)  # waited past ageing_s (1 h)
    small = pending("small", "a", 2, at=NOW - 60, seq=1)
    fifo = PolicyConfig(size_weight=0)  # submit order: the big job is the queue's head
    d = schedule(snap((node("n1"),), (queue("a", 8),), (big, small), run), fifo)
    assert d.placements == ()
    e = d.explanations["small"]
    assert e.reason == (
        "waits behind job big, which has waited ~2.0 h for queue a's a100 quota and goes "
        "first when it frees up"
    )
    assert e.blocking == "big"
    assert e.estimated_start == NOW + HOUR
    fresh = pending("big", "a", 4, at=NOW - 600)  # not starving yet: the small job backfills
    d = schedule(snap((node("n1"),), (queue("a", 8),), (fresh, small), run), fifo)
    assert [p.job_id for p in d.placements] == ["small"]


def test_a_gang_short_of_the_cohorts_gpus_gets_a_reservation_not_a_hold() -> None:
    # Queue a's 8-GPU gang can only run by borrowing, and the cohort is full: it has waited
    # past ageing_s, but what it lacks is GPUs shared by every queue, not its queue's quota.
    # It reserves the node for when r ends; a later job of its own queue that ends before
    # then still starts (a hold would have kept it waiting while other queues took the GPUs),
    # and one that would delay the gang does not.
    queues = (queue("a", nominal=2, cohort="c"), queue("b", nominal=6, cohort="c"))
    run = (running("r", "b", {"n1": 4}, started=NOW - HOUR, runtime=3 * HOUR),)
    big = pending("big", "a", 8, at=NOW - 2 * HOUR)
    short = pending("short", "a", 4, at=NOW - 60, runtime=HOUR, seq=1)
    d = schedule(snap((node("n1"),), queues, (big, short), run))
    assert [p.job_id for p in d.placements] == ["short"]
    assert d.explanations["big"].estimated_start == NOW + 2 * HOUR
    long = pending("short", "a", 4, at=NOW - 60, runtime=3 * HOUR, seq=1)
    d = schedule(snap((node("n1"),), queues, (big, long), run))
    assert d.placements == ()
    assert d.explanations["short"].blocking == "big"


def test_size_weight_puts_smaller_declared_jobs_first_within_a_bounded_wait() -> None:
    one_gpu = (node("n1", 1),)
    long = pending("long", "a", 1, at=NOW - 600, runtime=10 * HOUR)
    short = pending("short", "a", 1, at=NOW - 60, runtime=HOUR, seq=1)
    fifo = schedule(snap(one_gpu, (queue("a", 1),), (long, short)), PolicyConfig(size_weight=0))
    assert [p.job_id for p in fifo.placements] == ["long"]  # submit order
    config = PolicyConfig(size_weight=4.0)  # 10x the GPU-hours costs 4 levels = 4 h of waiting
    d = schedule(snap(one_gpu, (queue("a", 1),), (long, short)), config)
    assert [p.job_id for p in d.placements] == ["short"]
    # The cost is bounded: a larger job that has waited 4 h longer goes first again.
    patient = pending("long", "a", 1, at=NOW - 60 - 4 * HOUR - 600, runtime=10 * HOUR)
    d = schedule(snap(one_gpu, (queue("a", 1),), (patient, short)), config)
    assert [p.job_id for p in d.placements] == ["long"]
    # GPUs count as much as hours: 8 GPUs for 1 h weigh as 8 GPU-hours.
    wide = pending("long", "a", 8, at=NOW - 600, runtime=HOUR)
    d = schedule(snap((node("n1", 8),), (queue("a", 8),), (wide, short)), config)
    assert [p.job_id for p in d.placements] == ["short"]  # the gang no longer fits

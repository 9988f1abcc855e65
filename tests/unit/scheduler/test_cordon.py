"""Cordoned nodes without a database: the automatic rule (K platform failures in a row, reset
by a success), what an ending says of its nodes, and how a pass treats a cordoned node (left
out of placement, its running job kept and never a victim to make room there)."""

from __future__ import annotations

from typing import Any

from tests.unit.scheduler.test_convert import HALF_LIFE, NOW, member, node, rows, waiting
from tests.unit.scheduler.test_leases_plan import A, B, failed_report, job, plan
from trainyard_platform.services.scheduler.convert import build_snapshot, pending_notes
from trainyard_platform.services.scheduler.cordon import automatic_reason, cordons, tally
from trainyard_platform.services.scheduler.domain import JobStatus
from trainyard_platform.services.scheduler.policy.engine import schedule
from trainyard_platform.services.scheduler.policy.model import PolicyConfig

# --- the automatic rule ----------------------------------------------------------------


def test_k_platform_failures_in_a_row_cordon_and_fewer_do_not() -> None:
    assert tally(0, ["disk full", "disk full"]) == (2, "disk full")
    assert not cordons(2, after=3)
    count, last = tally(2, ["driver gone"])
    assert (count, last) == (3, "driver gone")
    assert cordons(count, after=3)
    assert automatic_reason(count, "driver gone") == "3 platform failures in a row: driver gone"


def test_a_success_resets_the_count() -> None:
    assert tally(2, [None]) == (0, None)
    # In order: two failures, a success, one failure: one in a row.
    assert tally(0, ["a", "b", None, "c"]) == (1, "c")
    assert not cordons(1, after=2)


def test_0_never_cordons() -> None:
    assert not cordons(1000, after=0)


def test_after_an_expired_cordon_the_count_stands_and_the_next_failure_cordons_again() -> None:
    # lift_expired keeps the count: a node still failing needs one more failure, not K.
    count, _ = tally(3, ["disk full"])
    assert cordons(count, after=3)


# --- what an ending says of its nodes ----------------------------------------------------


def node_failure() -> Any:
    """The runner's report of a platform failure of the node's own (a full disk, a GPU gone)."""
    return failed_report("platform_error", node_fault=True)


def test_a_platform_failure_counts_against_the_reporting_node_only() -> None:
    ending = plan(job(), "failed", 90, 100, reporter=B.allocation_id, failed=node_failure())
    assert ending.decision.job_status is JobStatus.QUEUED
    assert ending.node_ends == (("node-b", "exited with status 3"),)


def test_a_platform_failure_that_follows_the_jobs_input_never_counts() -> None:
    # Before: every platform_error counted, so a tenant's jobs whose git host answered 5xx,
    # did not resolve, or whose command was not on PATH cordoned each node they landed on.
    # The job is retried all the same; the node's count neither grows nor resets.
    for retries, status in ((0, JobStatus.QUEUED), (3, JobStatus.FAILED)):
        ending = plan(
            job(platform_retries=retries),
            "failed",
            90,
            100,
            reporter=B.allocation_id,
            failed=failed_report("platform_error", node_fault=False),
        )
        assert ending.decision.job_status is status
        assert ending.decision.failure_kind == "platform_error"
        assert ending.node_ends == ()


def test_a_platform_failure_with_no_retry_left_counts_too() -> None:
    ending = plan(
        job(platform_retries=3),
        "failed",
        90,
        100,
        reporter=B.allocation_id,
        failed=node_failure(),
    )
    assert ending.decision.job_status is JobStatus.FAILED
    assert ending.node_ends == (("node-b", "exited with status 3"),)


def test_a_success_is_one_on_every_node_of_the_job() -> None:
    ending = plan(job(), "succeeded", 90, 100, reporter=A.allocation_id)
    assert ending.node_ends == (("node-a", None), ("node-b", None))


def test_other_ends_say_nothing_of_the_node() -> None:
    own = plan(job(), "failed", 90, 100, reporter=B.allocation_id, failed=failed_report())
    assert own.node_ends == ()
    assert plan(job(), "preempted", 90, 100).node_ends == ()
    assert plan(job(), "lost", 90, 100).node_ends == ()
    cancelling = plan(
        job(JobStatus.CANCELLING),
        "failed",
        90,
        100,
        reporter=B.allocation_id,
        failed=node_failure(),
    )
    assert cancelling.node_ends == ()


# --- a pass and a cordoned node ----------------------------------------------------------


def cordoned_cluster(**parts: Any) -> Any:
    """n1 cordoned, all 4 GPUs held by a preemptible low job; n2 with 2 of 4 held by a job
    of the non-preemptible class ``high``; qa's quota room for everything."""
    quota = {"queue": "qa", "flavor": "a100", "nominal": 16}
    return rows(
        nodes=[{**node("n1"), "cordoned": True}, {**node("n2"), "cordoned": False}],
        leases=[
            *({"node_id": "n1", "gpu_index": i, "job_id": "low-job"} for i in range(4)),
            *({"node_id": "n2", "gpu_index": i, "job_id": "high-job"} for i in range(2)),
        ],
        running=[
            member("low-job", "n1", [0, 1, 2, 3]),
            member("high-job", "n2", [0, 1], priority_class="high"),
        ],
        quotas=[{**quota, "borrowing_limit": None, "lending_limit": None}],
        **parts,
    )


def test_a_cordoned_node_is_no_node_to_place_on_and_its_running_job_stays() -> None:
    built = build_snapshot(cordoned_cluster(), NOW, HALF_LIFE)
    assert [n.node_id for n in built.snapshot.nodes] == ["n2"]
    assert {r.job_id for r in built.snapshot.running} == {"low-job", "high-job"}
    # An implicit queue's quota still counts the cordoned node's GPUs (its jobs use them).
    implicit = next(q for q in built.snapshot.queues if q.name == "default:team-z")
    assert dict(implicit.nominal) == {"a100": 16}
    assert built.addresses.keys() == {"n1", "n2"}


def test_no_job_is_preempted_to_make_room_on_a_cordoned_node_nor_told_its_gpus_are_free() -> None:
    # Uncordoned, the urgent job would preempt low-job to take n1 (test below). Cordoned, the
    # only room it could make is on n1: nothing is preempted and nothing is placed.
    pending = [waiting("urgent", "qa", gpus=4, priority_class="high")]
    built = build_snapshot(cordoned_cluster(pending=pending), NOW, HALF_LIFE)
    decisions = schedule(built.snapshot, PolicyConfig(min_runtime_s=0.0))
    assert (decisions.placements, decisions.preemptions) == ((), ())
    note = pending_notes(decisions, built)["urgent"]
    assert "n1" not in note.reason and "low-job" not in note.reason, note.reason
    assert "the largest free block is 2 on n2" in note.reason, note.reason


def test_uncordoned_the_same_cluster_preempts_for_the_node() -> None:
    pending = [waiting("urgent", "qa", gpus=4, priority_class="high")]
    uncordoned = cordoned_cluster(pending=pending)
    uncordoned = rows(
        **{**uncordoned.__dict__, "nodes": [node("n1"), node("n2")]},
    )
    built = build_snapshot(uncordoned, NOW, HALF_LIFE)
    decisions = schedule(built.snapshot, PolicyConfig(min_runtime_s=0.0))
    assert [p.job_id for p in decisions.preemptions] == ["low-job"]

"""Admission: a job the configuration can never run is refused with the reason; a job that
only lacks capacity is not (it waits, and its pending note says why)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest

from trainyard_platform.services.scheduler.admission import REFUSED_PREFIX, Facts, refusal, refused
from trainyard_platform.services.scheduler.policy.model import Queue
from trainyard_platform.shared.events.payloads import JobSpec

CLASSES = ("high", "low", "normal")


def spec(gpus: int = 1, flavor: str = "a100", priority: str = "normal", **more: Any) -> JobSpec:
    return JobSpec(
        name="n",
        team="vision",
        user="ada",
        entrypoint="train",
        gpus=gpus,
        gpu_flavor=flavor,
        seed=0,
        max_runtime_seconds=60,
        priority=priority,
        **more,
    )


def facts(**change: Any) -> Facts:
    return Facts(**{"classes": CLASSES, **change})


# --- what is never refused -------------------------------------------------------------------


def test_a_plain_job_on_an_implicit_queue_is_admitted() -> None:
    assert refusal(spec(gpus=64), facts()) is None


def test_a_flavor_no_node_has_yet_waits_instead() -> None:
    # No node of it was ever seen: one may join (the pending note says "no ready node has").
    assert refusal(spec(gpus=13, flavor="h200"), facts(largest_node=0)) is None


def test_more_gpus_than_the_nodes_have_together_waits_instead() -> None:
    # 64 = 8 nodes x 8: the gang rules can form it; more nodes of 8 GPUs will do.
    assert refusal(spec(gpus=64), facts(largest_node=8)) is None


# --- priority classes --------------------------------------------------------------------------


def test_an_unknown_priority_class_is_refused_naming_the_existing_ones() -> None:
    assert refusal(spec(priority="urgent"), facts()) == (
        "priority class 'urgent' does not exist; existing: high, low, normal"
    )


def test_with_no_class_at_all_the_reason_says_so() -> None:
    reason = refusal(spec(), facts(classes=()))
    assert (
        reason
        == "priority class 'normal' does not exist; existing: none (ask an operator to define one)"
    )


# --- the queue's ceiling ---------------------------------------------------------------------


def queue(name: str = "vision", cohort: str | None = None, **quota: Any) -> Queue:
    return Queue(name, name, cohort, **quota)


@pytest.mark.parametrize(("gpus", "refused_"), [(7, False), (8, False), (9, True)])
def test_a_queue_without_cohort_holds_its_nominal_quota(gpus: int, refused_: bool) -> None:
    reason = refusal(spec(gpus=gpus), facts(queue=queue(nominal={"a100": 8})))
    assert (reason is not None) == refused_
    if refused_:
        assert reason == (
            "asks for 9 a100 GPUs but queue vision can never hold more than 8 (its nominal "
            "quota 8); ask for at most 8"
        )


def test_a_queue_without_quota_of_the_flavor_is_refused() -> None:
    only_h200 = queue(nominal={"h200": 8})
    assert refusal(spec(gpus=1), facts(queue=only_h200)) == (
        "asks for 1 a100 GPU but queue vision has no a100 quota; ask an operator for a100 quota"
    )
    lonely = queue(cohort="research", nominal={"h200": 8})
    assert refusal(spec(gpus=1), facts(queue=lonely)) == (
        "asks for 1 a100 GPU but queue vision has no a100 quota and its cohort research lends "
        "none; ask an operator for a100 quota"
    )


def test_a_queue_in_a_cohort_may_also_hold_what_the_others_lend() -> None:
    own = queue(cohort="research", nominal={"a100": 4})
    lender = queue("nlp", cohort="research", nominal={"a100": 4}, lending_limit={"a100": 2})
    both = facts(queue=own, cohort=(own, lender))  # the queue itself may be listed too
    assert refusal(spec(gpus=6), both) is None
    assert refusal(spec(gpus=7), both) == (
        "asks for 7 a100 GPUs but queue vision can never hold more than 6 (its nominal quota "
        "4 plus 2 it may borrow from cohort research); ask for at most 6"
    )
    capped = queue(cohort="research", nominal={"a100": 4}, borrowing_limit={"a100": 1})
    assert "never hold more than 5" in str(
        refusal(spec(gpus=6), facts(queue=capped, cohort=(lender,)))
    )
    borrower = queue(cohort="research")  # no quota of its own: it can only borrow
    assert refusal(spec(gpus=2), facts(queue=borrower, cohort=(lender,))) is None
    assert "never hold more than 2" in str(
        refusal(spec(gpus=3), facts(queue=borrower, cohort=(lender,)))
    )


# --- gang layouts ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("gpus", "largest", "asks"),
    [
        (11, 8, "ask for 10 or 12 GPUs"),
        (13, 8, "ask for 12 or 14 GPUs"),
        (61, 8, "ask for 60 or 63 GPUs"),
        (7, 4, "ask for 6 or 8 GPUs"),
    ],
)
def test_a_gang_no_node_size_allows_is_refused_with_what_would_fit(
    gpus: int, largest: int, asks: str
) -> None:
    reason = refusal(spec(gpus=gpus), facts(largest_node=largest))
    assert reason == (
        f"asks for {gpus} a100 GPUs, which cannot be laid out on a100 nodes of at most "
        f"{largest} GPUs (a job larger than one node takes equal parts on at most twice the "
        f"fewest nodes it needs); {asks}"
    )


@pytest.mark.parametrize(
    ("gpus", "largest"),
    [(8, 8), (9, 8), (12, 8), (16, 8), (63, 8), (64, 8), (7, 1), (5, 2), (1, 1)],
)
def test_layouts_the_gang_rules_allow_are_admitted(gpus: int, largest: int) -> None:
    assert refusal(spec(gpus=gpus), facts(largest_node=largest)) is None


def test_every_problem_is_named_at_once() -> None:
    reason = refusal(
        spec(gpus=11, priority="urgent"), facts(queue=queue(nominal={"a100": 8}), largest_node=8)
    )
    assert reason is not None
    assert reason.startswith(
        "priority class 'urgent' does not exist; existing: high, low, normal; "
    )
    assert "; asks for 11 a100 GPUs but queue vision can never hold more than 8" in reason
    assert reason.endswith("fewest nodes it needs); ask for 10 or 12 GPUs")


def test_the_refusal_is_the_jobs_final_failure_without_an_allocation() -> None:
    now = datetime(2025, 1, 1, tzinfo=UTC)
    event = refused("job-1", "priority class 'urgent' does not exist; existing: low", now)
    assert (event.job_id, event.allocation_id, event.node_id, event.epoch) == ("job-1", "", "", 0)
    assert event.failure_kind == "rejected" and event.exit_code is None
    assert event.reason == f"{REFUSED_PREFIX}priority class 'urgent' does not exist; existing: low"
    assert event.finished_at == now


def test_a_job_of_a_class_that_is_not_preemptible_holds_only_its_nominal_quota() -> None:
    own = queue(cohort="research", nominal={"a100": 4})
    lender = queue("nlp", cohort="research", nominal={"a100": 4})
    cohort = facts(queue=own, cohort=(lender,), unpreemptible=("high",))
    assert refusal(spec(gpus=6), cohort) is None  # a preemptible job may borrow 2
    assert refusal(spec(gpus=4, priority="high"), cohort) is None
    assert refusal(spec(gpus=6, priority="high"), cohort) == (
        "asks for 6 a100 GPUs but priority class high is not preemptible, so its jobs never "
        "borrow, and queue vision holds at most its nominal quota 4; ask for at most 4 or use "
        "a preemptible class"
    )
    borrower = queue(cohort="research")  # no a100 quota of its own: it only borrows
    assert str(refusal(spec(priority="high"), replace(cohort, queue=borrower))).endswith(
        "holds at most its nominal quota 0; use a preemptible class"
    )
    alone = facts(queue=queue(nominal={"a100": 4}), unpreemptible=("high",))
    assert "never hold more than 4 (its nominal quota 4)" in str(
        refusal(spec(gpus=6, priority="high"), alone)
    )


def test_a_job_in_a_container_image_is_refused_as_no_runner_runs_one() -> None:
    # Before: admitted and granted, then refused by its runner ("no container executor") as
    # a platform_error, retried on other nodes (PLATFORM_RETRIES), each refusal counting
    # towards that node's cordon: a member's few image jobs took nodes out of placement.
    reason = refusal(spec(image="ghcr.io/acme/train:1.0"), facts())
    assert reason is not None and "image" in reason and "container" in reason
    assert "leave image out" in reason

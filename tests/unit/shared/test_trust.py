"""Who may say what: every event type has its owner, and strangers are refused."""

from __future__ import annotations

import pytest

from trainyard_platform.deploy.local.nats import service_permissions
from trainyard_platform.shared.events import EVENT_TYPES
from trainyard_platform.shared.events.payloads import (
    AllocationGranted,
    CheckpointSaved,
    CostRecorded,
    JobFailed,
    JobPreempted,
    JobProgress,
    JobStarted,
    JobSucceeded,
    Payload,
    RunnerHeartbeat,
)
from trainyard_platform.shared.events.trust import (
    BILLING,
    RUNNER,
    SCHEDULER,
    SUBMISSION,
    forged_because,
    nats_subject_for,
    owner,
)


def test_every_event_type_has_an_owner_who_may_send_it() -> None:
    for event_type, payload in EVENT_TYPES.items():
        assert forged_because(event_type, owner(payload)) is None, event_type


@pytest.mark.parametrize(
    ("payload", "source"),
    [
        (AllocationGranted, RUNNER),  # a runner granting itself GPUs
        (AllocationGranted, "test"),
        (CostRecorded, SUBMISSION),  # a million dollars on another team's job
        (RunnerHeartbeat, SCHEDULER),
        (JobFailed, BILLING),
    ],
)
def test_a_type_from_a_source_that_may_not_send_it_is_forged(payload: type, source: str) -> None:
    reason = forged_because(payload.TYPE, source)
    assert reason is not None and source in reason


def test_the_scheduler_may_speak_for_a_runner_about_an_ending_only() -> None:
    assert forged_because(JobFailed.TYPE, SCHEDULER) is None
    assert forged_because(RunnerHeartbeat.TYPE, SCHEDULER) is not None


def test_an_unknown_type_is_refused() -> None:
    assert forged_because("trainyard.unknown.v1", RUNNER) is not None


def _reports() -> list[type[Payload]]:
    return [p for p in EVENT_TYPES.values() if p.SAID_BY_A_NODE]


def test_a_runners_reports_are_the_ones_said_by_a_node() -> None:
    assert {p.TYPE for p in _reports()} == {
        JobStarted.TYPE,
        JobProgress.TYPE,
        CheckpointSaved.TYPE,
        JobSucceeded.TYPE,
        JobFailed.TYPE,
        JobPreempted.TYPE,
    }
    assert all(owner(p) == RUNNER for p in _reports())


@pytest.mark.parametrize("payload", _reports(), ids=lambda p: p.TYPE)
def test_a_runners_report_travels_on_its_own_nodes_subject(payload: type[Payload]) -> None:
    """A gang member that knows a peer's allocation and epoch may say a report about it only
    on its own node's subject and naming its own node: the subject (which NATS lets only
    that node publish) and the node named must agree."""
    own = f"{payload.TYPE}.job-1.node-a"
    assert nats_subject_for(payload.TYPE, RUNNER, "job-1", "node-a") == own
    assert (
        forged_because(payload.TYPE, RUNNER, routing_key="job-1", subject=own, node="node-a")
        is None
    )
    # Naming the peer's node on its own subject, or its own node on the peer's.
    for subject, node in ((own, "node-b"), (f"{payload.TYPE}.job-1.node-b", "node-a")):
        reason = forged_because(
            payload.TYPE, RUNNER, routing_key="job-1", subject=subject, node=node
        )
        assert reason is not None and "travels on" in reason, reason
    # A report that names no node (from before ``node_id``) travels on the job's subject,
    # which no runner may publish (deploy.local.nats.service_permissions).
    assert nats_subject_for(payload.TYPE, RUNNER, "job-1") == f"{payload.TYPE}.job-1"


def test_the_runners_nats_user_may_say_its_reports_only_under_its_own_node() -> None:
    allowed = service_permissions("runner", "node-a")["publish"]["allow"]
    for payload in _reports():
        assert f"{payload.TYPE}.*.node-a" in allowed
        assert not any(
            a.startswith(f"{payload.TYPE}.") and a != f"{payload.TYPE}.*.node-a" for a in allowed
        )


def test_the_schedulers_word_on_a_runners_behalf_names_no_node_in_its_subject() -> None:
    assert nats_subject_for(JobFailed.TYPE, SCHEDULER, "job-1", "node-a") == (
        f"{JobFailed.TYPE}.by-scheduler"
    )


@pytest.mark.parametrize("payload", _reports(), ids=lambda p: p.TYPE)
def test_a_report_of_a_runner_from_before_node_subjects_is_judged_by_the_node_it_names(
    payload: type[Payload],
) -> None:
    """docs/operations.md, "Upgrade" (runner reports on node subjects): a runner from
    before publishes every report on ``<type>.<job>``. Where NATS still lets it (the old
    permissions), a report naming its node (``job.started`` and the ends always do) is
    dead-lettered as forged by the new consumers; one without (its ``job.progress`` and
    ``checkpoint.saved``) is believed. A redrive, which comes on the consumer's own subject
    (no subject to compare), is judged by the source alone."""
    old = f"{payload.TYPE}.job-1"
    named = forged_because(payload.TYPE, RUNNER, routing_key="job-1", subject=old, node="n1")
    assert named == f"{payload.TYPE} from {RUNNER} travels on {old}.n1, not on {old}"
    assert forged_because(payload.TYPE, RUNNER, routing_key="job-1", subject=old) is None
    assert forged_because(payload.TYPE, RUNNER, routing_key="job-1", node="n1") is None
    node_field = payload.model_fields["node_id"]
    assert node_field.is_required() == (payload not in (JobProgress, CheckpointSaved))

"""Who may say what: every event type has its owner, and strangers are refused."""

from __future__ import annotations

import pytest

from trainyard_platform.shared.events import EVENT_TYPES
from trainyard_platform.shared.events.payloads import (
    AllocationGranted,
    CostRecorded,
    JobFailed,
    RunnerHeartbeat,
)
from trainyard_platform.shared.events.trust import (
    BILLING,
    RUNNER,
    SCHEDULER,
    SUBMISSION,
    forged_because,
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

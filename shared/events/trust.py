"""Who may say what: the CloudEvents ``source`` allowed for each event type.

Every consumer checks an event's ``source`` against this table before any handler sees it
(``Bus`` does it for every delivery): an event of a type its source may not send is
dead-lettered as forged and changes nothing. The bus's own permissions (each service may
publish only its subjects) keep a service from sending a type outside its row; this table
keeps it from claiming another service's identity inside the payload. Events the scheduler
says on a runner's behalf (``job.preempted``, ``job.failed``) are the only types with two
allowed sources.
"""

from __future__ import annotations

from collections.abc import Mapping

from shared.events.payloads import (
    AllocationGranted,
    AllocationReleased,
    AllocationRevoked,
    CheckpointSaved,
    CostRecorded,
    JobCancelled,
    JobCancelRequested,
    JobFailed,
    JobPending,
    JobPreempted,
    JobProgress,
    JobStarted,
    JobSubmitted,
    JobSucceeded,
    ModelRegistered,
    Payload,
    RunnerHeartbeat,
)

SUBMISSION = "trainyard/submission"
SCHEDULER = "trainyard/scheduler"
RUNNER = "trainyard/runner"
REGISTRY = "trainyard/registry"
BILLING = "trainyard/billing"

_TABLE: tuple[tuple[type[Payload], str, frozenset[str]], ...] = (
    # (type, its owner, others that may say it on the owner's behalf)
    (JobSubmitted, SUBMISSION, frozenset()),
    (JobCancelRequested, SUBMISSION, frozenset()),
    (AllocationGranted, SCHEDULER, frozenset()),
    (AllocationRevoked, SCHEDULER, frozenset()),
    (AllocationReleased, SCHEDULER, frozenset()),
    (JobPending, SCHEDULER, frozenset()),
    (JobCancelled, SCHEDULER, frozenset()),
    (RunnerHeartbeat, RUNNER, frozenset()),
    (JobStarted, RUNNER, frozenset()),
    (JobProgress, RUNNER, frozenset()),
    (CheckpointSaved, RUNNER, frozenset()),
    (JobSucceeded, RUNNER, frozenset()),
    (JobFailed, RUNNER, frozenset({SCHEDULER})),
    (JobPreempted, RUNNER, frozenset({SCHEDULER})),
    (ModelRegistered, REGISTRY, frozenset()),
    (CostRecorded, BILLING, frozenset()),
)

OWNERS: Mapping[str, str] = {payload.TYPE: owner for payload, owner, _ in _TABLE}
ALLOWED_SOURCES: Mapping[str, frozenset[str]] = {
    payload.TYPE: others | {owner} for payload, owner, others in _TABLE
}


def types_said_by(source: str) -> list[type[Payload]]:
    """Every event type ``source`` may send (as owner or on an owner's behalf): what the
    bus lets its user publish."""
    return [payload for payload, owner_, others in _TABLE if source in others | {owner_}]


def owner(payload: Payload | type[Payload]) -> str:
    """The source that says events of this type (the runner for those the scheduler may
    also say on its behalf)."""
    return OWNERS[payload.TYPE]


def forged_because(event_type: str, source: str) -> str | None:
    """Why an event of ``event_type`` from ``source`` is not to be believed, or None."""
    allowed = ALLOWED_SOURCES.get(event_type)
    if allowed is None:
        return f"no source may send {event_type}"
    if source not in allowed:
        return f"{event_type} may come only from {', '.join(sorted(allowed))}, not {source!r}"
    return None

"""Who may say what: the CloudEvents ``source`` allowed for each event type.

Every consumer checks an event's ``source`` against this table before any handler sees it
(``Bus`` does it for every delivery): an event of a type its source may not send is
dead-lettered as forged and changes nothing. The bus's own permissions (each service may
publish only its subjects) keep a service from sending a type outside its row; this table
keeps it from claiming another service's identity inside the payload. Events the scheduler
says on a runner's behalf (``job.preempted``, ``job.failed``, and ``job.succeeded`` for a
late success it kept), and the ``job.cancel_requested`` the registry says on submission's
behalf (a job whose parent model version was deleted before the registry heard of it), are
the only types with two allowed sources; they travel on a subject of their own
(``nats_subject_for``: ``<type>.by-scheduler``, ``<type>.by-registry``) that only that
delegate may publish, and a consumer believes an
event only on the subject its type, source and routing key give (``forged_because`` with
``subject``), so a runner cannot pass its own report off as the scheduler's decision. Nor
is an event believed whose payload is about another node or job than it is routed to
(``misrouted_because``: a grant on node A's subject for node B).

A runner node speaks only for its own part of a job: what it says about one of its
allocations (``Payload.SAID_BY_A_NODE``: its start, progress, checkpoints and end) travels on
``<type>.<job>.<node>`` and names that node in ``node_id`` (``nats_subject_for`` with
``node``), and the bus lets each runner's NATS user publish those types only on its own
node's subjects, as its heartbeat and metric batches. So the node a report names is the
node that sent it, and a consumer that checks the report's allocation was granted on that
node (as each does: the scheduler's ``fence``, billing's and the registry's comparison with
the grant, submission's ``job_allocations``) believes no node about a gang peer's allocation.
"""

from __future__ import annotations

from collections.abc import Mapping

from trainyard_platform.shared.events.payloads import (
    EVENT_TYPES,
    AllocationGranted,
    AllocationReleased,
    AllocationRevoked,
    BudgetThresholdCrossed,
    BudgetUpdated,
    CheckpointSaved,
    CostRecorded,
    FlavorDeclared,
    FlavorRetired,
    GrantOfInvalidSpec,
    JobCancelled,
    JobCancelRequested,
    JobFailed,
    JobMetrics,
    JobPending,
    JobPreempted,
    JobProgress,
    JobStarted,
    JobSubmitted,
    JobSucceeded,
    ModelRegistered,
    NodeSupplied,
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
    # The registry asks to cancel a job whose parent model version was deleted between
    # its admission and the registry hearing of it (registry.job_inputs).
    (JobCancelRequested, SUBMISSION, frozenset({REGISTRY})),
    (AllocationGranted, SCHEDULER, frozenset()),
    (AllocationRevoked, SCHEDULER, frozenset()),
    (AllocationReleased, SCHEDULER, frozenset()),
    (JobPending, SCHEDULER, frozenset()),
    (JobCancelled, SCHEDULER, frozenset()),
    (RunnerHeartbeat, RUNNER, frozenset()),
    (JobStarted, RUNNER, frozenset()),
    (JobProgress, RUNNER, frozenset()),
    (JobMetrics, RUNNER, frozenset()),
    (CheckpointSaved, RUNNER, frozenset()),
    (JobSucceeded, RUNNER, frozenset({SCHEDULER})),
    (JobFailed, RUNNER, frozenset({SCHEDULER})),
    (JobPreempted, RUNNER, frozenset({SCHEDULER})),
    (ModelRegistered, REGISTRY, frozenset()),
    (CostRecorded, BILLING, frozenset()),
    (FlavorDeclared, SCHEDULER, frozenset()),
    (FlavorRetired, SCHEDULER, frozenset()),
    (NodeSupplied, SCHEDULER, frozenset()),
    (BudgetUpdated, BILLING, frozenset()),
    (BudgetThresholdCrossed, BILLING, frozenset()),
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


def delegate_key(source: str) -> str:
    """The routing key of the events ``source`` says on another's behalf (``by-scheduler``):
    never a job id (a uuid), so a subject with it is the delegate's alone."""
    return "by-" + source.rsplit("/", 1)[-1]


def said_by_a_node(event_type: str, source: str) -> bool:
    """Whether an event of ``event_type`` from ``source`` is a runner node's report on one of
    its allocations (``Payload.SAID_BY_A_NODE``), whose subject names the node."""
    payload = EVENT_TYPES.get(event_type)
    return payload is not None and payload.SAID_BY_A_NODE and source == OWNERS.get(event_type)


def speaker_of(payload: Payload) -> str | None:
    """The node a report ``SAID_BY_A_NODE`` names as its sender (``node_id``), or None."""
    node = getattr(payload, "node_id", None) if payload.SAID_BY_A_NODE else None
    return node if isinstance(node, str) else None


def sender_of(source: str, payload: Payload) -> str:
    """Who sent an event, as far as the bus vouches for it: its ``source``, and for a
    runner's event whose subject names its node (its heartbeat and metric batches, its
    reports on its allocations) that node too, ``trainyard/runner/<node>``. Every runner
    node says the one source ``trainyard/runner``, so an inbox that kept events apart by
    source alone let a node send an event of its own under the id a gang peer's coming
    report will carry (``uuid5(<allocation>:<kind>)``) and have that report skipped as a
    repeat (``shared.inbox`` keys on this instead)."""
    if source != RUNNER:
        return source
    node = speaker_of(payload)
    if node is None and isinstance(payload, RUNNER_NODE_ONLY):
        node = routing_key_of(payload)  # its node id
    return source if node is None else f"{source}/{node}"


def nats_subject_for(
    event_type: str, source: str, routing_key: str, node: str | None = None
) -> str:
    """The NATS subject of an event: ``<type>.<routing key>``, but ``<type>.by-<delegate>``
    for one said on its owner's behalf (the scheduler's ``job.failed``: on
    ``trainyard.job.failed.v1.by-scheduler``), and ``<type>.<routing key>.<node>`` for a
    runner's report on an allocation of ``node`` (``said_by_a_node``; without a node, the
    plain subject, which no runner may publish). The bus lets only the delegate publish on
    its subject and keeps the owner off it, and lets a runner publish its reports only on
    its own node's (deploy.local.nats.service_permissions)."""
    if source != OWNERS.get(event_type) and source in ALLOWED_SOURCES.get(event_type, ()):
        return f"{event_type}.{delegate_key(source)}"
    if node is not None and said_by_a_node(event_type, source):
        return f"{event_type}.{routing_key}.{node}"
    return f"{event_type}.{routing_key}"


def delegated_keys(payload: type[Payload]) -> list[str]:
    """The routing keys of ``payload``'s subjects that only its delegates may publish on."""
    return sorted(delegate_key(s) for s in ALLOWED_SOURCES[payload.TYPE] - {owner(payload)})


def node_subjects(node_id: str) -> str:
    """The one subject filter of everything routed to a runner node: its grants and its
    revocations (``trainyard.allocation.*.v1.<node>``; releases are routed by job). One
    filter, so that it can stand in the consumer-create API subject, where NATS checks it."""
    tokens = zip(AllocationGranted.TYPE.split("."), AllocationRevoked.TYPE.split("."), strict=True)
    return ".".join([*(a if a == b else "*" for a, b in tokens), node_id])


_ROUTED_BY_NODE: tuple[type[Payload], ...] = (
    AllocationGranted,
    GrantOfInvalidSpec,
    AllocationRevoked,
    RunnerHeartbeat,
    JobMetrics,
    NodeSupplied,
)
RUNNER_NODE_ONLY: tuple[type[Payload], ...] = (RunnerHeartbeat, JobMetrics)
"""What a runner may say only under its own node id (its NATS user's permissions)."""


_ROUTED_BY_OTHER: tuple[tuple[type[Payload], str, str], ...] = (
    (FlavorDeclared, "name", "flavor"),
    (FlavorRetired, "name", "flavor"),
    (BudgetUpdated, "team", "team"),
    (BudgetThresholdCrossed, "team", "team"),
)
"""Events about neither a job nor a node: (type, the field of their routing key, what it
names)."""


def _routed_by(payload: Payload) -> tuple[str, str]:
    for kind, field, what in _ROUTED_BY_OTHER:
        if isinstance(payload, kind):
            return field, what
    if isinstance(payload, _ROUTED_BY_NODE):
        return "node_id", "node"
    return "job_id", "job"


def routing_key_of(payload: Payload) -> str:
    """The routing key an event of ``payload`` carries (docs/events.md): its node id for a
    grant, a revocation, a heartbeat, a batch of metric points or a node's supply, the flavor's name for the
    flavor catalogue's events, the team for a budget's, its job id for every other event."""
    return str(getattr(payload, _routed_by(payload)[0]))


def misrouted_because(payload: Payload, routing_key: str) -> str | None:
    """Why an event routed by ``routing_key`` is not about what it is routed to (a grant on
    node A's subject for node B), or None. The routing key is in the NATS subject, which the
    bus's permissions vouch for and consumers filter on; the payload is what they act on."""
    about = routing_key_of(payload)
    if about != routing_key:
        what = _routed_by(payload)[1]
        return f"{payload.TYPE} routed to {what} {routing_key} is about {what} {about}"
    return None


def forged_because(
    event_type: str,
    source: str,
    *,
    routing_key: str | None = None,
    subject: str | None = None,
    node: str | None = None,
) -> str | None:
    """Why an event of ``event_type`` from ``source`` is not to be believed, or None. Given
    the NATS ``subject`` it came on (and its ``routing_key``, and for a runner's report the
    ``node`` it names, ``speaker_of``), also why that subject is not the one such an event
    travels on (``nats_subject_for``): the subject is what the bus's permissions vouch for,
    the envelope is what the sender wrote."""
    allowed = ALLOWED_SOURCES.get(event_type)
    if allowed is None:
        return f"no source may send {event_type}"
    if source not in allowed:
        return f"{event_type} may come only from {', '.join(sorted(allowed))}, not {source!r}"
    if subject is not None and routing_key is not None:
        expected = nats_subject_for(event_type, source, routing_key, node)
        if subject != expected:
            return f"{event_type} from {source} travels on {expected}, not on {subject}"
    return None

"""One frozen pydantic model per event payload, registered under its versioned type.

Adding an optional field to a payload keeps its version; removing or changing the
meaning of a field is a new version (``...v2``) published beside the old one.
The catalogue in docs/events.md lists every type here.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    model_validator,
)

# Defined by the client distribution (the job <-> runner contract) and carried in events.
from trainyard.control import CheckpointRef as CheckpointRef
from trainyard.control import HyperValue as HyperValue

BUNDLE_SHA256_PATTERN = r"^[0-9a-f]{64}$"
GIT_COMMIT_PATTERN = r"^[0-9a-f]{40}$"

# The bounds of a job spec: the submission API refuses anything beyond them (422 naming the
# field), and the wire ``JobSpec`` holds every consumer to them too.
MAX_JOB_GPUS = 64
MAX_JOB_RESTARTS = 20
MAX_NODE_GPUS = 256
"""The most GPUs one node may say it has (``RunnerHeartbeat.gpu_count``): the scheduler
works through each of a node's GPUs in every pass, so what a node says must be bounded."""
MAX_JOB_RUNTIME_SECONDS = 7 * 24 * 3600
MAX_SEED = 2**32 - 1
"""The widest seed every RNG a job may use (numpy's included) accepts."""
MAX_CPUS_PER_GPU = 1024
MAX_MEMORY_GIB_PER_GPU = 16384
"""The most CPUs and GiB of memory a job may declare per GPU (billing meters them)."""
MAX_ARGS = 1000
MAX_COMMAND = 200
MAX_ARGUMENT_CHARS = 10_000
MAX_REQUIREMENTS = 100
MAX_HYPERPARAMETERS = 1000
MAX_PROJECT = 100
MAX_EXPERIMENT = 100
MAX_LABELS = 64
MAX_LABEL_KEY = 317
"""A Kubernetes label key: an optional DNS-subdomain prefix (253) and ``/``, a name (63)."""
MAX_LABEL_VALUE = 200
"""Longer than Kubernetes' 63: a branch name or a short note fits."""
MAX_DATASETS = 16
"""The most registered dataset versions one job names (``JobSpec.datasets``)."""
MAX_REFERENCE = 320
"""The longest ``team/name:version`` or ``team/name@alias`` reference (two names of 100, a
separator and a version or an alias)."""
_REF_NAME = r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,99}"
DATASET_REF_PATTERN = rf"^{_REF_NAME}/{_REF_NAME}(?::[1-9][0-9]{{0,8}})?$"
"""``team/name`` or ``team/name:version`` of a registered dataset (names as the registry's:
no leading dot, no ``/``, ``%``, NUL or other control character)."""
MODEL_REF_PATTERN = rf"^{_REF_NAME}/{_REF_NAME}(?::[1-9][0-9]{{0,8}}|@[a-z][a-z0-9_-]{{0,62}})$"
"""``team/name:version`` or ``team/name@alias`` of a registered model version."""
VERSION_ID_PATTERN = r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"
"""The id of a registered version (a UUID, as the registry writes it)."""

NOT_IN_A_NAME = re.compile(r"[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
"""What no name, id or key may hold, whoever chose it (the APIs' screen of bodies,
``shared.http_errors``; a job's metric keys, ``runner.metric_limits``): C0 and C1 controls
(a NUL, which PostgreSQL stores in neither text nor JSON; a terminal escape), lone
surrogates, and the bidirectional embeddings, overrides and isolates (U+202A-202E,
U+2066-2069), with which a name can be shown as another ("Trojan Source")."""
NOT_IN_FREE_TEXT = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff]")
"""What no string may hold, free text included (an argument, a hyperparameter's value):
``NOT_IN_A_NAME`` but tab, newline and carriage return, and the bidirectional marks (the
argv of ``sh -c`` and right-to-left prose hold them)."""


def _refuse(found: re.Match[str] | None, allowed: str) -> None:
    if found is not None:
        raise ValueError(
            f"must not contain control characters (found U+{ord(found.group()):04X}; "
            f"allowed: {allowed})"
        )


def _name_text(value: str) -> str:
    _refuse(NOT_IN_A_NAME.search(value), "none")
    return value


def _free_text(value: str) -> str:
    _refuse(NOT_IN_FREE_TEXT.search(value), "tab, newline and carriage return only")
    return value


def _free_hyper_value(value: Any) -> Any:
    return _free_text(value) if isinstance(value, str) else value


def _with_time_zone(value: datetime) -> datetime:
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(
            "must carry a time zone (Z or an offset such as +00:00): a time without one "
            "names a different instant on every host that reads it"
        )
    return value


Instant = Annotated[datetime, AfterValidator(_with_time_zone)]
"""Every point in time an event carries, in any payload model (the one rule, kept in this
one place): a timestamp with a time zone or UTC offset, as RFC 3339 has it. One without
(``2026-12-01T10:00:00``) is refused whoever sent it, the error naming the field, never
taken for UTC or the reader's local time. Offsets other than UTC are kept as given."""


Text = Annotated[str, AfterValidator(_name_text)]
"""A string of a spec that is no free text: no control character (``NOT_IN_A_NAME``), as
the submission API's screen of bodies (``shared.http_errors.check_json``) has it."""
FreeText = Annotated[str, AfterValidator(_free_text)]
"""A string of a spec that is free text (``command``, ``args``, hyperparameter values):
``NOT_IN_FREE_TEXT`` refused, as the submission API's screen has it."""


FailureKind = Literal[
    "user_error",
    "out_of_memory",
    "node_lost",
    "preempted",
    "cancelled",
    "max_runtime",
    "platform_error",
    "rejected",
]
"""How an attempt ended badly. ``user_error`` (non-zero exit) and ``node_lost`` use up one
of the job's ``max_restarts``; ``platform_error`` means the job never ran its code (the
bundle could not be fetched or verified, the environment not built, the process not
started; ``JobFailed.node_fault`` says whether the node itself was at fault); ``rejected`` means the scheduler refused the job when it arrived, because it asks
for something this cluster's configuration can never give (an undefined priority class, more
GPUs than its queue may ever hold, a gang no node size allows): it never held GPUs."""


class Payload(BaseModel):
    """Base of every event payload; subclasses set ``TYPE``."""

    model_config = ConfigDict(frozen=True, extra="ignore", ser_json_inf_nan="strings")
    TYPE: ClassVar[str]
    SAID_BY_A_NODE: ClassVar[bool] = False
    """A runner's report about one of its allocations, routed by job: from a runner it
    travels on ``<type>.<job>.<node>``, a subject only that node's NATS user may publish,
    and names that node in ``node_id`` (``trust.nats_subject_for``), so a node speaks only
    for its own part of a job, never for a gang peer's."""

    @classmethod
    def event_type(cls) -> str:
        return cls.TYPE


class CodeBundle(BaseModel):
    """A packed working directory the submission service stores, content-addressed, at
    ``bundles/<team>/<sha256>.tar.gz`` in the object store."""

    model_config = ConfigDict(frozen=True)

    kind: Literal["bundle"] = "bundle"
    sha256: str = Field(pattern=BUNDLE_SHA256_PATTERN)
    size_bytes: int = Field(ge=0, le=2**40)


class CodeGit(BaseModel):
    """A git repository and the exact commit to check out."""

    model_config = ConfigDict(frozen=True)

    kind: Literal["git"] = "git"
    repository: Text = Field(min_length=1, max_length=500)
    commit: str = Field(pattern=GIT_COMMIT_PATTERN)


CodeRef = Annotated[CodeBundle | CodeGit, Field(discriminator="kind")]


class JobSpec(BaseModel):
    """What a job asks for, as accepted by submission (the wire copy, not the HTTP schema).

    Every field is bounded by the same limits as the HTTP schema (the submission API checks
    the finer rules: patterns, entrypoint paths, requirements), so a consumer never sees a
    spec the API would have refused for its size or range. No string holds a control
    character (``Text``; ``FreeText`` for ``command``, ``args`` and hyperparameter values),
    whoever produced the spec: an error names the field and the character."""

    model_config = ConfigDict(frozen=True, ser_json_inf_nan="strings")

    name: Text = Field(min_length=1, max_length=100)
    team: Text = Field(min_length=1, max_length=100)
    user: Text = Field(min_length=1, max_length=100)
    entrypoint: Text = Field(default="", max_length=300)
    """A dotted module (``python -m``) or a ``.py`` script path inside the code; empty when
    ``command`` is given instead."""
    args: list[Annotated[FreeText, Field(max_length=MAX_ARGUMENT_CHARS)]] = Field(
        default_factory=list, max_length=MAX_ARGS
    )
    gpus: int = Field(ge=1, le=MAX_JOB_GPUS)
    gpu_flavor: Text = Field(min_length=1, max_length=100)
    cpus_per_gpu: int = Field(default=0, ge=0, le=MAX_CPUS_PER_GPU)
    """CPUs the job declares per GPU (an allocation of ``g`` GPUs holds ``g`` x this);
    billing meters them at the flavor's CPU-hour price. 0: none declared."""
    memory_gib_per_gpu: int = Field(default=0, ge=0, le=MAX_MEMORY_GIB_PER_GPU)
    """Memory (GiB) the job declares per GPU, metered like ``cpus_per_gpu``."""
    hyperparameters: dict[
        Annotated[Text, Field(max_length=200)],
        Annotated[HyperValue, AfterValidator(_free_hyper_value)],
    ] = Field(default_factory=dict, max_length=MAX_HYPERPARAMETERS)
    seed: int = Field(ge=0, le=MAX_SEED)
    max_runtime_seconds: int = Field(ge=1, le=MAX_JOB_RUNTIME_SECONDS)
    dataset: Text | None = Field(default=None, max_length=1000)
    max_restarts: int = Field(default=3, ge=0, le=MAX_JOB_RESTARTS)
    priority: Text = Field(default="normal", min_length=1, max_length=40)
    """Priority class name; the scheduler's admin API defines the classes."""
    code: CodeRef | None = None
    """Where the job's code comes from; ``None``: only what the environment already has."""
    command: list[Annotated[FreeText, Field(max_length=MAX_ARGUMENT_CHARS)]] = Field(
        default_factory=list, max_length=MAX_COMMAND
    )
    """An argv run as is in the job's working directory (instead of ``entrypoint``)."""
    requirements: list[Annotated[Text, Field(max_length=200)]] = Field(
        default_factory=list, max_length=MAX_REQUIREMENTS
    )
    """Python requirements (PEP 508) installed into a cached virtual environment."""
    image: Text | None = Field(default=None, max_length=300)
    """A container image to run in (the container executor) instead of a local process."""
    project: Text = Field(default="default", min_length=1, max_length=MAX_PROJECT)
    """The team's project the job belongs to (``default`` when the spec names none)."""
    experiment: Text | None = Field(default=None, min_length=1, max_length=MAX_EXPERIMENT)
    """The experiment (a named group of runs in the team and project) the job is a run of."""
    labels: dict[
        Annotated[Text, Field(min_length=1, max_length=MAX_LABEL_KEY)],
        Annotated[Text, Field(max_length=MAX_LABEL_VALUE)],
    ] = Field(default_factory=dict, max_length=MAX_LABELS)
    """Free key/value labels (keys like Kubernetes label keys) to find and group runs by."""
    register_model: bool = False
    """Whether the registry registers a model version from the job's final checkpoint when it
    succeeds (``False``: it registers nothing unless asked by ``POST .../versions``)."""
    datasets: list[Annotated[Text, Field(min_length=3, max_length=MAX_REFERENCE)]] = Field(
        default_factory=list, max_length=MAX_DATASETS
    )
    """Registered dataset versions the job reads, each ``team/name:version`` (submission
    resolves a reference without a version to the latest one at admission)."""
    parent_model: Text | None = Field(default=None, min_length=3, max_length=MAX_REFERENCE)
    """The model version the job fine-tunes from, ``team/name:version`` (submission resolves
    ``team/name@alias`` to the version it points at, at admission)."""
    parent_model_version_id: Text | None = Field(default=None, pattern=VERSION_ID_PATTERN)
    """The id of the version ``parent_model`` named at admission (submission puts it there):
    the registry records that version as the parent, never another that has its name and
    number by the time it hears of the job (the model deleted and made again). None: from
    a publisher that does not say (the registry looks ``parent_model`` up by name)."""
    reproduces: Text | None = Field(default=None, min_length=1, max_length=100)
    """The id of the job this one reproduces (``POST /v1/jobs/{id}/reproduce``): the
    registry compares the two when this one ends."""


# --- submission ------------------------------------------------------------------


class JobSubmitted(Payload):
    TYPE = "trainyard.job.submitted.v1"
    job_id: str
    spec: JobSpec
    submitted_at: Instant
    lowered_from: Text | None = None
    """The priority class the job asked for when a spent budget (policy ``deprioritize``)
    admitted it at ``spec.priority`` (``low``) instead; None: admitted at the class asked for
    (or from a publisher that does not say)."""


class JobCancelRequested(Payload):
    TYPE = "trainyard.job.cancel_requested.v1"
    job_id: str
    team: str
    user: str
    reason: str = "cancelled by user"


# --- scheduler -------------------------------------------------------------------


class GangMember(BaseModel):
    """One node of a multi-node job: its ranks are ``first_rank .. first_rank+gpus-1``."""

    model_config = ConfigDict(frozen=True)

    node_id: str
    allocation_id: str
    address: str
    """Where the node's processes can be reached (its heartbeat's ``address``)."""
    gpus: int
    first_rank: int


class AllocationGranted(Payload):
    """GPUs leased to one job on one node. Routed to the node (envelope subject = node id)."""

    TYPE = "trainyard.allocation.granted.v1"
    allocation_id: str
    job_id: str
    node_id: str
    gpu_indices: list[int]
    epoch: int
    attempt: int
    granted_at: Instant
    spec: JobSpec
    gang: list[GangMember] = Field(default_factory=list)
    """Every allocation of the job's gang in rank order, this one included; empty for a
    job on one node."""
    queue: str | None = None
    """The scheduler's queue the job was placed from (billing attributes cost to it); None
    from a publisher that does not say."""
    resume: CheckpointRef | None = None
    """The checkpoint this attempt resumes from: the newest one the job's own allocations
    reported committed (``checkpoint.saved``, believed only from the node of the job's
    allocation), with the size and sha256 they committed. The runner restores exactly this
    one, verified against it, and never another it finds in the store; None: the job
    starts from nothing (its first attempt, one that never saved, a publisher that does
    not say)."""


class GrantOfInvalidSpec(Payload):
    """An ``AllocationGranted`` whose ``spec`` is no valid ``JobSpec`` (a producer other
    than the submission API wrote it): its other fields, valid, and why the spec is not
    (``problem``, each bad field named). Never published and in no catalogue: the runner
    reads a grant so (``runner.handlers.parse_event``) to fail its job as the job's own
    error, where the grant would otherwise be dead-lettered unanswered."""

    TYPE = AllocationGranted.TYPE
    allocation_id: str
    job_id: str
    node_id: str
    gpu_indices: list[int]
    epoch: int
    attempt: int
    granted_at: Instant
    problem: str = ""


class AllocationRevoked(Payload):
    """The runner must stop the job (checkpoint first, within the grace period)."""

    TYPE = "trainyard.allocation.revoked.v1"
    allocation_id: str
    job_id: str
    node_id: str
    epoch: int
    reason: Literal["cancelled", "preempted", "fenced"]
    grace_seconds: float = 30.0
    detail: str = ""
    """Why, in words, where the scheduler has more to say: a preemption names the job it
    makes room for, the rule that allowed it, and the work the victim loses."""


class AllocationReleased(Payload):
    """A lease ended; billing turns ``granted_at``..``released_at`` into GPU-seconds."""

    TYPE = "trainyard.allocation.released.v1"
    allocation_id: str
    job_id: str
    node_id: str
    team: str
    user: str
    gpu_flavor: str
    gpus: int
    granted_at: Instant
    released_at: Instant
    outcome: Literal["succeeded", "failed", "cancelled", "preempted", "lost"]
    platform_failure: bool = False
    """The attempt this allocation belonged to failed through the platform: the runner of
    one of its members (this one's or, in a gang, another's) reported ``platform_error``
    and the scheduler released every member for it. Its team pays nothing for the
    allocation. False says nothing more: billing still charges an allocation to the
    platform when its own runner reported ``platform_error`` (the field is absent from a
    scheduler older than it)."""


class JobPending(Payload):
    """Why a job waits, where it stands and when it may start."""

    TYPE = "trainyard.job.pending.v1"
    job_id: str
    reason: str
    position: int
    estimated_start: Instant | None = None
    blocking: str | None = None
    """Who or what holds what the job needs (a team, a job, a quota)."""
    suggestion: str | None = None
    """What would let the job start now, e.g. "ask for 4 GPUs instead of 8"."""


class JobCancelled(Payload):
    TYPE = "trainyard.job.cancelled.v1"
    job_id: str
    reason: str


# --- runner ----------------------------------------------------------------------


MAX_NODE_RUNNING = 1000
"""The most allocations one heartbeat may say its node runs (``running_allocations``)."""


def _within(low: int, high: int) -> AfterValidator:
    """``low`` to ``high`` (a number), checked after parsing: the bounds a heartbeat gained
    after its schema was published stay out of it (a schema changes within a version only
    by optional additions), and consumers refuse what is past them."""

    def check(value: int) -> int:
        if not low <= value <= high:
            raise ValueError(f"must be {low} to {high}, got {value}")
        return value

    return AfterValidator(check)


def _at_most(most: int, what: str) -> AfterValidator:
    """At most ``most`` ``what`` (characters of a string, items of a list), as ``_within``."""

    def check(value: Any) -> Any:
        if len(value) > most:
            raise ValueError(f"must hold at most {most} {what}, got {len(value)}")
        return value

    return AfterValidator(check)


def _within_length(least: int) -> AfterValidator:
    """At least ``least`` characters, as ``_within``."""

    def check(value: str) -> str:
        if len(value) < least:
            raise ValueError(f"must hold at least {least} character{'s' if least > 1 else ''}")
        return value

    return AfterValidator(check)


NodeText = Annotated[Text, _at_most(100, "characters")]
HostText = Annotated[Text, _at_most(253, "characters")]


class RunnerHeartbeat(Payload):
    """What a node says of itself every few seconds, bounded whoever sent it: the scheduler
    places work by ``gpu_count`` and goes through each of a node's GPUs in every pass, and
    operators read its strings in ``GET /v1/nodes``."""

    TYPE = "trainyard.runner.heartbeat.v1"
    node_id: str
    hostname: HostText
    gpu_flavor: Annotated[NodeText, _within_length(1)]
    gpu_count: Annotated[int, _within(0, MAX_NODE_GPUS)]
    gpu_names: Annotated[
        list[Annotated[Text, _at_most(200, "characters")]], _at_most(MAX_NODE_GPUS, "names")
    ] = Field(default_factory=list)
    running_allocations: Annotated[list[NodeText], _at_most(MAX_NODE_RUNNING, "allocations")] = (
        Field(default_factory=list)
    )
    sent_at: Instant
    topology: NodeText = "default"
    """Topology domain of the node (NVLink domain, rack) for gang placement."""
    address: HostText = "127.0.0.1"
    """Address other nodes reach this node's job processes at (distributed rendezvous)."""


class Environment(BaseModel):
    """Where a job ran: interpreter, libraries, hardware."""

    model_config = ConfigDict(frozen=True, ser_json_inf_nan="strings")

    packages: list[str] = Field(default_factory=list)
    """The resolved package list (``name==version``) of the job's environment."""
    packages_sha256: str | None = None
    """sha256 of ``packages`` (sorted, one per line); None when the list was not recorded."""
    environment_key: str | None = None
    """Hash of the requirement set the cached environment was built for."""
    image: str | None = None
    code_sha256: str | None = None

    python: str
    torch: str
    platform: str
    hostname: str
    node_id: str
    gpu_flavor: str
    gpu_names: list[str] = Field(default_factory=list)
    cuda: str | None = None
    cudnn: str | None = None
    """cuDNN of the job's interpreter (its installed ``nvidia-cudnn-*`` wheel); None when
    there is none (e.g. a CPU build of torch)."""
    nccl: str | None = None
    """NCCL of the job's interpreter (its installed ``nvidia-nccl-*`` wheel); None when none."""
    driver: str | None = None
    """The GPU driver version of the node; None on virtual GPUs (CPU)."""
    gpu_count: int | None = Field(default=None, ge=0)
    """How many GPUs the job was given (``gpu_names`` are their models)."""
    topology: str | None = Field(default=None, max_length=100)
    """The node's topology domain (NVLink domain, rack), as its heartbeat says."""
    code_diff_sha256: str | None = None
    """sha256 of the uncommitted changes of a dirty git work tree the code ran from (the
    diff against ``HEAD`` and the untracked files); None when clean or not a git tree."""


class JobStarted(Payload):
    TYPE = "trainyard.job.started.v1"
    SAID_BY_A_NODE = True
    job_id: str
    allocation_id: str
    node_id: str
    attempt: int
    epoch: int
    started_at: Instant
    code_version: str
    environment: Environment
    spec: JobSpec
    resumed_from: str | None = None


class JobProgress(Payload):
    TYPE = "trainyard.job.progress.v1"
    SAID_BY_A_NODE = True
    job_id: str
    allocation_id: str
    step: int
    metrics: dict[str, float]
    node_id: str | None = None
    """The node that says it (its allocation's); required of a runner (``SAID_BY_A_NODE``),
    absent only from events published before the field existed."""


MAX_METRIC_POINTS = 2000
"""The most points one ``job.metrics`` carries: with keys of ``MAX_METRIC_KEY`` characters
the event stays well under NATS's 1 MiB payload limit (about 500 KiB at worst)."""
MAX_METRIC_KEY = 200


class MetricPoint(BaseModel):
    """One value a job reported for one metric at one step, when the runner received it."""

    model_config = ConfigDict(frozen=True, ser_json_inf_nan="strings")

    key: str = Field(min_length=1, max_length=MAX_METRIC_KEY)
    step: int = Field(ge=0, le=2**63 - 1)
    time: Instant
    value: float
    """Any float: NaN and infinities are kept; the event's JSON writes them as the strings
    ``"NaN"``, ``"Infinity"`` and ``"-Infinity"`` (bare ``NaN`` is not JSON), and parsing
    reads those strings back as floats."""


class JobMetrics(Payload):
    """Every metric point a job reported, in batches, in the order it reported them
    (``job.progress`` is the latest values only). Routed by ``node_id``: only the runner of
    the node the job runs on may say it (``shared.events.trust``)."""

    TYPE = "trainyard.job.metrics.v1"
    job_id: str
    allocation_id: str
    node_id: str
    seq: int = Field(ge=0)
    """The batch's number within its allocation (0, 1, 2, ...)."""
    points: list[MetricPoint] = Field(min_length=1, max_length=MAX_METRIC_POINTS)


class CheckpointSaved(Payload):
    TYPE = "trainyard.checkpoint.saved.v1"
    SAID_BY_A_NODE = True
    job_id: str
    allocation_id: str
    epoch: int
    checkpoint: CheckpointRef
    saved_at: Instant
    node_id: str | None = None
    """The node that says it, as ``JobProgress.node_id``."""


class JobSucceeded(Payload):
    TYPE = "trainyard.job.succeeded.v1"
    SAID_BY_A_NODE = True
    job_id: str
    allocation_id: str
    node_id: str
    epoch: int
    finished_at: Instant
    metrics: dict[str, float] = Field(default_factory=dict)
    artifact: CheckpointRef | None = None


class JobFailed(Payload):
    TYPE = "trainyard.job.failed.v1"
    SAID_BY_A_NODE = True
    job_id: str
    allocation_id: str
    node_id: str
    epoch: int
    finished_at: Instant
    exit_code: int | None
    reason: str
    log_tail: str = ""
    failure_kind: FailureKind = "user_error"
    metrics: dict[str, float] = Field(default_factory=dict)
    """What the runner measured of the attempt, as ``JobSucceeded.metrics`` (e.g.
    ``gpu_utilization_mean``, ``data_wait_fraction_mean``); empty when it measured none."""
    node_fault: bool = False
    """The runner's word that a ``platform_error`` is this node's own fault (its GPUs, its
    disk, its runtime, its own storage credentials): only such a failure counts towards the
    node's automatic cordon. False for every other failure, and for a ``platform_error``
    that follows the job's own input (its git host, its command, its requirements), which
    is retried but never held against the node: a tenant's jobs cannot cordon nodes."""

    @property
    def through_platform(self) -> bool:
        """Whether the attempt failed through the platform (``platform_error``): its time is
        the platform's, not its team's. The one rule of both services: billing charges it
        to the platform (every member of its gang, ``AllocationReleased.platform_failure``)
        and the scheduler adds none of it to the team's fair-share usage (one heard after its
        allocation's release, its first, takes back what the release charged there)."""
        return self.failure_kind == "platform_error"


class JobPreempted(Payload):
    """The job stopped because its allocation was revoked; it resumes from ``checkpoint``."""

    TYPE = "trainyard.job.preempted.v1"
    SAID_BY_A_NODE = True
    job_id: str
    allocation_id: str
    node_id: str
    epoch: int
    finished_at: Instant
    reason: str
    checkpoint: CheckpointRef | None = None
    metrics: dict[str, float] = Field(default_factory=dict)
    """What the runner measured of the attempt, as ``JobSucceeded.metrics``."""


# --- registry --------------------------------------------------------------------


class Lineage(BaseModel):
    """How a model version was made: everything needed to reproduce it."""

    model_config = ConfigDict(frozen=True, ser_json_inf_nan="strings")

    job_id: str
    spec: JobSpec
    code_version: str
    dataset: str | None
    seed: int
    environment: Environment
    attempts: int
    parent_checkpoints: list[str] = Field(default_factory=list)


class ModelRegistered(Payload):
    TYPE = "trainyard.model.registered.v1"
    model_version_id: str
    model_name: str
    version: int
    team: str
    job_id: str
    artifact_uri: str
    artifact_sha256: str
    metrics: dict[str, float]
    lineage: Lineage


# --- billing ---------------------------------------------------------------------


class CostRecorded(Payload):
    """The bill of one ended allocation, attributed to job, user and team: its GPU-seconds x
    price, and, where its job declared CPUs and memory, their time x the flavor's CPU and
    memory prices (``cost`` is the whole).

    ``revision`` orders the events of one allocation: 0 for its first bill, higher for each
    correction (an amended bill, the bill made the platform's), so a consumer keeps the
    figure of the highest revision and an older one arriving late or again never replaces
    it. Events of a billing that did not say it read 0."""

    TYPE = "trainyard.cost.recorded.v1"
    allocation_id: str
    job_id: str
    team: str
    user: str
    gpu_flavor: str
    gpus: int
    started_at: Instant
    ended_at: Instant
    gpu_seconds: float
    price_per_gpu_hour: float
    cost: float
    currency: str
    revision: int = Field(default=0, ge=0)


EVENT_TYPES: dict[str, type[Payload]] = {
    model.TYPE: model
    for model in (
        JobSubmitted,
        JobCancelRequested,
        AllocationGranted,
        AllocationRevoked,
        AllocationReleased,
        JobPending,
        JobCancelled,
        RunnerHeartbeat,
        JobStarted,
        JobProgress,
        JobMetrics,
        CheckpointSaved,
        JobSucceeded,
        JobFailed,
        JobPreempted,
        ModelRegistered,
        CostRecorded,
    )
}


def nats_subject(payload_type: type[Payload], key: str = "*") -> str:
    """The NATS subject (or filter, with the default ``*``) for events of one type; the
    filter of a type ``SAID_BY_A_NODE`` is ``<type>.>``, matching its runners' subjects
    (``<type>.<job>.<node>``) and its delegate's (``<type>.by-scheduler``)."""
    if key == "*" and payload_type.SAID_BY_A_NODE:
        return f"{payload_type.TYPE}.>"
    return f"{payload_type.TYPE}.{key}"


def dump(payload: BaseModel) -> dict[str, Any]:
    """JSON-compatible dict of a model (datetimes as ISO strings)."""
    return payload.model_dump(mode="json")


# --- flavor catalogue (scheduler) and budgets (billing) ------------------------------------


class FlavorDeclared(Payload):
    """An operator declared or described a GPU flavor (``PUT /v1/admin/flavors/{name}``).

    ``revision`` grows with every change of the catalogue (one sequence for all flavors):
    a replica applies an event only when its revision is above the one it holds for the
    flavor, so redelivery and reordering never bring back an older state."""

    TYPE = "trainyard.flavor.declared.v1"
    name: str = Field(min_length=1, max_length=100)
    description: str = Field(default="", max_length=1000)
    revision: int = Field(ge=1)
    declared_at: Instant


class FlavorRetired(Payload):
    """An operator deleted a flavor (``DELETE /v1/admin/flavors/{name}``); see
    ``FlavorDeclared`` for ``revision``."""

    TYPE = "trainyard.flavor.retired.v1"
    name: str = Field(min_length=1, max_length=100)
    revision: int = Field(ge=1)
    retired_at: Instant


class NodeSupplied(Payload):
    """What the scheduler places on a node: the node's heartbeat claim capped by what
    operators declared (docs/operations.md, "The node inventory"), said when a judgement
    changes it (a change the node's own claim made, at most once a minute), and again at
    each scheduler leader's start and hourly. A consumer counting a node's GPUs (billing's
    unallocated GPUs) reads them here, not in the node's heartbeat, whose word is its own.

    ``gpu_flavor`` is empty for a node with no flavor (undeclared while the inventory is
    required). ``sequence`` orders a node's events: the version of its supply, one more at
    each change, kept in the scheduler's database (so neither two leaders nor a clock step
    can reorder them); a consumer keeps the highest, and one said again has the same
    supply. Absent (a scheduler from before it), ``judged_at`` orders them; a sequenced
    event is later than any without."""

    TYPE = "trainyard.node.supplied.v1"
    node_id: NodeText
    gpu_flavor: NodeText
    gpu_count: Annotated[int, _within(0, MAX_NODE_GPUS)]
    judged_at: Instant
    sequence: int | None = Field(default=None, ge=1, le=2**63 - 1)


RATE_PATTERN = r"^\d{1,10}(\.\d{1,6})?$"
MAX_PRICED_FLAVORS = 1000


class ReservationRates(BaseModel):
    """The highest prices per hour of one flavor from a budget state's moment on (the one in
    force then, and any set to take effect later): what the scheduler reserves a job of the
    flavor at (decimal strings in the budget's currency; ``"0"``: that resource unpriced)."""

    model_config = ConfigDict(frozen=True)

    gpu_hour: str = Field(pattern=RATE_PATTERN)
    cpu_hour: str = Field(default="0", pattern=RATE_PATTERN)
    memory_gib_hour: str = Field(default="0", pattern=RATE_PATTERN)


MAX_ACCRUING = 1000
"""The most running allocations a budget state names (``BudgetUpdated.accruing``)."""
BudgetPolicy = Literal["refuse", "deprioritize", "warn"]
"""What submission does with a new job of a team (or project) whose budget is spent."""
BudgetOnExhausted = Literal["finish", "stop"]
"""What the scheduler does with the running jobs of a team (or project) whose budget is
spent: let them ``finish``, or ``stop`` them (checkpoint and stop, as a preemption)."""


class BudgetUpdated(Payload):
    """The state of one budget as billing holds it now: set, changed, deleted, or spent
    further (every threshold crossing says it too).

    ``project`` None: the team's budget. ``deleted``: there is no budget any more.
    ``exhausted``: ``spent >= amount`` in ``month`` (``YYYY-MM``, UTC). ``revision`` grows
    with every change of any budget: a replica keeps the highest it saw per budget."""

    TYPE = "trainyard.budget.updated.v1"
    team: str = Field(min_length=1, max_length=100)
    project: str | None = Field(default=None, max_length=MAX_PROJECT)
    month: str = Field(pattern=r"^\d{4}-\d{2}$")
    amount: str
    """Decimal string, in ``currency``."""
    spent: str
    currency: str
    policy: BudgetPolicy
    exhausted: bool
    deleted: bool = False
    revision: int = Field(ge=1)
    on_exhausted: BudgetOnExhausted = "finish"
    """What the scheduler does with the budget's running jobs while it is exhausted (absent
    from a state said before the field existed: ``finish``)."""
    rates: dict[str, ReservationRates] | None = Field(default=None, max_length=MAX_PRICED_FLAVORS)
    """Per priced flavor, what a job of it is reserved at (``ReservationRates``), for a
    budget whose spent state holds queued jobs: the scheduler starts a job of its team (or
    project) only while its worst case fits in what is left (docs/scheduling.md, "Budgets
    that hold queued jobs"). None (a state said before the field existed, or of a budget
    that holds nothing): nothing is reserved, the budget holds only once it is spent.
    At most ``MAX_PRICED_FLAVORS`` (billing's price book holds no more flavors).

    Read from the wire (JSON), ``rates`` that do not validate (a billing of another
    version, a malformed rate) do not refuse the state: the rest of it (whether the budget
    is spent above all) is good and must be applied, so the state is read without them
    (None) and ``rates_unread`` says why; a replica then keeps the rates it had
    (``shared.budget_states.keep``). Built in Python (the producer), they are refused."""
    spent_at: Instant | None = None
    """When ``spent`` was measured (billing's clock): what the allocations still running had
    accrued up to this instant is part of it. None (a state said before the field existed):
    not said."""
    accruing: list[str] | None = Field(default=None, max_length=MAX_ACCRUING)
    """With ``rates``: the allocations (ids) still running whose cost up to ``spent_at`` is
    in ``spent``; the scheduler reserves such a running job only what it can cost after
    ``spent_at``, and any other its whole worst case. None (a state said before the field
    existed, of a budget that reserves nothing, or with more running allocations than
    ``MAX_ACCRUING``): each running job is reserved its whole worst case."""
    _rates_error: ValidationError | None = PrivateAttr(default=None)

    @property
    def rates_unread(self) -> str | None:
        """Why the ``rates`` of this state, read from the wire, were left out: each bad field
        by its path (``rates.<flavor>.<rate>``) and what is wrong, in plain words, ``; ``
        between them; None when they were read, or there were none."""
        if self._rates_error is None:
            return None
        # Imported here: http_errors stands on the bus, which stands on this module.
        from trainyard_platform.shared.http_errors import field_errors

        said = [f"{e.field}: {e.message}" for e in field_errors(self._rates_error)]
        more = f"; and {len(said) - 5} more" if len(said) > 5 else ""
        return "; ".join(said[:5]) + more

    @model_validator(mode="wrap")
    @classmethod
    def _read_without_bad_rates(
        cls, data: Any, handler: ModelWrapValidatorHandler[BudgetUpdated], info: ValidationInfo
    ) -> BudgetUpdated:
        """From JSON, a state whose only bad field is ``rates`` is read without them."""
        try:
            return handler(data)
        except ValidationError as exc:
            only_rates = all(e["loc"][:1] == ("rates",) for e in exc.errors())
            if info.mode != "json" or not isinstance(data, dict) or not only_rates:
                raise
            state = handler({k: v for k, v in data.items() if k != "rates"})
            state._rates_error = exc
            return state


class BudgetThresholdCrossed(Payload):
    """A budget's spending in a month reached one of its thresholds (percent of the amount):
    said once per budget, month and threshold."""

    TYPE = "trainyard.budget.threshold_crossed.v1"
    team: str = Field(min_length=1, max_length=100)
    project: str | None = Field(default=None, max_length=MAX_PROJECT)
    month: str = Field(pattern=r"^\d{4}-\d{2}$")
    threshold_percent: int = Field(ge=1, le=1000)
    amount: str
    spent: str
    currency: str
    policy: BudgetPolicy
    crossed_at: Instant


for _model in (
    FlavorDeclared,
    FlavorRetired,
    NodeSupplied,
    BudgetUpdated,
    BudgetThresholdCrossed,
):
    EVENT_TYPES[_model.TYPE] = _model

"""HTTP schemas of the submission API: what users send and what they read.

These are not wire events: ``JobRequest`` is turned into the wire ``JobSpec`` by
``to_spec`` after the caller's identity is known, and nothing here is ever published.

Validation errors are reported in the shared shape (``shared.http_errors``): every bad field
by its path (``hyperparameters.lr``, ``args[2]``), all at once.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from trainyard.patterns import pattern_message
from trainyard_platform.services.submission.domain import JobStatus
from trainyard_platform.shared.events.payloads import (
    BUNDLE_SHA256_PATTERN,
    DATASET_REF_PATTERN,
    GIT_COMMIT_PATTERN,
    MAX_ARGS,
    MAX_ARGUMENT_CHARS,
    MAX_COMMAND,
    MAX_CPUS_PER_GPU,
    MAX_DATASETS,
    MAX_EXPERIMENT,
    MAX_HYPERPARAMETERS,
    MAX_JOB_GPUS,
    MAX_JOB_RESTARTS,
    MAX_JOB_RUNTIME_SECONDS,
    MAX_LABEL_KEY,
    MAX_LABEL_VALUE,
    MAX_LABELS,
    MAX_MEMORY_GIB_PER_GPU,
    MAX_PROJECT,
    MAX_REQUIREMENTS,
    MAX_SEED,
    MODEL_REF_PATTERN,
    VERSION_ID_PATTERN,
    HyperValue,
    JobSpec,
)
from trainyard_platform.shared.http_errors import FieldError, RequestInvalid, field_errors
from trainyard_platform.shared.public_addresses import address_problem
from trainyard_platform.shared.requirements import (
    CREDENTIALS_IN_URL,
    has_userinfo,
    requirement_problem,
    wheel_address_problem,
)
from trainyard_platform.shared.suggest import NOT_JOB_FIELDS, unknown_field
from trainyard_platform.shared.url_hosts import read_git_url

NAME_PATTERN = r"^[A-Za-z0-9._-]{1,100}$"
PRIORITY_PATTERN = r"^[a-z][a-z0-9-]{0,39}$"
"""A priority class name; the scheduler's operators define the classes (``low``, ``normal``
and ``high`` exist from the start). The scheduler refuses a job whose class does not exist
when it takes it in: the job ends FAILED, ``failure_kind`` ``rejected``, with that reason."""
ENTRYPOINT_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"
"""A dotted module, run as ``python -m``."""
SCRIPT_SEGMENT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
"""One folder or file name of a ``.py`` script path: no ``.``/``..``, no hidden or
option-like (``-x``) names."""
FLAVOR_PATTERN = r"^[a-z0-9][a-z0-9-]{0,39}$"
"""A GPU flavor name: the rule of the scheduler's flavors and of a runner's
``TRAINYARD_RUNNER_GPU_FLAVOR``."""
NAME_MAX = 255
"""The longest file name (bytes) Linux file systems hold: every folder or file an entrypoint
or a program path names must fit."""
PATH_MAX = 4095
"""The longest path (bytes, without the final NUL) ``execve`` takes as a program."""
HYPERPARAMETERS_MAX_CHARS = 65_536
"""The longest the hyperparameters may be as the runner hands them to the job (JSON with
``\\uXXXX`` escapes, in one environment variable; Linux refuses a variable over 128 KiB and
the job would never start)."""
API_VERSION = "trainyard.dev/v1"
"""The ``apiVersion`` of a job spec; with ``kind: Job`` it names the spec's format."""
JOB_SCHEMA_ID = "https://trainyard.dev/schemas/job.v1.json"
IDEMPOTENCY_KEY = re.compile(r"[\x20-\x7e]{1,200}")
LABEL_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?")
"""The name part of a label key, as Kubernetes has it: at most 63 characters, alphanumeric at
both ends, ``-``, ``_`` and ``.`` inside."""
LABEL_PREFIX = re.compile(r"[a-z0-9](?:[a-z0-9-]*[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]*[a-z0-9])?)*")
"""The optional prefix of a label key (``example.com/`` in ``example.com/owner``): a DNS
subdomain of at most 253 characters."""


# --- code, command, requirements, image ----------------------------------------------------

_NO_CONTROL = r"[^\s\x00-\x1f\x7f]"
GIT_URL = re.compile(
    rf"(?:https|git)://(?:[A-Za-z0-9._~-]+@)?[A-Za-z0-9][A-Za-z0-9.-]*(?::[0-9]{{1,5}})?"
    rf"/{_NO_CONTROL}+"
)
"""``https://host[:port]/path`` or ``git://host[:port]/path``: no whitespace (``_git_url``
refuses credentials before the host and a port out of range)."""
SSH_GIT_URL = re.compile(r"(?:ssh|git\+ssh|ssh\+git)://|[^/:@]*@[^/@]+:")
"""The start of a repository git fetches by ssh: ``ssh://`` (and git's ``git+ssh://``,
``ssh+git://``) or the scp form ``user@host:path``."""
NO_SSH = (
    "ssh is not supported: a job fetches its code without keys, so only a public repository "
    "by https:// or git:// can be fetched; for a private repository submit a code bundle "
    "(leave code out of the spec and `trainyard submit` packs and uploads its folder)"
)

_IMAGE_DOMAIN = (
    r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*"
    r"(?::[0-9]{1,5})?/)?"
)
_IMAGE_PATH = r"[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*"
IMAGE = re.compile(
    rf"{_IMAGE_DOMAIN}{_IMAGE_PATH}(?:/{_IMAGE_PATH})*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"
    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?"
)
"""A docker image reference: ``[registry[:port]/]path[:tag][@digest]``."""


def _entrypoint(value: str) -> str:
    if value.endswith(".py"):
        if value.startswith("/"):
            raise ValueError("a script path must be relative to the code root (no leading '/')")
        segments = value.split("/")
        if any(s in ("", ".", "..") for s in segments):
            raise ValueError("a script path must not contain '..', '.' or empty segments")
        if all(SCRIPT_SEGMENT.fullmatch(s) for s in segments):
            if any(len(s) > NAME_MAX for s in segments):
                raise ValueError(
                    f"every folder and file name of a script path must be at most {NAME_MAX} "
                    "characters (a longer one cannot be a file name)"
                )
            return value
    elif re.fullmatch(ENTRYPOINT_PATTERN, value):
        # Each part is a package folder or, with ``.py``, the module's file.
        if any(len(part) + len(".py") > NAME_MAX for part in value.split(".")):
            raise ValueError(
                f"every part of a dotted module must be at most {NAME_MAX - len('.py')} "
                "characters (with .py, a longer one cannot be a file name)"
            )
        return value
    raise ValueError(
        "must be a dotted Python module (examples.digits_cnn) or a .py script path "
        "relative to the code root (scripts/train.py)"
    )


def _no_nul(value: str) -> str:
    if "\x00" in value:
        raise ValueError("must not contain a NUL character")
    return value


def _one_line(value: str) -> str:
    if re.search(r"[\x00-\x1f\x7f]", value):
        raise ValueError("must not contain control characters (newline, tab, NUL, ...)")
    return value


def program_problem_of_command(program: str) -> str | None:
    """Why ``command[0]`` cannot be a program ``execve`` starts, or None."""
    if not program:
        return "the program (command[0]) must not be empty"
    if re.search(r"[\x00-\x1f\x7f]", program):
        return "the program (command[0]) must not contain control characters (newline, tab, NUL)"
    size = len(program.encode())
    if size > PATH_MAX:
        return f"the program (command[0]) must be at most {PATH_MAX} bytes, not {size}"
    if any(len(part.encode()) > NAME_MAX for part in program.split("/")):
        return (
            f"every folder and file name of the program (command[0]) must be at most "
            f"{NAME_MAX} bytes"
        )
    return None


def _requirement(value: str) -> str:
    """A requirement the runners install (``requirement_problem``), its wheel URL (if any)
    one a node may fetch as far as this service can tell (``wheel_address_problem``: a host
    written as an address must be a public one; a host name is judged by each runner before
    it installs, as a repository's is)."""
    problem = requirement_problem(value) or wheel_address_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


def _label_key(value: str) -> str:
    prefix, slash, name = value.rpartition("/")
    if (not slash or (len(prefix) <= 253 and LABEL_PREFIX.fullmatch(prefix))) and (
        LABEL_NAME.fullmatch(name)
    ):
        return value
    raise ValueError(
        f"label key {value!r} must be a Kubernetes-style key: [prefix/]name, the name at most "
        "63 characters (letters, digits, '-', '_', '.'; a letter or digit at both ends), the "
        "optional prefix a lowercase DNS subdomain (example.com)"
    )


def _git_url(value: str) -> str:
    """A repository git may fetch: ``GIT_URL`` (never ssh, ``NO_SSH``: a job fetches
    without keys, never the host's, so an ssh fetch could never succeed), no credentials, a
    port from 1 to 65535, a host read as the runners read it (``shared.url_hosts``: what
    programs would read differently, such as ``127.0.0.1.``, is refused saying why), and
    that, if written as an address, is a public one (``shared.public_addresses``): ``https://10.0.0.5/...`` or ``git://127.0.0.1:4222/``
    could only ever reach the runner's own network. A host name is not judged here: what it resolves to is the runners'
    network's answer, not this service's, so each runner resolves and judges it before it
    fetches (``services.runner.git_remote``), allowing the private networks and names its
    operator lists (``TRAINYARD_RUNNER_FETCH_ALLOW_PRIVATE``): a company's own git server is
    named by host name."""
    if SSH_GIT_URL.match(value):
        raise ValueError(NO_SSH)
    if not GIT_URL.fullmatch(value):
        raise ValueError(
            "must be an https:// or git:// URL, its host a name or an IPv4 address (not an "
            "IPv6 one), without whitespace or credentials"
        )
    if has_userinfo(value):  # https and git take no user but a token
        raise ValueError(CREDENTIALS_IN_URL)
    port = _git_port(value)
    if port is not None and not 0 < port < 65536:
        raise ValueError(f"names the port {port}, which is no port: 1 to 65535")
    located = read_git_url(value)  # as the runners read it
    host, address = located.host, located.address
    problem = None if address is None else address_problem(address)
    if problem is not None:
        shown = "" if str(address) == host else f" ({address})"
        raise ValueError(
            f"names the address {host}{shown}, {problem}: the runners fetch code only from "
            "public addresses (a git server of your company's own network: name it by its "
            "host name, which the runners' operator may allow)"
        )
    return value


def _git_port(value: str) -> int | None:
    """The port a repository ``GIT_URL`` matched names, None when it names none."""
    authority = value.partition("://")[2].split("/", 1)[0]
    port = authority.rpartition("@")[2].partition(":")[2]
    return int(port) if port else None


def _image(value: str) -> str:
    if not IMAGE.fullmatch(value):
        raise ValueError(
            "must be a docker image reference: [registry[:port]/]name[:tag][@sha256:digest]"
        )
    return value


def program_problem(entrypoint_given: bool, command_given: bool) -> FieldError | None:
    """The error when a job names neither or both of ``entrypoint`` and ``command``."""
    if entrypoint_given and command_given:
        return FieldError(field="command", message="give either entrypoint or command, not both")
    if not entrypoint_given and not command_given:
        return FieldError(
            field="entrypoint",
            message="field required: give entrypoint (a module or a .py script) or command "
            "(an argv)",
        )
    return None


def script_problem(entrypoint: object, code: object) -> FieldError | None:
    """The error when ``entrypoint`` is a ``.py`` script and the job has no ``code``: the
    runner starts a script from the job's code, so it could never start. (A module may come
    from the requirements or the image.)"""
    if isinstance(entrypoint, str) and entrypoint.endswith(".py") and code is None:
        return FieldError(
            field="entrypoint",
            message="a .py script runs from the job's code and this job has none: give code "
            "(trainyard submit packs the spec's folder unless --no-code) or a module",
        )
    return None


class BundleCode(BaseModel):
    """Code from a bundle uploaded with ``PUT /v1/bundles/{sha256}`` by the same team."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    kind: Literal["bundle"]
    sha256: Annotated[str, Field(pattern=BUNDLE_SHA256_PATTERN)]
    size_bytes: Annotated[int, Field(ge=0, le=2**40)]


class GitCode(BaseModel):
    """Code from a git repository at an exact commit."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    kind: Literal["git"]
    repository: Annotated[str, Field(min_length=1, max_length=500), AfterValidator(_git_url)]
    commit: Annotated[str, Field(pattern=GIT_COMMIT_PATTERN)]


Code = Annotated[BundleCode | GitCode, Field(discriminator="kind")]
Entrypoint = Annotated[str, Field(min_length=1, max_length=300), AfterValidator(_entrypoint)]
Argument = Annotated[str, Field(max_length=MAX_ARGUMENT_CHARS), AfterValidator(_no_nul)]
Requirement = Annotated[str, Field(min_length=1, max_length=200), AfterValidator(_requirement)]
Image = Annotated[str, Field(min_length=1, max_length=300), AfterValidator(_image)]


HYPER_STR_MAX = 10_000
"""The longest hyperparameter string (a job's whole body is limited too: ``api``)."""


def _hyper_value(value: object) -> HyperValue:
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("must be a finite number")
    if isinstance(value, str) and len(value) > HYPER_STR_MAX:
        raise ValueError(f"must be at most {HYPER_STR_MAX} characters")
    if isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**63:
        raise ValueError("must be an integer that fits 64 bits")
    if isinstance(value, bool | int | float | str):
        return value
    raise ValueError("must be a number, a string or a boolean")


Name = Annotated[str, Field(min_length=1, max_length=100, pattern=NAME_PATTERN)]
NEW_TEAM_RULE = (
    "must not contain '.': a team's name is one token of NATS subjects and a folder of its objects"
)


def new_team(value: str) -> str:
    """``value`` as the name of a team to create, or ``ValueError`` (``NEW_TEAM_RULE``).

    A team's name is the routing key of its budget events, one token of their NATS subject
    (``trainyard.budget.updated.v1.<team>``, read with the filter ``...v1.*``), and a
    segment of object keys (``bundles/<team>/``, the registry's ``registry/<team>/``): a
    '.' would split the token (the event would match no consumer's filter) or make the
    segment ``.`` or ``..``. Teams that exist (made before the rule) are still looked up by
    ``Name``, and still get users (``identity.create_user``)."""
    if "." in value:
        raise ValueError(NEW_TEAM_RULE)
    return value


NewTeam = Annotated[Name, AfterValidator(new_team)]
Project = Annotated[str, Field(min_length=1, max_length=MAX_PROJECT, pattern=NAME_PATTERN)]
Experiment = Annotated[str, Field(min_length=1, max_length=MAX_EXPERIMENT, pattern=NAME_PATTERN)]
LabelKey = Annotated[str, Field(min_length=1, max_length=MAX_LABEL_KEY), AfterValidator(_label_key)]
LabelValue = Annotated[str, Field(max_length=MAX_LABEL_VALUE), AfterValidator(_one_line)]
DatasetRef = Annotated[str, Field(pattern=DATASET_REF_PATTERN)]
ModelRef = Annotated[str, Field(pattern=MODEL_REF_PATTERN)]
Hyper = Annotated[
    HyperValue, PlainValidator(_hyper_value, json_schema_input_type=bool | int | float | str)
]


class JobRequest(BaseModel):
    """The body of ``POST /v1/jobs``, and a job spec file (``trainyard submit``).

    ``apiVersion`` and ``kind`` may be left out: like Kubernetes' API server, the endpoint
    says what it takes; when given they must be ``trainyard.dev/v1`` and ``Job``."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        frozen=True,
        use_attribute_docstrings=True,
    )

    api_version: Literal["trainyard.dev/v1"] | None = Field(default=None, alias="apiVersion")
    """The spec's format: ``trainyard.dev/v1``."""
    kind: Literal["Job"] | None = None
    """What the file describes: ``Job``."""
    name: Name
    """The job's name (letters, digits, ``.``, ``_``, ``-``); need not be unique."""
    team: Name | None = None
    """Defaults to the caller's team; any other team is refused (403)."""
    entrypoint: Entrypoint | None = None
    """What the runner starts: a dotted module (``python -m examples.digits_cnn``) or a
    ``.py`` script relative to the code root (``scripts/train.py``). Exactly one of
    ``entrypoint`` and ``command`` is given."""
    command: Annotated[list[Argument], Field(min_length=1, max_length=MAX_COMMAND)] | None = None
    """An argv run as is in the job's working directory (``["bash", "run.sh"]``)."""
    code: Code | None = None
    """Where the job's code comes from: an uploaded bundle or a git commit."""
    requirements: Annotated[list[Requirement], Field(max_length=MAX_REQUIREMENTS)] = Field(
        default_factory=list
    )
    """Python requirements (a conservative PEP 508 subset) installed for the job."""
    image: Image | None = None
    """A container image to run the job in."""
    args: list[Argument] = Field(default_factory=list, max_length=MAX_ARGS)
    """Arguments after the entrypoint (``python -m module ARGS``)."""
    gpus: Annotated[int, Field(ge=1, le=MAX_JOB_GPUS)]
    """How many GPUs the job holds (a gang over several nodes when no node has them all)."""
    gpu_flavor: Annotated[str, Field(min_length=1, max_length=100)]
    """One of the submission service's ``flavors`` when parsed with them, else any name
    matching ``FLAVOR_PATTERN``."""
    cpus_per_gpu: Annotated[int, Field(ge=0, le=MAX_CPUS_PER_GPU)] = 0
    """CPUs the job uses per GPU, billed at the flavor's CPU-hour price (0: none declared)."""
    memory_gib_per_gpu: Annotated[int, Field(ge=0, le=MAX_MEMORY_GIB_PER_GPU)] = 0
    """Memory (GiB) the job uses per GPU, billed at the flavor's memory price (0: none)."""
    hyperparameters: dict[Annotated[str, Field(min_length=1, max_length=200)], Hyper] = Field(
        default_factory=dict, max_length=MAX_HYPERPARAMETERS
    )
    """At most ``MAX_HYPERPARAMETERS``, and ``HYPERPARAMETERS_MAX_CHARS`` as the job gets them."""
    seed: Annotated[int, Field(ge=0, le=MAX_SEED)] = 0
    """The seed the job's RNGs start from (``TRAINYARD_SEED``)."""
    max_runtime_seconds: Annotated[int, Field(ge=1, le=MAX_JOB_RUNTIME_SECONDS)] = 3600
    """The job is stopped (FAILED, ``max_runtime``) this long after its GPUs were granted,
    its preparation (code fetched, environment built) included; the platform's own waits
    are not counted (docs/job-spec.md, "max_runtime_seconds")."""
    dataset: (
        Annotated[str, Field(min_length=1, max_length=1000), AfterValidator(_one_line)] | None
    ) = None
    """A dataset URI the job reads (recorded in the model's lineage)."""
    max_restarts: Annotated[int, Field(ge=0, le=MAX_JOB_RESTARTS)] = 3
    """How often a failed attempt is restarted from the latest checkpoint."""
    priority: Annotated[str, Field(pattern=PRIORITY_PATTERN)] = "normal"
    """Name of the job's priority class (see ``PRIORITY_PATTERN``)."""
    project: Project = "default"
    """The team's project the job belongs to (a name like a job's)."""
    experiment: Experiment | None = None
    """The experiment the job is a run of (a name like a job's); runs of one experiment in
    one team and project are compared side by side."""
    labels: dict[LabelKey, LabelValue] = Field(default_factory=dict, max_length=MAX_LABELS)
    """Key/value labels to find and group runs by: keys like Kubernetes label keys
    (``[prefix/]name``, the name at most 63 characters), values of at most 200 characters
    on one line; at most 64 labels."""
    register_model: bool = False
    """Register a model version (named like the job, in its team) from the job's final
    checkpoint when it succeeds. Default: nothing is registered unless asked later."""
    datasets: list[DatasetRef] = Field(default_factory=list, max_length=MAX_DATASETS)
    """Registered datasets the job reads, each ``team/name`` (the latest version at
    admission) or ``team/name:version``; the job's team must own or be granted each one."""
    parent_model: ModelRef | None = None
    """The model version the job fine-tunes from: ``team/name:version`` or
    ``team/name@alias`` of a model of the job's own team."""
    parent_model_version_id: Annotated[str, Field(pattern=VERSION_ID_PATTERN)] | None = None
    """Optional pin of ``parent_model``: the id of the version it must name at admission
    (a job's spec carries it, so a rerun of the spec sends it back). Admission refuses the
    job when ``parent_model`` names another version by then (the model deleted and made
    again, an alias moved), and sets it when it is not given (``data_admission``)."""

    @field_validator("gpu_flavor")
    @classmethod
    def _known_flavor(cls, value: str, info: ValidationInfo) -> str:
        flavors: Sequence[str] | None = (info.context or {}).get("flavors")
        if flavors is not None and value not in flavors:
            raise ValueError(f"unknown flavor {value!r}; allowed: {', '.join(flavors)}")
        if flavors is None and not re.fullmatch(FLAVOR_PATTERN, value):
            raise ValueError(pattern_message(FLAVOR_PATTERN) or f"must match {FLAVOR_PATTERN}")
        return value

    @field_validator("command")
    @classmethod
    def _program_named(cls, value: list[str] | None) -> list[str] | None:
        problem = None if value is None else program_problem_of_command(value[0])
        if problem is not None:
            raise ValueError(problem)
        return value

    @field_validator("hyperparameters")
    @classmethod
    def _hyperparameters_fit_the_environment(
        cls, value: dict[str, HyperValue]
    ) -> dict[str, HyperValue]:
        # Exactly how the runner encodes them (``shared.control.JobRuntimeEnv``).
        size = len(json.dumps(value, sort_keys=True))
        if size > HYPERPARAMETERS_MAX_CHARS:
            raise ValueError(
                f"as the job gets them (JSON in TRAINYARD_HYPERPARAMETERS, non-ASCII escaped "
                f"as \\uXXXX) they take {size} characters; at most {HYPERPARAMETERS_MAX_CHARS}"
            )
        return value

    @model_validator(mode="after")
    def _one_program(self) -> JobRequest:
        problem = program_problem(
            self.entrypoint is not None, self.command is not None
        ) or script_problem(self.entrypoint, self.code)
        if problem is not None:
            raise ValueError(f"{problem.field}: {problem.message}")
        return self

    @model_validator(mode="after")
    def _model_name(self) -> JobRequest:
        # The registry names the model like the job and refuses a name starting with '.'
        # ('..' would be a segment of its object keys): it would register nothing, after
        # the whole run, with only a line in its log to say so.
        if self.register_model and self.name.startswith("."):
            raise ValueError(
                "name: with register_model the job's name names its model, which must not "
                "start with '.'"
            )
        return self

    @model_validator(mode="after")
    def _pin_of_a_parent(self) -> JobRequest:
        if self.parent_model_version_id is not None and self.parent_model is None:
            raise ValueError(
                "parent_model_version_id: pins the version of a parent_model, and the job "
                "names none"
            )
        return self

    def with_parent_version(self, parent_model: str, version_id: str | None) -> JobRequest:
        """This request with ``parent_model`` as admission resolved it (``team/name:version``)
        and the id of that version, which its spec carries (``to_spec``)."""
        return self.model_copy(
            update={"parent_model": parent_model, "parent_model_version_id": version_id}
        )

    def to_spec(self, user: str, team: str) -> JobSpec:
        """The wire spec, as submitted by ``user`` of ``team``."""
        fields = self.model_dump(exclude={"team", "api_version", "kind"})
        fields["entrypoint"] = self.entrypoint or ""
        fields["command"] = list(self.command or [])
        return JobSpec(**fields, user=user, team=team)


RoleName = Literal["viewer", "member", "admin", "operator"]


class RoleChange(BaseModel):
    """The body of ``PATCH /v1/admin/users/{name}``."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    role: RoleName
    """The user's new role; its tokens carry it from their next request."""


class CreateUserRequest(BaseModel):
    """The body of ``POST /v1/admin/users``."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    name: Name
    team: Name | None = None
    """Defaults to the caller's team; admins create users in their own team only, operators
    in any. A team that does not exist yet is made, its name held to ``new_team``."""
    role: RoleName = "member"
    """viewer reads; member also submits and cancels its own jobs; admin also manages the
    team's users and tokens and cancels any of its jobs; operator (created by operators
    only) runs the platform."""


class UserCreated(BaseModel):
    user: str
    team: str
    role: str
    token: str
    """Shown once; only its hash is stored."""


AttemptIndex = Annotated[
    int | None,
    Field(
        description=(
            "the attempt's 0-based index (0: the job's first attempt; one more for each "
            "requeue); texts for people name it counted from 1 (index 0 is 'attempt 1')"
        )
    ),
]
"""An ``attempt`` field of the API: the index the events carry, kept as it always was."""


class HistoryEntry(BaseModel):
    status: JobStatus
    at: datetime
    reason: str | None = None


class PendingView(BaseModel):
    reason: str | None
    position: int | None
    estimated_start: datetime | None
    blocking: str | None = None
    """Who or what holds what the job needs (jobs, a queue, a quota)."""
    suggestion: str | None = None
    """What would let the job start now, e.g. "ask for 4 GPUs"."""


class FailureView(BaseModel):
    """The latest failure: the job's (FAILED, as the scheduler decided it) or, while the job
    goes on (restarted), its last failed attempt's."""

    reason: str
    exit_code: int | None = None
    log_tail: str = ""
    failure_kind: str | None = None
    """``user_error``, ``out_of_memory``, ``platform_error``, ``max_runtime``, ``node_lost``,
    ... (``job.failed``'s ``failure_kind``); None for failures recorded before it was kept."""
    attempt: AttemptIndex = None
    """The attempt that failed (its index)."""


class CheckpointView(BaseModel):
    step: int
    uri: str
    sha256: str
    size_bytes: int
    saved_at: datetime


class ModelView(BaseModel):
    name: str
    version: int
    artifact_uri: str
    artifact_sha256: str
    metrics: dict[str, float | None]
    lineage: dict[str, Any]


class CostView(BaseModel):
    gpu_seconds: float
    cost: float
    currency: str | None
    price_per_gpu_hour: float | None
    """The billed prices per GPU-hour, weighted by GPU-seconds (``cost`` may also hold CPU
    and memory charges)."""
    final: bool
    """The job has ended and every allocation it held has been billed."""


class JobView(BaseModel):
    """One job as its team sees it."""

    id: str
    name: str
    team: str
    user: str
    spec: dict[str, Any]
    status: JobStatus
    terminal: bool
    history: list[HistoryEntry]
    pending: PendingView | None
    node: str | None
    gpu_indices: list[int]
    attempt: AttemptIndex
    submitted_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    updated_at: datetime
    cancel_requested: bool
    failure: FailureView | None
    """None once the job has SUCCEEDED (an earlier attempt's failure stays in the history)."""
    failed_attempts: int = 0
    """How many of the job's attempts failed (each restart after a failure follows one)."""
    step: int | None
    metrics: dict[str, float | None]
    checkpoints: list[CheckpointView]
    model: ModelView | None
    cost: CostView
    trace_id: str | None = None
    """The W3C trace id the job's spans share, from the request that submitted it (look it
    up in Jaeger, or ``trainyard trace JOB``), only when that trace was recorded (sampled
    at submission); None when it was not: the sampler dropped it (``OTEL_TRACES_SAMPLER``
    ``always_off``, a ratio, or a caller's ``traceparent`` flagged not sampled), tracing was
    off, or the job predates trace ids."""


def parse_job_request(body: bytes, flavors: Sequence[str] | None) -> JobRequest:
    """Validate a ``POST /v1/jobs`` body; raise ``RequestInvalid`` naming every bad field.
    ``flavors``: those ``gpu_flavor`` may name (None: any name matching ``FLAVOR_PATTERN``)."""
    allowed = None if flavors is None else list(flavors)
    try:
        return JobRequest.model_validate_json(body, context={"flavors": allowed})
    except ValidationError as exc:
        errors = [_without_tag(_suggested(e)) for e in field_errors(exc)]
        # The model check of entrypoint/command runs only once every field is valid; name
        # its problem together with the others.
        problem = _program_problem_of(body)
        if problem is not None and problem.field not in {e.field for e in errors}:
            errors.append(problem)
        raise RequestInvalid(errors, "invalid job spec") from None


def known_fields(path: str) -> list[str]:
    """The field names a job spec takes in the object at ``path`` (``""``: the spec itself,
    ``code.bundle``/``code.git``: a code reference of that kind, ``code``: either)."""
    models: dict[str, list[type[BaseModel]]] = {
        "": [JobRequest],
        "code": [BundleCode, GitCode],
        "code.bundle": [BundleCode],
        "code.git": [GitCode],
    }
    return sorted(
        {info.alias or name for m in models.get(path, []) for name, info in m.model_fields.items()}
    )


def _suggested(error: FieldError) -> FieldError:
    """An unknown field's error names the closest known field, if one is close."""
    if error.message != "unknown field":
        return error
    # The object it is in, by the longest path of one that field names are known in: a key
    # may hold a dot itself (``{"a.b": 1}`` is the field ``a.b`` of the spec).
    parent = next(
        (p for p in ("code.bundle", "code.git", "code") if error.field.startswith(f"{p}.")), ""
    )
    name = error.field.removeprefix(f"{parent}.") if parent else error.field
    message = unknown_field(name, known_fields(parent), NOT_JOB_FIELDS if not parent else None)
    return FieldError(field=error.field, message=message)


def job_json_schema() -> dict[str, Any]:
    """The published JSON Schema of a job spec file (``client/trainyard/schemas/job.v1.json``)."""
    schema = JobRequest.model_json_schema(by_alias=True)
    return (
        {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": JOB_SCHEMA_ID}
        | {k: v for k, v in schema.items() if k != "$schema"}
        | {"title": "Trainyard job spec"}
    )


def _without_tag(error: FieldError) -> FieldError:
    """``code.bundle.sha256`` -> ``code.sha256``: the union's tag is not part of the path."""
    field = re.sub(r"^code\.(?:bundle|git)(?=\.|$)", "code", error.field)
    return error if field == error.field else FieldError(field=field, message=error.message)


def _program_problem_of(body: bytes) -> FieldError | None:
    try:
        raw = json.loads(body)
    except ValueError:
        return None
    if not isinstance(raw, dict):
        return None
    return program_problem(
        raw.get("entrypoint") is not None, raw.get("command") is not None
    ) or script_problem(raw.get("entrypoint"), raw.get("code"))


def parse_idempotency_key(value: str | None) -> str | None:
    """The ``Idempotency-Key`` header: absent, or 1-200 printable ASCII characters."""
    if value is None:
        return None
    if not IDEMPOTENCY_KEY.fullmatch(value):
        error = FieldError(
            field="Idempotency-Key", message="must be 1-200 printable ASCII characters"
        )
        raise RequestInvalid([error], "invalid Idempotency-Key header")
    return value


@dataclass(frozen=True)
class Fingerprint:
    """What identifies a submission, for an ``Idempotency-Key``'s replay
    (``request_fingerprint``): ``stored`` is kept with a new job; ``matches`` tells whether
    a job's stored fingerprint is of this same request, whichever form it was stored in."""

    stored: str
    """The sha256 (hex) of the request in its canonical form: what a new job keeps."""
    as_sent: str
    """The sha256 (hex) of the fields the body set, as validated: the form jobs stored
    before the canonical one kept, still compared with their retries."""

    def matches(self, stored: str) -> bool:
        """Whether a job's stored fingerprint is of this request. The two forms hash texts
        that differ (the canonical one alone has the key ``FINGERPRINT_FORM``), so a
        fingerprint of one form never equals one of the other."""
        return stored in (self.stored, self.as_sent)


FINGERPRINT_FORM = "$form"
"""The key the canonical form of ``request_fingerprint`` has and no request has (a job
request forbids unknown fields): what sets its text apart from the form before it."""
_CANONICAL = "defaults-applied"
_FIELDS_NOT_THE_JOB = frozenset({"api_version", "kind"})
"""Fields that say what a spec file is, not what the job is: each takes one value or none
(by name: ``model_dump`` excludes by field name, not alias)."""


def request_fingerprint(
    request: JobRequest, reproduces: str | None = None, *, team: str
) -> Fingerprint:
    """What identifies a submission by the job its client asked for, for an
    ``Idempotency-Key``'s replay: the sha256 (hex) of the canonical JSON (keys sorted, no
    spaces, ASCII) of the request as validated, every default applied, and for a
    reproduction the id of the job it reproduces. ``team``: the caller's, which a request
    leaving ``team`` out means. Equal for the same request however its client spelled it:
    keys in any order or spacing, a field left out or sent with its default value
    (``"seed": 0``), ``team`` left out or naming the caller's team, ``apiVersion`` and
    ``kind`` given or not. Any other difference in what the job would be (a value, a list's
    order, a number's type: ``1`` is not ``1.0``) differs. Nothing the server decides later
    (a budget's lowering, a dataset version the registry resolves) is in it, so a retry has
    the same fingerprint whenever it comes; a default changed by a new version of the
    service changes it (a retry across that change is another request, 409, never a job
    different from the one it asked for). ``as_sent``: the form kept before, of the fields
    the body set only, for jobs stored then (``Fingerprint.matches``)."""
    fields = request.model_dump(mode="json", by_alias=True, exclude=set(_FIELDS_NOT_THE_JOB))
    fields["team"] = request.team or team
    if reproduces is not None:
        fields["reproduces"] = reproduces  # not a field of a request (``extra="forbid"``)
    fields[FINGERPRINT_FORM] = _CANONICAL
    as_sent = request.model_dump(mode="json", by_alias=True, exclude_unset=True)
    if reproduces is not None:
        as_sent["reproduces"] = reproduces
    return Fingerprint(stored=sha256_of_json(fields), as_sent=sha256_of_json(as_sent))


def sha256_of_json(fields: dict[str, Any]) -> str:
    """The sha256 (hex) of ``fields`` as canonical JSON (keys sorted, no spaces, ASCII):
    what every ``Idempotency-Key``'s request fingerprint is."""
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode("ascii")).hexdigest()


ID_PREFIX_PATTERN = r"^[0-9a-f][0-9a-f-]{0,35}$"
LABEL_FILTER_PATTERN = r"^[^=\x00-\x1f]{1,317}=[^\x00-\x1f]{0,200}$"
"""``GET /v1/jobs?label=KEY=VALUE``."""
"""A job id's beginning, as ``GET /v1/jobs?id_prefix=`` takes it (lower-case hex and ``-``)."""


class JobFilters(BaseModel):
    """What ``GET /v1/jobs`` lists besides the team and the status: every filter given must
    hold (none: every job)."""

    model_config = ConfigDict(frozen=True)

    id_prefix: str | None = None
    """Jobs whose id starts with this (the CLI's short ids)."""
    user: str | None = None
    project: str | None = None
    experiment: str | None = None
    label: str | None = None
    """``KEY=VALUE``: jobs whose spec has that label."""

    def query(self) -> dict[str, str]:
        """The filters given, as query parameters (for the next page's link)."""
        return {k: v for k, v in self.model_dump().items() if v is not None}


class JobSummary(BaseModel):
    """One line of ``GET /v1/jobs``."""

    id: str
    name: str
    team: str
    user: str
    status: JobStatus
    terminal: bool
    gpu_flavor: str
    gpus: int
    submitted_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    node: str | None
    attempt: AttemptIndex
    step: int | None
    cost: float
    currency: str | None
    project: str = "default"
    experiment: str | None = None
    reason: str | None = None
    """Why the job waits (PENDING, QUEUED) or failed (FAILED); else the reason of its latest
    change, if it had one (cancelled by whom, preempted by what)."""


class BundleStored(BaseModel):
    """The answer of ``PUT /v1/bundles/{sha256}``."""

    sha256: str
    size_bytes: int
    team: str
    created: bool
    """False: the team had uploaded this bundle before (nothing was written)."""


class LogChunk(BaseModel):
    stream: str
    """``a<attempt:04d>-<node_id>``: one attempt of the job on one node."""
    seq: int
    text: str
    """The chunk's bytes as UTF-8 (undecodable bytes replaced)."""


class LogPage(BaseModel):
    """The answer of ``GET /v1/jobs/{id}/logs``."""

    chunks: list[LogChunk]
    cursor: str
    """Pass as ``after`` to get what comes next (opaque; per-stream positions)."""
    streams_complete: bool
    """Every stream has ended and this page reached its end (or the job never started)."""
    job_terminal: bool

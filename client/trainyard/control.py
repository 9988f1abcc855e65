"""The contract between the runner (parent process) and a job (child process).

Runner -> job: environment variables, modelled by ``JobRuntimeEnv`` (``to_env`` /
``from_env``). A job holds no credential of the platform: its checkpoint folder is a local
staging folder in its own sandbox, and the runner uploads what the job commits there.

Job -> runner: newline-delimited JSON over the Unix socket named by
``TRAINYARD_CONTROL_SOCKET`` (in the job's sandbox; every process of the job, each
``torchrun`` worker included, may connect), one ``ControlMessage`` per line, at most
``MAX_CONTROL_LINE_BYTES`` long. The runner parses each line with ``parse_control_line``; a
bad line is the job's bug and raises ``ValueError`` (the runner logs it and carries on).
A ``CheckpointMessage`` names a complete checkpoint in the staging folder; the runner
verifies it against its manifest, uploads it to the job's own prefix and publishes it.

Exit status: 0 means the job finished; ``PREEMPTED_EXIT_CODE`` (75, ``EX_TEMPFAIL``)
means it stopped early on SIGTERM after its checkpoints were uploaded and should be
resumed; anything else is a failure.

``CheckpointRef`` and ``HyperValue`` are defined here, in the client distribution, because
both sides of this contract speak them; the platform's events (``shared.events.payloads``)
import them from here, so there is one definition.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator

HyperValue = float | int | str | bool
"""One hyperparameter's value, as a job spec carries it and a job receives it."""


class CheckpointRef(BaseModel):
    """A complete checkpoint: its object, and the manifest written after it."""

    model_config = ConfigDict(frozen=True, ser_json_inf_nan="constants")

    uri: str
    manifest_uri: str
    step: int
    size_bytes: int
    sha256: str


PREEMPTED_EXIT_CODE = 75
"""Exit status of a job that stopped on SIGTERM with its checkpoints safely uploaded."""

MAX_CONTROL_LINE_BYTES = 1024 * 1024
"""Longest control line accepted; a runner reading the pipe can cap its buffer at this."""

ENV_JOB_ID = "TRAINYARD_JOB_ID"
ENV_ALLOCATION_ID = "TRAINYARD_ALLOCATION_ID"
ENV_ATTEMPT = "TRAINYARD_ATTEMPT"
ENV_SEED = "TRAINYARD_SEED"
ENV_HYPERPARAMETERS = "TRAINYARD_HYPERPARAMETERS"
ENV_CHECKPOINT_URI = "TRAINYARD_CHECKPOINT_URI"
ENV_CONTROL_SOCKET = "TRAINYARD_CONTROL_SOCKET"
ENV_DATASET = "TRAINYARD_DATASET"
ENV_GPU_INDICES = "TRAINYARD_GPU_INDICES"


class JobRuntimeEnv(BaseModel):
    """What the runner tells a job about its run, as environment variables."""

    model_config = ConfigDict(frozen=True)

    job_id: str = Field(min_length=1)
    allocation_id: str = Field(min_length=1)
    attempt: int = Field(ge=0)
    seed: int
    hyperparameters: dict[str, HyperValue] = Field(default_factory=dict)
    checkpoint_uri: str = Field(min_length=1)
    """Folder the job commits checkpoints to: on the platform a local staging folder the
    runner uploads from (``file:///<sandbox>/checkpoints``), which also holds the verified
    checkpoint to resume from."""
    control_socket: str | None = Field(default=None, min_length=1)
    """Path of the runner's control socket; ``None``: no control channel."""
    dataset: str | None = None
    gpu_indices: list[int] | None = None
    """GPUs leased to the job; ``None``: not set (CPU job), ``[]``: explicitly none."""

    def to_env(self) -> dict[str, str]:
        """The variables to add to the job's environment (optional ones only when set)."""
        env = {
            ENV_JOB_ID: self.job_id,
            ENV_ALLOCATION_ID: self.allocation_id,
            ENV_ATTEMPT: str(self.attempt),
            ENV_SEED: str(self.seed),
            ENV_HYPERPARAMETERS: json.dumps(self.hyperparameters, sort_keys=True),
            ENV_CHECKPOINT_URI: self.checkpoint_uri,
        }
        if self.control_socket is not None:
            env[ENV_CONTROL_SOCKET] = self.control_socket
        if self.dataset is not None:
            env[ENV_DATASET] = self.dataset
        if self.gpu_indices is not None:
            env[ENV_GPU_INDICES] = ",".join(str(i) for i in self.gpu_indices)
        return env

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> JobRuntimeEnv | None:
        """Read the variables back; ``None`` when ``TRAINYARD_JOB_ID`` is absent (the job
        runs outside the platform). A present but broken set raises ``ValueError`` naming
        the variable, because a job must not silently run with half its configuration."""
        if ENV_JOB_ID not in environ:
            return None

        def required(name: str) -> str:
            if name not in environ:
                raise ValueError(f"{name} is missing although {ENV_JOB_ID} is set")
            return environ[name]

        def integer(name: str, value: str) -> int:
            try:
                return int(value)
            except ValueError:
                raise ValueError(f"{name} must be an integer, got {value!r}") from None

        hyper_text = environ.get(ENV_HYPERPARAMETERS, "{}")
        try:
            hyperparameters = json.loads(hyper_text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{ENV_HYPERPARAMETERS} is not valid JSON: {exc}") from None
        if not isinstance(hyperparameters, dict):
            raise ValueError(f"{ENV_HYPERPARAMETERS} must be a JSON object, got {hyper_text!r}")

        gpus = environ.get(ENV_GPU_INDICES)
        gpu_indices = None
        if gpus is not None:
            gpu_indices = [integer(ENV_GPU_INDICES, g.strip()) for g in gpus.split(",") if g]

        try:
            return cls(
                job_id=environ[ENV_JOB_ID],
                allocation_id=required(ENV_ALLOCATION_ID),
                attempt=integer(ENV_ATTEMPT, required(ENV_ATTEMPT)),
                seed=integer(ENV_SEED, required(ENV_SEED)),
                hyperparameters=hyperparameters,
                checkpoint_uri=required(ENV_CHECKPOINT_URI),
                control_socket=environ.get(ENV_CONTROL_SOCKET) or None,
                dataset=environ.get(ENV_DATASET) or None,
                gpu_indices=gpu_indices,
            )
        except ValidationError as exc:
            raise ValueError(f"invalid job runtime environment: {_describe(exc)}") from None


# --- the socket's address --------------------------------------------------------------

MAX_UNIX_PATH = 100
"""Socket paths at least this long do not fit ``sun_path`` (108 bytes on Linux)."""


def unix_address(path: str) -> str:
    """An address for ``path`` that fits a Unix socket address: ``path`` itself when short
    enough, else ``/proc/self/fd/<fd>/<name>`` through a descriptor of its folder (kept open
    for the life of the process), so deep work folders still work on Linux."""
    if len(os.fsencode(path)) < MAX_UNIX_PATH:
        return path
    folder, name = os.path.split(path)
    fd = os.open(folder, getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY)
    return f"/proc/self/fd/{fd}/{name}"


# --- control messages (job -> runner) -------------------------------------------------


class _Message(BaseModel):
    # Unknown fields are ignored so an SDK newer than the runner can add optional fields.
    # NaN/inf are written as JSON's common NaN/Infinity extension rather than null: a loss
    # going NaN is exactly the metric the runner must see, and json.loads reads them back.
    model_config = ConfigDict(frozen=True, extra="ignore", ser_json_inf_nan="constants")

    def encode(self) -> bytes:
        """One control line: compact JSON and a trailing newline."""
        return self.model_dump_json().encode() + b"\n"


MAX_STEP = 2**63 - 1
"""The largest step a control message may name: steps are stored as 64-bit integers."""


class MetricsMessage(_Message):
    """Training metrics at one step (the runner publishes them as ``JobProgress``)."""

    kind: Literal["metrics"] = "metrics"
    step: int = Field(ge=0, le=MAX_STEP)
    metrics: dict[str, float]


class CheckpointMessage(_Message):
    """A checkpoint is complete: its object and then its manifest are in the store."""

    kind: Literal["checkpoint"] = "checkpoint"
    checkpoint: CheckpointRef

    @field_validator("checkpoint")
    @classmethod
    def _step_fits(cls, checkpoint: CheckpointRef) -> CheckpointRef:
        if not 0 <= checkpoint.step <= MAX_STEP:
            raise ValueError(f"step must be 0 to {MAX_STEP}, not {checkpoint.step}")
        return checkpoint


ControlMessage = Annotated[MetricsMessage | CheckpointMessage, Field(discriminator="kind")]

_CONTROL_ADAPTER: TypeAdapter[MetricsMessage | CheckpointMessage] = TypeAdapter(ControlMessage)


def parse_control_line(line: bytes | str) -> MetricsMessage | CheckpointMessage:
    """Parse one control line (trailing newline optional); ``ValueError`` says what's wrong."""
    raw = line.encode() if isinstance(line, str) else bytes(line)
    if len(raw) > MAX_CONTROL_LINE_BYTES:
        raise ValueError(
            f"control line is {len(raw)} bytes, longer than the {MAX_CONTROL_LINE_BYTES} allowed"
        )
    raw = raw.strip()
    if not raw:
        raise ValueError("control line is empty")
    try:
        document = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"control line is not valid JSON: {exc}: {_preview(raw)}") from None
    except RecursionError:  # nested deeper than the decoder goes: no message is
        raise ValueError(f"control line is nested too deeply: {_preview(raw)}") from None
    if not isinstance(document, dict):
        raise ValueError(f"control line is not a JSON object: {_preview(raw)}")
    kind = document.get("kind")
    if kind not in ("metrics", "checkpoint"):
        raise ValueError(f"unknown control message kind {kind!r}: {_preview(raw)}")
    try:
        return _CONTROL_ADAPTER.validate_python(document)
    except ValidationError as exc:
        # The first location element is the union tag ("metrics"), already in the message.
        raise ValueError(f"invalid {kind} control message: {_describe(exc, skip=1)}") from None


def _describe(exc: ValidationError, skip: int = 0) -> str:
    """``field.path: problem; ...`` instead of pydantic's multi-line report."""
    return "; ".join(
        f"{'.'.join(str(part) for part in error['loc'][skip:]) or '<root>'}: {error['msg']}"
        for error in exc.errors()
    )


def _preview(raw: bytes, limit: int = 200) -> str:
    text = raw.decode("utf-8", errors="replace")
    return text if len(text) <= limit else text[:limit] + "..."

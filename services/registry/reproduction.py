"""The reproducibility record of a job, and the verdict on a reproduction of it.

A job's **record** (``build_record``) is assembled from what the registry itself recorded,
never from what anyone typed: the ``job.started`` of its final run (the resolved spec, the
code version, the environment the runner captured) and the dataset versions the job was
given (the access audit, ``job_inputs``), each with its content hash and feature-processing
version, and the model version it fine-tuned from (its recorded parent, with the sha256 of
its weights: the spec names it by name and number, which a model made again under a deleted
model's name gives again). Its **outcome** is how it ended: the status, the final metrics its
``job.succeeded`` reported and its final committed checkpoint (its sha256).

``compare`` decides a reproduction (a job whose spec names the original in ``reproduces``)
against its original, from both records and outcomes:

- Record fields are compared one by one and every one that differs is named
  (``RECORD_FIELDS`` below: code, data, seed, hyper-parameters, the spec fields that change
  what runs, the environment and the GPU models and count). Where the job ran (host, node,
  topology, OS build) is recorded but not compared: a reproduction elsewhere is still one.
- The status must be the same (``status``).
- Every final metric of either is compared (``metrics.<key>``): missing on one side, or a
  relative difference ``|a - b| / max(|a|, |b|)`` above ``RELATIVE_TOLERANCE``, differs.
  NaN equals NaN; infinities equal only themselves. The platform's own measures of speed
  (``PERFORMANCE_METRICS``: throughput, data wait, GPU utilisation) are shown, not compared.
- Weights (``weights``) are compared when both have a committed final checkpoint, by the
  sha256 of its content. A run is deterministic here when both ran on CPU (no CUDA in
  either environment): then different weights are a difference. On GPUs (whose kernels
  need not be deterministic) different weights alone are tolerated when the metrics are
  within tolerance, and the verdict says the weights were not equal.

Verdict: ``different`` when anything above differs (all of it named); else ``identical``
when every metric is exactly equal and the weights are equal (or neither has a
checkpoint); else ``within_tolerance``.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from trainyard_platform.shared.events.payloads import Environment, JobSpec

RELATIVE_TOLERANCE = 1e-3
"""The largest relative difference of a final metric that still counts as reproduced."""

PERFORMANCE_METRICS = frozenset(
    {
        "samples_per_s",
        "data_wait_fraction",
        "data_wait_fraction_mean",
        "gpu_utilization_mean",
        "input_bound",
        "gpu_seconds_waiting_for_data",
    }
)
"""Metrics the platform measures of how fast a job ran (the SDK's throughput window, the
runner's GPU and input-bound figures), not of what it learned: timing, never the same twice,
so they are shown but not compared."""

Verdict = Literal["identical", "within_tolerance", "different"]
Status = Literal["succeeded", "failed", "cancelled"]

_SPEC_FIELDS = (
    "entrypoint",
    "args",
    "command",
    "code",
    "requirements",
    "image",
    "parent_model",
    "gpus",
    "gpu_flavor",
)
"""Spec fields that change what runs (compared as ``spec.<field>``); the name, user, labels,
project, priority and limits do not."""
_ENVIRONMENT_FIELDS = (
    "python",
    "torch",
    "cuda",
    "cudnn",
    "nccl",
    "driver",
    "image",
    "packages_sha256",
)
RECORD_FIELDS = (
    "code.version",
    "code.diff_sha256",
    "data.datasets",
    "data.feature_versions",
    "data.dataset",
    "data.parent_model",
    "seed",
    "hyperparameters.<key>",
    *(f"spec.{name}" for name in _SPEC_FIELDS),
    *(f"environment.{name}" for name in _ENVIRONMENT_FIELDS),
    "hardware.gpu_models",
    "hardware.gpu_count",
)
"""Every field of the record ``compare`` checks (``<key>``: one per hyper-parameter)."""


@dataclass(frozen=True)
class DatasetInput:
    """One dataset version a job was given, as the registry recorded it."""

    reference: str
    """``team/name:version``."""
    uri: str
    sha256: str
    size_bytes: int
    feature_version: str


@dataclass(frozen=True)
class ParentInput:
    """The model version a job fine-tuned from, as the registry recorded it (its parent,
    ``job_inputs``): a deleted model's name may name a model made again since, whose
    version of the same number is other weights."""

    reference: str
    """``team/name:version``."""
    sha256: str


@dataclass(frozen=True)
class Outcome:
    """How a job ended."""

    status: Status
    metrics: Mapping[str, float] = field(default_factory=dict)
    checkpoint_uri: str | None = None
    checkpoint_sha256: str | None = None


@dataclass(frozen=True)
class Record:
    """What a job ran with (see the module docstring)."""

    job_id: str
    spec: JobSpec
    code_version: str
    environment: Environment
    datasets: Sequence[DatasetInput] = ()
    parent: ParentInput | None = None

    def as_json(self) -> dict[str, Any]:
        env = self.environment
        spec = self.spec
        return {
            "job_id": self.job_id,
            "team": spec.team,
            "reproduces": spec.reproduces,
            "code": {
                "version": self.code_version,
                "source": None if spec.code is None else spec.code.model_dump(mode="json"),
                "bundle_sha256": env.code_sha256,
                "diff_sha256": env.code_diff_sha256,
            },
            "data": {
                "datasets": [
                    {
                        "reference": d.reference,
                        "uri": d.uri,
                        "sha256": d.sha256,
                        "size_bytes": d.size_bytes,
                        "feature_version": d.feature_version,
                    }
                    for d in self.datasets
                ],
                "dataset": spec.dataset,
                "parent_model": None
                if self.parent is None
                else {"reference": self.parent.reference, "sha256": self.parent.sha256},
            },
            "spec": spec.model_dump(mode="json"),
            "hyperparameters": dict(spec.hyperparameters),
            "seed": spec.seed,
            "environment": {
                "image": env.image or spec.image,
                "image_digest": image_digest(env.image or spec.image),
                "packages": list(env.packages),
                "packages_sha256": packages_sha256(env),
                "environment_key": env.environment_key,
                "python": env.python,
                "torch": env.torch,
                "cuda": env.cuda,
                "cudnn": env.cudnn,
                "nccl": env.nccl,
                "driver": env.driver,
                "platform": env.platform,
            },
            "hardware": {
                "gpu_flavor": env.gpu_flavor,
                "gpu_models": list(env.gpu_names),
                "gpu_count": env.gpu_count if env.gpu_count is not None else len(env.gpu_names),
                "node_id": env.node_id,
                "hostname": env.hostname,
                "topology": env.topology,
            },
        }


@dataclass(frozen=True)
class Difference:
    """One thing that differs: the field's name and both values (JSON)."""

    field: str
    original: Any
    reproduction: Any

    def as_json(self) -> dict[str, Any]:
        return {"field": self.field, "original": self.original, "reproduction": self.reproduction}


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    differences: list[Difference]
    metrics: dict[str, dict[str, Any]]
    """Per metric key: both values and their relative difference (None: one is missing)."""
    weights: dict[str, Any]
    """Both checkpoints' sha256, whether they were compared, whether equal, and whether the
    runs count as deterministic."""
    relative_tolerance: float


def image_digest(image: str | None) -> str | None:
    """The digest an image reference pins (``name@sha256:<hex>``), or None: a tag alone
    names no fixed content, and the registry never resolves one."""
    if image is None:
        return None
    _, at, digest = image.rpartition("@")
    return digest if at and re.fullmatch(r"sha256:[0-9a-f]{64}", digest) else None


def packages_sha256(env: Environment) -> str | None:
    """The recorded digest of the package list, or one computed from the list as the
    runner computes it (for runs recorded before the digest was); None without a list."""
    if env.packages_sha256 is not None:
        return env.packages_sha256
    if not env.packages:
        return None
    return hashlib.sha256("\n".join(sorted(env.packages)).encode()).hexdigest()


def relative_difference(a: float, b: float) -> float:
    """``|a - b| / max(|a|, |b|)``; 0 for equal values (NaN and NaN included), inf for a
    finite value against a non-finite one, or NaN against a number."""
    if a == b or (math.isnan(a) and math.isnan(b)):
        return 0.0
    if not (math.isfinite(a) and math.isfinite(b)):
        return math.inf
    return abs(a - b) / max(abs(a), abs(b))


def _record_differences(original: Record, reproduction: Record) -> list[Difference]:
    found: list[Difference] = []

    def check(name: str, a: Any, b: Any) -> None:
        if a != b:
            found.append(Difference(name, a, b))

    one, two = original.as_json(), reproduction.as_json()
    check("code.version", one["code"]["version"], two["code"]["version"])
    check("code.diff_sha256", one["code"]["diff_sha256"], two["code"]["diff_sha256"])
    check(
        "data.datasets",
        [f"{d['reference']} sha256:{d['sha256']}" for d in one["data"]["datasets"]],
        [f"{d['reference']} sha256:{d['sha256']}" for d in two["data"]["datasets"]],
    )
    check(
        "data.feature_versions",
        [d["feature_version"] for d in one["data"]["datasets"]],
        [d["feature_version"] for d in two["data"]["datasets"]],
    )
    check("data.dataset", one["data"]["dataset"], two["data"]["dataset"])
    check(
        "data.parent_model",
        _parent_text(one["data"]["parent_model"]),
        _parent_text(two["data"]["parent_model"]),
    )
    check("seed", one["seed"], two["seed"])
    hyper_one, hyper_two = one["hyperparameters"], two["hyperparameters"]
    for key in sorted(set(hyper_one) | set(hyper_two)):
        check(f"hyperparameters.{key}", hyper_one.get(key), hyper_two.get(key))
    for name in _SPEC_FIELDS:
        check(f"spec.{name}", one["spec"].get(name), two["spec"].get(name))
    for name in _ENVIRONMENT_FIELDS:
        check(f"environment.{name}", one["environment"][name], two["environment"][name])
    check("hardware.gpu_models", one["hardware"]["gpu_models"], two["hardware"]["gpu_models"])
    check("hardware.gpu_count", one["hardware"]["gpu_count"], two["hardware"]["gpu_count"])
    return found


def _parent_text(parent: dict[str, str] | None) -> str | None:
    return None if parent is None else f"{parent['reference']} sha256:{parent['sha256']}"


def _json_float(value: float | None) -> float | str | None:
    """A float as JSON can hold it (non-finite values as the strings events use)."""
    if value is None or math.isfinite(value):
        return value
    return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")


def compare(
    original: Record | None,
    original_outcome: Outcome | None,
    reproduction: Record,
    reproduction_outcome: Outcome,
    tolerance: float = RELATIVE_TOLERANCE,
) -> Decision:
    """The verdict on ``reproduction`` (see the module docstring). A missing original record
    or outcome (it never started, or ended before outcomes were recorded) is a difference
    named ``record`` or ``outcome`` (then metrics and weights are not compared)."""
    differences: list[Difference] = []
    if original is None:
        differences.append(Difference("record", None, "recorded"))
    else:
        differences.extend(_record_differences(original, reproduction))
    if original_outcome is None:  # nothing to compare the metrics and weights with
        differences.append(Difference("outcome", None, reproduction_outcome.status))
        weights = {
            "original_sha256": None,
            "reproduction_sha256": reproduction_outcome.checkpoint_sha256,
            "compared": False,
            "equal": None,
            "deterministic": False,
        }
        return Decision("different", differences, {}, weights, tolerance)
    if original_outcome.status != reproduction_outcome.status:
        differences.append(
            Difference("status", original_outcome.status, reproduction_outcome.status)
        )

    metrics: dict[str, dict[str, Any]] = {}
    exact = True
    a_metrics, b_metrics = original_outcome.metrics, reproduction_outcome.metrics
    for key in sorted(set(a_metrics) | set(b_metrics)):
        a, b = a_metrics.get(key), b_metrics.get(key)
        rel = None if a is None or b is None else relative_difference(a, b)
        metrics[key] = {
            "original": _json_float(a),
            "reproduction": _json_float(b),
            "relative_difference": _json_float(rel),
        }
        if key in PERFORMANCE_METRICS:
            metrics[key]["compared"] = False
            continue
        if rel is None or rel > tolerance:
            differences.append(Difference(f"metrics.{key}", _json_float(a), _json_float(b)))
        elif rel != 0.0:
            exact = False

    deterministic = (
        original is not None
        and original.environment.cuda is None
        and reproduction.environment.cuda is None
    )
    a_sha, b_sha = original_outcome.checkpoint_sha256, reproduction_outcome.checkpoint_sha256
    compared = a_sha is not None and b_sha is not None
    equal = (a_sha == b_sha) if compared else None
    if (a_sha is None) != (b_sha is None):
        differences.append(Difference("weights", a_sha, b_sha))  # one has none
    elif compared and not equal:
        if deterministic:
            differences.append(Difference("weights", a_sha, b_sha))
        else:
            exact = False
    weights = {
        "original_sha256": a_sha,
        "reproduction_sha256": b_sha,
        "compared": compared,
        "equal": equal,
        "deterministic": deterministic,
    }
    verdict: Verdict = "different" if differences else "identical" if exact else "within_tolerance"
    return Decision(verdict, differences, metrics, weights, tolerance)

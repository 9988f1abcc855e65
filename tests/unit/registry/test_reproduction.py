"""The verdict on a reproduction: what counts as identical, within tolerance or different,
and that every difference is named."""

from __future__ import annotations

import hashlib
import math

import pytest

from trainyard_platform.services.registry.reproduction import (
    RELATIVE_TOLERANCE,
    DatasetInput,
    Outcome,
    ParentInput,
    Record,
    compare,
    image_digest,
    packages_sha256,
    relative_difference,
)
from trainyard_platform.shared.events.payloads import CodeBundle, Environment, JobSpec

SHA_A = "a" * 64
SHA_B = "b" * 64


def spec(**changes: object) -> JobSpec:
    base: dict[str, object] = {
        "name": "digits",
        "team": "vision",
        "user": "alice",
        "entrypoint": "train.py",
        "gpus": 1,
        "gpu_flavor": "cpu",
        "hyperparameters": {"lr": 0.003, "epochs": 2},
        "seed": 42,
        "max_runtime_seconds": 600,
        "code": CodeBundle(sha256=SHA_A, size_bytes=10),
    }
    return JobSpec.model_validate({**base, **changes})


def environment(**changes: object) -> Environment:
    base: dict[str, object] = {
        "python": "CPython 3.12.3",
        "torch": "2.4.0",
        "platform": "Linux",
        "hostname": "host-1",
        "node_id": "node-1",
        "gpu_flavor": "cpu",
        "gpu_names": ["virtual-cpu-0"],
        "packages": ["numpy==2.0.0", "torch==2.4.0"],
        "gpu_count": 1,
    }
    return Environment.model_validate({**base, **changes})


def dataset(version: int = 1, sha: str = SHA_A, feature: str = "fv1") -> DatasetInput:
    return DatasetInput(f"vision/digits:{version}", "s3://b/d.npz", sha, 100, feature)


def record(job_id: str = "orig", **changes: object) -> Record:
    datasets = changes.pop("datasets", [dataset()])
    env = changes.pop("environment", environment())
    the_spec = changes.pop("spec", spec())
    return Record(
        job_id=job_id,
        spec=the_spec,  # type: ignore[arg-type]
        code_version=str(changes.pop("code_version", "bundle:sha256:" + SHA_A)),
        environment=env,  # type: ignore[arg-type]
        datasets=datasets,  # type: ignore[arg-type]
        **changes,  # type: ignore[arg-type]
    )


def outcome(metrics: dict[str, float] | None = None, sha: str | None = SHA_B) -> Outcome:
    return Outcome(
        status="succeeded",
        metrics={"loss": 0.25, "val_accuracy": 0.95} if metrics is None else metrics,
        checkpoint_uri=None if sha is None else "s3://b/ckpt.pt",
        checkpoint_sha256=sha,
    )


def fields(decision: object) -> list[str]:
    return [d.field for d in decision.differences]  # type: ignore[attr-defined]


def test_the_same_record_metrics_and_weights_are_identical() -> None:
    decision = compare(record(), outcome(), record("repro"), outcome())
    assert decision.verdict == "identical" and decision.differences == []
    assert decision.weights["compared"] and decision.weights["equal"]
    assert decision.weights["deterministic"]  # CPU on both sides


def test_another_host_is_recorded_but_not_a_difference() -> None:
    elsewhere = record("repro", environment=environment(hostname="host-2", node_id="node-9"))
    assert compare(record(), outcome(), elsewhere, outcome()).verdict == "identical"


def test_a_changed_dataset_version_is_different_and_named() -> None:
    changed = record("repro", datasets=[dataset(version=2, sha=SHA_B)])
    decision = compare(record(), outcome(), changed, outcome())
    assert decision.verdict == "different"
    assert fields(decision) == ["data.datasets"]
    (difference,) = decision.differences
    assert difference.original == [f"vision/digits:1 sha256:{SHA_A}"]
    assert difference.reproduction == [f"vision/digits:2 sha256:{SHA_B}"]


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"spec": spec(seed=7)}, "seed"),
        ({"spec": spec(hyperparameters={"lr": 0.01, "epochs": 2})}, "hyperparameters.lr"),
        ({"spec": spec(hyperparameters={"lr": 0.003})}, "hyperparameters.epochs"),
        ({"spec": spec(requirements=["numpy==2.1"])}, "spec.requirements"),
        ({"spec": spec(dataset="other")}, "data.dataset"),
        ({"code_version": "git:" + "1" * 40}, "code.version"),
        ({"environment": environment(code_diff_sha256=SHA_B)}, "code.diff_sha256"),
        ({"environment": environment(torch="2.5.0")}, "environment.torch"),
        ({"environment": environment(packages=["numpy==2.1.0"])}, "environment.packages_sha256"),
        ({"environment": environment(gpu_names=["NVIDIA H200"])}, "hardware.gpu_models"),
        ({"environment": environment(gpu_count=2)}, "hardware.gpu_count"),
        ({"datasets": [dataset(feature="fv2")]}, "data.feature_versions"),
    ],
)
def test_each_record_field_that_differs_is_named(changes: dict[str, object], field: str) -> None:
    decision = compare(record(), outcome(), record("repro", **changes), outcome())
    assert decision.verdict == "different"
    assert fields(decision) == [field]


def test_metrics_within_the_tolerance_are_within_tolerance() -> None:
    close = outcome({"loss": 0.25 * (1 + RELATIVE_TOLERANCE / 2), "val_accuracy": 0.95})
    decision = compare(record(), outcome(), record("repro"), close)
    assert decision.verdict == "within_tolerance" and decision.differences == []
    assert 0 < decision.metrics["loss"]["relative_difference"] <= RELATIVE_TOLERANCE


def test_metrics_beyond_the_tolerance_or_missing_are_different() -> None:
    far = outcome({"loss": 0.25 * (1 + 2 * RELATIVE_TOLERANCE)})
    decision = compare(record(), outcome(), record("repro"), far)
    assert decision.verdict == "different"
    assert fields(decision) == ["metrics.loss", "metrics.val_accuracy"]
    assert decision.metrics["val_accuracy"]["reproduction"] is None


def test_different_weights_on_cpu_are_different() -> None:
    decision = compare(record(), outcome(), record("repro"), outcome(sha=SHA_A))
    assert decision.verdict == "different" and fields(decision) == ["weights"]


def test_different_weights_on_gpus_with_close_metrics_are_within_tolerance() -> None:
    gpu = environment(cuda="12.4", gpu_names=["NVIDIA H200"], gpu_flavor="h200")
    original, repro = record(environment=gpu), record("repro", environment=gpu)
    decision = compare(original, outcome(), repro, outcome(sha=SHA_A))
    assert decision.verdict == "within_tolerance"
    assert decision.weights == {
        "original_sha256": SHA_B,
        "reproduction_sha256": SHA_A,
        "compared": True,
        "equal": False,
        "deterministic": False,
    }


def test_a_checkpoint_on_one_side_only_is_different() -> None:
    decision = compare(record(), outcome(), record("repro"), outcome(sha=None))
    assert fields(decision) == ["weights"]
    neither = compare(record(), outcome(sha=None), record("repro"), outcome(sha=None))
    assert neither.verdict == "identical" and not neither.weights["compared"]


def test_another_status_is_different() -> None:
    failed = Outcome(status="failed")
    decision = compare(record(), outcome(sha=None), record("repro"), failed)
    assert fields(decision)[0] == "status"
    assert decision.verdict == "different"


def test_a_missing_original_is_named() -> None:
    decision = compare(None, None, record("repro"), outcome())
    assert fields(decision) == ["record", "outcome"]
    assert decision.verdict == "different"


def test_relative_difference() -> None:
    assert relative_difference(1.0, 1.0) == 0.0
    assert relative_difference(0.0, 0.0) == 0.0
    assert relative_difference(math.nan, math.nan) == 0.0
    assert relative_difference(math.inf, math.inf) == 0.0
    assert relative_difference(1.0, math.nan) == math.inf
    assert relative_difference(math.inf, -math.inf) == math.inf
    assert relative_difference(2.0, 1.0) == pytest.approx(0.5)
    assert relative_difference(-1.0, 1.0) == pytest.approx(2.0)


def test_non_finite_metrics_travel_as_strings() -> None:
    decision = compare(
        record(), outcome({"loss": math.nan}), record("repro"), outcome({"loss": math.inf})
    )
    assert decision.differences[0].original == "NaN"
    assert decision.differences[0].reproduction == "Infinity"


def test_the_package_digest_is_computed_for_older_records() -> None:
    env = environment()
    expected = hashlib.sha256(b"numpy==2.0.0\ntorch==2.4.0").hexdigest()
    assert packages_sha256(env) == expected
    assert packages_sha256(environment(packages_sha256=SHA_A)) == SHA_A
    assert packages_sha256(environment(packages=[])) is None


def test_the_platforms_speed_measures_are_shown_not_compared() -> None:
    fast = outcome({"loss": 0.25, "val_accuracy": 0.95, "samples_per_s": 5000.0})
    slow = outcome(
        {"loss": 0.25, "val_accuracy": 0.95, "samples_per_s": 2500.0, "data_wait_fraction": 0.1}
    )
    decision = compare(record(), fast, record("repro"), slow)
    assert decision.verdict == "identical"
    assert decision.metrics["samples_per_s"]["compared"] is False
    assert decision.metrics["data_wait_fraction"]["original"] is None


def test_the_image_digest_is_the_one_the_reference_pins() -> None:
    assert image_digest(f"registry.example/train@sha256:{SHA_A}") == f"sha256:{SHA_A}"
    assert image_digest("registry.example:5000/train:2.4") is None
    assert image_digest(None) is None
    pinned = record(spec=spec(image=f"train@sha256:{SHA_A}"))
    assert pinned.as_json()["environment"]["image_digest"] == f"sha256:{SHA_A}"


def test_a_parent_of_the_same_name_and_number_with_other_weights_is_different() -> None:
    """The spec names its parent ``team/name:version``; once the model is deleted, a model
    made again under its name gives that version number again, to other weights. The record
    holds the parent the registry recorded, with its sha256: a reproduction fine-tuned from
    the new model is different (``data.parent_model``), though ``spec.parent_model`` is the
    same text. Before, it was identical."""
    tuned = spec(parent_model="vision/base:1")
    original = record(spec=tuned, parent=ParentInput("vision/base:1", SHA_A))
    again = record("repro", spec=tuned, parent=ParentInput("vision/base:1", SHA_B))
    decision = compare(original, outcome(), again, outcome())
    assert decision.verdict == "different"
    assert fields(decision) == ["data.parent_model"]
    (difference,) = decision.differences
    assert difference.original == f"vision/base:1 sha256:{SHA_A}"
    assert difference.reproduction == f"vision/base:1 sha256:{SHA_B}"
    assert original.as_json()["data"]["parent_model"] == {
        "reference": "vision/base:1",
        "sha256": SHA_A,
    }
    same = record("repro", spec=tuned, parent=ParentInput("vision/base:1", SHA_A))
    assert compare(original, outcome(), same, outcome()).verdict == "identical"

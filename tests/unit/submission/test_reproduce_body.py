"""The body a reproduction is submitted with: the original's resolved spec, as the API
takes it, with only the deliberate changes."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from trainyard_platform.services.submission.reproduce import ReproduceRequest, reproduction_body
from trainyard_platform.services.submission.schemas import parse_job_request
from trainyard_platform.shared.events.payloads import CodeBundle, JobSpec

ORIGINAL = JobSpec(
    name="digits",
    team="vision",
    user="alice",
    entrypoint="digits_cnn.py",
    gpus=1,
    gpu_flavor="cpu",
    hyperparameters={"lr": 0.003, "epochs": 1},
    seed=42,
    max_runtime_seconds=600,
    datasets=["vision/digits:1"],
    code=CodeBundle(sha256="a" * 64, size_bytes=10),
    register_model=True,
    reproduces="an-earlier-job",
)


def test_the_same_job_is_submitted_without_registering_a_model() -> None:
    body = reproduction_body(ORIGINAL, ReproduceRequest())
    request = parse_job_request(body, ["cpu"])
    spec = request.to_spec(user="bob", team="vision")
    assert spec.model_dump(exclude={"user", "register_model", "reproduces"}) == (
        ORIGINAL.model_dump(exclude={"user", "register_model", "reproduces"})
    )
    assert spec.register_model is False and spec.reproduces is None
    assert "user" not in json.loads(body) and "team" not in json.loads(body)


def test_deliberate_changes_are_applied() -> None:
    changes = ReproduceRequest(
        datasets=["vision/digits:2"], seed=7, hyperparameters={"lr": 0.01, "extra": "x"}
    )
    spec = parse_job_request(reproduction_body(ORIGINAL, changes), ["cpu"]).to_spec(
        user="bob", team="vision"
    )
    assert spec.datasets == ["vision/digits:2"] and spec.seed == 7
    assert spec.hyperparameters == {"lr": 0.01, "epochs": 1, "extra": "x"}


def test_unknown_or_out_of_range_changes_are_refused() -> None:
    with pytest.raises(ValidationError, match="name"):
        ReproduceRequest.model_validate({"name": "other"})
    with pytest.raises(ValidationError, match="seed"):
        ReproduceRequest.model_validate({"seed": -1})


def test_a_fine_tuned_job_is_reproduced_from_the_very_parent_version_it_had() -> None:
    """The original's spec carries the id of the parent version its admission resolved
    (``parent_model_version_id``): the reproduction's body names the parent as
    ``team/name:version`` pinned to that id, so its own admission refuses it (naming the
    field) rather than fine-tune from a model made again under the parent's name."""
    tuned = ORIGINAL.model_copy(
        update={
            "parent_model": "vision/base:1",
            "parent_model_version_id": "0b6f3f4e-8a59-4c39-9a43-4f6b2b1f4a11",
        }
    )
    body = json.loads(reproduction_body(tuned, ReproduceRequest()))
    assert body["parent_model"] == "vision/base:1"
    assert body["parent_model_version_id"] == "0b6f3f4e-8a59-4c39-9a43-4f6b2b1f4a11"
    spec = parse_job_request(json.dumps(body).encode(), ["cpu"]).to_spec(user="bob", team="vision")
    assert (spec.parent_model, spec.parent_model_version_id) == (
        "vision/base:1",
        "0b6f3f4e-8a59-4c39-9a43-4f6b2b1f4a11",
    )

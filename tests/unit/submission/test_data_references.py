"""The dataset and parent-model references of a job spec: only ``team/name[:version]`` (and
``@alias`` for a model) pass; anything that could name a path is refused, naming the item."""

from __future__ import annotations

import json
from typing import Any

import pytest

from trainyard_platform.services.submission.schemas import parse_job_request
from trainyard_platform.shared.http_errors import RequestInvalid

GOOD: dict[str, Any] = {"name": "n", "entrypoint": "train", "gpus": 1, "gpu_flavor": "cpu"}
HOSTILE = [
    "../etc/passwd",
    "vision/..",
    "vision/../other",
    "vision%2Fdata",
    "vision/da%2Fta",
    "vision/da\x00ta",
    "/vision/data",
    "vision/data/",
    "vision\\data",
    "vision/.hidden",
    "vision/data:0",
    "vision/data:-1",
    "vision/" + "d" * 101,
    "v" * 101 + "/data",
    "vision",
    "",
]


def _errors(**fields: Any) -> dict[str, str]:
    with pytest.raises(RequestInvalid) as caught:
        parse_job_request(json.dumps({**GOOD, **fields}).encode(), ["cpu"])
    return {e.field: e.message for e in caught.value.errors}


@pytest.mark.parametrize("reference", HOSTILE)
def test_a_dataset_reference_that_is_not_team_name_version_is_refused(reference: str) -> None:
    assert list(_errors(datasets=["vision/ok", reference])) == ["datasets[1]"]


@pytest.mark.parametrize("reference", [*HOSTILE, "vision/model", "vision/model@Prod"])
def test_a_parent_model_that_is_not_a_version_or_an_alias_is_refused(reference: str) -> None:
    assert list(_errors(parent_model=reference)) == ["parent_model"]


def test_good_references_reach_the_wire_spec() -> None:
    body = {
        **GOOD,
        "datasets": ["vision/digits", "ml/feat.v2:12"],
        "parent_model": "vision/cnn@production",
        "register_model": True,
    }
    spec = parse_job_request(json.dumps(body).encode(), ["cpu"]).to_spec("alice", "vision")
    assert spec.datasets == ["vision/digits", "ml/feat.v2:12"]
    assert spec.parent_model == "vision/cnn@production" and spec.register_model is True
    plain = parse_job_request(json.dumps(GOOD).encode(), ["cpu"]).to_spec("alice", "vision")
    assert (plain.datasets, plain.parent_model, plain.register_model) == ([], None, False)


def test_a_version_past_the_largest_is_refused_saying_the_largest() -> None:
    # A reference's version is at most nine digits; "a version from 1" left a user of
    # vision/data:1234567890 (a number the registry could hold) to guess what was wrong.
    assert (
        "a version from 1 to 999999999"
        in _errors(datasets=["vision/data:1234567890"])["datasets[0]"]
    )
    assert (
        "a version from 1 to 999999999"
        in _errors(parent_model="vision/cnn:1234567890")["parent_model"]
    )
    parse_job_request(json.dumps({**GOOD, "datasets": ["v/d:999999999"]}).encode(), ["cpu"])

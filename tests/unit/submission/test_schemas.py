"""The HTTP job schema: every bad field is named, defaults are filled in."""

from __future__ import annotations

import json
from typing import Any

import pytest

from services.submission.config import DEFAULT_FLAVORS
from services.submission.schemas import (
    CreateUserRequest,
    JobRequest,
    parse_idempotency_key,
    parse_job_request,
)
from shared.http_errors import RequestInvalid, field_path, parse_body

GOOD: dict[str, Any] = {
    "name": "digits-cnn",
    "entrypoint": "examples.digits_cnn",
    "gpus": 2,
    "gpu_flavor": "h200",
}


def _errors(body: dict[str, Any] | bytes) -> dict[str, str]:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    with pytest.raises(RequestInvalid) as caught:
        parse_job_request(raw, DEFAULT_FLAVORS)
    return {e.field: e.message for e in caught.value.errors}


def test_minimal_spec_gets_the_documented_defaults() -> None:
    job = parse_job_request(json.dumps(GOOD).encode(), DEFAULT_FLAVORS)
    assert job.args == []
    assert job.hyperparameters == {}
    assert (job.seed, job.max_runtime_seconds, job.max_restarts) == (0, 3600, 3)
    assert job.dataset is None and job.team is None


def test_to_spec_stamps_the_caller_and_keeps_value_types() -> None:
    body = {**GOOD, "hyperparameters": {"lr": 0.1, "layers": 3, "opt": "sgd", "nesterov": True}}
    spec = parse_job_request(json.dumps(body).encode(), DEFAULT_FLAVORS).to_spec("alice", "ml")
    assert (spec.user, spec.team, spec.gpus, spec.gpu_flavor) == ("alice", "ml", 2, "h200")
    assert spec.hyperparameters == {"lr": 0.1, "layers": 3, "opt": "sgd", "nesterov": True}
    assert type(spec.hyperparameters["nesterov"]) is bool
    assert type(spec.hyperparameters["layers"]) is int


@pytest.mark.parametrize("missing", ["name", "entrypoint", "gpus", "gpu_flavor"])
def test_missing_field_is_named(missing: str) -> None:
    body = {k: v for k, v in GOOD.items() if k != missing}
    assert _errors(body) == {missing: "field required"}


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("gpus", "2"),  # no silent coercion from strings
        ("gpus", 2.5),
        ("gpus", True),
        ("seed", "7"),
        ("name", 5),
        ("args", "--epochs 2"),
        ("hyperparameters", [1, 2]),
        ("max_restarts", None),
    ],
)
def test_wrong_type_is_named(field: str, value: object) -> None:
    assert list(_errors({**GOOD, field: value})) == [field]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("gpus", -1),
        ("gpus", 0),
        ("gpus", 65),
        ("seed", -1),
        ("max_runtime_seconds", 0),
        ("max_runtime_seconds", 604_801),
        ("max_restarts", 21),
        ("name", "has space"),
        ("name", "x" * 101),
        ("entrypoint", "examples/digits.py"),
        ("entrypoint", "1examples.digits"),
        ("entrypoint", "examples..digits"),
        ("dataset", ""),
    ],
)
def test_out_of_range_or_malformed_value_is_named(field: str, value: object) -> None:
    assert list(_errors({**GOOD, field: value})) == [field]


def test_negative_gpus_message_says_why() -> None:
    assert "greater than or equal to 1" in _errors({**GOOD, "gpus": -4})["gpus"]


def test_unknown_flavor_lists_the_allowed_ones() -> None:
    message = _errors({**GOOD, "gpu_flavor": "tpu-v5"})["gpu_flavor"]
    assert "tpu-v5" in message
    assert all(flavor in message for flavor in DEFAULT_FLAVORS)


def test_configured_flavors_are_the_allowed_ones() -> None:
    body = json.dumps({**GOOD, "gpu_flavor": "mi300"}).encode()
    assert parse_job_request(body, ["mi300"]).gpu_flavor == "mi300"
    with pytest.raises(RequestInvalid):
        parse_job_request(json.dumps(GOOD).encode(), ["mi300"])


def test_unknown_field_is_named() -> None:
    assert _errors({**GOOD, "colour": "blue"}) == {"colour": "unknown field"}


def test_priority_is_a_class_name_defaulting_to_normal() -> None:
    assert parse_job_request(json.dumps(GOOD).encode(), DEFAULT_FLAVORS).priority == "normal"
    job = parse_job_request(json.dumps({**GOOD, "priority": "high"}).encode(), DEFAULT_FLAVORS)
    assert job.to_spec("alice", "ml").priority == "high"
    for bad in ("High", "9lives", "", "x" * 41, "a_b"):
        assert set(_errors({**GOOD, "priority": bad})) == {"priority"}


def test_nested_errors_carry_their_path() -> None:
    errors = _errors({**GOOD, "args": ["ok", 3], "hyperparameters": {"lr": {"x": 1}}})
    assert set(errors) == {"args[1]", "hyperparameters.lr"}
    assert errors["hyperparameters.lr"] == "must be a number, a string or a boolean"


def test_every_error_is_reported_at_once() -> None:
    errors = _errors({"gpus": -1, "gpu_flavor": "tpu", "extra": 1})
    assert set(errors) == {"name", "entrypoint", "gpus", "gpu_flavor", "extra"}


def test_non_finite_hyperparameter_is_refused() -> None:
    raw = b'{"name": "n", "entrypoint": "m", "gpus": 1, "gpu_flavor": "cpu", "hyperparameters": {"lr": NaN}}'
    assert list(_errors(raw)) == ["hyperparameters.lr"]


@pytest.mark.parametrize("raw", [b"", b"not json", b"[1]", b'"spec"', b"null"])
def test_body_that_is_not_an_object_is_reported_as_body(raw: bytes) -> None:
    assert list(_errors(raw)) == ["body"]


def test_field_path_formats() -> None:
    assert field_path(()) == "body"
    assert field_path(("gpus",)) == "gpus"
    assert field_path(("args", 2)) == "args[2]"
    assert field_path(("hyperparameters", "lr")) == "hyperparameters.lr"


def test_create_user_request_defaults_to_member_and_refuses_unknown_roles() -> None:
    assert parse_body(CreateUserRequest, b'{"name": "carol"}').role == "member"
    with pytest.raises(RequestInvalid) as caught:
        parse_body(CreateUserRequest, b'{"name": "carol", "role": "root"}')
    assert [e.field for e in caught.value.errors] == ["role"]


def test_job_request_is_not_a_wire_event() -> None:
    assert "user" not in JobRequest.model_fields


def test_idempotency_key_header() -> None:
    assert parse_idempotency_key(None) is None
    assert parse_idempotency_key("nightly run 2024-06-01") == "nightly run 2024-06-01"
    for bad in ("", "k" * 201, "caf\u00e9", "tab\there"):
        with pytest.raises(RequestInvalid) as caught:
            parse_idempotency_key(bad)
        assert [e.field for e in caught.value.errors] == ["Idempotency-Key"]

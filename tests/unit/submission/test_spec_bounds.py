"""Every field of a job spec is bounded: a value past its bound is a 422 naming the field, never
a job that dead-letters or fails at the runner (issue 10, "bad input never breaks anything")."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from trainyard_platform.services.submission.schemas import (
    HYPERPARAMETERS_MAX_CHARS,
    JobRequest,
    parse_job_request,
)
from trainyard_platform.shared.events.payloads import JobSpec
from trainyard_platform.shared.http_errors import RequestInvalid

FLAVORS = ["cpu", "h200"]
GOOD: dict[str, Any] = {"name": "n", "entrypoint": "train", "gpus": 1, "gpu_flavor": "h200"}
COMMAND: dict[str, Any] = {"name": "n", "command": ["python"], "gpus": 1, "gpu_flavor": "h200"}
GIT = {"kind": "git", "repository": "https://github.com/o/r", "commit": "a" * 40}


def _body(**change: Any) -> bytes:
    base = COMMAND if "command" in change else GOOD
    return json.dumps({**base, **change}).encode()


def _errors(body: bytes) -> dict[str, str]:
    with pytest.raises(RequestInvalid) as caught:
        parse_job_request(body, FLAVORS)
    return {e.field: e.message for e in caught.value.errors}


def _accepted(body: bytes) -> JobSpec:
    return parse_job_request(body, FLAVORS).to_spec(user="u", team="t")


# One value just inside and one just past the bound of every field: (field, ok, too much, path).
BOUNDS: list[tuple[str, dict[str, Any], dict[str, Any], str]] = [
    ("name", {"name": "n" * 100}, {"name": "n" * 101}, "name"),
    ("team", {"team": "t" * 100}, {"team": "t" * 101}, "team"),
    ("entrypoint", {"entrypoint": "m" * 252}, {"entrypoint": "m" * 301}, "entrypoint"),
    ("command", {"command": ["x"] * 200}, {"command": ["x"] * 201}, "command"),
    (
        "command",
        {"command": ["python", "a" * 10_000]},
        {"command": ["python", "a" * 10_001]},
        "command[1]",
    ),
    (
        "code",
        {"code": {**GIT, "repository": "https://h/" + "r" * 490}},
        {"code": {**GIT, "repository": "https://h/" + "r" * 491}},
        "code.repository",
    ),
    (
        "requirements",
        {"requirements": ["torch"] * 100},
        {"requirements": ["torch"] * 101},
        "requirements",
    ),
    (
        "requirements",
        {"requirements": ["t" * 200]},
        {"requirements": ["t" * 201]},
        "requirements[0]",
    ),
    ("image", {"image": "i" * 300}, {"image": "i" * 301}, "image"),
    ("args", {"args": ["a"] * 1000}, {"args": ["a"] * 1001}, "args"),
    ("args", {"args": ["a" * 10_000]}, {"args": ["a" * 10_001]}, "args[0]"),
    ("gpus", {"gpus": 64}, {"gpus": 65}, "gpus"),
    ("cpus_per_gpu", {"cpus_per_gpu": 1024}, {"cpus_per_gpu": 1025}, "cpus_per_gpu"),
    (
        "memory_gib_per_gpu",
        {"memory_gib_per_gpu": 16384},
        {"memory_gib_per_gpu": 16385},
        "memory_gib_per_gpu",
    ),
    ("gpu_flavor", {"gpu_flavor": "cpu"}, {"gpu_flavor": "c" * 101}, "gpu_flavor"),
    (
        "hyperparameters",
        {"hyperparameters": {str(i): 1 for i in range(1000)}},
        {"hyperparameters": {str(i): 1 for i in range(1001)}},
        "hyperparameters",
    ),
    (
        "hyperparameters",
        {"hyperparameters": {"k" * 200: 1}},
        {"hyperparameters": {"k" * 201: 1}},
        "hyperparameters.[key]",
    ),
    (
        "hyperparameters",
        {"hyperparameters": {"p": "v" * 10_000}},
        {"hyperparameters": {"p": "v" * 10_001}},
        "hyperparameters.p",
    ),
    (
        "hyperparameters",
        {"hyperparameters": {"n": 2**63 - 1}},
        {"hyperparameters": {"n": 2**63}},
        "hyperparameters.n",
    ),
    ("seed", {"seed": 2**32 - 1}, {"seed": 2**32}, "seed"),
    (
        "max_runtime_seconds",
        {"max_runtime_seconds": 604_800},
        {"max_runtime_seconds": 604_801},
        "max_runtime_seconds",
    ),
    ("dataset", {"dataset": "d" * 1000}, {"dataset": "d" * 1001}, "dataset"),
    ("max_restarts", {"max_restarts": 20}, {"max_restarts": 21}, "max_restarts"),
    ("priority", {"priority": "p" * 40}, {"priority": "p" * 41}, "priority"),
    ("project", {"project": "p" * 100}, {"project": "p" * 101}, "project"),
    ("experiment", {"experiment": "e" * 100}, {"experiment": "e" * 101}, "experiment"),
    (
        "labels",
        {"labels": {f"k{i}": "v" for i in range(64)}},
        {"labels": {f"k{i}": "v" for i in range(65)}},
        "labels",
    ),
    (
        "labels",
        {"labels": {"d" * 253 + "/" + "n" * 63: "v"}},
        {"labels": {"d" * 253 + "/" + "n" * 64: "v"}},
        "labels.[key]",
    ),
    ("labels", {"labels": {"k": "v" * 200}}, {"labels": {"k": "v" * 201}}, "labels.k"),
    ("register_model", {"register_model": True}, {"register_model": "yes"}, "register_model"),
    (
        "datasets",
        {"datasets": [f"t/d{i}" for i in range(16)]},
        {"datasets": [f"t/d{i}" for i in range(17)]},
        "datasets",
    ),
    (
        "datasets",
        {"datasets": ["t" * 100 + "/" + "d" * 100 + ":" + "9" * 9]},
        {"datasets": ["t" * 100 + "/" + "d" * 101 + ":1"]},
        "datasets[0]",
    ),
    (
        "parent_model",
        {"parent_model": "t" * 100 + "/" + "m" * 100 + "@" + "a" * 63},
        {"parent_model": "t" * 100 + "/" + "m" * 100 + "@" + "a" * 64},
        "parent_model",
    ),
    (
        "parent_model_version_id",
        {
            "parent_model": "t/m:1",
            "parent_model_version_id": "0" * 8 + "-0000" * 3 + "-" + "0" * 12,
        },
        {
            "parent_model": "t/m:1",
            "parent_model_version_id": "0" * 8 + "-0000" * 3 + "-" + "0" * 13,
        },
        "parent_model_version_id",
    ),
]


def test_every_field_of_the_job_spec_has_a_bound_here() -> None:
    """A new field must come with its bound (and a row above); ``apiVersion`` and ``kind``
    are constants."""
    assert {field for field, *_ in BOUNDS} == set(JobRequest.model_fields) - {
        "api_version",
        "kind",
    }


@pytest.mark.parametrize(("field", "ok", "over", "path"), BOUNDS)
def test_a_value_past_its_bound_is_named(
    field: str, ok: dict[str, Any], over: dict[str, Any], path: str
) -> None:
    if path == "image":  # an image name of 300 characters must still be a reference
        ok, over = {"image": "r/" + "i" * 298}, {"image": "r/" + "i" * 299}
    _accepted(_body(**ok))  # and the wire spec takes what the API accepts
    errors = _errors(_body(**over))
    if path.endswith(".[key]"):
        prefix = path.removesuffix(".[key]")
        assert list(errors) and all(e.startswith(prefix) for e in errors), errors
    else:
        assert path in errors, errors


@pytest.mark.parametrize(
    "entrypoint",
    [
        "../../etc/passwd",
        "/etc/passwd",
        "/abs/train.py",
        "a\x00b",
        "a\x00b.py",
        "x" * 5000,
        "scripts\\train.py",
        "C:\\train.py",
        "train.py/",
        "train.py\n",
        "a b",
        "pkg..mod",
        ".train",
        "train.",
        "a/" + "b" * 253 + ".py",  # a file name of 256 characters
        "c" * 256 + "/train.py",  # a folder name of 256 characters
        "m" * 253,  # m...m.py would be 256 characters
        "pkg." + "m" * 253,
    ],
)
def test_an_entrypoint_that_cannot_be_a_module_or_a_file_is_422(entrypoint: str) -> None:
    assert list(_errors(_body(entrypoint=entrypoint))) == ["entrypoint"]


@pytest.mark.parametrize(
    "entrypoint", ["a/" + "b" * 252 + ".py", "c" * 255 + "/train.py", "m" * 252, "p." + "m" * 252]
)
def test_entrypoint_names_up_to_the_file_name_limit_are_accepted(entrypoint: str) -> None:
    # A script needs code to run from (schemas.script_problem).
    assert _accepted(_body(entrypoint=entrypoint, code=GIT)).entrypoint == entrypoint


@pytest.mark.parametrize(
    ("program", "says"),
    [
        ("", "must not be empty"),
        ("bash\n", "control characters"),
        ("ba\tsh", "control characters"),
        ("/" + "x" * 4095, "at most 4095 bytes"),
        ("x" * 256, "at most 255 bytes"),
        ("/opt/" + "x" * 256 + "/run", "at most 255 bytes"),
    ],
)
def test_a_program_execve_cannot_start_is_422(program: str, says: str) -> None:
    errors = _errors(_body(command=[program, "arg"]))
    assert list(errors) == ["command"]
    assert says in errors["command"]


@pytest.mark.parametrize("program", ["bash", "/usr/bin/env", "./run.sh", "x" * 255])
def test_programs_are_names_or_paths(program: str) -> None:
    assert _accepted(_body(command=[program, "a\tb"])).command[0] == program


def test_hyperparameters_must_fit_the_jobs_environment() -> None:
    # 6,000 emoji are 24 KB in the body but 72,000 characters as the runner escapes them.
    errors = _errors(_body(hyperparameters={"p": "\U0001f600" * 6000}))
    assert list(errors) == ["hyperparameters"]
    assert f"at most {HYPERPARAMETERS_MAX_CHARS}" in errors["hyperparameters"]
    assert _accepted(_body(hyperparameters={"p": "\u00e9" * 10_000})).hyperparameters


def test_args_and_dataset_refuse_nul_and_control_characters_without_the_http_screen() -> None:
    assert list(_errors(_body(args=["ok", "a\x00b"]))) == ["args[1]"]
    assert list(_errors(_body(dataset="s3://d/\nx"))) == ["dataset"]


def test_a_flavor_is_a_flavor_name_when_no_list_is_given() -> None:
    with pytest.raises(ValidationError) as caught:
        JobRequest.model_validate({**GOOD, "gpu_flavor": "H 200"})
    assert [e["loc"] for e in caught.value.errors()] == [("gpu_flavor",)]
    assert JobRequest.model_validate({**GOOD, "gpu_flavor": "mi300"}).gpu_flavor == "mi300"


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"gpus": 0}, "gpus"),
        ({"gpus": 65}, "gpus"),
        ({"seed": -1}, "seed"),
        ({"max_runtime_seconds": 0}, "max_runtime_seconds"),
        ({"max_restarts": 21}, "max_restarts"),
        ({"entrypoint": "m" * 301}, "entrypoint"),
        ({"args": ["a"] * 1001}, "args"),
        ({"name": ""}, "name"),
    ],
)
def test_the_wire_spec_holds_consumers_to_the_same_bounds(
    change: dict[str, Any], field: str
) -> None:
    fields = {
        "name": "n",
        "team": "t",
        "user": "u",
        "entrypoint": "m",
        "gpus": 1,
        "gpu_flavor": "cpu",
        "seed": 0,
        "max_runtime_seconds": 60,
    }
    with pytest.raises(ValidationError) as caught:
        JobSpec(**{**fields, **change})
    assert [e["loc"][0] for e in caught.value.errors()] == [field]


@pytest.mark.parametrize(
    "key", ["", "-a", "a-", "a b", "A.Example/x", "ex..com/x", "/x", "x/", "a/b/c", "k" * 64]
)
def test_a_label_key_must_look_like_a_kubernetes_one(key: str) -> None:
    errors = _errors(_body(labels={key: "v"}))
    assert list(errors) and all(e.startswith("labels") for e in errors), errors


@pytest.mark.parametrize("key", ["team", "a.b_c-d", "example.com/owner", "k" * 63, "K8s"])
def test_kubernetes_style_label_keys_are_accepted(key: str) -> None:
    assert _accepted(_body(labels={key: "v"})).labels == {key: "v"}


def test_project_experiment_and_labels_reach_the_wire_spec() -> None:
    spec = _accepted(_body(project="vision", experiment="lr-sweep", labels={"stage": "dev"}))
    assert (spec.project, spec.experiment, spec.labels) == ("vision", "lr-sweep", {"stage": "dev"})
    plain = _accepted(_body())
    assert (plain.project, plain.experiment, plain.labels) == ("default", None, {})
    assert list(_errors(_body(project="a/b"))) == ["project"]
    assert list(_errors(_body(labels={"k": "a\nb"}))) == ["labels.k"]


def test_a_wire_spec_of_before_these_fields_reads_with_their_defaults() -> None:
    old = JobSpec.model_validate(
        {
            "name": "n",
            "team": "t",
            "user": "u",
            "gpus": 1,
            "gpu_flavor": "h200",
            "seed": 0,
            "max_runtime_seconds": 60,
        }
    )
    assert (old.project, old.experiment, old.labels) == ("default", None, {})

"""Did you mean ...? for a misspelt field name."""

from __future__ import annotations

import pytest

from trainyard_platform.shared.suggest import NOT_JOB_FIELDS, closest, unknown_field

FIELDS = ["name", "gpus", "gpu_flavor", "hyperparameters", "max_restarts", "seed", "labels"]


@pytest.mark.parametrize(
    ("typo", "meant"),
    [
        ("hyperparameter", "hyperparameters"),
        ("hyperparamters", "hyperparameters"),
        ("maxRestarts", "max_restarts"),
        ("max-restarts", "max_restarts"),
        ("GPUS", "gpus"),
        ("gpu_flavour", "gpu_flavor"),
        ("label", "labels"),
    ],
)
def test_a_close_name_is_suggested(typo: str, meant: str) -> None:
    assert closest(typo, FIELDS) == meant


@pytest.mark.parametrize("name", ["zzz", "timeout", "x", ""])
def test_nothing_close_is_nothing(name: str) -> None:
    assert closest(name, FIELDS) is None


def test_no_candidates_is_no_suggestion() -> None:
    assert closest("colour", []) is None
    assert unknown_field("colour", []) == "unknown field 'colour'"


def test_the_message() -> None:
    assert unknown_field("hyperparameter", FIELDS) == (
        "unknown field 'hyperparameter': did you mean 'hyperparameters'?"
    )
    assert unknown_field("zzz", FIELDS) == "unknown field 'zzz'"


SPEC_FIELDS = [
    "apiVersion", "kind", "name", "team", "entrypoint", "command", "code", "requirements",
    "image", "args", "gpus", "gpu_flavor", "cpus_per_gpu", "memory_gib_per_gpu",
    "hyperparameters", "seed", "max_runtime_seconds", "dataset", "max_restarts", "priority",
    "project", "experiment", "labels", "register_model", "datasets", "parent_model",
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "meant"),
    [
        # A wrong guess sends a person the wrong way: "cpus: 4" -> "did you mean 'gpus'?"
        # asked for 4 GPUs. Each of these was suggested the name after "was".
        ("cpus", "cpus_per_gpu"),  # was gpus
        ("memory", "memory_gib_per_gpu"),  # was nothing
        ("environment", None),  # was requirements
        ("model", None),  # was code; parent_model and register_model are both candidates
        ("nodes", None),  # was code
        ("tags", None),  # was args
        ("params", None),  # was args
        # Kept: a word of a field, an abbreviation, a typo.
        ("num_gpus", "gpus"),
        ("flavor", "gpu_flavor"),
        ("restarts", "max_restarts"),
        ("max_runtime", "max_runtime_seconds"),
        ("experiment_name", "experiment"),
        ("hparams", "hyperparameters"),
        ("hyper_parameters", "hyperparameters"),
        ("requirement", "requirements"),
        ("gpu", "gpus"),
    ],
)
def test_a_suggestion_is_what_was_meant_or_nothing(name: str, meant: str | None) -> None:
    assert closest(name, SPEC_FIELDS) == meant


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("env", "a job gets no environment variables of yours"),
        ("environment", "a job gets no environment variables of yours"),
        ("ENV_VARS", "a job gets no environment variables of yours"),
        ("queue", "a job goes to its team's queue"),
        ("timeout", "the time limit is max_runtime_seconds"),
        ("nodes", "the scheduler chooses the nodes"),
    ],
)
def test_a_field_people_expect_that_the_spec_has_not_says_what_to_do(name: str, says: str) -> None:
    """``env:``, ``queue:``, ``timeout:``, ``nodes:`` answered only "unknown field 'env'":
    a person who wants to pass a variable, pick a queue or set a time limit was not told how
    (or that it is not theirs to choose). The spec file check and the API say the same."""
    from trainyard.spec import parse
    from trainyard_platform.services.submission.schemas import parse_job_request
    from trainyard_platform.shared.http_errors import RequestInvalid

    message = unknown_field(name, SPEC_FIELDS, NOT_JOB_FIELDS)
    assert message.startswith(f"unknown field {name!r}: {says}")
    head = "name: a\nentrypoint: t\ngpus: 1\ngpu_flavor: cpu\n"
    with pytest.raises(Exception) as in_file:
        parse(f"{head}{name}: x\n", "job.yaml")
    assert str(in_file.value) == f"job.yaml:5:1: {name}: {message}"
    with pytest.raises(RequestInvalid) as in_api:
        parse_job_request(
            f'{{"name": "a", "entrypoint": "t", "gpus": 1, "gpu_flavor": "cpu", "{name}": 1}}'.encode(),
            ["cpu"],
        )
    assert [(e.field, e.message) for e in in_api.value.errors] == [(name, message)]


def test_a_key_of_a_requests_size_is_no_field_and_is_not_repeated_whole() -> None:
    # A 100,000-character unknown key was aligned with every field (seconds of CPU for one
    # request to the submission service) and repeated whole in the error message.
    key = "k" * 100_000
    assert closest(key, ["hyperparameters", "requirements", "gpus"]) is None
    message = unknown_field(key, ["hyperparameters", "requirements", "gpus"])
    assert len(message) < 100, message
    assert message.startswith("unknown field 'kkkk") and message.endswith("…'")


def test_no_candidates_is_no_guess() -> None:
    """With nothing to choose from there is no guess (it raised ``ValueError``: the registry
    answered 500 for an alias asked of a model that has none)."""
    assert closest("prod", []) is None
    assert unknown_field("prod", []) == "unknown field 'prod'"

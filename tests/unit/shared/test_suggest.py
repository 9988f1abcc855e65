"""Did you mean ...? for a misspelt field name."""

from __future__ import annotations

import pytest

from trainyard_platform.shared.suggest import closest, unknown_field

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


def test_the_message() -> None:
    assert unknown_field("hyperparameter", FIELDS) == (
        "unknown field 'hyperparameter': did you mean 'hyperparameters'?"
    )
    assert unknown_field("zzz", FIELDS) == "unknown field 'zzz'"

"""``rerun --reproduce`` and ``reproduction``: what the verdict looks like printed, and the
overrides a reproduction refuses before any call."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from trainyard.cli_base import CliError, Exit
from trainyard.cli_jobs import render_verdict, reproduce

DIFFERENT: dict[str, Any] = {
    "job_id": "repro-1",
    "original_job_id": "orig-1",
    "verdict": "different",
    "differences": [
        {
            "field": "data.datasets",
            "original": ["vision/digits:1 sha256:aa"],
            "reproduction": ["vision/digits:2 sha256:bb"],
        }
    ],
    "metrics": {
        "loss": {"original": 0.5, "reproduction": 0.5, "relative_difference": 0.0},
        "samples_per_s": {
            "original": 10.0,
            "reproduction": 20.0,
            "relative_difference": 0.5,
            "compared": False,
        },
    },
    "weights": {"compared": True, "equal": True, "original_sha256": "c" * 64},
    "relative_tolerance": 0.001,
}


def test_a_verdict_names_every_difference_and_shows_the_metrics() -> None:
    lines = render_verdict({**DIFFERENT, "weights": {**DIFFERENT["weights"]}}).splitlines()
    assert lines[0] == "reproduction repro-1 of job orig-1"
    assert lines[1] == "verdict: different"
    assert lines[2] == (
        '  differs: data.datasets: ["vision/digits:1 sha256:aa"] -> ["vision/digits:2 sha256:bb"]'
    )
    assert "  loss: 0.5 -> 0.5 (relative difference 0.0)" in lines
    assert "  samples_per_s: 10.0 -> 20.0 (a measure of speed, not compared)" in lines
    assert lines[-1].startswith("weights: equal (sha256 cccccccccccc")


def test_an_undecided_verdict_says_so() -> None:
    shown = render_verdict({"job_id": "r", "original_job_id": "o", "verdict": None})
    assert shown.splitlines()[-1] == "verdict: not decided yet (the reproduction has not ended)"


def test_weights_not_compared_are_said_to_be() -> None:
    shown = render_verdict({**DIFFERENT, "weights": {"compared": False}})
    assert shown.splitlines()[-1] == "weights: not compared (a final checkpoint is missing)"


class _Session:
    def __init__(self, **args: Any) -> None:
        defaults = {"job": "abc", "name": None, "project": None, "experiment": None}
        self.args = argparse.Namespace(**{**defaults, "label": None, **args})

    @property
    def client(self) -> Any:
        raise AssertionError("no call may be made")


@pytest.mark.parametrize("option", ["name", "project", "experiment"])
def test_spec_overrides_are_refused_before_any_call(option: str) -> None:
    with pytest.raises(CliError) as refused:
        reproduce(_Session(**{option: "x"}))  # type: ignore[arg-type]
    assert refused.value.code == Exit.USAGE and f"--{option}" in str(refused.value)

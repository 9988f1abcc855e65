"""``submit`` says the most a job costs before submitting it, when billing is configured."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, cast

import pytest
from pydantic import SecretStr

from trainyard.cli_base import CliSettings, Session
from trainyard.cli_jobs import _say_estimate
from trainyard.client import TrainyardClient, TrainyardError

ESTIMATE = {
    "gpu_flavor": "a100",
    "gpus": 2,
    "max_runtime_seconds": 1800,
    "currency": "USD",
    "estimated_cost": "2.500000",
    "worst_case_cost": "10.000000",
}


class Billing:
    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.calls: list[tuple[str, str, Any]] = []

    def call(self, method: str, path: str, body: Any = None) -> Any:
        self.calls.append((method, path, body))
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def session(tmp_path: Path, billing: Billing | None) -> Session:
    settings = CliSettings(
        token=SecretStr("t"),
        config=tmp_path / "none.json",
        billing_url="http://billing" if billing is not None else None,
    )
    return Session(
        settings, argparse.Namespace(), lambda url, token: cast(TrainyardClient, billing)
    )


def test_the_estimate_is_noted_before_submitting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    billing = Billing(ESTIMATE)
    spec = {"name": "j", "gpus": 2, "gpu_flavor": "a100", "max_runtime_seconds": 1800}
    _say_estimate(session(tmp_path, billing), spec)
    assert billing.calls == [("POST", "/v1/costs/estimate", spec)]
    out = capsys.readouterr()
    assert out.out == ""  # stdout stays the submission's (``--json`` included)
    assert out.err.strip() == (
        "estimated cost: at most 2.500000 USD (2 x a100 for 1800 s; 10.000000 USD if every "
        "restart is used)"
    )


def test_no_billing_url_no_estimate_and_a_failed_one_is_only_noted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _say_estimate(session(tmp_path, None), {}) is None
    assert capsys.readouterr().err == ""
    failed = Billing(TrainyardError(422, "no price for 'tpu'"))
    # Returned for the caller to note once the API has accepted the job, not said at once.
    assert (
        _say_estimate(session(tmp_path, failed), {}) == "no cost estimate: 422 no price for 'tpu'"
    )
    assert capsys.readouterr().err == ""

"""``trainyard model show TEAM/NAME:V`` prints what the version cost to make (the registry's
``cost``: totals per currency, its own job first, then the upstream jobs), and ``model
grant|revoke`` checks its reference before any call."""

from __future__ import annotations

import pytest

from trainyard.cli import main
from trainyard.cli_base import Exit
from trainyard.cli_models import cost_lines, render_version

COST = {
    "currency": "USD",
    "total": "4.633334",
    "own_job": "2.750001",
    "upstream": "1.883333",
    "by_currency": [
        {"currency": "USD", "total": "4.633334", "own_job": "2.750001", "upstream": "1.883333"}
    ],
    "jobs": [
        {
            "job_id": "tuned-job-0001",
            "team": "vision",
            "name": "tuned",
            "status": "succeeded",
            "relation": "own",
            "allocations": 2,
            "costs": {"USD": "2.750001"},
        },
        {
            "job_id": "base-job-0002",
            "team": "vision",
            "name": "base",
            "status": "failed",
            "relation": "upstream",
            "allocations": 1,
            "costs": {"USD": "1.583333"},
        },
    ],
    "hidden_jobs": 1,
    "complete": True,
}


def test_a_versions_cost_is_its_total_then_each_job() -> None:
    assert cost_lines(COST) == [
        "  cost:        4.633334 USD (own job 2.750001, upstream 1.883333)",
        "    own      tuned-jo  tuned (succeeded): 2.750001 USD, 2 allocations",
        "    upstream base-job  base (failed): 1.583333 USD, 1 allocation",
        "    and 1 upstream job of other teams",
    ]


def test_nothing_billed_and_a_running_lineage_say_so() -> None:
    empty = {**COST, "by_currency": [], "jobs": [], "hidden_jobs": 0, "complete": False}
    assert cost_lines(empty) == [
        "  cost:        nothing billed yet so far: a job of its lineage still runs"
    ]
    version = {"team": "v", "model": "m", "version": 1, "job_id": "j", "cost": COST}
    assert "  cost:        4.633334 USD" in render_version(version)
    assert "cost:" not in render_version({**version, "cost": None})


def test_grant_checks_its_reference_before_any_call(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["--url", "http://127.0.0.1:9", "--token", "t"]  # nothing listens: exit 5 if called
    assert main([*base, "model", "grant", "nope", "ml"]) == Exit.USAGE
    assert "TEAM/NAME: 'nope'" in capsys.readouterr().err
    assert main([*base, "model", "revoke", "a/b:3", "ml"]) == Exit.USAGE

"""A whole number the API bounds, given out of bounds on the command line, reached the API
and came back as its 422 naming a field the user never wrote, exit 1: ``trainyard audit
--limit 0`` was ``422 invalid request (limit: Expected `int` >= 1)``, ``token revoke -3``
``(token_id: ...)``, ``deadletters list --limit 0`` or ``--after -1`` alike. Each is now a
usage error naming the option (exit 2), before any request, as ``token create --days``
is (test_cli_token_days.py)."""

from __future__ import annotations

import httpx
import pytest

from trainyard import cli

BASE = ["--url", "http://api.test", "--token", "ty_a"]


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["audit", "--limit", "0"], "--limit"),
        (["audit", "--limit", "-5"], "--limit"),
        (["audit", "--before", "0"], "--before"),
        (["audit", "--before", "9223372036854775808"], "--before"),
        (["token", "revoke", "-3"], "ID"),
        (["token", "revoke", "0"], "ID"),
        (["deadletters", "list", "--limit", "0"], "--limit"),
        (["deadletters", "list", "--limit", "501"], "--limit"),
        (["deadletters", "list", "--after", "-1"], "--after"),
        (["dataset", "register", "a/b", "--uri", "u", "--sha256", "x", "--size", "-1"], "--size"),
        (["sweep", "job.yaml", "--grid", "lr=1", "--median-stop", "-1"], "--median-stop"),
        (["sweep", "job.yaml", "--uniform", "lr=0:1", "--random", "0"], "--random"),
        (["deadletters", "show", "0"], "SEQ"),
        (["deadletters", "redrive", "1", "-2"], "SEQ"),
    ],
)
def test_an_out_of_bounds_whole_number_is_a_usage_error_naming_its_option(
    args: list[str],
    option: str,
    sent: list[httpx.Request],
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as ended:
        cli.main([*BASE, *args])
    assert ended.value.code == 2
    assert f"argument {option}: " in capsys.readouterr().err
    assert sent == []


def test_the_bounds_are_the_services() -> None:
    from trainyard.cli_base import ID_MAX
    from trainyard.cli_deadletters import PAGE_MAX
    from trainyard_platform.shared import deadletters

    assert PAGE_MAX == deadletters.MAX_PAGE
    assert ID_MAX == 2**63 - 1

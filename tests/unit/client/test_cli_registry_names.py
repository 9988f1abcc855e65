"""Every name a registry command sends in a URL is checked before any request: a team, model,
dataset or project name that cannot be one is a usage error naming its argument (exit 2).

Before, ``trainyard models vision/digits`` (the TEAM/NAME every other model command takes)
and ``trainyard model grant vision/cnn a/b`` reached the registry as an encoded slash, which
no route takes, and were told ``404 Not Found ... this server has no such route (... is the
URL right? Or the service is older than this CLI ...)``: the wrong way to look."""

from __future__ import annotations

import httpx
import pytest

from trainyard import cli

BASE = ["--url", "http://127.0.0.1:9", "--token", "ty_a"]


@pytest.mark.parametrize(
    ("argv", "named", "says"),
    [
        (["models", "vision/digits"], "NAME", "trainyard model show vision/digits"),
        (["models", "../x"], "NAME", "is not a model name"),
        (["models", "digits", "--team", "a/b"], "--team", "is not a team name"),
        (["model", "ls", "--team", ".hidden"], "--team", "is not a team name"),
        (["model", "ls", "--project", "a b"], "--project", "is not a project name"),
        (["model", "grant", "vision/cnn", "a/b"], "TEAM", "is not a team name"),
        (["model", "revoke", "vision/cnn", "x" * 101], "TEAM", "is not a team name"),
        (["dataset", "grant", "vision/digits", "ml/"], "TEAM", "is not a team name"),
        (["dataset", "revoke", "vision/digits", "%2F"], "TEAM", "is not a team name"),
    ],
)
def test_a_name_that_cannot_be_one_is_a_usage_error_before_any_request(
    argv: list[str],
    named: str,
    says: str,
    sent: list[httpx.Request],
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as raised:
        cli.main([*BASE, *argv])
    assert raised.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {named}: " in err and says in err, err
    assert "1 to 100 letters, digits" in err
    assert sent == []


def test_good_names_still_reach_the_registry(sent: list[httpx.Request]) -> None:
    for argv in (
        ["models", "digits.v2", "--team", "ml-research"],
        ["model", "grant", "vision/cnn", "ml_2"],
        ["model", "ls", "--project", "Digits"],
    ):
        cli.main([*BASE, *argv])
    assert [r.url.path for r in sent] == [
        "/v1/models/ml-research/digits.v2/versions",
        "/v1/models/vision/cnn/grants/ml_2",
        "/v1/models",
    ]

"""An empty value of any option or argument that takes one is a usage error naming it
(exit 2, no request), never silently "none" (``ls --experiment ''`` listed the runs of every
experiment). Free text (a description, a note) may be empty."""

from __future__ import annotations

import argparse

import httpx
import pytest

from trainyard import cli
from trainyard.cli_base import CliError, Exit

JOB = "abc12345-0000-4000-8000-000000000001"
BASE = ["--url", "http://127.0.0.1:9", "--token", "ty_a"]


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["ls", "--experiment", ""], "--experiment"),
        (["ls", "--project", " "], "--project"),
        (["ls", "--user", ""], "--user"),
        (["ls", "--after", ""], "--after"),
        (["model", "ls", "--project", ""], "--project"),
        (["model", "grant", "a/b", ""], "TEAM"),
        (["dataset", "grant", "a/b", ""], "TEAM"),
        (["cost", "--team", ""], "--team"),
        (["waste", "--project", ""], "--project"),
        (["tokens", "--team", ""], "--team"),
        (["metrics", JOB, ""], "KEY"),
        (["describe", ""], "JOB"),
        (
            ["dataset", "register", "a/b", "--uri", "s3://x", "--sha256", "a" * 64, "--job", ""],
            "--job",
        ),
        (["experiments", "--sort", ""], "--sort"),
    ],
)
def test_an_empty_value_is_a_usage_error_naming_it(
    argv: list[str],
    named: str,
    sent: list[httpx.Request],
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main([*BASE, *argv]) == Exit.USAGE
    err = capsys.readouterr().err
    assert err.startswith(f"trainyard: error: {named} is empty: "), err
    assert sent == []


def test_every_option_that_takes_a_value_refuses_an_empty_one() -> None:
    """Not only the ones listed above: every argument of every command, but free text."""
    parser = cli._parser()
    checked = 0

    def walk(p: argparse.ArgumentParser) -> None:
        nonlocal checked
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    walk(sub)
            elif action.nargs != 0 and action.dest not in cli.FREE_TEXT:
                assert action.type is not None, action.dest
                # Refused by the argument's own type (argparse's usage error) or as empty.
                with pytest.raises((CliError, argparse.ArgumentTypeError, ValueError)) as refused:
                    action.type(" ")
                if isinstance(refused.value, CliError):
                    assert refused.value.code == Exit.USAGE
                checked += 1

    walk(parser)
    assert checked > 50


def test_free_text_may_be_empty(sent: list[httpx.Request]) -> None:
    assert cli.main([*BASE, "note", JOB, ""]) == Exit.NOT_FOUND  # '' clears the note: sent
    assert [r.url.path for r in sent] == [f"/v1/jobs/{JOB}/note"]


@pytest.mark.parametrize(
    "argv",
    [
        ["dataset", "register", "a/b", "--uri", " ", "--sha256", "a" * 64, "--size", "1"],
        ["nodes", "cordon", "gpu-07", "--reason", "  "],
    ],
)
def test_an_empty_required_option_is_not_told_to_be_left_out(
    argv: list[str], sent: list[httpx.Request], capsys: pytest.CaptureFixture[str]
) -> None:
    """An option the command cannot do without said "give a value or leave the option out",
    and leaving it out is the next usage error: its empty value asks for a value only."""
    assert cli.main([*BASE, *argv]) == Exit.USAGE
    err = capsys.readouterr().err
    assert err.endswith("is empty: give a value\n"), err
    assert sent == []

"""An option the command's form does not use is a usage error naming it (exit 2, no
request), never silently dropped: ``experiments --sort final:loss`` (no EXP) listed the
experiments unsorted, ``cost JOB --team x`` showed the job's bill unfiltered, ``metrics JOB
--points 5`` (no KEY) the whole table, and ``ls --mine --user bob`` your own jobs."""

from __future__ import annotations

import httpx
import pytest

from trainyard import cli
from trainyard.cli_base import Exit

JOB = "abc12345-0000-4000-8000-000000000001"
BASE = ["--url", "http://127.0.0.1:9", "--token", "ty_a"]


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["experiments", "--sort", "final:loss"], "--sort"),
        (["experiments", "--filter", "final:loss<1"], "--filter"),
        (["metrics", JOB, "--points", "5"], "--points"),
        (["cost", JOB, "--team", "vision"], "--team"),
        (["cost", JOB, "--project", "p"], "--project"),
        (["cost", JOB, "--user", "u"], "--user"),
        (["cost", JOB, "--queue", "q"], "--queue"),
        (["cost", JOB, "--flavor", "h200"], "--flavor"),
    ],
)
def test_an_option_the_form_does_not_use_is_a_usage_error(
    argv: list[str],
    named: str,
    sent: list[httpx.Request],
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main([*BASE, *argv]) == Exit.USAGE
    err = capsys.readouterr().err
    assert err.startswith("trainyard: error: ") and named in err, err
    assert len(err.splitlines()) == 1
    assert sent == []


def test_mine_and_another_user_are_one_or_the_other(
    sent: list[httpx.Request], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main([*BASE, "ls", "--mine", "--user", "bob"])
    assert exited.value.code == Exit.USAGE
    assert "--user" in capsys.readouterr().err and sent == []


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--json", "cost", "--csv"], "--csv"),
        (["--json", "waste", "--csv"], "--csv"),
        (["--json", "completion", "bash"], "completion"),
    ],
)
def test_json_is_json_or_a_usage_error(
    argv: list[str],
    named: str,
    sent: list[httpx.Request],
    capsys: pytest.CaptureFixture[str],
) -> None:
    # `--json cost --csv` printed CSV and `--json completion bash` a shell script: a script
    # that asked for JSON got something else, exit 0.
    assert cli.main([*BASE, *argv]) == Exit.USAGE
    captured = capsys.readouterr()
    assert captured.out == "" and "--json" in captured.err and named in captured.err
    assert sent == []

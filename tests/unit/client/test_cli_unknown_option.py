"""An option a command does not have is a usage error of that command: `trainyard logs JOB
--tail 5` said `trainyard: error: unrecognized arguments: --tail 5 (see trainyard --help)`,
sending the user to the list of commands rather than to the options of `logs`."""

from __future__ import annotations

import pytest

from trainyard import cli


@pytest.mark.parametrize(
    ("argv", "prog"),
    [
        (["logs", "j-1", "--tail", "5"], "trainyard logs"),
        (["rerun", "j-1", "--dry-run"], "trainyard rerun"),
        (["context", "use", "lab", "--force"], "trainyard context use"),
        (["model", "ls", "--all"], "trainyard model ls"),
    ],
)
def test_an_unknown_option_names_the_command_and_its_help(
    argv: list[str], prog: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as ended:
        cli.main(argv)
    assert ended.value.code == 2
    extra = " ".join(argv[argv.index(next(a for a in argv if a.startswith("--"))) :])
    assert capsys.readouterr().err.splitlines() == [
        f"{prog}: error: unrecognized arguments: {extra} (see {prog} --help)"
    ]


def test_an_unknown_option_before_any_command_stays_the_top_level_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        cli.main(["--bogus", "ls"])
    assert "(see trainyard --help)" in capsys.readouterr().err

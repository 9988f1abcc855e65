"""`trainyard --help` listed every exit code but 7 (not configured), the one a new user meets
first (`no token (no context: not logged in)`), so a script's author reading it took exit 7
for an undocumented failure. The list is now made from the codes themselves."""

from __future__ import annotations

import re

import pytest

from trainyard import cli
from trainyard.cli_base import EXIT_WORDS, Exit


def test_every_exit_code_has_its_words() -> None:
    assert set(EXIT_WORDS) == set(Exit)


def test_help_lists_every_exit_code(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        cli.main(["--help"])
    assert done.value.code == 0
    said = " ".join(capsys.readouterr().out.split())  # argparse wraps the epilog
    listed = re.search(r"Exit codes: (.*)\.$", said)
    assert listed is not None
    assert listed.group(1) == (
        "0 ok, 1 error, 2 usage, 3 not found, 4 not allowed, 5 unreachable, 6 timed out, "
        "7 not configured, 10 job failed, 11 job cancelled, 130 interrupted"
    )

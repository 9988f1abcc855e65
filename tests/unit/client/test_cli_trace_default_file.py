"""``trainyard trace JOB`` run outside the checkout that runs ``dev.py up`` (the user's own
project folder) read the default ``.trainyard/local/spans.jsonl`` relative to that folder
and ended ``cannot read spans from .trainyard/local/spans.jsonl: No such file or
directory``, with no word of ``--file`` or where the stack's file is."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainyard.cli import main

JOB = "3f2a9c1e-5b7d-4e21-9a0c-7d1e2f3a4b5c"


@pytest.fixture(autouse=True)
def elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TRAINYARD_CONFIG", str(tmp_path / "config.json"))
    for name in ("URL", "TOKEN", "CONTEXT"):
        monkeypatch.delenv(f"TRAINYARD_{name}", raising=False)


def test_a_missing_default_file_says_where_it_looked_and_how_to_name_the_right_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["trace", JOB]) == 1
    assert capsys.readouterr().err.splitlines() == [
        "trainyard: error: cannot read spans from .trainyard/local/spans.jsonl: No such file "
        "or directory (the default, relative to the current folder: name the stack's span "
        "file with --file; dev.py up prints it on its 'spans' line)"
    ]


def test_a_missing_file_given_with_file_is_said_as_before(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["trace", JOB, "--file", "nope.jsonl"]) == 1
    assert capsys.readouterr().err.splitlines() == [
        "trainyard: error: cannot read spans from nope.jsonl: No such file or directory"
    ]

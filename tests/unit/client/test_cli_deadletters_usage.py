"""``deadletters redrive|discard`` with neither SEQ nor ``--all`` (or both), or ``--reason``
without ``--all``, is a usage error: exit 2, before any request. It was exit 5, the code of
a server that does not answer."""

from __future__ import annotations

import httpx
import pytest

from trainyard import cli


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["deadletters", "redrive"], "redrive: name dead letters (SEQ...) or pass --all"),
        (["deadletters", "discard", "1", "--all"], "discard: name dead letters (SEQ...) or"),
        (["deadletters", "redrive", "1", "--reason", "x"], "redrive: --reason goes with --all"),
    ],
)
def test_a_wrong_choice_of_letters_is_a_usage_error(
    argv: list[str],
    says: str,
    sent: list[httpx.Request],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("TRAINYARD_TOKEN", "ty_a")
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"trainyard: error: {says}") and len(err.splitlines()) == 1
    assert sent == []

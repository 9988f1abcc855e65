"""``login`` refuses the options it would otherwise ignore without a word, before any
request: ``--url`` (its URL is its argument: ``login A --url B`` logged in to A) and
``--token`` beside ``--token-stdin`` (the token from stdin was taken, ``--token`` dropped)."""

from __future__ import annotations

import io

import httpx
import pytest

from trainyard import cli


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--url", "http://other.test", "--token", "ty_a"], "not --url"),
        (["--token", "ty_a", "--token-stdin"], "give --token or --token-stdin, not both"),
    ],
)
def test_an_option_login_would_ignore_is_a_usage_error(
    extra: list[str],
    says: str,
    sent: list[httpx.Request],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("ty_b\n"))
    assert cli.main(["login", "http://api.test", *extra]) == 2
    err = capsys.readouterr().err
    assert says in err and len(err.splitlines()) == 1
    assert sent == []

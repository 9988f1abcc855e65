"""``submit --idempotency-key`` is checked as the API checks the header, before anything is
sent: an HTTP header cannot carry a newline or an ``é``, and the client failed on them
itself, as "cannot reach" the server (exit 5) or an unexpected ``UnicodeEncodeError``."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from trainyard import cli
from trainyard.cli_jobs import IDEMPOTENCY_KEY_MAX, idempotency_key_arg
from trainyard_platform.services.submission.schemas import IDEMPOTENCY_KEY


@pytest.mark.parametrize(
    ("key", "says"),
    [
        ("a\nb", "character 2 is U+000A"),
        ("é", "character 1 is U+00E9"),
        ("a\x01", "character 2 is U+0001"),
        ("k" * 201, "has 201 characters, more than the 200"),
    ],
)
def test_a_key_no_header_can_carry_is_a_usage_error(
    key: str,
    says: str,
    sent: list[httpx.Request],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("TRAINYARD_TOKEN", "ty_a")
    spec = tmp_path / "job.yaml"
    spec.write_text("name: a\ngpus: 1\ngpu_flavor: cpu\nentrypoint: m\n")
    with pytest.raises(SystemExit) as usage:
        cli.main(["submit", str(spec), "--no-code", "--idempotency-key", key])
    err = capsys.readouterr().err
    assert usage.value.code == 2, err
    assert "argument --idempotency-key: " + says in err and len(err.splitlines()) == 1
    assert sent == []


@pytest.mark.parametrize("key", ["a", "run 1: lr=0.1 ~ok", "k" * 200, " ", "é", "a\tb", "k" * 201])
def test_the_client_takes_what_the_api_takes(key: str) -> None:
    try:
        taken = idempotency_key_arg(key) == key
    except Exception:
        taken = False
    assert taken == bool(IDEMPOTENCY_KEY.fullmatch(key))
    assert IDEMPOTENCY_KEY_MAX == 200

"""Files the CLI reads besides specs (``dataset register --schema``): whatever they hold, a
one-line error naming the option and the file, exit 2, and no request."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from trainyard import cli
from trainyard.client import TrainyardClient


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ("[" * 5000 + "]" * 5000, "nested too deeply"),
        ("{bad", "Expecting property name"),
    ],
)
def test_a_schema_file_that_is_no_json_is_named(
    content: str,
    says: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    sent: list[httpx.Request] = []

    def make(base_url: str, token: str, timeout: float = 10) -> TrainyardClient:
        transport = httpx.MockTransport(lambda r: sent.append(r) or httpx.Response(500))
        return TrainyardClient(base_url, token, timeout, transport=transport)

    monkeypatch.setattr(cli, "TrainyardClient", make)
    monkeypatch.setenv("TRAINYARD_CONFIG", str(tmp_path / "config.json"))
    monkeypatch.setenv("TRAINYARD_TOKEN", "ty_a")
    monkeypatch.setenv("TRAINYARD_REGISTRY_URL", "http://registry.test")
    schema = tmp_path / "schema.json"
    schema.write_text(content)
    argv = ["dataset", "register", "ml/digits", "--uri", "s3://d/x", "--sha256", "a" * 64]
    code = cli.main([*argv, "--size", "1", "--schema", str(schema)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith(f"trainyard: error: --schema: cannot read {schema} as JSON: ")
    assert says in err and "Error" not in err and len(err.splitlines()) == 1
    assert sent == []

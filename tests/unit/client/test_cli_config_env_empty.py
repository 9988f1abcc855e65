"""An empty ``TRAINYARD_CONFIG`` means the default config file, as an empty
``TRAINYARD_URL``, ``TRAINYARD_TOKEN`` or ``TRAINYARD_CONTEXT`` means none. It was read as
the path ``.`` (the current folder): ``cannot read .: not a file``, exit 1, for every
command."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainyard import cli


@pytest.mark.parametrize("empty", ["", " "])
def test_an_empty_config_variable_is_the_default_file(
    empty: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("TRAINYARD_CONFIG", empty)
    monkeypatch.chdir(tmp_path)
    default = tmp_path / ".config" / "trainyard" / "config.json"
    default.parent.mkdir(parents=True, mode=0o700)
    default.write_text('{"current": "home", "contexts": {"home": {"url": "http://h.test"}}}')
    default.chmod(0o600)
    assert cli.main(["context", "ls"]) == 0
    out, err = capsys.readouterr()
    assert "home" in out and "http://h.test" in out and err == ""

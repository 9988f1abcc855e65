"""``--workdir`` names a folder to pack: one that is missing or is a file is a usage error
naming the option, before any request. It was "trainyard: error: /nonexistent is not a
directory" with exit 1, naming no option."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from trainyard import cli
from trainyard.cli_base import Exit

BASE = ["--url", "http://127.0.0.1:9", "--token", "ty_a"]


@pytest.mark.parametrize("command", ["submit", "sweep"])
@pytest.mark.parametrize("where", ["missing", "a-file"])
def test_a_workdir_that_is_no_folder_is_a_usage_error_naming_it(
    command: str,
    where: str,
    tmp_path: Path,
    sent: list[httpx.Request],
    capsys: pytest.CaptureFixture[str],
) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text("name: a\ngpus: 1\ngpu_flavor: cpu\nentrypoint: m\n")
    workdir = tmp_path / where
    if where == "a-file":
        workdir.write_text("x")
    extra = ["--grid", "lr=1,2"] if command == "sweep" else []
    with pytest.raises(SystemExit) as exited:
        cli.main([*BASE, command, str(spec), "--workdir", str(workdir), *extra])
    assert exited.value.code == Exit.USAGE
    err = capsys.readouterr().err
    assert "argument --workdir:" in err and f"{workdir!s}" in err and "not a folder" in err
    assert sent == []

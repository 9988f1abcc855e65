"""``submit`` checks the spec against the code it packs, before anything is uploaded."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from trainyard.cli import main
from trainyard.cli_base import Exit

HEAD = "apiVersion: trainyard.dev/v1\nkind: Job\nname: a\ngpus: 1\ngpu_flavor: cpu\n"


def submit(
    tmp_path: Path, spec: str, sent: list[httpx.Request], capsys: pytest.CaptureFixture[str]
) -> tuple[int, list[str]]:
    (tmp_path / "job.yaml").write_text(HEAD + spec)
    code = main(["--token", "ty_a", "submit", str(tmp_path / "job.yaml")])
    return code, capsys.readouterr().err.splitlines()


def test_an_entrypoint_script_missing_from_the_code_is_refused_before_the_upload(
    tmp_path: Path, sent: list[httpx.Request], capsys: pytest.CaptureFixture[str]
) -> None:
    """``entrypoint: missing.py`` beside only ``train.py`` was packed, uploaded and accepted;
    the job then failed four times ("can't open file .../missing.py") before it ended."""
    (tmp_path / "train.py").write_text("print(1)\n")
    code, err = submit(tmp_path, "entrypoint: missing.py\n", sent, capsys)
    assert code == Exit.ERROR
    assert err == [
        f"trainyard: error: {tmp_path / 'job.yaml'}:6:13: entrypoint: no file missing.py in "
        f"the code packed from {tmp_path}"
    ]
    assert sent == []  # nothing uploaded, nothing submitted


def test_an_entrypoint_script_left_out_by_an_ignore_file_says_so(
    tmp_path: Path, sent: list[httpx.Request], capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "train.py").write_text("print(1)\n")
    (tmp_path / ".gitignore").write_text("scripts/\n")
    code, err = submit(tmp_path, "entrypoint: scripts/train.py\n", sent, capsys)
    assert code == Exit.ERROR
    assert err == [
        f"trainyard: error: {tmp_path / 'job.yaml'}:6:13: entrypoint: scripts/train.py is in "
        f"{tmp_path} but not packed: a .gitignore or .trainyardignore leaves it out, or a "
        "folder never packed (.git/, .venv/, __pycache__/, .trainyard/) holds it"
    ]
    assert sent == []


@pytest.mark.parametrize(
    "entrypoint",
    [
        "train.py",  # the script is there
        "pkg/run.py",
        "some.module",  # a module may come from the requirements: the runner finds out
    ],
)
def test_an_entrypoint_in_the_code_or_a_module_goes_on_to_the_upload(
    tmp_path: Path, entrypoint: str, sent: list[httpx.Request], capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "train.py").write_text("print(1)\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "run.py").write_text("print(1)\n")
    submit(tmp_path, f"entrypoint: {entrypoint}\n", sent, capsys)
    assert sent and sent[0].url.path.startswith("/v1/bundles/")

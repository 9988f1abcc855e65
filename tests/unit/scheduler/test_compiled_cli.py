"""``python -m trainyard_platform.services.scheduler.compiled``: what it cannot do is one
line on stderr and exit 1, never a traceback (the image build's log is what an operator
reads)."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainyard_platform.services.scheduler.compiled import copy_for_compiling, main

REPO = Path(__file__).parents[3]


def test_a_root_without_the_package_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--root", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "must hold trainyard_platform/" in err
    assert "Traceback" not in err


def test_an_interpreter_that_does_not_exist_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = copy_for_compiling(REPO, tmp_path)
    missing = str(tmp_path / "no-such-python")
    assert main(["--root", str(root), "--with", missing]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and missing in err
    assert "Traceback" not in err

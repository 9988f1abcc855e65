"""Ctrl-C at any moment of a command is ``interrupted`` on stderr and exit 130, no traceback.

``trainyard.cli.main`` caught ``KeyboardInterrupt`` only once it ran the command: one that
came while the command line was being imported (about half a second of every command's
start) or while its parser was built was a traceback. The installed ``trainyard`` command is
``trainyard.launch:main``, which catches it before importing anything of the client."""

from __future__ import annotations

import importlib.abc
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

import pytest

from trainyard import cli, launch
from trainyard.cli_base import Exit


class _CtrlCOnImport(importlib.abc.MetaPathFinder):
    """Ctrl-C pressed while ``trainyard.cli`` is being imported."""

    def find_spec(
        self, name: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if name == "trainyard.cli":
            raise KeyboardInterrupt
        return None


def test_ctrl_c_while_the_command_line_is_imported(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delitem(sys.modules, "trainyard.cli")
    monkeypatch.delattr("trainyard.cli")  # the package's attribute: the import runs again
    monkeypatch.setattr(sys, "meta_path", [_CtrlCOnImport(), *sys.meta_path])
    assert launch.main() == Exit.INTERRUPTED == launch.INTERRUPTED
    assert capsys.readouterr().err == "interrupted\n"


def test_ctrl_c_while_the_parser_is_built(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def interrupted() -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_parser", interrupted)
    assert cli.main(["ls"]) == Exit.INTERRUPTED
    assert capsys.readouterr().err == "interrupted\n"


def test_the_entry_point_runs_the_command(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "argv", ["trainyard", "version", "--json"])
    assert launch.main() == Exit.OK
    assert '"client"' in capsys.readouterr().out

"""deploy/README.md's options of the local stack's ``demo`` and ``up`` are the parser's.

It listed ``--spans`` ("also write spans to spans.jsonl") for ``up``: the parser refuses it
(spans are written unless ``--no-spans`` is given), and ``--fresh`` was missing."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from trainyard_platform.deploy.local.__main__ import _parser

README = (Path(__file__).resolve().parents[3] / "deploy" / "README.md").read_text()


def _bullet(command: str) -> str:
    """The bullet of deploy/README.md that starts with ``* `command` ``."""
    start = README.index(f"* `{command}` works in")
    return README[start : README.index("\n* ", start)]


def _options(command: str) -> set[str]:
    [sub] = [a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction)]
    parser = sub.choices[command]
    return {o for a in parser._actions for o in a.option_strings if o.startswith("--")} - {"--help"}


@pytest.mark.parametrize("command", ["demo", "up"])
def test_the_documented_options_are_the_parser_s(command: str) -> None:
    documented = set(re.findall(r"`(--[a-z][a-z-]*)", _bullet(command)))
    assert documented == _options(command)

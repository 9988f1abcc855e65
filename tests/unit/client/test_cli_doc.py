"""docs/cli.md lists every command of the ``trainyard`` parser with every option it takes,
and no document names a command the parser does not have.

The synopsis had no ``trace``, ``tokens``, ``token``, ``user`` (beyond ``token ...`` and
``user ...``), ``audit`` or ``deadletters`` line, and left out options such as ``submit
--workdir``/``--no-code``/``--idempotency-key``, ``login --scheduler-url``, ``metrics
--points``; docs/dashboard.md told users to run ``trainyard tokens create``, which the
parser refuses (``tokens`` lists; ``token create`` creates).

The synopsis is the first fenced block of docs/cli.md. Each ``trainyard COMMAND ...`` on a
line (lines that start with blanks continue the one above) is a command followed by its
arguments; `` | `` starts another subcommand of the same command (``model ls ... | show
...``) or, when its first word is no subcommand, more of the same one (``[--token T |
--token-stdin]``)."""

from __future__ import annotations

import argparse
import re
from collections import defaultdict
from pathlib import Path

import pytest

from trainyard.cli import _parser

ROOT = Path(__file__).resolve().parents[3]
CLI_DOC = (ROOT / "docs" / "cli.md").read_text()
GLOBAL = frozenset({"-h", "--help", "--url", "--token", "--context", "--json"})
"""Options every command takes, documented once under "Contexts" and "Output"."""
_OPTION = re.compile(r"(?<![\w-])(--?[a-z][\w-]*)")


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def leaves(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> list[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """(command path, parser) of every command that runs something, aliases left out."""
    found = []
    seen: set[int] = set()
    for name, sub in _subcommands(parser).items():
        if id(sub) in seen:
            continue
        seen.add(id(sub))
        found.extend(leaves(sub, (*path, name)) if _subcommands(sub) else [((*path, name), sub)])
    return found


PARSER = _parser()
LEAVES = leaves(PARSER)


def synopsis() -> dict[tuple[str, ...], set[str]]:
    """Each command path of the synopsis -> the options written with it."""
    block = CLI_DOC[CLI_DOC.index("```\n") + 4 :]
    block = block[: block.index("```")]
    lines: list[str] = []
    for line in block.splitlines():
        if line.startswith((" ", "\t")) and lines:
            lines[-1] += " " + line.strip()
        else:
            lines.append(line)
    documented: dict[tuple[str, ...], set[str]] = defaultdict(set)
    for line in lines:
        for piece in re.split(r"(?:^|\s)trainyard\s", line)[1:]:
            top, _, rest = piece.partition(" ")
            path: tuple[str, ...] = ()
            for segment in rest.split(" | "):
                words = segment.split()
                parser = _subcommands(PARSER).get(top)
                candidate: tuple[str, ...] = (top,)
                while parser is not None and words and words[0] in _subcommands(parser):
                    parser = _subcommands(parser)[words[0]]
                    candidate = (*candidate, words.pop(0))
                if len(candidate) > 1 or not path:
                    path = candidate
                documented[path] |= set(_OPTION.findall(segment))
    return documented


SYNOPSIS = synopsis()


@pytest.mark.parametrize(("path", "parser"), LEAVES, ids=[" ".join(p) for p, _ in LEAVES])
def test_every_command_and_option_is_in_the_synopsis(
    path: tuple[str, ...], parser: argparse.ArgumentParser
) -> None:
    name = "trainyard " + " ".join(path)
    assert path in SYNOPSIS, f"{name} is not in docs/cli.md's synopsis"
    for action in parser._actions:
        strings = set(action.option_strings)
        if strings and not strings & GLOBAL:
            assert strings & SYNOPSIS[path], f"{name}: {'/'.join(strings)} is not in the synopsis"


def test_the_synopsis_names_only_commands_there_are() -> None:
    known = {path[: i + 1] for path, _ in LEAVES for i in range(len(path))}
    assert sorted(set(SYNOPSIS) - known) == []


def _mentions() -> list[tuple[str, str]]:
    """(file, words after ``trainyard``) of every command a document names: in inline code,
    or at the start of a line (a command of a fenced block)."""
    found = []
    for doc in [ROOT / "README.md", ROOT / "deploy" / "README.md", *(ROOT / "docs").glob("*.md")]:
        text = doc.read_text()
        fenced = [line.strip() for line in text.splitlines() if not line.startswith("|")]
        for code in [*re.findall(r"`([^`\n]+)`", text), *fenced]:
            for mention in re.findall(r"(?:^|\$\(|bin/)trainyard ([a-z][a-z -]*)", code):
                found.append((doc.name, mention.split("  ")[0]))  # a synopsis line goes on
    return found


@pytest.mark.parametrize(("doc", "words"), _mentions())
def test_documents_name_only_commands_there_are(doc: str, words: str) -> None:
    """A word after a command that has subcommands must be one of them, and a command that
    takes no argument but options is followed by nothing else."""
    parser = PARSER
    said = ["trainyard"]
    for word in words.split():
        if word.startswith("-"):
            break
        subcommands = _subcommands(parser)
        if subcommands:
            assert word in subcommands, f"{doc}: `{' '.join(said)} {word}` is no command"
            parser = subcommands[word]
            said.append(word)
            continue
        takes_arguments = any(not a.option_strings for a in parser._actions)
        assert takes_arguments, f"{doc}: `{' '.join(said)}` takes no {word!r}"
        break


def _command_lines() -> list[tuple[str, str]]:
    """(file, the words after ``trainyard``) of every command line a document shows, in
    inline code or a fenced block, up to a comment or a `` | `` (another subcommand of a
    synopsis line)."""
    found = []
    for doc in [ROOT / "README.md", ROOT / "deploy" / "README.md", *(ROOT / "docs").glob("*.md")]:
        text = doc.read_text()
        fenced = [line.strip() for line in text.splitlines() if not line.startswith("|")]
        for code in [*re.findall(r"`([^`\n]+)`", text), *fenced]:
            for rest in re.findall(r"(?:^|\$\(|bin/)trainyard ([a-z].*)", code):
                line = re.split(r"\s#|\s\|\s|\)|`", rest)[0]
                found.append((doc.name, line.split("  ")[0]))  # a synopsis line goes on
    return found


@pytest.mark.parametrize(("doc", "line"), _command_lines())
def test_documents_give_commands_only_options_they_take(doc: str, line: str) -> None:
    """Each ``--option`` a document writes after a command is one that command takes (or one
    every command takes): `test_documents_name_only_commands_there_are` checks the words
    before the options, this the options."""
    parser = PARSER
    words = line.split()
    while words and not words[0].startswith("-") and words[0] in _subcommands(parser):
        parser = _subcommands(parser)[words.pop(0)]
    taken = {s for action in parser._actions for s in action.option_strings} | GLOBAL
    given = {
        option.split("=")[0].rstrip(".,;:]")
        for word in words
        for option in word.strip("[]").split("|")
        if option.startswith("--")
    }
    assert sorted(given - taken) == [], f"{doc}: trainyard {line}"

"""Every argument a command takes is named in its usage and errors as docs/cli.md names it:
`trainyard submit` said `the following arguments are required: file` while the docs (and
`sweep`'s own help) call it SPEC; `context use` and `logout` said `name` for CTX."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from trainyard import cli


def _positionals(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[str, str]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _positionals(sub, (*path, name))
        elif not action.option_strings and action.dest != "help":
            # One of fixed choices too: its usage shows them, but a missing one is named by
            # its metavar, else its dest (`user role` said `NAME, role`).
            yield " ".join(path), str(action.metavar or action.dest)


def test_every_positional_argument_is_named_in_capitals() -> None:
    lower = [(cmd, name) for cmd, name in _positionals(cli._parser()) if name != name.upper()]
    assert lower == []


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["submit"], "SPEC"),
        (["sweep"], "SPEC"),
        (["context", "use"], "CTX"),
        (["token", "revoke"], "ID"),
        (["deadletters", "show"], "SEQ"),
        (["user", "role"], "NAME, ROLE"),
    ],
)
def test_a_missing_argument_is_named_as_the_docs_name_it(
    argv: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        cli.main(argv)
    assert f"the following arguments are required: {named}" in capsys.readouterr().err

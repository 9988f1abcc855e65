"""``trainyard deadletters``: an operator's view of one service's dead letters.

    trainyard deadletters list [--reason TEXT] [--after SEQ] [--limit N]
    trainyard deadletters show SEQ
    trainyard deadletters redrive SEQ... | --all [--reason TEXT]
    trainyard deadletters discard SEQ... | --all [--reason TEXT]

Every service keeps the dead letters of its own consumer (``shared.deadletters``), so
``--url`` names that service (e.g. ``http://registry:8083``) and ``--token`` its operator
token (or an operator's user token; none: a context's own service URL, stored by ``login
--registry-url`` ..., gets the context's token). ``redrive`` republishes each to its consumer and
removes it; ``discard`` removes it. ``--all`` acts on every dead letter there is when the
command starts (those with ``--reason`` in their reason), never on one that fails again
meanwhile. ``--json`` prints the API's JSON.

``add_deadletter_commands(commands, common)`` adds the command to the ``trainyard`` parser;
``run_deadletters(client, args)`` runs it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from typing import Any

from trainyard.cli_base import ID_MAX, CliError, Exit, whole_arg
from trainyard.client import Answer, TrainyardClient, TrainyardError, malformed

_PAGE = 200
PAGE_MAX = 500
"""The most dead letters ``GET /v1/deadletters`` answers in one page (its ``limit``)."""


def add_deadletter_commands(
    commands: Any,
    common: argparse.ArgumentParser,
) -> None:
    """Add ``deadletters`` (and its actions) to the CLI's sub-commands; ``common`` holds the
    shared options (``--url``, ``--token``, ``--json``)."""
    command = commands.add_parser(
        "deadletters",
        parents=[common],
        help="operators: list, show, redrive or discard a service's dead letters "
        "(--url: that service)",
    )
    actions = command.add_subparsers(dest="deadletters_action", required=True, metavar="ACTION")
    listing = actions.add_parser("list", parents=[common], help="the dead letters, oldest first")
    listing.add_argument("--reason", help="only those whose reason contains this text")
    listing.add_argument(
        "--after", type=whole_arg(0, ID_MAX), default=0, help="only those after this sequence"
    )
    listing.add_argument(
        "--limit",
        type=whole_arg(1, PAGE_MAX),
        default=50,
        help=f"at most this many, 1 to {PAGE_MAX} (default 50)",
    )
    show = actions.add_parser("show", parents=[common], help="one dead letter, with its event")
    show.add_argument("sequence", metavar="SEQ", type=whole_arg(1, ID_MAX))
    for name, what in (
        ("redrive", "hand dead letters back to their consumer"),
        ("discard", "delete dead letters for good"),
    ):
        action = actions.add_parser(name, parents=[common], help=what)
        action.add_argument("sequences", type=whole_arg(1, ID_MAX), nargs="*", metavar="SEQ")
        action.add_argument("--all", action="store_true", help="every dead letter there is now")
        action.add_argument("--reason", help="with --all: only those whose reason contains this")
    command.set_defaults(run=run_deadletters)


def run_deadletters(client: TrainyardClient, args: argparse.Namespace) -> int:
    """Run ``trainyard deadletters ACTION``; the exit status."""
    as_json = bool(getattr(args, "json", False))
    letters = _DeadLetterApi(client)
    action = args.deadletters_action
    if action == "list":
        page = letters.page(args.after, args.limit, args.reason)
        print(_dumps(page) if as_json else render_page(page))
        return 0
    if action == "show":
        letter = letters.get(args.sequence)
        print(_dumps(letter) if as_json else render_letter(letter))
        return 0
    # Usage errors (exit 2): a TrainyardError of status 0 here read as "unreachable", exit 5.
    if args.all == bool(args.sequences):
        raise CliError(f"{action}: name dead letters (SEQ...) or pass --all, not both", Exit.USAGE)
    if args.reason and not args.all:
        raise CliError(f"{action}: --reason goes with --all", Exit.USAGE)
    sequences = args.sequences or [d["sequence"] for d in letters.every(args.reason)]
    done: list[Any] = []
    failed = 0
    for sequence in sequences:
        try:
            result = letters.redrive(sequence) if action == "redrive" else letters.discard(sequence)
        except TrainyardError as exc:
            failed += 1
            print(f"trainyard: error: dead letter {sequence}: {exc}", file=sys.stderr)
            continue
        done.append(result)
        if not as_json:
            print(
                f"redriven {sequence} (event {result.get('event_id') or '?'}) to {result['subject']}"
                if action == "redrive"
                else f"discarded {sequence}"
            )
    if as_json:
        print(_dumps(done))
    elif not sequences:
        print("no dead letters")
    return 1 if failed else 0


class _DeadLetterApi:
    """``/v1/deadletters`` of the service the client talks to."""

    def __init__(self, client: TrainyardClient) -> None:
        self._client = client

    def page(self, after: int, limit: int, reason: str | None) -> Answer:
        params: dict[str, str | int] = {"after": after, "limit": limit}
        if reason:
            params["reason"] = reason
        return self._client._object("GET", "/v1/deadletters", params=params)

    def every(self, reason: str | None) -> list[dict[str, Any]]:
        """Every dead letter now (with ``reason`` in its reason), across pages."""
        found: list[dict[str, Any]] = []
        after: int | None = 0
        while after is not None:
            page = self.page(after, _PAGE, reason)
            found.extend(page["dead_letters"])
            following = page["next_after"]
            if following is not None and (type(following) is not int or following <= after):
                # Not past the page just read: asked for, it would come again, for ever.
                raise malformed(page, f"'next_after' is not past {after}: {following!r}")
            after = following
        return found

    def get(self, sequence: int) -> dict[str, Any]:
        return self._client._object("GET", f"/v1/deadletters/{sequence}")

    def redrive(self, sequence: int) -> dict[str, Any]:
        return self._client._object("POST", f"/v1/deadletters/{sequence}/redrive")

    def discard(self, sequence: int) -> dict[str, Any]:
        return self._client._object("DELETE", f"/v1/deadletters/{sequence}")


def render_page(page: dict[str, Any]) -> str:
    """A page of dead letters as a table."""
    letters = page["dead_letters"]
    if not letters:
        return f"no dead letters of {page['consumer']} ({page['total']} in all)"
    header = ("SEQ", "WHEN", "EVENT", "TYPE", "SUBJECT", "REASON")
    rows = [header] + [
        (
            str(d["sequence"]),
            (d.get("dead_lettered_at") or "-")[:19],
            d.get("event_id") or "-",
            d.get("event_type") or "-",
            d.get("event_subject") or d.get("original_subject") or "-",
            _short(d["reason"], 80),
        )
        for d in letters
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header) - 1)]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row[:-1], widths, strict=True))
        + "  "
        + row[-1]
        for row in rows
    ]
    more = f"; more after {page['next_after']}" if page.get("next_after") is not None else ""
    lines.append(
        f"{len(letters)} shown of {page['total']} dead letters of {page['consumer']}{more}"
    )
    return "\n".join(line.rstrip() for line in lines)


def render_letter(letter: dict[str, Any]) -> str:
    """One dead letter for people: where it came from, why, and the event."""
    rows = [
        ("sequence", str(letter["sequence"])),
        ("consumer", letter["consumer"]),
        ("when", letter.get("dead_lettered_at") or "-"),
        ("reason", letter["reason"]),
        ("subject", letter["original_subject"]),
        ("stream seq", str(letter.get("original_sequence") or "-")),
        ("deliveries", str(letter.get("deliveries") or "-")),
        ("event", f"{letter.get('event_id') or '-'} {letter.get('event_type') or ''}".rstrip()),
    ]
    body = str(letter["body"])
    if letter.get("body_encoding") == "utf-8":
        with contextlib.suppress(ValueError):
            body = json.dumps(json.loads(body), indent=2, sort_keys=True)
    else:
        body = f"(base64) {body}"
    return "\n".join(f"{label:<12}{value}" for label, value in rows) + "\n" + body


def _short(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _dumps(value: object) -> str:
    return json.dumps(value, indent=2, sort_keys=True)

"""``trainyard admin``: the scheduler's governance (flavors, cohorts, queues and their quotas,
priority classes) and billing's price book, without hand-written JSON.

    trainyard admin flavors ls | show NAME | set NAME [--description D] | rm NAME
    trainyard admin cohorts ls | show NAME | set NAME [--description D] | rm NAME
    trainyard admin queues ls | show NAME | rm NAME
    trainyard admin queues set NAME --team T [--cohort C] [--weight W]
        [--quota FLAVOR=N]... [--borrow FLAVOR=N]... [--lend FLAVOR=N]...
    trainyard admin priority-classes ls | show NAME | rm NAME
    trainyard admin priority-classes set NAME --value N --preemptible|--no-preemptible
        [--min-runtime S] [--description D]
    trainyard admin prices ...                     billing's prices (``cli_prices``)

Each kind is the scheduler's ``/v1/admin/{kind}`` routes: ``ls`` every page of ``GET
/v1/admin/{kind}`` (the ``Link`` header followed), ``show`` ``GET .../{name}``, ``set`` ``PUT
.../{name}`` and ``rm`` ``DELETE .../{name}``; ``--json`` prints the scheduler's answer
(``rm``: ``{"removed": NAME}``). ``set`` sends the whole definition, as ``PUT`` replaces it:
what it leaves out takes the route's default (no cohort, weight 1, no quotas, an empty
description). Reads are open to every user; writes are the operators' (403 for anyone else).

What the command line alone shows to be wrong is a usage error before any request (exit 2):
a ``--quota h200=abc`` (no whole number), a flavor given twice to one option, a ``--borrow``
or ``--lend`` of a flavor without a ``--quota``, a weight or a runtime that is no finite
number. The values themselves (bounds, names, a cohort that exists) are the scheduler's to
judge: its refusal is one line, ``scheduler: 422 invalid request (quotas.h200.nominal:
...)``, with the exit code of its status (403: 4, 404: 3, 409 a cohort with queues: 1).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trainyard import cli_prices
from trainyard.cli_base import CliError, Exit, Session, asked
from trainyard.cli_render import table, time_text
from trainyard.client import segment

Row = tuple[object, ...]


def count_arg(value: str) -> tuple[str, int]:
    """``FLAVOR=N`` (``--quota``, ``--borrow``, ``--lend``): a flavor and a whole number of
    GPUs. Its bounds are the scheduler's to judge."""
    flavor, sep, number = value.partition("=")
    if not sep or not flavor.strip():
        raise argparse.ArgumentTypeError(f"{value!r} is not FLAVOR=N")
    try:
        return flavor, int(number)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{value!r}: {number!r} is not a whole number of GPUs"
        ) from None


def finite_arg(value: str) -> float:
    """A number (``--weight``, ``--min-runtime``): NaN and infinity, which JSON has no
    number for, are refused; its bounds are the scheduler's to judge."""
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not math.isfinite(number):
        raise argparse.ArgumentTypeError(f"{value!r} is not a finite number")
    return number


@dataclass(frozen=True)
class Kind:
    """One kind of the scheduler's configuration: its command and route (``queues``), what
    one is called (``queue``), its table, its ``set`` options and the body they make."""

    name: str
    noun: str
    header: tuple[str, ...]
    row: Callable[[dict[str, Any]], Row]
    options: Callable[[argparse.ArgumentParser], None]
    body: Callable[[argparse.Namespace], dict[str, Any]]

    def path(self, name: str | None = None) -> str:
        return f"/v1/admin/{self.name}" + ("" if name is None else f"/{segment(name)}")


def _description_option(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--description", help="what it is for (up to 1000 characters)")


def _described(args: argparse.Namespace) -> dict[str, Any]:
    return {} if args.description is None else {"description": args.description}


def _queue_options(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--team", required=True, help="the team whose jobs the queue holds")
    sub.add_argument("--cohort", help="the cohort it lends to and borrows from")
    sub.add_argument("--weight", type=finite_arg, help="its fair share in the cohort (1)")
    for option, text in (
        ("--quota", "GPUs of FLAVOR the queue is guaranteed (repeat per flavor)"),
        ("--borrow", "most GPUs of FLAVOR it may borrow beyond its quota (default: no limit)"),
        ("--lend", "most of its unused quota of FLAVOR it lends (default: all of it)"),
    ):
        sub.add_argument(option, action="append", type=count_arg, metavar="FLAVOR=N", help=text)


def _queue_body(args: argparse.Namespace) -> dict[str, Any]:
    """The body of ``PUT /v1/admin/queues/{name}``: each flavor's quota from ``--quota``, its
    limits from ``--borrow`` and ``--lend`` (usage errors: a flavor twice to one option, a
    limit without a quota)."""
    quotas: dict[str, dict[str, int]] = {}
    for option, field in (
        ("quota", "nominal"),
        ("borrow", "borrowing_limit"),
        ("lend", "lending_limit"),
    ):
        for flavor, number in getattr(args, option) or []:
            if option != "quota" and flavor not in quotas:
                raise CliError(
                    f"--{option} {flavor}={number}: give --quota {flavor}=N too", Exit.USAGE
                )
            if field in quotas.setdefault(flavor, {}):
                raise CliError(f"--{option} names {flavor} twice", Exit.USAGE)
            quotas[flavor][field] = number
    body: dict[str, Any] = {"team": args.team, "quotas": quotas}
    if args.cohort is not None:
        body["cohort"] = args.cohort
    if args.weight is not None:
        body["weight"] = args.weight
    return body


def _class_options(sub: argparse.ArgumentParser) -> None:
    sub.add_argument(
        "--value", type=int, required=True, help="higher runs first, may preempt lower"
    )
    sub.add_argument(
        "--preemptible",
        action=argparse.BooleanOptionalAction,
        required=True,
        help="whether a job of the class may be preempted",
    )
    sub.add_argument(
        "--min-runtime",
        type=finite_arg,
        metavar="SECONDS",
        help="seconds a job runs before it may be preempted (0)",
    )
    _description_option(sub)


def _class_body(args: argparse.Namespace) -> dict[str, Any]:
    body: dict[str, Any] = {"value": args.value, "preemptible": args.preemptible}
    if args.min_runtime is not None:
        body["min_runtime_seconds"] = args.min_runtime
    return {**body, **_described(args)}


def quotas_text(quotas: dict[str, Any]) -> str:
    """A queue's quotas on one line, by flavor: ``h200=8 (borrow 4, lend 2)``; ``-``: none."""
    parts = []
    for flavor, quota in sorted(quotas.items()):
        limits = [
            f"{word} {quota[field]}"
            for word, field in (("borrow", "borrowing_limit"), ("lend", "lending_limit"))
            if quota.get(field) is not None
        ]
        parts.append(f"{flavor}={quota['nominal']}" + (f" ({', '.join(limits)})" if limits else ""))
    return ", ".join(parts) or "-"


def _one_line(text: str) -> str:
    return " ".join(text.split()) or "-"


KINDS = (
    Kind(
        "flavors",
        "flavor",
        ("NAME", "NODES", "READY", "GPUS", "READY GPUS", "DESCRIPTION"),
        lambda f: (
            f["name"],
            f["nodes"],
            f["ready_nodes"],
            f["gpus"],
            f["ready_gpus"],
            _one_line(f["description"]),
        ),
        _description_option,
        _described,
    ),
    Kind(
        "cohorts",
        "cohort",
        ("NAME", "QUEUES", "UPDATED", "DESCRIPTION"),
        lambda c: (
            c["name"],
            ", ".join(c["queues"]) or "-",
            time_text(c["updated_at"]),
            _one_line(c["description"]),
        ),
        _description_option,
        _described,
    ),
    Kind(
        "queues",
        "queue",
        ("NAME", "TEAM", "COHORT", "WEIGHT", "QUOTAS"),
        lambda q: (
            q["name"] + (" (implicit)" if q["implicit"] else ""),
            q["team"],
            q["cohort"] or "-",
            f"{q['weight']:g}",
            quotas_text(q["quotas"]),
        ),
        _queue_options,
        _queue_body,
    ),
    Kind(
        "priority-classes",
        "priority class",
        ("NAME", "VALUE", "PREEMPTIBLE", "MIN RUNTIME", "DESCRIPTION"),
        lambda p: (
            p["name"],
            p["value"],
            "yes" if p["preemptible"] else "no",
            f"{p['min_runtime_seconds']:g}s",
            _one_line(p["description"]),
        ),
        _class_options,
        _class_body,
    ),
)


def add_commands(
    command: Callable[..., argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    """Add ``admin KIND ls|show|set|rm`` for each of ``KINDS`` and ``admin prices`` to the
    CLI's commands (``common``: the options every command takes)."""
    admin = command(
        "admin", None, "the scheduler's flavors, cohorts, queues, priority classes; prices"
    )
    kinds = admin.add_subparsers(dest="kind", required=True, metavar="KIND")
    for kind in KINDS:
        _add_kind(kinds, kind, common)
    cli_prices.add_commands(kinds, common)


def _add_kind(
    kinds: argparse._SubParsersAction[argparse.ArgumentParser],
    kind: Kind,
    common: argparse.ArgumentParser,
) -> None:
    text = f"the scheduler's {kind.name.replace('-', ' ')} (writes: operators)"
    sub = kinds.add_parser(kind.name, parents=[common], help=text, description=text)
    actions = sub.add_subparsers(dest="action", required=True, metavar="ACTION")

    def action(name: str, run: Callable[[Session], int], text: str) -> argparse.ArgumentParser:
        parser = actions.add_parser(name, parents=[common], help=text, description=text)
        parser.set_defaults(run=run)
        return parser

    action("ls", _lister(kind), f"every {kind.noun}")
    show = action("show", _shower(kind), f"one {kind.noun}")
    show.add_argument("name", metavar="NAME")
    put = action(
        "set", _setter(kind), f"create a {kind.noun} or replace its whole definition (operators)"
    )
    put.add_argument("name", metavar="NAME")
    kind.options(put)
    rm = action("rm", _remover(kind), f"delete a {kind.noun} (operators)")
    rm.add_argument("name", metavar="NAME")


def _lister(kind: Kind) -> Callable[[Session], int]:
    def run(session: Session) -> int:
        rows = asked("scheduler", lambda: session.service("scheduler").get_all(kind.path()))
        # In the scheduler's order: by name, priority classes highest value first.
        session.emit(
            rows,
            lambda: table(kind.header, [kind.row(r) for r in rows], empty=f"no {kind.name}"),
        )
        return Exit.OK

    return run


def _shower(kind: Kind) -> Callable[[Session], int]:
    def run(session: Session) -> int:
        path = kind.path(session.args.name)
        found = asked("scheduler", lambda: session.service("scheduler").get(path))
        session.emit(found, lambda: table(kind.header, [kind.row(found)]))
        return Exit.OK

    return run


def _setter(kind: Kind) -> Callable[[Session], int]:
    def run(session: Session) -> int:
        body = kind.body(session.args)  # usage errors before any request
        path = kind.path(session.args.name)
        found = asked("scheduler", lambda: session.service("scheduler").call("PUT", path, body))
        response = getattr(found, "response", None)
        done = "created" if response is not None and response.status_code == 201 else "set"
        session.emit(
            found,
            lambda: f"{done} {kind.noun} {found['name']}\n" + table(kind.header, [kind.row(found)]),
        )
        return Exit.OK

    return run


def _remover(kind: Kind) -> Callable[[Session], int]:
    def run(session: Session) -> int:
        name = session.args.name
        asked("scheduler", lambda: session.service("scheduler").delete(kind.path(name)))
        session.emit({"removed": name}, lambda: f"removed {kind.noun} {name}")
        return Exit.OK

    return run

"""``trainyard admin``: the scheduler's governance (flavors, cohorts, queues and their quotas,
priority classes) and billing's price book, without hand-written JSON.

    trainyard admin flavors ls | show NAME | set NAME [--description D] | rm NAME
    trainyard admin cohorts ls | show NAME | set NAME [--description D] | rm NAME
    trainyard admin queues ls | show NAME | rm NAME
    trainyard admin queues set NAME [--team T] [--cohort C | --no-cohort] [--weight W]
        [--quota FLAVOR=N]... [--borrow FLAVOR=N|none]... [--lend FLAVOR=N|none]...
        [--remove-quota FLAVOR]... [--replace]
    trainyard admin priority-classes ls | show NAME | rm NAME
    trainyard admin priority-classes set NAME [--value N] [--preemptible|--no-preemptible]
        [--min-runtime S] [--description D] [--replace]
    trainyard admin node-inventory ls | show NODE | rm NODE          (operators)
    trainyard admin node-inventory set NODE [--flavor F] [--gpus N]
        [--topology T | --no-topology] [--description D] [--replace]
    trainyard admin prices ...                     billing's prices (``cli_prices``)

Each kind is the scheduler's ``/v1/admin/{kind}`` routes: ``ls`` every page of ``GET
/v1/admin/{kind}`` (the ``Link`` header followed), ``show`` ``GET .../{name}``, ``set`` ``PUT
.../{name}`` and ``rm`` ``DELETE .../{name}``; ``--json`` prints the scheduler's answer
(``rm``: ``{"removed": NAME}``). Reads are open to every user but the node inventory's;
writes are the operators' (403 for anyone else).

The node inventory declares what each node has (its flavor, GPU count and, optionally, its
topology), by node id: the scheduler never places more on a node than its declaration,
whatever its runner's heartbeat claims, and ``show`` prints what the node claims and each
field the declaration caps (docs/security.md, "A compromised runner node").

``set`` of a queue, a priority class or a node's declaration that exists changes only what its options name and
keeps the rest (``PATCH``, a JSON Merge Patch the scheduler applies under its lock: no other
change falls between reading and writing): ``queues set vision --weight 2`` keeps the team,
cohort and quotas; ``--quota``, ``--borrow`` and ``--lend`` change that flavor's figure
alone, ``none`` lifts a limit, ``--remove-quota`` drops a flavor's quota, ``--no-cohort``
leaves the cohort. When there is none yet (404), ``set`` creates it with ``PUT`` (a queue
then needs ``--team``, a class ``--value`` and ``--preemptible``, or the scheduler names
what is missing; a declaration ``--flavor`` and ``--gpus``); that ``PUT`` says ``If-None-Match: *``, so one another admin created since
the patch is not replaced: the scheduler answers 412 and ``set`` patches it instead, once
(``cli_base.patch_or_create``). ``--replace`` sends the whole definition with ``PUT``
instead: what it leaves out takes the route's default (no cohort, weight 1, no quotas, an
empty description).
A flavor's or a cohort's only field is its description, so their ``set`` is always a ``PUT``.

``show`` prints the resource's ``etag`` last (the scheduler's ``ETag``). ``set`` and ``rm``
with ``--if-match ETAG`` send it as ``If-Match``: the change goes ahead only while the
resource is as ``show`` printed it. When another operator changed it since, the scheduler
refuses (412) and nothing changes: the command says so in one line, and to run ``show``
again (exit 1). With ``--if-match``, ``set`` of a queue or a class only patches (one
deleted since is a 404, not created again). Without it, as before.

What the command line alone shows to be wrong is a usage error before any request (exit 2):
a ``--quota h200=abc`` (no whole number), a flavor given twice to one option or both set and
removed, a weight or a runtime that is no finite number; and, for a ``PUT``, a ``--borrow``
or ``--lend`` of a flavor without a ``--quota``. The values themselves (bounds, names, a cohort that exists) are the scheduler's to
judge: its refusal is one line, ``scheduler: 422 invalid request (quotas.h200.nominal:
...)``, with the exit code of its status (403: 4, 404: 3, 409 a cohort with queues: 1), each
field an option sets named by that option (``--gpus (gpu_count): must be at least 0``,
``Kind.named``).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trainyard import cli_prices
from trainyard.cli_base import (
    CliError,
    Exit,
    Session,
    add_if_match,
    asked,
    created,
    if_match,
    patch_or_create,
)
from trainyard.cli_render import none_yet, table, time_text
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


def limit_arg(value: str) -> tuple[str, int | None]:
    """``FLAVOR=N`` or ``FLAVOR=none`` (``--borrow``, ``--lend``): a limit, or none."""
    flavor, sep, number = value.partition("=")
    if sep and flavor.strip() and number.strip().lower() == "none":
        return flavor, None
    return count_arg(value)


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
    patch: Callable[[argparse.Namespace], dict[str, Any]] | None = None
    """The merge patch of ``set``'s options, for a kind the scheduler patches (None: ``set``
    is always a ``PUT``)."""
    create: str = "NAME"
    """What ``set`` needs to create one (an empty ``ls`` says it)."""
    key: str = "name"
    """The field of a view that names it (its path's last segment)."""
    readers: str = "every user"
    """Who may read them (writes are the operators')."""
    named: tuple[tuple[str, str], ...] = ()
    """Each field of the body and the option that sets it, by which a refusal of ``set``
    names the field (``cli_base.optioned``): ``--gpus (gpu_count): ...``."""

    def path(self, name: str | None = None) -> str:
        return f"/v1/admin/{self.name}" + ("" if name is None else f"/{segment(name)}")


def _description_option(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--description", help="what it is for (up to 1000 characters)")


def _described(args: argparse.Namespace) -> dict[str, Any]:
    return {} if args.description is None else {"description": args.description}


def _queue_options(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--team", help="the team whose jobs the queue holds (to create it)")
    cohort = sub.add_mutually_exclusive_group()
    cohort.add_argument("--cohort", help="the cohort it lends to and borrows from")
    cohort.add_argument("--no-cohort", action="store_true", help="leave its cohort")
    sub.add_argument("--weight", type=finite_arg, help="its fair share in the cohort (1)")
    sub.add_argument(
        "--quota",
        action="append",
        type=count_arg,
        metavar="FLAVOR=N",
        help="GPUs of FLAVOR the queue is guaranteed (repeat per flavor)",
    )
    for option, text in (
        ("--borrow", "most GPUs of FLAVOR it may borrow beyond its quota (none: no limit)"),
        ("--lend", "most of its unused quota of FLAVOR it lends (none: all of it)"),
    ):
        sub.add_argument(
            option, action="append", type=limit_arg, metavar="FLAVOR=N|none", help=text
        )
    sub.add_argument(
        "--remove-quota", action="append", metavar="FLAVOR", help="drop its quota of FLAVOR"
    )
    _replace_option(sub)


def _replace_option(sub: argparse.ArgumentParser) -> None:
    sub.add_argument(
        "--replace",
        action="store_true",
        help="send the whole definition (PUT): what the options leave out takes its default",
    )


_QUOTA_FIELDS = (("quota", "nominal"), ("borrow", "borrowing_limit"), ("lend", "lending_limit"))


def _quota_figures(args: argparse.Namespace) -> dict[str, dict[str, int | None]]:
    """Each flavor's figures from ``--quota``, ``--borrow`` and ``--lend`` (usage error: a
    flavor twice to one option)."""
    quotas: dict[str, dict[str, int | None]] = {}
    for option, field in _QUOTA_FIELDS:
        for flavor, number in getattr(args, option) or []:
            if field in quotas.setdefault(flavor, {}):
                raise CliError(f"--{option} names {flavor} twice", Exit.USAGE)
            quotas[flavor][field] = number
    return quotas


def _queue_body(args: argparse.Namespace) -> dict[str, Any]:
    """The body of ``PUT /v1/admin/queues/{name}``: each flavor's quota from ``--quota``, its
    limits from ``--borrow`` and ``--lend`` (usage error: a limit without a quota); what is
    not given is left out, for the scheduler to default or to name as missing."""
    quotas = _quota_figures(args)
    for flavor, figures in quotas.items():
        if "nominal" not in figures:
            option, number = next((o, figures[f]) for o, f in _QUOTA_FIELDS if f in figures)
            raise CliError(f"--{option} {flavor}={number}: give --quota {flavor}=N too", Exit.USAGE)
    body: dict[str, Any] = {
        "quotas": {
            flavor: {k: v for k, v in figures.items() if v is not None}
            for flavor, figures in quotas.items()
        }
    }
    for option, name in _QUEUE_FIELDS:
        if getattr(args, option) is not None:
            body[name] = getattr(args, option)
    return body


def _queue_patch(args: argparse.Namespace) -> dict[str, Any]:
    """The merge patch of ``PATCH /v1/admin/queues/{name}``: only what the options name
    (usage error: a flavor both set and removed)."""
    quotas: dict[str, Any] = dict(_quota_figures(args))
    for flavor in args.remove_quota or []:
        if flavor in quotas:
            raise CliError(
                f"--remove-quota {flavor}: --quota, --borrow or --lend set it", Exit.USAGE
            )
        quotas[flavor] = None
    patch: dict[str, Any] = {"quotas": quotas} if quotas else {}
    for option in ("team", "cohort", "weight"):
        if getattr(args, option) is not None:
            patch[option] = getattr(args, option)
    if args.no_cohort:
        patch["cohort"] = None
    return patch


def _class_options(sub: argparse.ArgumentParser) -> None:
    sub.add_argument(
        "--value", type=int, help="higher runs first, may preempt lower (to create it)"
    )
    sub.add_argument(
        "--preemptible",
        action=argparse.BooleanOptionalAction,
        help="whether a job of the class may be preempted (to create it)",
    )
    sub.add_argument(
        "--min-runtime",
        type=finite_arg,
        metavar="SECONDS",
        help="seconds a job runs before it may be preempted (0)",
    )
    _description_option(sub)
    _replace_option(sub)


_CLASS_FIELDS = (
    ("value", "value"),
    ("preemptible", "preemptible"),
    ("min_runtime", "min_runtime_seconds"),
)
"""Each option of ``priority-classes set`` (its ``dest``) and the field it sets."""


def _class_body(args: argparse.Namespace) -> dict[str, Any]:
    """The body of a ``PUT`` (or the patch) of a priority class: the options given."""
    body: dict[str, Any] = {}
    for option, name in _CLASS_FIELDS:
        if getattr(args, option) is not None:
            body[name] = getattr(args, option)
    return {**body, **_described(args)}


def _node_options(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--flavor", help="its GPUs' flavor (to declare it)")
    sub.add_argument("--gpus", type=int, help="the most GPUs it is placed on (to declare it)")
    topology = sub.add_mutually_exclusive_group()
    topology.add_argument("--topology", help="its topology domain, whatever it claims")
    topology.add_argument(
        "--no-topology", action="store_true", help="take the topology its heartbeat claims"
    )
    _description_option(sub)
    _replace_option(sub)


_NODE_FIELDS = (("flavor", "gpu_flavor"), ("gpus", "gpu_count"), ("topology", "topology"))
"""Each option of ``node-inventory set`` (its ``dest``) and the field it sets."""


def _node_body(args: argparse.Namespace) -> dict[str, Any]:
    """The body of a ``PUT`` of a node's declaration: the options given."""
    body: dict[str, Any] = {}
    for option, name in _NODE_FIELDS:
        if getattr(args, option) is not None:
            body[name] = getattr(args, option)
    return {**body, **_described(args)}


def _flags(*pairs: tuple[str, str]) -> tuple[tuple[str, str], ...]:
    """``Kind.named`` of options given as (``dest``, field) pairs."""
    return tuple((name, "--" + dest.replace("_", "-")) for dest, name in pairs)


_DESCRIBED = ("description", "description")
_QUEUE_FIELDS = (("team", "team"), ("cohort", "cohort"), ("weight", "weight"))
"""Each plain option of ``queues set`` and its field (the quotas are named by flavor)."""


def _node_patch(args: argparse.Namespace) -> dict[str, Any]:
    """The merge patch of a node's declaration: what the options name."""
    return {**_node_body(args), **({"topology": None} if args.no_topology else {})}


def claim_text(declared: dict[str, Any]) -> str:
    """What a declared node's latest heartbeat claims: ``8 h200 (rack-1), ready``; ``-``:
    never heard."""
    claim = declared.get("reported")
    if not claim:
        return "-"
    return (
        f"{claim['gpu_count']} {claim['gpu_flavor']} ({claim['topology']}), "
        f"{str(claim['status']).lower()}"
    )


def capped_text(declared: dict[str, Any]) -> str:
    """Each field the declaration caps, with what the node gets; ``-``: none."""
    return "; ".join(f"{c['field']}: {c['message']}" for c in declared.get("capped") or []) or "-"


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
        named=_flags(_DESCRIBED),
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
        named=_flags(_DESCRIBED),
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
        _queue_patch,
        "NAME --team T",
        named=_flags(*_QUEUE_FIELDS),
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
        _class_body,
        "NAME --value N --preemptible",
        named=_flags(*_CLASS_FIELDS, _DESCRIBED),
    ),
    Kind(
        "node-inventory",
        "node declaration",
        ("NODE", "FLAVOR", "GPUS", "TOPOLOGY", "CLAIMS", "CAPPED", "DESCRIPTION"),
        lambda n: (
            n["node_id"],
            n["gpu_flavor"],
            n["gpu_count"],
            n["topology"] or "(as claimed)",
            claim_text(n),
            capped_text(n),
            _one_line(n["description"]),
        ),
        _node_options,
        _node_body,
        _node_patch,
        "NODE --flavor F --gpus N",
        "node_id",
        "operators",
        named=_flags(*_NODE_FIELDS, _DESCRIBED),
    ),
)


def add_commands(
    command: Callable[..., argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    """Add ``admin KIND ls|show|set|rm`` for each of ``KINDS`` and ``admin prices`` to the
    CLI's commands (``common``: the options every command takes)."""
    admin = command(
        "admin",
        None,
        "the scheduler's flavors, cohorts, queues, priority classes, node inventory; prices",
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
    who = "operators" if kind.readers == "operators" else "writes: operators"
    text = f"the scheduler's {kind.name.replace('-', ' ')} ({who})"
    sub = kinds.add_parser(kind.name, parents=[common], help=text, description=text)
    actions = sub.add_subparsers(dest="action", required=True, metavar="ACTION")

    def action(name: str, run: Callable[[Session], int], text: str) -> argparse.ArgumentParser:
        parser = actions.add_parser(name, parents=[common], help=text, description=text)
        parser.set_defaults(run=run)
        return parser

    action("ls", _lister(kind), f"every {kind.noun}")
    metavar = kind.create.split()[0]
    show = action("show", _shower(kind), f"one {kind.noun}")
    show.add_argument("name", metavar=metavar)
    text = (
        f"create a {kind.noun} or replace its whole definition (operators)"
        if kind.patch is None
        else f"create a {kind.noun}, or change only what the options name (operators)"
    )
    put = action("set", _setter(kind), text)
    put.add_argument("name", metavar=metavar)
    kind.options(put)
    add_if_match(put)
    rm = action("rm", _remover(kind), f"delete a {kind.noun} (operators)")
    rm.add_argument("name", metavar=metavar)
    add_if_match(rm)


def _lister(kind: Kind) -> Callable[[Session], int]:
    def run(session: Session) -> int:
        rows = asked("scheduler", lambda: session.service("scheduler").get_all(kind.path()))
        # In the scheduler's order: by name, priority classes highest value first.
        session.emit(
            rows,
            lambda: table(
                kind.header,
                [kind.row(r) for r in rows],
                empty=none_yet(f"no {kind.name}", f"trainyard admin {kind.name} set {kind.create}"),
            ),
        )
        return Exit.OK

    return run


def _shower(kind: Kind) -> Callable[[Session], int]:
    def run(session: Session) -> int:
        path = kind.path(session.args.name)
        found = asked("scheduler", lambda: session.service("scheduler").get(path))
        session.emit_tagged(found, lambda: table(kind.header, [kind.row(found)]))
        return Exit.OK

    return run


def _setter(kind: Kind) -> Callable[[Session], int]:
    def run(session: Session) -> int:
        args = session.args
        path = kind.path(args.name)
        scheduler = session.service("scheduler")
        conditions = if_match(args)
        reread = _show_command(kind, args.name)
        if kind.patch is not None and not args.replace:
            patch = kind.patch(args)  # usage errors before any request
            found, made = patch_or_create(
                "scheduler",
                scheduler,
                path,
                patch,
                lambda: kind.body(args),
                conditions,
                reread,
                dict(kind.named),
            )
        else:
            body = kind.body(args)
            found = asked(
                "scheduler",
                lambda: scheduler.call("PUT", path, body, conditions),
                reread,
                dict(kind.named),
            )
            made = created(found)
        return _show_set(session, kind, "created" if made else "set", found)

    return run


def _show_command(kind: Kind, name: str) -> str:
    """The command that shows ``name`` (after a 412: it changed since it was read)."""
    return f"trainyard admin {kind.name} show {name}"


def _show_set(session: Session, kind: Kind, done: str, found: dict[str, Any]) -> int:
    session.emit(
        found,
        lambda: f"{done} {kind.noun} {found[kind.key]}\n" + table(kind.header, [kind.row(found)]),
    )
    return Exit.OK


def _remover(kind: Kind) -> Callable[[Session], int]:
    def run(session: Session) -> int:
        name = session.args.name
        scheduler = session.service("scheduler")
        conditions = if_match(session.args)
        reread = _show_command(kind, name)
        asked("scheduler", lambda: scheduler.delete(kind.path(name), conditions), reread)
        session.emit({"removed": name}, lambda: f"removed {kind.noun} {name}")
        return Exit.OK

    return run

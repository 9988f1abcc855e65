"""``trainyard budget``: billing's monthly budgets of a team or a team's project
(``--billing-url`` at login, or ``TRAINYARD_BILLING_URL``; docs/billing.md, "Budgets").

    trainyard budget ls [--team T]                   every budget you may read, spent so far
    trainyard budget show TEAM [--project P]         one, with its thresholds and forecast
    trainyard budget set TEAM [--project P] [--amount A] [--policy refuse|deprioritize|warn]
        [--on-exhausted finish|stop] [--thresholds N,N,...] [--replace] [--if-match ETAG]
                                                     (team admins)
    trainyard budget rm TEAM [--project P] [--if-match ETAG]   (team admins)

``ls`` is every page of ``GET /v1/budgets`` (``?team=``: operators, another team's); ``show``
``GET /v1/budgets/{team}[/{project}]``; ``set`` ``PATCH`` (or ``PUT``) and ``rm`` ``DELETE``
of the same path. ``--json`` prints billing's answer (``rm``: ``{"removed": {"team": T,
"project": P}}``).

``set`` of a budget that exists changes only what its options name and keeps the rest
(``PATCH``, a JSON Merge Patch billing applies under the budget's lock: a change another
admin makes at the same time to other fields is kept too): ``budget set ml --amount 2000``
keeps a ``refuse`` policy. When there is none yet (404), ``set`` creates it with ``PUT`` of
its options alone, billing defaulting the rest (policy ``warn``, ``on_exhausted``
``finish``, thresholds 50, 80, 100) or naming what is missing (``amount``); that ``PUT``
says ``If-None-Match: *``, so a budget another admin created since the patch is not
replaced: billing answers 412 and ``set`` patches that one instead, once. ``--replace``
sends only the options with ``PUT`` instead: what they leave out takes its default.

``show`` prints the budget's ``etag`` last (billing's ``ETag``). ``set`` and ``rm`` with
``--if-match ETAG`` send it as ``If-Match``: the change goes ahead only while the budget is
as ``show`` printed it. When another admin changed it since, billing refuses (412) and
nothing changes: the command says so in one line, and to run ``show`` again (exit 1). With
``--if-match``, ``set`` only patches (a budget deleted since is a 404, not created again).
Without it, as before: the change goes ahead whatever changed since.

What the command line alone shows to be wrong is a usage error before any request (exit 2):
``set`` without any of its options, an amount that is no finite decimal number, thresholds
that are no list of whole numbers, a policy or an ``--on-exhausted`` that is none of the
choices. The values' bounds are billing's to judge: its refusal is one line naming the
field, ``billing: 422 invalid request (amount: must be greater than 0)`` (exit 1);
a budget that does not exist, or another team's, ``billing: 404 ...`` (exit 3); a member
who is no admin writing one, ``billing: 403 ...`` (exit 4).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from trainyard.cli_base import (
    CliError,
    Exit,
    Session,
    add_if_match,
    asked,
    created,
    decimal_arg,
    if_match,
    patch_or_create,
)
from trainyard.cli_render import money, none_yet, table, time_text
from trainyard.client import segment

POLICIES = ("refuse", "deprioritize", "warn")
"""What submission does with a new job once the budget is spent (billing's ``policy``)."""
ON_EXHAUSTED = ("finish", "stop")
"""What the scheduler does with running jobs once it is spent (billing's ``on_exhausted``)."""
FIELDS = (
    ("amount", "--amount"),
    ("policy", "--policy"),
    ("on_exhausted", "--on-exhausted"),
    ("thresholds", "--thresholds"),
)
"""Each field of billing's body (and answer) and the option of ``set`` that gives it."""
HEADER = (
    "TEAM",
    "PROJECT",
    "MONTH",
    "AMOUNT",
    "SPENT",
    "SPENT %",
    "STATE",
    "POLICY",
    "ON EXHAUSTED",
)


amount_arg = decimal_arg("1000")
"""A budget's amount as written (``cli_base.decimal_arg``)."""


def thresholds_arg(value: str) -> list[int]:
    """``50,80,100``: percents of the amount, whole numbers; their bounds are billing's."""
    try:
        return [int(part) for part in value.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not whole percents separated by commas, such as 50,80,100"
        ) from None


def add_commands(
    command: Callable[..., argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    """Add ``budget ls|show|set|rm`` to the CLI's commands (``common``: the options every
    command takes)."""
    budget = command("budget", None, "billing's monthly budgets of teams and projects")
    actions = budget.add_subparsers(dest="action", required=True, metavar="ACTION")

    def action(name: str, run: Callable[[Session], int], text: str) -> argparse.ArgumentParser:
        sub = actions.add_parser(name, parents=[common], help=text, description=text)
        sub.set_defaults(run=run)
        return sub

    listing = action("ls", run_list, "every budget you may read: spent this month, state")
    listing.add_argument("--team", help="only this team's budgets (operators: any team)")
    show = action("show", run_show, "one budget: spent, state, thresholds, forecast")
    _scope_arguments(show)
    put = action(
        "set",
        run_set,
        "create a budget, or change only what the options name (team admins)",
    )
    _scope_arguments(put)
    put.add_argument("--amount", type=amount_arg, help="money per UTC month, in billing's currency")
    put.add_argument(
        "--policy",
        choices=POLICIES,
        help="what a new job gets once it is spent: refused, run at priority low, or "
        "accepted with a warning (a new budget: warn)",
    )
    put.add_argument(
        "--on-exhausted",
        choices=ON_EXHAUSTED,
        help="what its running jobs do once it is spent: finish, or stop (checkpoint and "
        "wait, queued) (a new budget: finish)",
    )
    put.add_argument(
        "--thresholds",
        type=thresholds_arg,
        metavar="N,N,...",
        help="percents of the amount billing says when reached (a new budget: 50,80,100)",
    )
    put.add_argument(
        "--replace",
        action="store_true",
        help="replace the whole budget (PUT): what the options leave out takes its default",
    )
    add_if_match(put)
    rm = action("rm", run_remove, "delete a budget (team admins)")
    _scope_arguments(rm)
    add_if_match(rm)


def _scope_arguments(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("team", metavar="TEAM", help="the team")
    sub.add_argument("--project", help="the team's project (default: the team's own budget)")


def path_of(team: str, project: str | None) -> str:
    """The budget's route: ``/v1/budgets/{team}`` or ``/v1/budgets/{team}/{project}``, each
    value one path segment."""
    return f"/v1/budgets/{segment(team)}" + ("" if project is None else f"/{segment(project)}")


def scope_text(team: str, project: str | None) -> str:
    return f"team {team}" if project is None else f"project {team}/{project}"


def run_list(session: Session) -> int:
    billing = session.service("billing")
    rows = asked("billing", lambda: billing.get_all("/v1/budgets", team=session.args.team))
    team = session.args.team
    empty = none_yet(
        f"no budgets of team {team}" if team else "no budgets",
        f"trainyard budget set {team or 'TEAM'} --amount A",
    )
    session.emit(rows, lambda: table(HEADER, [budget_row(r) for r in rows], empty=empty))
    return Exit.OK


def run_show(session: Session) -> int:
    args = session.args
    path = path_of(args.team, args.project)
    found = asked("billing", lambda: session.service("billing").get(path))
    session.emit_tagged(found, lambda: budget_text(found))
    return Exit.OK


def _show_command(team: str, project: str | None) -> str:
    """The command that shows the budget (after a 412: it changed since it was read)."""
    return f"trainyard budget show {team}" + ("" if project is None else f" --project {project}")


def run_set(session: Session) -> int:
    args = session.args
    given = {field: getattr(args, field) for field, _ in FIELDS if getattr(args, field) is not None}
    if not given:  # before any request: nothing to change
        options = ", ".join(option for _, option in FIELDS)
        raise CliError(f"give at least one of {options}", Exit.USAGE)
    path = path_of(args.team, args.project)
    billing = session.service("billing")
    conditions = if_match(args)
    reread = _show_command(args.team, args.project)
    if args.replace:
        found = asked("billing", lambda: billing.call("PUT", path, given, conditions), reread)
        made = created(found)
    else:
        found, made = patch_or_create(
            "billing", billing, path, given, lambda: given, conditions, reread
        )
    return _show_set(session, "created" if made else "set", found)


def _show_set(session: Session, done: str, found: dict[str, Any]) -> int:
    scope = scope_text(session.args.team, session.args.project)
    session.emit(found, lambda: f"{done} budget of {scope}\n" + budget_text(found))
    return Exit.OK


def run_remove(session: Session) -> int:
    args = session.args
    path = path_of(args.team, args.project)
    billing = session.service("billing")
    reread = _show_command(args.team, args.project)
    asked("billing", lambda: billing.delete(path, if_match(args)), reread)
    session.emit(
        {"removed": {"team": args.team, "project": args.project}},
        lambda: f"removed budget of {scope_text(args.team, args.project)}",
    )
    return Exit.OK


def state_text(budget: dict[str, Any]) -> str:
    """``exhausted`` once the month's spending reached the amount; else when it runs out at
    this month's rate (``runs out 2026-12-19``); else ``ok``."""
    if budget["exhausted"]:
        return "exhausted"
    runs_out = budget.get("runs_out_at")
    if runs_out:
        return f"runs out {time_text(runs_out)[:10]}"
    return "ok"


def budget_row(budget: dict[str, Any]) -> tuple[object, ...]:
    return (
        budget["team"],
        budget.get("project") or "-",
        budget["month"],
        money(budget["amount"], budget["currency"]),
        money(budget["spent"]),
        f"{budget['percent_spent']}%",
        state_text(budget),
        budget["policy"],
        budget["on_exhausted"],
    )


def budget_text(budget: dict[str, Any]) -> str:
    """One budget: its row, then its thresholds, forecast and last change."""
    thresholds = ", ".join(f"{t}%" for t in budget["thresholds"]) or "none"
    return "\n".join(
        [
            table(HEADER, [budget_row(budget)]),
            f"remaining: {money(budget['remaining'], budget['currency'])}",
            f"thresholds: {thresholds}",
            f"forecast: {budget['forecast']}",
            f"updated by {budget['updated_by']} at {time_text(budget['updated_at'])}",
        ]
    )

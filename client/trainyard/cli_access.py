"""The CLI's commands about who may do what: the caller, tokens, users and the audit log.

    trainyard whoami                                 user, team, role and token expiry
    trainyard token list [--user U] [--team T]       tokens (never their secrets)
    trainyard token create [--name N] [--days D]     a new token for yourself (shown once)
    trainyard token rotate [--days D]                replace the token in use (old one dies)
    trainyard token revoke ID                        revoke a token at once
    trainyard user list [--team T]                   the team's users (admins)
    trainyard user add NAME [--role R] [--team T]    a user and its first token (admins)
    trainyard user show NAME [--team T]              a user, with its etag (admins)
    trainyard user role NAME ROLE [--team T] [--if-match ETAG]
                                                     give a user another role (admins)
    trainyard user disable NAME [--team T] [--if-match ETAG]
                                                     disable a user, revoke its tokens (admins)
    trainyard audit [--limit N | --all | --ndjson] [--before ID] [--since T] [--until T]
                                                     a service's audit log (operators;
                                                     --url: that service, submission's
                                                     by default)

``audit --ndjson`` writes every entry of the window to stdout as it streams, oldest first,
one JSON object a line (the service's ``Accept: application/x-ndjson`` export): an
auditor's export of any size, never held in memory. A refusal, or an export that breaks off,
is an error (exit non-zero) after the lines already written.

A new token is printed once, alone on stdout with ``--json`` off, so that
``export TRAINYARD_TOKEN=$(trainyard token rotate)`` works. ``token create`` and ``token
rotate`` send their request under an ``Idempotency-Key`` and send it again when no answer
came or the API was away: ``create`` never makes a second token for one it lost the answer
of (``create_token``), ``rotate`` never leaves the user without a working token
(``rotate_token``).

``user show`` prints the user's ``etag`` last (the submission API's ``ETag``; with ``--json``
on stderr, ``cli_base.emit_tagged``); ``user role`` and ``user disable`` with ``--if-match
ETAG`` change the user only while it is as ``show`` printed it: when another admin changed
it since, nothing changes and one line says so and to run ``show`` again (exit 1).
"""

from __future__ import annotations

import argparse
import time
import uuid
from typing import Any

from trainyard.cli_base import (
    CliError,
    add_if_match,
    conditional,
    emit_tagged,
    if_match,
    note,
    positive_arg,
    whole_arg,
)
from trainyard.cli_render import none_yet, table, time_text
from trainyard.client import NoAnswer, TrainyardClient, TrainyardError

ROLES = ("viewer", "member", "admin", "operator")
TOKEN_DAYS_MIN, TOKEN_DAYS_MAX = 1, 366
"""The lifetimes a token may be given (``expires_in_days`` of the submission API)."""


days_arg = whole_arg(TOKEN_DAYS_MIN, TOKEN_DAYS_MAX, "days")
"""``token create|rotate --days``."""


COMMANDS = frozenset({"whoami", "token", "user", "audit"})


def add_commands(commands: Any, common: argparse.ArgumentParser) -> None:
    """Register the commands on the CLI's sub-parsers (``commands``)."""
    commands.add_parser("whoami", parents=[common], help="who this token belongs to")
    token = commands.add_parser("token", parents=[common], help="list, create, rotate, revoke")
    tokens = token.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = tokens.add_parser("list", parents=[common], help="tokens of a user")
    listing.add_argument("--user", help="another user of your team (admins)")
    listing.add_argument("--team", help="another team (operators)")
    for action, text in (("create", "a new token for yourself"), ("rotate", "replace this one")):
        made = tokens.add_parser(action, parents=[common], help=text)
        made.add_argument("--name", help="a label (laptop, ci, ...)")
        made.add_argument(
            "--days",
            type=days_arg,
            help=f"lifetime in days, {TOKEN_DAYS_MIN} to {TOKEN_DAYS_MAX} (server default: 90)",
        )
    revoke = tokens.add_parser("revoke", parents=[common], help="revoke a token by id")
    revoke.add_argument("token_id", metavar="ID", type=positive_arg)
    user = commands.add_parser(
        "user", parents=[common], help="list, add, change the role of, disable users"
    )
    users = user.add_subparsers(dest="action", required=True, metavar="ACTION")
    users.add_parser("list", parents=[common], help="the team's users").add_argument(
        "--team", help="another team (operators)"
    )
    add = users.add_parser("add", parents=[common], help="a new user and its first token")
    add.add_argument("name", metavar="NAME")
    add.add_argument("--role", choices=ROLES, default="member")
    add.add_argument("--team", help="another team (operators)")
    show = users.add_parser("show", parents=[common], help="a user, with its etag")
    show.add_argument("name", metavar="NAME")
    show.add_argument("--team", help="another team (operators)")
    role = users.add_parser("role", parents=[common], help="give a user another role")
    role.add_argument("name", metavar="NAME")
    role.add_argument(
        "role", metavar="ROLE", choices=ROLES, help="the new role: " + ", ".join(ROLES)
    )
    role.add_argument("--team", help="another team (operators)")
    add_if_match(role)
    disable = users.add_parser("disable", parents=[common], help="disable a user")
    disable.add_argument("name", metavar="NAME")
    disable.add_argument("--team", help="another team (operators)")
    add_if_match(disable)
    audit = commands.add_parser(
        "audit", parents=[common], help="a service's audit log (operators; --url: that service)"
    )
    how_many = audit.add_mutually_exclusive_group()
    how_many.add_argument("--limit", type=positive_arg, default=50)
    how_many.add_argument(
        "--all", action="store_true", help="every entry (with --json: an export of the window)"
    )
    how_many.add_argument(
        "--ndjson",
        action="store_true",
        help="every entry of the window, oldest first, one JSON object a line as it streams",
    )
    audit.add_argument("--before", type=positive_arg, help="entries older than this id")
    audit.add_argument(
        "--since", metavar="TIME", help="entries written at or after this RFC 3339 time"
    )
    audit.add_argument("--until", metavar="TIME", help="entries written before this RFC 3339 time")


def run(client: TrainyardClient, args: argparse.Namespace, as_json: bool) -> Any:
    """Do the command; return what to print (a string for people, or JSON data), or None
    when it printed it itself (``user show``: the ETag too)."""
    if args.command == "whoami":
        me = client.whoami()
        return me if as_json else render_whoami(me)
    if args.command == "audit" and args.ndjson:
        for line in client.audit_export(before=args.before, since=args.since, until=args.until):
            print(line)
        return None
    if args.command == "audit":
        entries = client.audit(
            before=args.before,
            limit=None if args.all else args.limit,
            since=args.since,
            until=args.until,
        )
        return entries if as_json else render_audit(entries, args.before)
    if args.command == "token":
        return _token(client, args, as_json)
    return _user(client, args, as_json)


def _token(client: TrainyardClient, args: argparse.Namespace, as_json: bool) -> Any:
    if args.action == "list":
        tokens = client.tokens(user=args.user, team=args.team)
        return tokens if as_json else render_tokens(tokens)
    if args.action == "revoke":
        client.revoke_token(args.token_id)
        return {"revoked": args.token_id} if as_json else f"token {args.token_id} revoked"
    if args.action == "create":
        made = create_token(client, args.name, args.days)
    else:
        made = rotate_token(client, args.name, args.days)
    return made if as_json else str(made["token"])


TOKEN_TRIES = 3
"""How many requests ``token create`` or ``rotate`` sends at most, for its answer lost or
the API away."""
TOKEN_PAUSE_S = 1.0
"""How long ``token create`` or ``rotate`` waits before its first retry (then twice as long
each time, or what the API's ``Retry-After`` says, up to ``TOKEN_PAUSE_MAX_S``)."""
TOKEN_PAUSE_MAX_S = 30.0
AWAY = frozenset({502, 503, 504})
"""Statuses of an API that is away for a while, whose request is sent again."""


def create_token(client: TrainyardClient, name: str | None, days: int | None) -> dict[str, Any]:
    """``token create``: ``POST /v1/tokens`` under an ``Idempotency-Key`` of its own, sent
    again under the same key when it got no answer in time (``NoAnswer``: the token may have
    been made all the same) or the API was away (502-504), ``TOKEN_TRIES`` requests at
    most. A retry of a request the server did make answers that token without its secret
    (only its hash is kept): nobody holds that secret, so the token is revoked, not left
    live, and another is made under a new key. Any other refusal is raised at once."""
    key, pause = _token_key("create"), TOKEN_PAUSE_S
    for attempt in range(1, TOKEN_TRIES + 1):
        try:
            made = client.create_token(name=name, days=days, idempotency_key=key)
        except TrainyardError as exc:
            pause = _pause_or_raise(exc, attempt, pause)
            continue
        if made["token"] is not None:
            return made
        client.revoke_token(made["id"])
        lost = (
            f"token {made['id']} was made by an earlier try whose answer was lost, and its "
            "secret is shown only in that answer: revoked it"
        )
        if attempt == TOKEN_TRIES:
            raise CliError(f"{lost}; no token was made: run the command again")
        note(f"{lost}; making another")
        key = _token_key("create")
    raise AssertionError("unreachable: the last try returns or raises")


def rotate_token(client: TrainyardClient, name: str | None, days: int | None) -> dict[str, Any]:
    """``token rotate``: ``POST /v1/tokens/rotate`` under an ``Idempotency-Key`` of its own,
    sent again as ``create_token`` sends its request, presenting the same token. A rotation
    the server did make revoked that token; the API lets exactly its retry in (the token,
    the key, the same request, within minutes) and answers the new token with a new
    secret, the one in the lost answer dead: the user is never left holding no working
    token. Answered without a secret (the new token was revoked or expired since), nothing
    is left to hold: an error saying so. Any other refusal is raised at once."""
    key, pause = _token_key("rotate"), TOKEN_PAUSE_S
    for attempt in range(1, TOKEN_TRIES + 1):
        try:
            made = client.rotate_token(name=name, days=days, idempotency_key=key)
        except TrainyardError as exc:
            pause = _pause_or_raise(exc, attempt, pause)
            continue
        if made["token"] is None:
            raise CliError(
                f"token {made['id']} replaced this one by an earlier try whose answer was "
                "lost, and was revoked or expired since: this token was revoked by that try; "
                "use another token, or ask an admin for one"
            )
        return made
    raise AssertionError("unreachable: the last try returns or raises")


def _pause_or_raise(exc: TrainyardError, attempt: int, pause: float) -> float:
    """Wait before sending try ``attempt``'s request again under its key, and return the
    pause before the next; raise ``exc`` when it was the last try, or a refusal that a
    retry would not change (anything but ``NoAnswer`` or an API away). The note of a retry
    says only that no answer came: not ``NoAnswer``'s advice to look before repeating,
    since this command repeats the request itself, under a key that makes it safe."""
    if attempt == TOKEN_TRIES or not (isinstance(exc, NoAnswer) or exc.status in AWAY):
        raise exc
    wait = pause if exc.retry_after is None else min(exc.retry_after, TOKEN_PAUSE_MAX_S)
    said = exc.unanswered if isinstance(exc, NoAnswer) else str(exc)  # no "look before"
    note(f"{said}; trying again in {wait:g} s under the same Idempotency-Key")
    time.sleep(wait)
    return min(2 * pause, TOKEN_PAUSE_MAX_S)


def _token_key(action: str) -> str:
    """An ``Idempotency-Key`` no other request of this user has."""
    return f"trainyard-token-{action}-{uuid.uuid4()}"


def _user(client: TrainyardClient, args: argparse.Namespace, as_json: bool) -> Any:
    if args.action == "list":
        users = client.users(team=args.team)
        return users if as_json else render_users(users)
    if args.action == "add":
        made = client.create_user(args.name, args.role, team=args.team)
        return made if as_json else str(made["token"])
    if args.action == "show":
        found = client.user(args.name, team=args.team)
        emit_tagged(as_json, found, lambda: render_users([found]))
        return None
    conditions = if_match(args)
    reread = f"trainyard user show {args.name}" + (f" --team {args.team}" if args.team else "")
    if args.action == "role":
        changed = conditional(
            "submission",
            lambda: client.change_role(args.name, args.role, args.team, conditions),
            reread,
        )
        return changed if as_json else f"user {args.name} is {changed['role']} now"
    conditional("submission", lambda: client.disable_user(args.name, args.team, conditions), reread)
    return {"disabled": args.name} if as_json else f"user {args.name} disabled, tokens revoked"


def render_whoami(me: dict[str, Any]) -> str:
    expiry = f"expires {time_text(me['expires_at'])}" if me.get("expires_at") else "never expires"
    return (
        f"{me['user']} of team {me['team']} ({me['role']}); "
        f"token {me['token_id']} ({me['token_name']}) {expiry}"
    )


def render_tokens(tokens: list[dict[str, Any]]) -> str:
    rows = [
        (
            t["id"],
            t["name"],
            t["user"],
            time_text(t["expires_at"]) if t.get("expires_at") else "never",
            "revoked" if t.get("revoked_at") else "active",
        )
        for t in tokens
    ]
    return table(
        ("ID", "NAME", "USER", "EXPIRES", "STATE"),
        rows,
        empty=none_yet("no tokens", "trainyard token create", "makes one"),
    )


def render_users(users: list[dict[str, Any]]) -> str:
    rows = [(u["name"], u["role"], "disabled" if u.get("disabled_at") else "active") for u in users]
    return table(
        ("NAME", "ROLE", "STATE"),
        rows,
        empty=none_yet("no users", "trainyard user add NAME", "adds one"),
    )


def render_audit(entries: list[dict[str, Any]], before: int | None = None) -> str:
    """The audit entries as a table; none: what records one (below ``before``: where the
    newest are)."""
    rows = [(e["id"], time_text(e["at"]), e["actor"], e["action"], e["target"]) for e in entries]
    empty = (
        none_yet(f"no audit entries before id {before}", "trainyard audit", "shows the newest")
        if before
        else none_yet("no audit entries", "trainyard user add NAME, or any change,", "records one")
    )
    return table(("ID", "AT", "ACTOR", "ACTION", "TARGET"), rows, empty=empty)

"""The CLI's model commands: ``trainyard model ls|show|register|alias|download|rm|delete|
grant|revoke``.

They call the registry's models API (docs/models.md) at the registry URL of the context
(``TRAINYARD_REGISTRY_URL``). References are checked here before any call, so a malformed
one is refused with a message naming the argument (exit 2):

    TEAM/NAME            a model
    TEAM/NAME:V          one version (V from 1 to VERSION_MAX)
    TEAM/NAME@ALIAS      the version an alias points at

``download`` writes the bytes to a temporary file beside ``-o`` (beside the file a link
names, which is replaced and the link kept), checks their size and sha256 against what the
registry answered, and only then renames the file into place: a failed or interrupted
download leaves no file at all, and an existing file is replaced only by verified bytes.
An ``-o`` that is a device or a pipe is refused: it would be replaced, not written to.

``alias set`` and ``alias rm`` with ``--from VERSION`` change the alias only while it still
points at VERSION (``--from none``: ``set`` only while there is no such alias): the command
reads the alias (its ``ETag``), refuses without writing when it points elsewhere, and sends
the tag it read as ``If-Match`` (``If-None-Match: *`` for ``none``), so a move another
member makes between the read and the write is refused too (412, nothing changed). Each
refusal is one line saying where the alias is and to look at ``alias history`` (exit 1).
Without ``--from``, as before: the alias moves whatever moved it since.

``show TEAM/NAME:V`` prints the version's ``etag`` last (the registry's ``ETag``; with
``--json`` on stderr, ``cli_base.emit_tagged``); ``rm TEAM/NAME VERSION --if-match ETAG``
deletes it only while it is the registration ``show`` printed: otherwise nothing is deleted
and one line says so and to run ``show`` again (exit 1). ``show TEAM/NAME`` prints the
model's ``etag`` last the same way, and ``delete TEAM/NAME --if-match ETAG`` deletes the model
(once it has no live version; the registry's 409 names them) only while it is as ``show``
printed it.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainyard.cli_base import (
    CliError,
    Exit,
    Session,
    add_if_match,
    conditional,
    emit_tagged,
    etag_of,
    if_match,
    note,
    refusal_text,
)
from trainyard.cli_render import money, none_yet, short, table, time_text
from trainyard.client import Answer, TrainyardClient, TrainyardError, amended, download, segment

_NAME = r"[A-Za-z0-9_\-][A-Za-z0-9_.\-]{0,99}"
_ALIAS = r"[a-z][a-z0-9_\-]{0,62}"
_REF = re.compile(
    rf"(?P<team>{_NAME})/(?P<name>{_NAME})(?::(?P<version>\d+)|@(?P<alias>{_ALIAS}))?"
)
VERSION_MAX = 2**31 - 1
"""The largest version number the registry has (a PostgreSQL ``integer``; its routes refuse
more): a larger one is a usage error here, not a request the registry refuses in its
parser's words."""


@dataclass(frozen=True)
class Ref:
    """A parsed ``TEAM/NAME[:V|@ALIAS]``."""

    team: str
    name: str
    version: int | None = None
    alias: str | None = None

    @property
    def path(self) -> str:
        """The URL path segment pair ``team/name``, each segment quoted."""
        return f"{segment(self.team)}/{segment(self.name)}"

    def __str__(self) -> str:
        tail = f":{self.version}" if self.version else f"@{self.alias}" if self.alias else ""
        return f"{self.team}/{self.name}{tail}"


def parse_ref(value: str, what: str, *, version: bool | None = False, alias: bool = False) -> Ref:
    """``value`` as a reference, or a ``CliError`` (usage) naming ``what``.

    ``version``: False refuses ``:V``, None allows it, True requires it (``alias`` allows
    ``@ALIAS`` as the alternative)."""
    found = _REF.fullmatch(value.strip())
    shape = "TEAM/NAME" + (
        ""
        if version is False
        else ":V"
        if not alias
        else "[:V|@ALIAS]"
        if version is None
        else ":V or TEAM/NAME@ALIAS"
    )
    if not found:
        raise CliError(
            f"{what}: {value!r} is not {shape} (names: letters, digits, _ . -; "
            "V: a positive integer)",
            Exit.USAGE,
        )
    number = int(found["version"]) if found["version"] else None
    if number is not None and version is False:
        raise CliError(f"{what}: {value!r} names a version; give {shape}", Exit.USAGE)
    if found["alias"] and not alias:
        raise CliError(f"{what}: {value!r} names an alias; give {shape}", Exit.USAGE)
    if number == 0:
        raise CliError(f"{what}: version must be 1 or more, got 0", Exit.USAGE)
    if number is not None and number > VERSION_MAX:
        raise CliError(
            f"{what}: version must be at most {VERSION_MAX} (the registry's largest), got {number}",
            Exit.USAGE,
        )
    if version is True and number is None and not found["alias"]:
        raise CliError(f"{what}: {value!r} names no version; give {shape}", Exit.USAGE)
    return Ref(found["team"], found["name"], number, found["alias"])


NAME_RULE = "1 to 100 letters, digits, _ . or -, not starting with ."
"""The registry's rule for team, model, dataset and project names, in words."""


def name_arg(kind: str) -> Callable[[str], str]:
    """An argparse ``type`` for a ``kind`` name (team, model, dataset, project) that goes into
    a registry URL or query: one that cannot be a name is a usage error naming the argument,
    before any request (an encoded ``/`` would reach no route, and be told so in words about
    the URL). An empty value passes, for the CLI's own check of empty values."""

    def check(value: str) -> str:
        if value.strip() and not re.fullmatch(_NAME, value):
            found = _REF.fullmatch(value.strip()) if "/" in value else None
            hint = (
                f"; for a model as TEAM/NAME: trainyard model show {value.strip()}"
                if found and kind == "model"
                else ""
            )
            raise argparse.ArgumentTypeError(f"{value!r} is not a {kind} name ({NAME_RULE}){hint}")
        return value

    check.__name__ = f"{kind} name"
    return check


def alias_arg(value: str) -> str:
    """An alias as argparse checks it (lower-case, as the registry requires)."""
    if not re.fullmatch(_ALIAS, value):
        raise argparse.ArgumentTypeError(
            f"{value!r} is not an alias (1-63 lower-case letters, digits, _ or -, "
            "starting with a letter)"
        )
    return value


def version_arg(value: str) -> int:
    """A VERSION argument: 1 to ``VERSION_MAX``, else argparse's usage error naming it."""
    if not value.isdecimal() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"{value!r} is not a version (a positive integer)")
    if int(value) > VERSION_MAX:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a version: at most {VERSION_MAX} (the registry's largest)"
        )
    return int(value)


def from_arg(value: str) -> int:
    """``--from``: a version, or ``none`` (0: no such alias)."""
    return 0 if value == "none" else version_arg(value)


def add_commands(
    command: Callable[..., argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    model = command("model", None, "the team's models: versions, aliases, downloads")
    actions = model.add_subparsers(dest="action", required=True, metavar="ACTION")

    def action(name: str, run: Callable[[Session], int], text: str) -> argparse.ArgumentParser:
        sub = actions.add_parser(name, parents=[common], help=text, description=text)
        sub.set_defaults(run=run)
        return sub

    ls = action("ls", run_ls, "the team's models, then those other teams granted to it")
    ls.add_argument(
        "--team",
        type=name_arg("team"),
        help="another team's (operators; members: those it granted to their team)",
    )
    ls.add_argument(
        "--granted", action="store_true", help="only the models other teams granted to yours"
    )
    ls.add_argument("--project", type=name_arg("project"), help="only models of this project")
    show = action("show", run_show, "a model: its versions and aliases, or one version")
    show.add_argument("model", metavar="TEAM/NAME[:V|@ALIAS]")
    register = action("register", run_register, "register a job's committed checkpoint")
    register.add_argument("model", metavar="TEAM/NAME")
    register.add_argument("--job", required=True, metavar="JOB", help="the job (id or prefix)")
    register.add_argument("--checkpoint", metavar="URI", help="one of its committed checkpoints")
    register.add_argument("--tag", action="append", default=[], help="a tag (repeatable)")
    register.add_argument("--description", default="", help="what this version is")
    alias = action("alias", run_alias, "point, remove or show the moves of an alias")
    alias_actions = alias.add_subparsers(dest="alias_action", required=True, metavar="ACTION")
    alias_set = alias_actions.add_parser("set", parents=[common], help="point ALIAS at VERSION")
    alias_set.add_argument("model", metavar="TEAM/NAME")
    alias_set.add_argument("alias", type=alias_arg, metavar="ALIAS")
    alias_set.add_argument("version", type=version_arg, metavar="VERSION")
    alias_rm = alias_actions.add_parser("rm", parents=[common], help="delete an alias")
    alias_rm.add_argument("model", metavar="TEAM/NAME")
    alias_rm.add_argument("alias", type=alias_arg, metavar="ALIAS")
    for sub in (alias_set, alias_rm):
        sub.add_argument(
            "--from",
            dest="expected",
            type=from_arg,
            metavar="VERSION",
            help="only while ALIAS still points at VERSION (set: none, only while there is "
            "no such alias); else nothing changes (exit 1)",
        )
    history = alias_actions.add_parser("history", parents=[common], help="every move of an alias")
    history.add_argument("model", metavar="TEAM/NAME")
    history.add_argument("alias", type=alias_arg, metavar="ALIAS")
    get = action("download", run_download, "download a version, verified by its sha256")
    get.add_argument("model", metavar="TEAM/NAME[:V|@ALIAS]", help="default: the latest version")
    get.add_argument("-o", "--output", type=Path, required=True, metavar="FILE")
    rm = action("rm", run_rm, "delete a version (frees its stored bytes)")
    rm.add_argument("model", metavar="TEAM/NAME")
    rm.add_argument("version", type=version_arg, metavar="VERSION")
    add_if_match(rm)
    gone = action("delete", run_delete, "delete a model with no live version, freeing its name")
    gone.add_argument("model", metavar="TEAM/NAME")
    add_if_match(gone)
    for name, text in (
        ("grant", "let another team read, download and fine-tune from it (admins)"),
        ("revoke", "stop another team reading it (admins)"),
    ):
        change = action(name, run_grant, text)
        change.add_argument("model", metavar="TEAM/NAME")
        change.add_argument("grantee", type=name_arg("team"), metavar="TEAM", help="the team")


def _metrics(metrics: dict[str, Any] | None) -> str:
    return " ".join(
        f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
        for k, v in sorted((metrics or {}).items())
    )


def _pages(registry: TrainyardClient, **params: str | None) -> list[dict[str, Any]]:
    """Every model of ``GET /v1/models`` with ``params``, page after page."""
    models: list[dict[str, Any]] = registry.get_every("/v1/models", "models", **params, limit=500)[
        "models"
    ]
    return models


def _granted_to_us(registry: TrainyardClient, **params: str | None) -> list[dict[str, Any]]:
    """The models other teams granted to the caller's (none for an operator's token, which
    speaks for no team: the registry refuses ``granted`` for it)."""
    try:
        return _pages(registry, **params, granted="true")
    except TrainyardError as exc:
        if exc.status == 422 and any(e.get("field") == "granted" for e in exc.errors or []):
            return []
        raise


def _no_models(args: argparse.Namespace) -> str:
    """What an empty ``model ls`` says: what it looked for, not "no models yet" where the
    team's own were never listed (``--granted``) or were filtered out."""
    if args.granted:
        return "no models granted to your team by another team"
    given = [f"--{o} {getattr(args, o)}" for o in ("team", "project") if getattr(args, o)]
    if given:
        return f"no models match {' '.join(given)}"
    return none_yet(
        "no models yet", "trainyard model register TEAM/NAME --job JOB", "registers one"
    )


def run_ls(session: Session) -> int:
    args = session.args
    registry = session.service("registry")
    listed = [] if args.granted else _pages(registry, team=args.team, project=args.project)
    # Another team's models, as a member sees them, are those it granted: marked as well.
    granted = _granted_to_us(registry, team=args.team, project=args.project)
    keys = {(m["team"], m["name"]) for m in granted}
    models = [amended(m, granted=(m["team"], m["name"]) in keys) for m in listed]
    seen = {(m["team"], m["name"]) for m in listed}
    models += [amended(m, granted=True) for m in granted if (m["team"], m["name"]) not in seen]
    rows = [
        (
            f"{m['team']}/{m['name']}",
            m.get("project") or "-",  # null: another team's, granted to the caller's
            m["versions"],
            m["latest_version"],
            " ".join(f"{a}={v}" for a, v in sorted(m["aliases"].items())) or "-",
            time_text(m["created_at"]),
            f"granted by {m['team']}" if m["granted"] else "-",
        )
        for m in models
    ]
    session.emit(
        models,
        lambda: table(
            ("MODEL", "PROJECT", "VERSIONS", "LATEST", "ALIASES", "CREATED", "ACCESS"),
            rows,
            empty=_no_models(args),
        ),
    )
    return Exit.OK


def _version_path(ref: Ref) -> str:
    if ref.alias:
        return f"/v1/models/{ref.path}/versions/by-alias/{segment(ref.alias)}"
    return f"/v1/models/{ref.path}/versions/{ref.version}"


def _job_of(v: dict[str, Any]) -> str:
    """The version's job; to a team the model is granted to the registry shows no job (the
    owner's work): then whose it was."""
    return str(v["job_id"]) if v.get("job_id") else f"a job of team {v['team']}"


def render_version(v: dict[str, Any]) -> str:
    """One version as ``key: value`` lines (``-`` for what the registry does not show: the
    owner's job, people and checkpoints to a team the model is granted to)."""
    artifact = v.get("artifact") or {}
    lines = [
        f"{v['team']}/{v['model']}:{v['version']}",
        f"  job:         {_job_of(v)}",
        f"  registered:  {time_text(v.get('registered_at'))} by {v.get('created_by') or '-'} ({v.get('origin', '-')})",
        f"  aliases:     {' '.join(v.get('aliases') or []) or '-'}",
        f"  tags:        {' '.join(v.get('tags') or []) or '-'}",
        f"  metrics:     {_metrics(v.get('metrics')) or '-'}",
        f"  artifact:    {artifact.get('uri') or '-'} (step {artifact.get('step', '-')}, {artifact.get('size_bytes', '-')} bytes)",
        f"  sha256:      {artifact.get('sha256', '-')}",
    ]
    if v.get("source_uri"):
        lines.append(f"  source:      {v['source_uri']}")
    if v.get("description"):
        lines.append(f"  description: {v['description']}")
    if v.get("cost") is not None:
        lines.extend(cost_lines(v["cost"]))
    return "\n".join(lines)


def _amounts(amounts: dict[str, str]) -> str:
    return " + ".join(money(amount, currency) for currency, amount in sorted(amounts.items()))


def cost_lines(cost: dict[str, Any]) -> list[str]:
    """What a version cost to make (the registry's ``cost``), as ``key: value`` lines and one
    line per job: its own job first, then the jobs upstream of it."""
    totals = cost.get("by_currency") or []
    if not totals:
        head = "nothing billed yet"
    else:
        head = "; ".join(
            f"{money(t['total'], t['currency'])} (own job {money(t['own_job'])}, "
            f"upstream {money(t['upstream'])})"
            for t in totals
        )
    if not cost.get("complete", True):
        head += " so far: a job of its lineage still runs"
    lines = [f"  cost:        {head}"]
    for job in cost.get("jobs") or []:
        billed = _amounts(job.get("costs") or {}) or "nothing billed"
        allocations = job.get("allocations", 0)
        lines.append(
            f"    {job.get('relation', '-'):<8} {short(job['job_id'])}  {job.get('name', '-')}"
            f" ({job.get('status', '-')}): {billed}, {allocations} allocation"
            + ("" if allocations == 1 else "s")
        )
    hidden = cost.get("hidden_jobs", 0)
    if hidden:
        lines.append(f"    and {hidden} upstream job{'' if hidden == 1 else 's'} of other teams")
    return lines


def run_show(session: Session) -> int:
    ref = parse_ref(session.args.model, "TEAM/NAME", version=None, alias=True)
    registry = session.service("registry")
    if ref.version or ref.alias:
        found = registry.get(_version_path(ref))
        session.emit_tagged(found, lambda: render_version(found))
        return Exit.OK
    model = registry.get(f"/v1/models/{ref.path}")
    versions = registry.get_every(f"/v1/models/{ref.path}/versions", "versions", limit=500)[
        "versions"
    ]
    by_version: dict[int, list[str]] = {}
    for name, number in model["aliases"].items():
        by_version.setdefault(number, []).append(name)
    rows = [
        (
            v["version"],
            " ".join(sorted(by_version.get(v["version"], []))) or "-",
            short(v["job_id"]) if v.get("job_id") else "-",
            time_text(v["registered_at"]),
            _metrics(v["metrics"]) or "-",
        )
        for v in versions
    ]

    def text() -> str:
        head = (
            f"{model['team']}/{model['name']}  project {model.get('project') or '-'}, "
            f"{model['versions']} live versions, latest {model['latest_version']}"
        )
        grants = model.get("grants")
        if grants is not None:
            head += f", read by: {', '.join(grants) or 'its team only'}"
        return (
            head
            + "\n\n"
            + table(
                ("VERSION", "ALIASES", "JOB", "REGISTERED", "METRICS"),
                rows,
                # Its own team may add one; a team it is granted to (no grants shown) not.
                empty="no live versions"
                if grants is None
                else none_yet(
                    "no live versions", f"trainyard model register {ref} --job JOB", "adds one"
                ),
            )
        )

    # The model's ETag (for ``delete --if-match``) under the answer, as every ``show``.
    answer = Answer({**model, "version_list": versions})
    answer.response = getattr(model, "response", None)
    emit_tagged(session.as_json, answer, text)
    return Exit.OK


def run_register(session: Session) -> int:
    from trainyard.cli_base import resolve

    args = session.args
    ref = parse_ref(args.model, "TEAM/NAME")
    body: dict[str, Any] = {"job_id": resolve(session.client, args.job), "tags": args.tag}
    if args.checkpoint:
        body["checkpoint_uri"] = args.checkpoint
    if args.description:
        body["description"] = args.description
    found = session.service("registry").call("POST", f"/v1/models/{ref.path}/versions", body)
    session.emit(found, lambda: "registered " + render_version(found))
    return Exit.OK


def run_alias(session: Session) -> int:
    args = session.args
    ref = parse_ref(args.model, "TEAM/NAME")
    registry = session.service("registry")
    path = f"/v1/models/{ref.path}/aliases/{segment(args.alias)}"
    if args.alias_action in ("set", "rm"):
        conditions = _alias_conditions(registry, f"{ref}@{args.alias}", path, args.expected)
    if args.alias_action == "set":
        moved = _conditional(
            f"{ref}@{args.alias}",
            lambda: registry.call("PUT", path, {"version": args.version}, conditions),
            f"trainyard model alias history {ref} {args.alias}",
        )
        was = moved.get("previous")
        session.emit(
            moved,
            lambda: (
                f"{ref}@{args.alias} -> version {moved['version']}"
                + (f" (was {was})" if was is not None else " (new)")
            ),
        )
    elif args.alias_action == "rm":
        gone = _conditional(
            f"{ref}@{args.alias}",
            lambda: registry.call("DELETE", path, None, conditions),
            f"trainyard model alias history {ref} {args.alias}",
        )
        session.emit(
            gone, lambda: f"removed {ref}@{args.alias} (was version {gone.get('previous')})"
        )
    else:
        moves = registry.get_every(f"{path}/moves", "moves", limit=500)
        rows = [
            (
                time_text(m["at"]),
                "-" if m["from_version"] is None else m["from_version"],
                "(deleted)" if m["to_version"] is None else m["to_version"],
                m["actor"] or "-",  # null to a team the model is granted to
            )
            for m in moves["moves"]
        ]
        empty = none_yet(
            "no moves", f"trainyard model alias set {ref} {args.alias} VERSION", "sets it"
        )
        session.emit(moves, lambda: table(("AT", "FROM", "TO", "BY"), rows, empty=empty))
    return Exit.OK


def _alias_conditions(
    registry: TrainyardClient, alias: str, path: str, expected: int | None
) -> dict[str, str]:
    """The conditions of ``--from`` (None: not given, none): read the alias, refuse when it
    points elsewhere, else ``If-Match`` with the tag read (``--from none``: ``If-None-Match:
    *``, only while there is no such alias)."""
    if expected is None:
        return {}
    if expected == 0:
        return {"If-None-Match": "*"}
    try:
        found = registry.get(path)
    except TrainyardError as exc:
        if exc.status != 404:
            raise
        raise CliError(
            f"{alias} does not exist (any more), not version {expected}: nothing changed",
            Exit.ERROR,
        ) from None
    if found["version"] != expected:
        raise CliError(
            f"{alias} points at version {found['version']}, not {expected}: someone moved it; "
            "nothing changed",
            Exit.ERROR,
        )
    tag = etag_of(found)
    return {"If-Match": tag} if tag else {}


def _conditional(alias: str, call: Callable[[], Any], reread: str) -> Any:
    """``call()``'s answer; a 412 (``--from``) as one plain line."""
    try:
        return call()
    except TrainyardError as exc:
        if exc.status != 412:
            raise
        if any(e.get("field") == "If-None-Match" for e in exc.errors):
            raise CliError(
                f"{alias} exists already (someone set it): nothing changed; see `{reread}`",
                Exit.ERROR,
            ) from None
        again = "--from set to where it points now"
        raise CliError(refusal_text("registry", exc, reread, again), Exit.ERROR) from None


def run_rm(session: Session) -> int:
    args = session.args
    ref = parse_ref(args.model, "TEAM/NAME")
    registry = session.service("registry")
    freed = conditional(
        "registry",
        lambda: registry.call(
            "DELETE", f"/v1/models/{ref.path}/versions/{args.version}", None, if_match(args)
        ),
        f"trainyard model show {ref}:{args.version}",
    )
    session.emit(
        freed,
        lambda: (
            f"deleted {ref}:{args.version} (freed {freed.get('objects', 0)} objects, "
            f"{freed.get('bytes', 0)} bytes)"
        ),
    )
    return Exit.OK


def run_delete(session: Session) -> int:
    args = session.args
    ref = parse_ref(args.model, "TEAM/NAME")
    registry = session.service("registry")
    deleted = conditional(
        "registry",
        lambda: registry.call("DELETE", f"/v1/models/{ref.path}", None, if_match(args)),
        f"trainyard model show {ref}",
    )
    session.emit(deleted, lambda: deleted_text(str(ref), deleted))
    return Exit.OK


def deleted_text(ref: str, deleted: Any) -> str:
    """What ``model delete`` says: the tombstones it kept (none for a model never given a
    version). It frees nothing: each version's deletion freed its objects."""
    kept = int(deleted.get("tombstones", 0))
    stay = (
        ""
        if not kept
        else f" (its {kept} deleted version stays in the lineage made from it)"
        if kept == 1
        else f" (its {kept} deleted versions stay in the lineage made from them)"
    )
    return f"deleted {ref}; its name is free{stay}"


def run_grant(session: Session) -> int:
    args = session.args
    ref = parse_ref(args.model, "TEAM/NAME")
    method = "PUT" if args.action == "grant" else "DELETE"
    path = f"/v1/models/{ref.path}/grants/{segment(args.grantee)}"
    change = session.service("registry").call(method, path)
    verb = "may read" if change["granted"] else "may not read"
    same = "" if change.get("changed", True) else " (unchanged)"
    session.emit(change, lambda: f"{args.grantee} {verb} {ref}{same}")
    return Exit.OK


def run_download(session: Session) -> int:
    args = session.args
    ref = parse_ref(args.model, "TEAM/NAME", version=None, alias=True)
    registry = session.service("registry")
    if ref.version is None and ref.alias is None:
        latest = registry.get_every(f"/v1/models/{ref.path}/versions", "versions", limit=500)[
            "versions"
        ]
        if not latest:
            raise CliError(f"{ref} has no live version", Exit.NOT_FOUND)
        ref = Ref(ref.team, ref.name, int(latest[-1]["version"]))
    if ref.alias:
        ref = Ref(ref.team, ref.name, int(registry.get(_version_path(ref))["version"]))
    where = registry.get(f"{_version_path(ref)}/download")
    size = fetch_verified(registry, where, args.output)
    answer = {**where, "reference": str(ref), "path": str(args.output)}
    answer.pop("url", None)  # a presigned URL is a credential while it lasts
    session.emit(
        answer, lambda: f"downloaded {ref} to {args.output} ({size} bytes, sha256 verified)"
    )
    return Exit.OK


def fetch_verified(registry: TrainyardClient, where: dict[str, Any], output: Path) -> int:
    """Download ``where['url']`` into ``output`` (bytes counted); keep the file only when its
    size and sha256 are ``where``'s. Raises ``CliError`` and leaves no new file otherwise,
    reading no more than ``where['size_bytes']`` and a chunk."""
    # Through links to what they name: the verified file is renamed into place, and a
    # rename onto a link replaces the link (``-o /dev/stdout`` replaced the machine's).
    target = Path(os.path.realpath(output.expanduser()))
    if target.is_dir():
        raise CliError(f"-o: {output} is a folder; give a file name", Exit.USAGE)
    if target.exists() and not target.is_file():
        # A device or a pipe would be replaced by a file, not written to; the bytes go in
        # place only once verified, so there is no stream to give it.
        raise CliError(
            f"-o: {output} is not a regular file (a device, a pipe or a socket); give a file "
            "name: the bytes are put in place only once their sha256 is verified",
            Exit.USAGE,
        )
    folder = target.parent if str(target.parent) else Path(".")
    if not folder.is_dir():
        raise CliError(f"-o: no folder {folder}", Exit.USAGE)
    digest = hashlib.sha256()
    size = 0
    expected = int(where["size_bytes"])
    try:
        handle, temp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=folder)
    except OSError as exc:
        raise CliError(f"-o: cannot write {output}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(handle, "wb") as sink:

            def take(chunk: bytes) -> None:
                nonlocal size
                size += len(chunk)
                if size > expected:  # it cannot verify: stop reading, rather than fill the disk
                    raise CliError(
                        f"download does not match the registered version: more than "
                        f"{expected} bytes came, the registered size; stopped there, nothing "
                        "was written"
                    )
                digest.update(chunk)
                sink.write(chunk)

            download(registry, str(where["url"]), bool(where.get("needs_token")), take)
        if size != expected or digest.hexdigest() != where["sha256"]:
            raise CliError(
                f"download does not match the registered version: got {size} bytes with sha256 "
                f"{digest.hexdigest()}, expected {where['size_bytes']} bytes with {where['sha256']}; "
                "nothing was written"
            )
        os.replace(temp, target)
    except OSError as exc:  # a full disk, a rename refused: as the folder refusing the file
        Path(temp).unlink(missing_ok=True)
        raise CliError(f"-o: cannot write {output}: {exc.strerror or exc}") from None
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    note(f"verified sha256 {where['sha256']}")
    return size

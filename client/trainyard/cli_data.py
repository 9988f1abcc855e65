"""The CLI's data commands: ``trainyard dataset ls|show|register|grant|revoke`` and
``trainyard lineage up|down`` (docs/datasets.md, docs/lineage.md), at the registry URL.

``lineage`` prints the registry's graph as an indented tree from the root: upstream, each
node's children are what it came from; downstream, what was made from it. A node reached
twice is printed once in full and then as ``(see above)``, so a diamond does not repeat a
subtree; levels past ``INDENT_LEVELS`` keep its indent, their level written. ``--openlineage`` prints the registry's OpenLineage events (JSON) as they are.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainyard.cli_base import ID_MAX, CliError, Exit, Session, dumps, resolve, whole_arg
from trainyard.cli_models import Ref, name_arg, parse_ref
from trainyard.cli_render import none_yet, short, table, time_text
from trainyard.client import segment


def add_commands(
    command: Callable[..., argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    dataset = command("dataset", None, "datasets: versions and grants to other teams")
    actions = dataset.add_subparsers(dest="action", required=True, metavar="ACTION")

    def action(name: str, run: Callable[[Session], int], text: str) -> argparse.ArgumentParser:
        sub = actions.add_parser(name, parents=[common], help=text, description=text)
        sub.set_defaults(run=run)
        return sub

    action("ls", run_ls, "the datasets your team may read")
    show = action("show", run_show, "a dataset's versions (and grants), or one version")
    show.add_argument("dataset", metavar="TEAM/NAME[:V]")
    register = action("register", run_register, "register the next version of a dataset")
    register.add_argument("dataset", metavar="TEAM/NAME")
    register.add_argument("--uri", required=True, help="where the data is")
    register.add_argument("--sha256", required=True, help="its content hash (hex)")
    register.add_argument(
        "--size", type=whole_arg(0, ID_MAX, "bytes"), required=True, help="its size in bytes"
    )
    register.add_argument("--schema", type=Path, metavar="FILE", help="a JSON file: its schema")
    register.add_argument("--feature-version", default="", help="the code that made it")
    register.add_argument("--job", metavar="JOB", help="the job that produced it")
    for name, text in (("grant", "let a team read it"), ("revoke", "stop a team reading it")):
        change = action(name, run_grant, text)
        change.add_argument("dataset", metavar="TEAM/NAME")
        change.add_argument("grantee", type=name_arg("team"), metavar="TEAM", help="the team")

    lineage = command("lineage", None, "where a model version came from, what a dataset made")
    ways = lineage.add_subparsers(dest="action", required=True, metavar="ACTION")
    for name, metavar, text in (
        ("up", "TEAM/MODEL:V|@ALIAS", "everything a model version came from"),
        ("down", "TEAM/DATASET:V", "everything made from a dataset version"),
    ):
        way = ways.add_parser(name, parents=[common], help=text, description=text)
        way.add_argument("ref", metavar=metavar)
        way.add_argument("--openlineage", action="store_true", help="OpenLineage events (JSON)")
        way.set_defaults(run=run_lineage)


def _path(team: str, name: str) -> str:
    return f"/v1/datasets/{segment(team)}/{segment(name)}"


def run_ls(session: Session) -> int:
    registry = session.service("registry")
    # Every page: a listing is never cut short silently.
    found = registry.get_every("/v1/datasets", "datasets", limit=500)
    rows = [
        (f"{d['team']}/{d['name']}", d["latest_version"], time_text(d["created_at"]))
        for d in found["datasets"]
    ]
    session.emit(
        found,
        lambda: table(
            ("DATASET", "LATEST", "CREATED"),
            rows,
            empty=none_yet(
                "no datasets your team may read",
                "trainyard dataset register TEAM/NAME --uri URI --sha256 HEX --size BYTES",
                "adds one",
            ),
        ),
    )
    return Exit.OK


def run_show(session: Session) -> int:
    ref = parse_ref(session.args.dataset, "TEAM/NAME", version=None)
    registry = session.service("registry")
    if ref.version:
        v = registry.get(f"{_path(ref.team, ref.name)}/versions/{ref.version}")
        session.emit(v, lambda: _version_text(v))
        return Exit.OK
    found = registry.get_every(_path(ref.team, ref.name), "versions", limit=500)
    rows = [
        (
            v["version"],
            v["uri"],
            v["size_bytes"],
            v["sha256"][:12],
            v["feature_version"] or "-",
            short(v["producing_job_id"]) if v.get("producing_job_id") else "-",
            time_text(v["created_at"]),
        )
        for v in found["versions"]
    ]

    def text() -> str:
        grants = found.get("grants")
        head = f"{found['team']}/{found['name']}  latest version {found['latest_version']}"
        if grants is not None:
            head += f", read by: {', '.join(grants) or 'its team only'}"
        return (
            head
            + "\n\n"
            + table(("VERSION", "URI", "BYTES", "SHA256", "FEATURES", "JOB", "CREATED"), rows)
        )

    session.emit(found, text)
    return Exit.OK


def _version_text(v: dict[str, Any]) -> str:
    return "\n".join(
        [
            v["reference"],
            f"  uri:       {v['uri']}",
            f"  size:      {v['size_bytes']} bytes",
            f"  sha256:    {v['sha256']}",
            f"  features:  {v['feature_version'] or '-'}",
            f"  job:       {v.get('producing_job_id') or '-'}",
            f"  schema:    {json.dumps(v.get('data_schema') or {}, sort_keys=True)}",
            f"  created:   {time_text(v['created_at'])} by {v.get('created_by') or '-'}",
        ]
    )


def run_register(session: Session) -> int:
    args = session.args
    ref = parse_ref(args.dataset, "TEAM/NAME")
    body: dict[str, Any] = {
        "uri": args.uri,
        "sha256": args.sha256,
        "size_bytes": args.size,
        "feature_version": args.feature_version,
    }
    if args.schema is not None:
        try:
            body["data_schema"] = json.loads(args.schema.read_text())
        except (OSError, ValueError) as exc:
            raise CliError(
                f"--schema: cannot read {args.schema} as JSON: {exc}", Exit.USAGE
            ) from None
        except RecursionError:  # the decoder recurses per level
            raise CliError(
                f"--schema: cannot read {args.schema} as JSON: nested too deeply", Exit.USAGE
            ) from None
    if args.job:
        body["producing_job_id"] = resolve(session.client, args.job)
    v = session.service("registry").call("POST", f"{_path(ref.team, ref.name)}/versions", body)
    session.emit(v, lambda: "registered " + _version_text(v))
    return Exit.OK


def run_grant(session: Session) -> int:
    args = session.args
    ref = parse_ref(args.dataset, "TEAM/NAME")
    method = "PUT" if args.action == "grant" else "DELETE"
    path = f"{_path(ref.team, ref.name)}/grants/{segment(args.grantee)}"
    change = session.service("registry").call(method, path)
    verb = "may read" if change["granted"] else "may not read"
    same = "" if change.get("changed", True) else " (unchanged)"
    session.emit(change, lambda: f"{args.grantee} {verb} {ref}{same}")
    return Exit.OK


def run_lineage(session: Session) -> int:
    args = session.args
    up = args.action == "up"
    # A model version may be named by an alias, as model show and download take it; a
    # dataset has none.
    ref = parse_ref(args.ref, "TEAM/NAME:V", version=True, alias=up)
    kind, way = ("models", "upstream") if up else ("datasets", "downstream")
    registry = session.service("registry")
    if ref.alias:
        pointed = registry.get(f"/v1/models/{ref.path}/versions/by-alias/{segment(ref.alias)}")
        ref = Ref(ref.team, ref.name, int(pointed["version"]))
    path = (
        f"/v1/lineage/{kind}/{segment(ref.team)}/{segment(ref.name)}/versions/{ref.version}/{way}"
    )
    if args.openlineage:
        print(dumps(registry.get(path, format="openlineage")))
        return Exit.OK
    graph = registry.get(path)
    session.emit(graph, lambda: render_tree(graph))
    return Exit.OK


def node_label(node: dict[str, Any]) -> str:
    """One node of a lineage graph as a line of text."""
    kind = node.get("kind")
    if kind == "job":
        return f"job {short(str(node.get('job_id')))} {node.get('name', '')} ({node.get('status', '?')})"
    if kind in ("dataset_version", "model_version"):
        what = "dataset" if kind == "dataset_version" else "model"
        # A deleted model's name may be a model made again: say which version is whose.
        gone = (
            " (deleted with its model)"
            if node.get("model_deleted")
            else " (deleted)"
            if node.get("deleted")
            else ""
        )
        return f"{what} {node.get('team')}/{node.get('name')}:{node.get('version')}{gone}"
    if kind == "checkpoint":
        return f"checkpoint {node.get('uri') or node['id'].split(':', 1)[-1]}"
    return str(node.get("id"))


def render_tree(graph: dict[str, Any]) -> str:
    """The graph as an indented tree from its root (see the module's docstring)."""
    nodes = {n["id"]: n for n in graph.get("nodes", [])}
    upstream = graph.get("direction") == "upstream"
    children: dict[str, list[tuple[str, str]]] = {}
    for edge in graph.get("edges", []):
        parent, child = (edge["to"], edge["from"]) if upstream else (edge["from"], edge["to"])
        children.setdefault(parent, []).append((edge["relation"], child))
    lines: list[str] = []
    seen: set[str] = set()
    # Depth first from a stack, not a call per level: the registry answers chains of
    # thousands of nodes (a model fine-tuned from one fine-tuned from ...).
    stack: list[tuple[str, str, int]] = [(graph["root"], "", 0)]
    while stack:
        node_id, relation, depth = stack.pop()
        node = nodes.get(node_id, {"id": node_id})
        prefix = _indent(depth) + (f"<-{relation}- " if upstream else f"-{relation}-> ") * bool(
            relation
        )
        if node_id in seen:
            lines.append(f"{prefix}{node_label(node)} (see above)")
            continue
        seen.add(node_id)
        lines.append(prefix + node_label(node))
        stack.extend(
            (child, rel, depth + 1) for rel, child in reversed(sorted(children.get(node_id, [])))
        )
    notes = []
    if graph.get("hidden"):
        notes.append(f"{graph['hidden']} nodes of other teams hidden")
    if graph.get("truncated"):
        notes.append("truncated at the registry's limit")
    return "\n".join(lines + ([f"({'; '.join(notes)})"] if notes else []))


INDENT_LEVELS = 32
"""Levels a lineage tree indents; deeper ones stay at this indent, their level written
(``(40) <-saved- ...``), so a chain of thousands of nodes prints in lines of bounded width."""


def _indent(depth: int) -> str:
    if depth <= INDENT_LEVELS:
        return "  " * depth
    return "  " * INDENT_LEVELS + f"({depth}) "

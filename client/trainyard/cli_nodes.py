"""``trainyard nodes``: the cluster's nodes; cordoning one, retiring one (operators; the
scheduler's API).

    trainyard nodes ls [--retired]           every node: flavor, GPUs, state, last heard, cordon
    trainyard nodes show NODE                NODE's cordon and its etag
    trainyard nodes cordon NODE --reason T [--if-match ETAG]
                                             no new allocation on NODE; its running jobs go on
    trainyard nodes uncordon NODE [--if-match ETAG]
                                             NODE takes new work again (an automatic cordon too)
    trainyard nodes retire NODE              forget a lost NODE taken out for good

The list is the ``nodes`` of the scheduler's ``GET /v1/queue`` (what the dashboard's nodes
page reads; ``--json`` prints that list), retired nodes only with ``--retired``
(``?retired=true``); cordon and uncordon are ``POST /v1/admin/nodes/{node}/cordon|uncordon``,
whose answer (the node's cordon, null once lifted) ``--json`` prints; retire is ``DELETE
/v1/admin/nodes/{node}`` (204; ``--json`` prints ``{"retired": NODE}``), which the scheduler
refuses with 409 naming why for a node that is ready or still holds a live allocation (exit
1). All four are for operators: the scheduler answers 403 to anyone else, and 404 to a node
it has never heard of; both are one line (exit 4, exit 3). A blank ``--reason`` is refused
before any request (exit 2); one the scheduler refuses (over 500 characters, a control
character) is its 422 naming ``reason`` (exit 1).

``show`` is ``GET /v1/admin/nodes/{node}/cordon`` and prints the cordon's ``etag`` last (the
scheduler's ``ETag``; with ``--json`` on stderr, ``cli_base.emit_tagged``). ``cordon`` and
``uncordon`` with ``--if-match ETAG`` send it as ``If-Match``: the change goes ahead only
while the cordon is as ``show`` printed it; when another operator changed it since, nothing
changes and one line says so and to run ``show`` again (exit 1, ``cli_base.refusal_text``).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from trainyard.cli_base import Exit, Session, add_if_match, asked, if_match
from trainyard.cli_render import none_yet, table, time_text
from trainyard.client import segment

HEADER = ("NODE", "FLAVOR", "GPUS", "USED", "FREE", "STATE", "LAST HEARD", "CORDON")


def add_commands(
    command: Callable[..., argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    """Add ``nodes ls|cordon|uncordon|retire`` to the CLI's commands (``common``: the options
    every command takes)."""
    nodes = command("nodes", None, "operators: the nodes, their GPUs and state; cordon, retire")
    actions = nodes.add_subparsers(dest="action", required=True, metavar="ACTION")

    def action(name: str, run: Callable[[Session], int], text: str) -> argparse.ArgumentParser:
        sub = actions.add_parser(name, parents=[common], help=text, description=text)
        sub.set_defaults(run=run)
        return sub

    ls = action("ls", run_list, "every node: flavor, GPUs used and free, state, last heard, cordon")
    ls.add_argument("--retired", action="store_true", help="list retired nodes too")
    show = action("show", run_show, "NODE's cordon (none: it takes new work) and its etag")
    show.add_argument("node", metavar="NODE", help="the node's id (as `nodes ls` shows it)")
    cordon = action("cordon", run_cordon, "no new allocation on NODE; its running jobs go on")
    cordon.add_argument("node", metavar="NODE", help="the node's id (as `nodes ls` shows it)")
    cordon.add_argument("--reason", required=True, help="why, for the other operators")
    add_if_match(cordon)
    uncordon = action("uncordon", run_uncordon, "NODE takes new work again (any cordon lifted)")
    uncordon.add_argument("node", metavar="NODE", help="the node's id")
    add_if_match(uncordon)
    retire = action(
        "retire", run_retire, "forget NODE, lost and taken out for good (its history stays)"
    )
    retire.add_argument("node", metavar="NODE", help="the node's id")


def run_list(session: Session) -> int:
    retired = "true" if session.args.retired else None
    answer = _asked(lambda: session.service("scheduler").get("/v1/queue", retired=retired))
    nodes: list[dict[str, Any]] = answer["nodes"]
    session.emit(nodes, lambda: nodes_text(nodes))
    return Exit.OK


def run_show(session: Session) -> int:
    path = f"/v1/admin/nodes/{segment(session.args.node)}/cordon"
    found = _asked(lambda: session.service("scheduler").get(path))
    session.emit_tagged(found, lambda: f"{found['node_id']}: cordon {cordon_text(found['cordon'])}")
    return Exit.OK


def _show_command(node: str) -> str:
    """The command that shows NODE's cordon (after a 412: it changed since it was read)."""
    return f"trainyard nodes show {node}"


def run_cordon(session: Session) -> int:
    args = session.args
    path = f"/v1/admin/nodes/{segment(args.node)}/cordon"
    scheduler = session.service("scheduler")
    found = asked(
        "scheduler",
        lambda: scheduler.call("POST", path, {"reason": args.reason}, if_match(args)),
        _show_command(args.node),
    )
    session.emit(found, lambda: f"cordoned {found['node_id']}: {cordon_text(found['cordon'])}")
    return Exit.OK


def run_uncordon(session: Session) -> int:
    args = session.args
    path = f"/v1/admin/nodes/{segment(args.node)}/uncordon"
    scheduler = session.service("scheduler")
    found = asked(
        "scheduler",
        lambda: scheduler.call("POST", path, None, if_match(args)),
        _show_command(args.node),
    )
    session.emit(found, lambda: f"uncordoned {found['node_id']}: it takes new work")
    return Exit.OK


def run_retire(session: Session) -> int:
    node = session.args.node
    path = f"/v1/admin/nodes/{segment(node)}"
    _asked(lambda: session.service("scheduler").delete(path))
    session.emit({"retired": node}, lambda: f"retired {node}: left out until it heartbeats again")
    return Exit.OK


def _asked(call: Callable[[], Any]) -> Any:
    """``call()``'s answer; the scheduler's refusal as one line naming it, with its exit code
    (403: 4, 404: 3, unreachable: 5, else 1; ``cli_base.asked``)."""
    return asked("scheduler", call)


def nodes_text(nodes: list[dict[str, Any]]) -> str:
    """The nodes as a table, by id: its flavor (``-``: none, undeclared while the node
    inventory is required), GPUs in all (what it is placed on: no more than the node
    inventory declares), leased and free for new work (none on a lost or cordoned node),
    ``ready``/``cordoned``/``lost``/``retired`` with what the inventory capped of its claim,
    the last heartbeat, and the cordon."""
    rows = [
        (
            node["node_id"],
            node["gpu_flavor"] or "-",  # none: undeclared while the inventory is required
            node["gpu_count"],
            len(node["used_gpus"]),
            len(node["free_gpus"]),
            _state(node),
            time_text(node["last_heartbeat"]),
            cordon_text(node.get("cordon")),
        )
        for node in sorted(nodes, key=lambda n: str(n["node_id"]))
    ]
    return table(HEADER, rows, empty=NO_NODES)


NO_NODES = none_yet(
    "no nodes: none has sent a heartbeat yet",
    "python -m trainyard_platform.services.runner on a GPU machine",
    "starts one",
)


def _state(node: dict[str, Any]) -> str:
    """Its state, and what the node inventory capped of its claim: ``ready (capped:
    gpu_count)`` (``trainyard admin node-inventory show NODE`` says how)."""
    if node.get("retired_at"):
        return "retired"
    if node["status"] == "LOST":
        state = "lost"
    else:
        state = "cordoned" if node.get("cordon") else str(node["status"]).lower()
    capped = node.get("capped") or []
    return f"{state} (capped: {', '.join(capped)})" if capped else state


def cordon_text(cordon: dict[str, Any] | None) -> str:
    """A cordon on one line: who, since and until when, why (``-``: none)."""
    if not cordon:
        return "-"
    until = time_text(cordon["until"]) if cordon.get("until") else "uncordoned"
    reason = " ".join(str(cordon["reason"]).split())  # one line, whatever the reason holds
    return f"by {cordon['by']} since {time_text(cordon['since'])} until {until}: {reason}"

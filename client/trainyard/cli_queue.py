"""``trainyard queue``: what waits, and why; the team's line, or every team's (operators).

    trainyard queue [--limit N]          the team's waiting jobs in order (the submission API)
    trainyard queue --all-teams [--team T] [--flavor F] [--limit N]
                                         every queue's waiting jobs (operators; the scheduler)

``--all-teams`` reads the scheduler's ``GET /v1/queue`` (``login --scheduler-url`` or
``TRAINYARD_SCHEDULER_URL``, an operator's token; 403 to anyone else, exit 4): each queue
with its first ``PENDING_SHOWN`` (100) waiting jobs in queue order and how many wait in all,
so its answer stays bounded however long the lines are. The table lists, queue by queue
(by team, then name; a queue where nothing waits is left out), at most ``--limit`` waiting
jobs of each (default ``ALL_TEAMS_LIMIT``), in order: position, job, GPUs, flavor, priority,
time waited since submission, estimated start and why it waits. ``--team`` keeps the queues
of one team, ``--flavor`` the jobs of one GPU flavor. Where the answer's head holds fewer than
``--limit`` of them and the queue has more, the rest is read from ``GET
/v1/queue/{name}/pending`` a page at a time, only until ``--limit`` are found. A queue with
more waiting than it shows gets one note on stderr (``queue vision: 20 of 5321 waiting jobs
shown (--limit N shows more)``). ``--json`` prints the shown queues as the scheduler answers
them (``name``, ``team``, ``waiting``: how many in all, ...), each with ``pending`` holding
the jobs shown. ``--team`` and ``--flavor`` without ``--all-teams`` are a usage error (exit 2).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from functools import partial
from typing import Any

from trainyard import cli_jobs
from trainyard.cli_base import CliError, Exit, Session, asked, note, positive_arg
from trainyard.cli_render import duration, none_yet, short, table, time_text, waiting_reason
from trainyard.client import TrainyardClient, segment

OWN_TEAM_LIMIT = 100
"""``queue``'s ``--limit`` for the team's own line."""
ALL_TEAMS_LIMIT = 20
"""``queue --all-teams``' ``--limit``: waiting jobs shown per queue (a screen of each team)."""
PAGE_MAX = 1000
"""The most rows a page of ``GET /v1/queue/{name}/pending`` holds (the scheduler's bound)."""
HEADER = (
    "QUEUE",
    "TEAM",
    "POS",
    "JOB",
    "GPUS",
    "FLAVOR",
    "PRIORITY",
    "WAITED",
    "EST. START",
    "REASON",
)


def add_command(command: Callable[..., argparse.ArgumentParser]) -> None:
    """Add ``queue`` to the CLI's commands."""
    queue = command("queue", run_queue, "the team's waiting jobs and why they wait")
    queue.add_argument(
        "--all-teams",
        action="store_true",
        help="operators: every queue's waiting jobs, from the scheduler",
    )
    queue.add_argument("--team", help="with --all-teams: only this team's queues")
    queue.add_argument("--flavor", help="with --all-teams: only jobs of this GPU flavor")
    queue.add_argument(
        "--limit",
        type=positive_arg,
        help=f"at most this many ({OWN_TEAM_LIMIT}; with --all-teams: "
        f"per queue, {ALL_TEAMS_LIMIT})",
    )


def run_queue(session: Session) -> int:
    args = session.args
    if not args.all_teams:
        if args.team is not None or args.flavor is not None:
            raise CliError("--team and --flavor go with --all-teams (operators)", Exit.USAGE)
        args.limit = args.limit or OWN_TEAM_LIMIT
        return cli_jobs.queue(session)
    limit: int = args.limit or ALL_TEAMS_LIMIT
    scheduler = session.service("scheduler")
    answer = asked("scheduler", lambda: scheduler.get("/v1/queue"))
    queues = sorted(
        (q for q in answer["queues"] if args.team is None or q["team"] == args.team),
        key=lambda q: (str(q["team"]), str(q["name"])),
    )
    shown: list[dict[str, Any]] = []
    for queue in queues:
        jobs = asked("scheduler", partial(_waiting, scheduler, queue, limit, args.flavor))
        if jobs:
            shown.append({**queue, "pending": jobs})
    for queue in shown:
        more = _more(queue, limit, args.flavor)
        if more:
            note(more)
    session.emit(shown, lambda: _table(shown, args.team, args.flavor))
    return Exit.OK


def _fits(job: dict[str, Any], flavor: str | None) -> bool:
    return flavor is None or job["gpu_flavor"] == flavor


def _waiting(
    scheduler: TrainyardClient, queue: dict[str, Any], limit: int, flavor: str | None
) -> list[dict[str, Any]]:
    """The first ``limit`` waiting jobs of ``queue`` (of ``flavor``), in queue order: from the
    head ``GET /v1/queue`` answered when it holds them or the whole line, else read again from
    the queue's pages, only as far as needed."""
    head = [job for job in queue["pending"] if _fits(job, flavor)]
    if len(head) >= limit or len(queue["pending"]) >= queue["waiting"]:
        return head[:limit]
    found: list[dict[str, Any]] = []
    path = f"/v1/queue/{segment(queue['name'])}/pending"
    # A flavor's jobs may lie far down the line: read it in the largest pages then.
    size = PAGE_MAX if flavor else min(limit, PAGE_MAX)
    for page in scheduler.get_pages(path, limit=size):
        found += [job for job in page if _fits(job, flavor)]
        if len(found) >= limit:
            break
    return found[:limit]


def _more(queue: dict[str, Any], limit: int, flavor: str | None) -> str | None:
    """The note for a queue where more wait than it shows, or None."""
    count = len(queue["pending"])
    if flavor is None and queue["waiting"] > count:
        shown = f"{count} of {queue['waiting']} waiting jobs shown"
    elif flavor is not None and count >= limit and queue["waiting"] > count:
        shown = (
            f"the first {count} waiting jobs of flavor {flavor} shown, of {queue['waiting']} in all"
        )
    else:
        return None
    return f"queue {queue['name']}: {shown} (--limit N shows more)"


def _table(queues: list[dict[str, Any]], team: str | None, flavor: str | None) -> str:
    rows = [
        (
            queue["name"],
            queue["team"],
            job.get("position") or "-",
            short(job["job_id"]),
            job["gpus"],
            job["gpu_flavor"],
            job["priority"],
            duration(job["submitted_at"], None),
            time_text(job.get("estimated_start")),
            waiting_reason(job),
        )
        for queue in queues
        for job in queue["pending"]
    ]
    where = "any queue" if team is None else f"a queue of team {team}"
    of_flavor = "" if flavor is None else f" for {flavor}"
    nothing = f"no job waits{of_flavor} in {where}"
    return table(HEADER, rows, empty=none_yet(nothing, "trainyard submit SPEC", "submits one"))

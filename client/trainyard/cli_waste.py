"""``trainyard waste``: billing's waste figures and the job success rate (``GET /v1/waste``).

``trainyard waste [--by DIMS] [--from T] [--to T] [--team ...] [--job JOB] [--csv]``: one row
per group and figure (idle GPUs, queueing, failed attempts, platform failures (charged to
the platform, not the team), lost work, input-bound time, low-priority holding; the ``*_unmeasured`` rows are GPU time nobody measured, not waste),
then unallocated GPUs (operators), unattributed spend (must be 0) and the success rate per
day, team and queue. ``--json`` prints billing's answer; ``--csv`` billing's CSV of the rows,
as it is. A user sees their own team's figures; an operator every team's.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from typing import Any

from trainyard.cli_base import CliError, Exit, Session, refused, resolved_job
from trainyard.cli_render import money, short, table, time_text
from trainyard.cli_tracking import billing_csv, filtered_text
from trainyard.client import TrainyardError

DIMENSIONS = ("team", "project", "user", "queue", "flavor", "job")
"""What billing's ``GET /v1/waste`` groups and filters by (docs/billing.md)."""


def dimensions_arg(value: str) -> list[str]:
    """``--by``: known dimensions, comma-separated, each once."""
    dims = [d.strip() for d in value.split(",") if d.strip()]
    unknown = [d for d in dims if d not in DIMENSIONS]
    if unknown or not dims:
        raise argparse.ArgumentTypeError(
            f"unknown dimension {', '.join(map(repr, unknown)) or repr(value)} "
            f"(one of {', '.join(DIMENSIONS)})"
        )
    if len(set(dims)) != len(dims):
        raise argparse.ArgumentTypeError(f"{value!r} names a dimension twice")
    return dims


def add_command(command: Callable[..., argparse.ArgumentParser]) -> None:
    waste = command("waste", run_waste, "waste priced per team, project, user, job; success rate")
    waste.add_argument(
        "--by",
        type=dimensions_arg,
        metavar="DIMS",
        help=f"group by these, comma-separated (default team): {', '.join(DIMENSIONS)}",
    )
    waste.add_argument(
        "--from",
        dest="start",
        metavar="TIME",
        help="ISO 8601, a whole UTC hour, or a month: 2026-11 (default: this month)",
    )
    waste.add_argument(
        "--to",
        dest="end",
        metavar="TIME",
        help="ISO 8601 or a month, excluded (default: the end of --from's month)",
    )
    for dim in DIMENSIONS:
        waste.add_argument(f"--{dim}", help=f"only this {dim}")
    waste.add_argument("--csv", action="store_true", help="billing's CSV of the rows, as it is")


def run_waste(session: Session) -> int:
    args = session.args
    if args.csv and session.as_json:
        raise CliError("--json and --csv are two outputs: give one", Exit.USAGE)
    billing = session.service("billing")
    params: dict[str, str | None] = {
        "group_by": ",".join(args.by or ["team"]),
        "from": args.start,
        "to": args.end,
        **{d: getattr(args, d) for d in DIMENSIONS},
    }
    if args.job is not None:  # an id or a unique prefix, as everywhere
        params["job"] = resolved_job(session, args.job)
    try:
        if args.csv:
            sys.stdout.write(billing_csv(billing, "/v1/waste", params))
            return Exit.OK
        report = billing.get("/v1/waste", **params)
    except TrainyardError as exc:
        raise refused(f"billing: {exc}", exc) from None
    session.emit(report, lambda: waste_text(report))
    return Exit.OK


def _hours(seconds: Any) -> str:
    try:
        return f"{Decimal(str(seconds)) / 3600:.2f}"
    except (InvalidOperation, ValueError):
        return "-"


def _money(row: dict[str, Any]) -> str:
    text = f"{money(row.get('cost'))} {row.get('currency', '')}".rstrip()
    unpriced = Decimal(str(row.get("unpriced_gpu_seconds") or 0))
    return f"{text} (+{_hours(unpriced)} GPU-h unpriced)" if unpriced else text


def waste_text(report: dict[str, Any]) -> str:
    """``GET /v1/waste``'s answer as tables."""
    dims = list(report.get("group_by") or [])
    span = f"{time_text(report.get('start'))} to {time_text(report.get('end'))}"
    rows = [
        (
            *((short(str(r[d])) if d == "job" and r.get(d) else r.get(d) or "-") for d in dims),
            r["figure"],
            _hours(r.get("gpu_seconds")),
            _money(r),
            _hours(r.get("seconds")) if r["figure"] == "queueing" else "",
        )
        for r in report.get("rows") or []
    ]
    header = (*(d.upper() for d in dims), "FIGURE", "GPU-HOURS", "COST", "WAIT-HOURS")
    lines = [
        f"waste {span} (idle: under {report.get('idle_threshold_percent')} % utilisation)",
        table(header, rows, empty=f"no waste measured{filtered_text(report)}"),
    ]
    if report.get("truncated"):
        lines.append("(more rows than the limit: the totals cover them all)")
    totals = report.get("totals") or []
    if totals:
        lines.append("\ntotal per figure:")
        lines.append(
            table(
                ("FIGURE", "GPU-HOURS", "COST"),
                [(t["figure"], _hours(t["gpu_seconds"]), _money(t)) for t in totals],
            )
        )
    spare = report.get("unallocated") or []
    if spare:
        lines.append("\nGPUs unallocated while jobs of their flavor waited:")
        lines.append(
            table(
                ("FLAVOR", "GPU-HOURS", "COST"),
                [(s.get("flavor") or "-", _hours(s["gpu_seconds"]), _money(s)) for s in spare],
            )
        )
    for u in report.get("unattributed") or []:
        lines.append(
            f"\nunattributed spend: {money(u['cost'])} {u['currency']} "
            f"({_hours(u['gpu_seconds'])} GPU-hours) of {money(u['ledger_cost'])} "
            f"{u['currency']} billed"
        )
    success = report.get("success") or []
    if success:
        lines.append("\njob success rate:")
        lines.append(
            table(
                ("DAY", "TEAM", "QUEUE", "ENDED", "SUCCEEDED", "FAILED", "CANCELLED", "RATE"),
                [
                    (
                        str(s["day"])[:10],
                        s.get("team") or "-",
                        s.get("queue") or "-",
                        s["ended"],
                        s["succeeded"],
                        s["failed"],
                        s["cancelled"],
                        f"{Decimal(str(s['success_rate'])) * 100:.1f} %",
                    )
                    for s in success
                ],
            )
        )
    return "\n".join(lines)

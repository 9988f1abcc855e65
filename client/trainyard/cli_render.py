"""How the CLI shows things to people: job views, tables, durations, sparklines.

Tables are plain text in aligned columns (no colours, no box drawing), so they read the same
in a terminal, a pipe, a log or ``grep``; ``--json`` is the format for scripts.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from collections.abc import Sequence
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from trainyard.bundle import format_size

SHORT_ID = 8
"""How many characters of a job id a table shows (any unique prefix is accepted back)."""
SPARKS = "▁▂▃▄▅▆▇█"


def table(header: Sequence[str], rows: Sequence[Sequence[object]], empty: str = "") -> str:
    """``rows`` under ``header`` in aligned columns; ``empty`` when there are no rows."""
    if not rows and empty:
        return empty
    cells = [[str(c) for c in header]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in cells
    )


MONEY_PLACES = 6
"""The places every amount of money is shown to: billing's, never rounded for a view or a
table, so that rows add up to their total on the screen as they do in the ledger, and one
cost reads the same in ``describe``, ``ls``, ``cost``, ``waste``, ``budget`` and ``model
show``."""


def money(value: Any, currency: str | None = None) -> str:
    """An amount of money (a decimal string as billing sends it, or a number) as every
    command shows it: to ``MONEY_PLACES`` places, then its ``currency`` when given; ``-``
    for none, and what is no number as it came."""
    if value is None:
        return "-"
    try:
        text = f"{Decimal(str(value)):.{MONEY_PLACES}f}"
    except (InvalidOperation, ValueError):
        text = str(value)
    return f"{text} {currency}" if currency else text


def none_yet(nothing: str, command: str, does: str = "creates one") -> str:
    """What a listing with no rows says: ``nothing`` (``no budgets``), then the next step,
    the command that makes one and what it ``does``: ``no budgets (trainyard budget set TEAM
    --amount A creates one)``. Every listing that can be empty says it this way, so that
    none ends with nothing to do."""
    return f"{nothing} ({command} {does})"


def short(job_id: str) -> str:
    return job_id[:SHORT_ID]


def attempt_number(index: int) -> int:
    """An attempt as people count it: the API, the events and the stored keys carry its
    0-based index (``attempt``: 0 for the first), every view shows 1 for it."""
    return index + 1


def attempt_text(index: int) -> str:
    return f"attempt {attempt_number(index)}"


_STREAM = re.compile(r"a([0-9]{4,})-(.+)")


def stream_text(stream: str) -> str:
    """A log stream as people read it: ``a0001-node-7`` -> ``attempt 2 on node-7`` (a name
    of another form as it is)."""
    match = _STREAM.fullmatch(stream)
    return f"{attempt_text(int(match[1]))} on {match[2]}" if match else stream


def sparkline(values: Sequence[float | None], width: int = 40) -> str:
    """``values`` as a line of block characters (NaN, inf and None as spaces), at most
    ``width`` wide (each character the mean of its share of the values)."""
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return ""
    buckets: list[list[float]] = [[] for _ in range(min(width, len(values)))]
    for i, v in enumerate(values):
        if v is not None and math.isfinite(v):
            buckets[i * len(buckets) // len(values)].append(v)
    low, high = min(finite), max(finite)
    out = ""
    for bucket in buckets:
        if not bucket:
            out += " "
            continue
        mean = sum(bucket) / len(bucket)
        level = 0 if high == low else round((mean - low) / (high - low) * (len(SPARKS) - 1))
        out += SPARKS[level]
    return out


def duration(started: str | None, finished: str | None, now: datetime | None = None) -> str:
    """How long a job ran (so far): ``1h02m``, ``3m05s``, ``12s``; ``-`` before it started."""
    if not started:
        return "-"
    try:
        start = datetime.fromisoformat(started)
        end = datetime.fromisoformat(finished) if finished else (now or datetime.now(UTC))
    except ValueError:
        return "-"
    seconds = max(0, int((end - start).total_seconds()))
    if seconds >= 86_400:
        return f"{seconds // 86_400}d{seconds % 86_400 // 3600:02d}h"
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"


class FollowPrinter:
    """Prints what changed in a job view since the last one: new history entries, metrics,
    checkpoints, the model and the final cost."""

    def __init__(self, quiet: bool = False) -> None:
        self._quiet = quiet
        self._history = 0
        self._step: int | None = None
        self._checkpoints = 0
        self._model = False
        self._cost = False

    def __call__(self, view: dict[str, Any]) -> None:
        for line in self.changes(view):
            if not self._quiet:
                print(line, flush=True)

    def changes(self, view: dict[str, Any]) -> list[str]:
        lines: list[str] = []
        for entry in view["history"][self._history :]:
            reason = f"  {entry['reason']}" if entry.get("reason") else ""
            # A reason of several lines stays indented under its entry, as in describe.
            line = f"{time_text(entry['at'])}  {entry['status']}{reason}"
            lines.append(line.replace("\n", "\n" + " " * 10))
        self._history = len(view["history"])
        if view.get("pending") and lines:
            lines.append(f"          {pending_text(view['pending'])}")
        if view.get("step") is not None and view["step"] != self._step:
            self._step = view["step"]
            lines.append(f"          step {view['step']}: {metrics_text(view['metrics'])}")
        for ckpt in view["checkpoints"][self._checkpoints :]:
            lines.append(
                f"          checkpoint at step {ckpt['step']} ({_size(ckpt['size_bytes'])})"
            )
        self._checkpoints = len(view["checkpoints"])
        if view.get("model") and not self._model:
            self._model = True
            lines.append(f"          model registered: {_model(view['model'])}")
        if view["cost"]["final"] and not self._cost:
            self._cost = True
            lines.append(f"          cost: {cost_text(view['cost'])}")
        return lines


def render_job(view: dict[str, Any]) -> str:
    """A job view for people."""
    spec = view["spec"]
    status = view["status"]
    if view.get("node"):
        gpus = ",".join(str(i) for i in view.get("gpu_indices") or []) or "none"
        at = "" if view.get("attempt") is None else f"{attempt_text(view['attempt'])} "
        status += f" ({at}on {view['node']}, GPUs {gpus})"
    if view.get("cancel_requested") and not view.get("terminal"):
        status += ", cancellation requested"
    rows = [
        ("job", f"{view['id']}  {view['name']}"),
        ("status", status),
        ("owner", f"{view['team']}/{view['user']}"),
        ("project", spec.get("project") or "default"),
        (
            "resources",
            f"{spec['gpus']} x {spec['gpu_flavor']}, {_program(spec)} "
            f"{' '.join(spec.get('args') or [])}".rstrip(),
        ),
        # The class it runs at: a spent budget may have lowered the one asked for.
        ("priority", spec.get("priority") or "normal"),
        (
            "times",
            "  ".join(
                f"{label} {time_text(view[key])}"
                for label, key in (
                    ("submitted", "submitted_at"),
                    ("started", "started_at"),
                    ("finished", "finished_at"),
                )
                if view.get(key)
            ),
        ),
    ]
    if spec.get("experiment"):
        rows.append(("experiment", spec["experiment"]))
    if spec.get("labels"):
        rows.append(("labels", " ".join(f"{k}={v}" for k, v in sorted(spec["labels"].items()))))
    if view.get("started_at"):
        rows.append(("duration", duration(view["started_at"], view.get("finished_at"))))
    if spec.get("code"):
        rows.append(("code", _code(spec["code"])))
    if view.get("pending"):
        rows.append(("pending", pending_text(view["pending"])))
    if view.get("step") is not None or view.get("metrics"):
        rows.append(("metrics", f"step {view.get('step')}: {metrics_text(view['metrics'])}"))
    if view["checkpoints"]:
        last = view["checkpoints"][-1]
        rows.append(
            ("checkpoints", f"{len(view['checkpoints'])}, latest step {last['step']} {last['uri']}")
        )
    if view.get("model"):
        rows.append(("model", _model(view["model"])))
    rows.append(("cost", cost_text(view["cost"])))
    if view.get("failure"):
        failure = view["failure"]
        code = "" if failure.get("exit_code") is None else f" (exit code {failure['exit_code']})"
        rows.append(("failure", failure["reason"] + code))
        rows.extend(("", line) for line in (failure.get("log_tail") or "").splitlines()[-10:])
    rows.append(("history", ""))
    rows.extend(
        ("", f"{time_text(h['at'])}  {h['status']:<10} {h.get('reason') or ''}".rstrip())
        for h in view["history"]
    )
    # A value of several lines (a failure's reason may hold a tool's output) stays in its
    # column: each further line is indented under the first.
    return "\n".join(
        f"{label:<12}{value}".rstrip().replace("\n", "\n" + " " * 12) for label, value in rows
    )


NO_JOBS = none_yet("no jobs", "trainyard submit SPEC", "submits one")
"""What an empty job listing says."""
LIST_HEADER = ("ID", "NAME", "USER", "STATUS", "REASON", "GPUS", "SUBMITTED", "DURATION", "COST")
REASON_WIDTH = 48


def render_list(jobs: list[dict[str, Any]], with_team: bool = False) -> str:
    """The job list as a table (``no jobs`` when empty); ``with_team``: a TEAM column first
    (a list of every team's jobs)."""
    if with_team:
        rows = [(str(j.get("team", "-")), *list_row(j)) for j in jobs]
        return table(("TEAM", *LIST_HEADER), rows, empty=NO_JOBS)
    return table(LIST_HEADER, [list_row(j) for j in jobs], empty=NO_JOBS)


def summary_reason(view: dict[str, Any]) -> str | None:
    """The reason ``GET /v1/jobs`` gives a job, from its full view (``trainyard get`` shows
    the same line as ``ls``): why it waits (QUEUED, PENDING), why it failed (FAILED), else
    the reason of its latest change, if that had one (cancelled by whom, preempted by what)."""
    if view["status"] in ("QUEUED", "PENDING"):
        waiting = (view.get("pending") or {}).get("reason")
        if waiting:
            return str(waiting)
    if view["status"] == "FAILED":
        failed = (view.get("failure") or {}).get("reason")
        if failed:
            return str(failed)
    history = view.get("history") or []
    latest = history[-1].get("reason") if history else None
    return str(latest) if latest else None


def list_row(job: dict[str, Any]) -> tuple[str, ...]:
    reason = " ".join(str(job.get("reason") or "-").split())
    if len(reason) > REASON_WIDTH:
        reason = reason[: REASON_WIDTH - 1] + "…"
    return (
        short(job["id"]),
        job["name"],
        job["user"],
        job["status"],
        reason,
        f"{job['gpus']}x{job['gpu_flavor']}",
        time_text(job["submitted_at"]),
        duration(job.get("started_at"), job.get("finished_at")),
        money(job["cost"], job["currency"]) if job.get("currency") else "-",
    )


def _program(spec: dict[str, Any]) -> str:
    return str(spec.get("entrypoint") or shlex.join(spec.get("command") or []))


def _code(code: dict[str, Any]) -> str:
    if code.get("kind") == "bundle":
        return f"bundle {str(code['sha256'])[:7]} ({_size(int(code['size_bytes']))})"
    if code.get("kind") == "git":
        return f"git {code['repository']} @ {str(code['commit'])[:12]}"
    return json.dumps(code, sort_keys=True)


def pending_text(pending: dict[str, Any]) -> str:
    parts = [pending.get("reason") or "waiting"]
    if pending.get("position") is not None:
        parts.append(f"position {pending['position']}")
    if pending.get("estimated_start"):
        parts.append(f"estimated start {time_text(pending['estimated_start'])}")
    if pending.get("blocking"):
        parts.append(f"blocked by {pending['blocking']}")
    if pending.get("suggestion"):
        parts.append(f"suggestion: {pending['suggestion']}")
    return ", ".join(parts)


def waiting_reason(pending: dict[str, Any]) -> str:
    """Why a job waits, on one line: the scheduler's reason, what blocks it, its suggestion
    and the end of a back-off after a failure (``-``: none said)."""
    parts = (
        pending.get("reason"),
        pending.get("blocking") and f"blocked by {pending['blocking']}",
        pending.get("suggestion") and f"suggestion: {pending['suggestion']}",
        pending.get("eligible_at") and f"backing off until {time_text(pending['eligible_at'])}",
    )
    return "; ".join(p for p in parts if p) or "-"


def metrics_text(metrics: dict[str, Any]) -> str:
    if not metrics:
        return "(none)"
    return " ".join(
        f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in sorted(metrics.items())
    )


def _model(model: dict[str, Any]) -> str:
    return f"{model['name']} v{model['version']} {model['artifact_uri']}"


def cost_text(cost: dict[str, Any]) -> str:
    state = "final" if cost["final"] else "so far"
    if not cost.get("currency"):
        # "yet" only while more may come: a job that ended holding no GPU costs nothing.
        return "nothing billed (final)" if cost["final"] else "nothing billed yet (so far)"
    hours = cost["gpu_seconds"] / 3600
    price = cost.get("price_per_gpu_hour")
    at_price = f" at {money(price, cost['currency'])}/GPU-hour" if price is not None else ""
    return f"{money(cost['cost'], cost['currency'])} for {hours:.3f} GPU-hours{at_price} ({state})"


def _size(size: int) -> str:
    return format_size(size)


def time_text(value: str | None) -> str:
    if not value:
        return "-"
    try:
        return datetime.fromisoformat(value).astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")
    except ValueError:
        return value


def why(view: dict[str, Any]) -> str:
    if view.get("failure"):
        return f": {view['failure']['reason']}"
    reasons = [h.get("reason") for h in view["history"] if h["status"] == view["status"]]
    return f": {reasons[-1]}" if reasons and reasons[-1] else ""

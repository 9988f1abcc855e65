"""The CLI's tracking commands: metrics, experiments, compare, models, cost.

Metric series and experiments come from the registry (``--registry-url`` at login, or
``TRAINYARD_REGISTRY_URL``), costs from billing's exact ledger (``TRAINYARD_BILLING_URL``):
``GET /v1/costs`` for reports, ``GET /v1/jobs/{id}/cost`` for one job. Without the
registry, ``metrics`` shows the job's latest values from the submission API.

``note JOB`` without TEXT shows the run's note and tags with the note's ``etag`` last (the
registry's ``ETag`` of ``GET /v1/jobs/{id}/note``; with ``--json`` on stderr,
``cli_base.emit_tagged``); ``note JOB TEXT --if-match ETAG`` replaces the note only while it
is as shown: when another member edited it since, nothing changes and one line says so and
to run ``note JOB`` again (exit 1).
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from typing import Any

from trainyard.cli_base import (
    CliError,
    Exit,
    Session,
    add_if_match,
    conditional,
    if_match,
    note,
    refused,
    resolve,
    resolved_job,
    whole_arg,
)
from trainyard.cli_models import name_arg
from trainyard.cli_render import (
    attempt_number,
    duration,
    metrics_text,
    money,
    none_yet,
    short,
    sparkline,
    table,
    time_text,
)
from trainyard.client import TrainyardClient, TrainyardError, get_response, segment


def add_commands(command: Callable[..., argparse.ArgumentParser]) -> None:
    metrics = command("metrics", run_metrics, "a job's metrics: a table, or one as a sparkline")
    metrics.add_argument("job", metavar="JOB")
    metrics.add_argument(
        "key", metavar="KEY", nargs="?", help="one metric: its curve (points with --json)"
    )
    metrics.add_argument(
        "--points",
        type=points_arg,
        help=f"with KEY: at most this many points, {POINTS_MIN} to {POINTS_MAX} ({CURVE_POINTS})",
    )
    experiments = command(
        "experiments", run_experiments, "the team's experiments, or the runs of one"
    )
    experiments.add_argument("experiment", nargs="?", metavar="EXP", help="a name or an id")
    experiments.add_argument("--project", help="only this project's (with EXP: EXP is a name)")
    experiments.add_argument(
        "--sort", type=sort_arg, help="with EXP: its runs by final:<key> or best:<key>"
    )
    experiments.add_argument(
        "--filter", type=filter_arg, help="with EXP: its runs, e.g. final:accuracy>=0.9"
    )
    compare = command("compare", run_compare, "runs of an experiment side by side")
    compare.add_argument("experiment", metavar="EXP", help="a name or an id")
    compare.add_argument("--project", help="the experiment's project (EXP is then a name)")
    compare.add_argument("--keys", help="metric keys to compare, comma-separated")
    compare.add_argument("--jobs", nargs="+", metavar="JOB", help="only these runs")
    tag = command("tag", run_tag, "tag a run (or --rm a tag)")
    tag.add_argument("job", metavar="JOB")
    tag.add_argument("tags", nargs="+", metavar="TAG")
    tag.add_argument("--rm", action="store_true", help="remove the tags instead")
    note = command("note", run_note, "show a run's note, or set it ('' clears it)")
    note.add_argument("job", metavar="JOB")
    note.add_argument("text", metavar="TEXT", nargs="?", help="the new note (none: show it)")
    add_if_match(note)
    models = command("models", run_models, "the versions of one of the team's models")
    models.add_argument(
        "name",
        type=name_arg("model"),
        metavar="NAME",
        help="the model's name (a job's model shows it)",
    )
    models.add_argument("--team", type=name_arg("team"), help="another team's (operators)")
    cost = command(
        "cost", run_cost, "exact costs from billing's ledger: a report, or one job's bill"
    )
    cost.add_argument("job", nargs="?", metavar="JOB", help="one job's cost per allocation")
    cost.add_argument(
        "--by",
        type=dimensions_arg,
        metavar="DIMS",
        help=f"group by these, comma-separated (default user): {', '.join(COST_DIMENSIONS)}",
    )
    cost.add_argument(
        "--from",
        dest="start",
        metavar="TIME",
        help="ISO 8601, a whole UTC hour, or a month: 2026-11 (default: this month)",
    )
    cost.add_argument(
        "--to",
        dest="end",
        metavar="TIME",
        help="ISO 8601 or a month, excluded (default: the end of --from's month)",
    )
    cost.add_argument("--granularity", choices=("hour", "day", "month"), help="one row per bucket")
    for dim in COST_DIMENSIONS:
        if dim != "job":
            cost.add_argument(f"--{dim}", help=f"only this {dim}")
    cost.add_argument("--csv", action="store_true", help="billing's CSV, as it is")


def _number(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.4g}"
    return str(value)


# The forms the registry takes (its tracking_query): judged here too, so that a malformed
# one is a usage error naming the option rather than a 422 naming the query parameter.
_SORT = re.compile(r"(final|best):(.{1,200})")
_FILTER = re.compile(r"(final|best):(.{1,200}?)(<=|>=|<|>)(.+)")


def sort_arg(value: str) -> str:
    """``experiments EXP --sort``: ``final:KEY`` or ``best:KEY`` (a blank one is left to
    the empty-value check, which names it as empty)."""
    if value.strip() and not _SORT.fullmatch(value):
        raise argparse.ArgumentTypeError(f"{value!r} is not final:KEY or best:KEY")
    return value


def filter_arg(value: str) -> str:
    """``experiments EXP --filter``: ``final:KEY`` or ``best:KEY``, a comparison, a number
    (a blank one is left to the empty-value check, which names it as empty)."""
    if not value.strip():
        return value
    found = _FILTER.fullmatch(value)
    try:
        number = found is not None and float(found.group(4)) is not None
    except ValueError:
        number = False
    if not number:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not final:KEY or best:KEY, then <, <=, > or >=, then a number"
        )
    return value


CURVE_POINTS = 1000
"""How many points ``metrics JOB KEY`` asks for without ``--points``."""
POINTS_MIN, POINTS_MAX = 4, 100_000
"""The ``max_points`` the registry takes for one curve."""


points_arg = whole_arg(POINTS_MIN, POINTS_MAX)
"""``--points``: the ``max_points`` the registry takes for one curve."""


def unused(*given: tuple[str, object], form: str) -> None:
    """A usage error naming the options of ``given`` (``(option, value)``) that were given
    while the command's ``form`` does not use them: an option is never silently dropped."""
    named = [option for option, value in given if value not in (None, False)]
    if named:
        raise CliError(f"{form} takes no {', '.join(named)}", Exit.USAGE)


def _float(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def metric_key_path(key: str) -> str:
    """A metric key as the rest of ``/v1/jobs/{id}/metrics/``, which the registry reads as
    the key (its ``/`` included): each part between slashes quoted as one path segment. A
    key with an empty, ``.`` or ``..`` part is refused (a usage error naming KEY): a URL
    resolves or merges such parts, so the request would reach another key or route."""
    parts = key.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise CliError(
            f"KEY: {key!r} has an empty, '.' or '..' part between slashes, which a URL path "
            "cannot carry as it is (`trainyard metrics JOB --json` lists every key with its "
            "final value)",
            Exit.USAGE,
        )
    return "/".join(segment(part) for part in parts)


def no_metrics(job: str) -> str:
    """What ``metrics JOB`` says of a job that reported none: how a job reports them, and
    where its output is."""
    return none_yet(
        "no metrics reported",
        f"ctx.report_metrics(STEP, NAME=VALUE) in the job reports some; trainyard logs {job}",
        "shows what it printed",
    )


def run_metrics(session: Session) -> int:
    args = session.args
    if not args.key:
        unused(("--points", args.points), form="metrics JOB (without KEY: the table)")
    job_id = resolve(session.client, args.job)
    try:
        registry = session.service("registry")
    except CliError:
        if args.key:
            raise
        view = session.client.get_job(job_id)
        session.emit(
            {"job_id": job_id, "step": view.get("step"), "metrics": view.get("metrics")},
            lambda: (
                f"step {view.get('step')}: {metrics_text(view['metrics'])}"
                if view.get("metrics")
                else no_metrics(args.job)  # as the registry's table says it
            ),
        )
        return Exit.OK
    if args.key:
        curve = registry.get(
            f"/v1/jobs/{segment(job_id)}/metrics/{metric_key_path(args.key)}",
            max_points=CURVE_POINTS if args.points is None else args.points,
        )
        points = curve["points"]
        values = [_float(p["value"]) for p in points]
        finite = [v for v in values if v is not None and math.isfinite(v)]

        def text() -> str:
            if not points:
                return f"{args.key}: no points"
            return (
                f"{args.key}  {sparkline(values, 60)}\n"
                f"steps {points[0]['step']}..{points[-1]['step']}, {curve['total']} points"
                + (" (downsampled)" if curve.get("downsampled") else "")
                + (f", min {min(finite):.4g}, max {max(finite):.4g}" if finite else "")
                + f", last {_number(_float(points[-1]['value']))}"
            )

        session.emit(curve, text)
        return Exit.OK
    listed = registry.get(f"/v1/jobs/{segment(job_id)}/metrics")
    rows = []
    for m in listed["metrics"]:
        rows.append(
            (
                m["key"],
                m["count"],
                f"{m['first_step']}..{m['last_step']}",
                _number(m["last"]),
                f"{_number(m['best'])} @{m['best_step']}" if m.get("best") is not None else "-",
                _number(m["min"]),
                _number(m["max"]),
            )
        )
    session.emit(
        listed,
        lambda: table(
            ("KEY", "POINTS", "STEPS", "LAST", "BEST", "MIN", "MAX"),
            rows,
            empty=no_metrics(args.job),
        ),
    )
    return Exit.OK


EXPERIMENT_ID_MAX = 2**63 - 1
"""The largest experiment id (the registry's ``bigint``)."""


def _experiment_id(session: Session, ref: str, project: str | None) -> int:
    """The id EXP ``ref`` stands for: without ``--project``, ASCII digits are an id when an
    experiment the caller may read has it; else (and always with ``--project``) a name,
    which may be digits too (``2024``)."""
    registry = session.service("registry")
    if project is None and ref.isascii() and ref.isdecimal():
        number = int(ref)
        if 1 <= number <= EXPERIMENT_ID_MAX and _readable(registry, number):
            return number
    found = registry.get_every("/v1/experiments", "experiments", project=project, limit=500)
    matches = [e for e in found["experiments"] if e["name"] == ref]
    if not matches:
        raise CliError(f"no experiment {ref!r} in your team", Exit.NOT_FOUND)
    if len(matches) > 1:
        where = ", ".join(f"{e['project']} (id {e['id']})" for e in matches)
        raise CliError(
            f"experiment {ref!r} exists in several projects: {where}; pass --project or the id",
            Exit.NOT_FOUND,
        )
    return int(matches[0]["id"])


def _readable(registry: TrainyardClient, number: int) -> bool:
    try:
        registry.get(f"/v1/experiments/{number}", limit=1)
    except TrainyardError as exc:
        if exc.status == 404:
            return False
        raise
    return True


def run_experiments(session: Session) -> int:
    args = session.args
    if not args.experiment:
        unused(
            ("--sort", args.sort),
            ("--filter", args.filter),
            form="experiments (without EXP: the list; --sort and --filter order its runs)",
        )
    registry = session.service("registry")
    if not args.experiment:
        found = registry.get_every(
            "/v1/experiments", "experiments", project=args.project, limit=500
        )
        rows = [
            (
                e["id"],
                e["project"],
                e["name"],
                e["runs"],
                e["running"],
                time_text(e["last_started_at"]),
            )
            for e in found["experiments"]
        ]
        session.emit(
            found,
            lambda: table(
                ("ID", "PROJECT", "NAME", "RUNS", "RUNNING", "LAST STARTED"),
                rows,
                empty="no experiments yet (name one in a spec: experiment: NAME)",
            ),
        )
        return Exit.OK
    number = _experiment_id(session, args.experiment, args.project)
    found = registry.get_every(
        f"/v1/experiments/{number}", "runs", sort=args.sort, filter=args.filter
    )
    keys = sorted({k for run in found["runs"] for k in run["metrics"]})[:6]
    rows = [
        (
            short(run["job_id"]),
            run["name"],
            run["user"],
            run["status"],
            duration(run["started_at"], run.get("ended_at")),
            *(_number((run["metrics"].get(k) or {}).get("final")) for k in keys),
        )
        for run in found["runs"]
    ]
    total = int(found["experiment"]["runs"])
    shown = len(found["runs"])
    # A registry without paging answers at most its limit of runs: say so, not stop short.
    cut = f"\n({shown} of {total} runs shown: the registry answers at most {shown})"
    session.emit(
        found,
        lambda: (
            table(
                ("ID", "NAME", "USER", "STATUS", "DURATION", *(k.upper() for k in keys)),
                rows,
                empty=(
                    "no runs match the filter"
                    if args.filter
                    else none_yet(
                        "no runs",
                        f"trainyard submit SPEC --experiment "
                        f"{found['experiment'].get('name') or args.experiment}",
                        "adds one",
                    )
                ),
            )
            + (cut if not args.filter and shown < total else "")
        ),
    )
    return Exit.OK


def run_compare(session: Session) -> int:
    args = session.args
    registry = session.service("registry")
    number = _experiment_id(session, args.experiment, args.project)
    jobs = None
    if args.jobs:
        jobs = ",".join(resolve(session.client, ref) for ref in args.jobs)
    found = registry.get(f"/v1/experiments/{number}/compare", keys=args.keys, jobs=jobs)

    def text() -> str:
        runs = found["runs"]
        ids = [r["job_id"] for r in runs]
        header = ("", *(short(i) for i in ids))
        rows: list[tuple[str, ...]] = [
            ("name", *(r["name"] for r in runs)),
            ("status", *(r["status"] for r in runs)),
            ("duration", *(duration(r["started_at"], r.get("ended_at")) for r in runs)),
        ]
        for name, by_job in sorted(found["differing_parameters"].items()):
            rows.append((f"param {name}", *(_number(by_job.get(i)) for i in ids)))
        for key, by_job in sorted(found["final"].items()):
            rows.append((f"final {key}", *(_number(by_job.get(i)) for i in ids)))
        lines = [table(header, rows)]
        for key, curves in sorted(found.get("curves", {}).items()):
            lines.append(f"\n{key}")
            for job_id, curve in curves.items():
                values = [_float(p["value"]) for p in curve["points"]]
                lines.append(f"  {short(job_id)}  {sparkline(values, 50)}")
        return "\n".join(lines)

    session.emit(found, text)
    return Exit.OK


def run_tag(session: Session) -> int:
    args = session.args
    job_id = resolve(session.client, args.job)
    registry = session.service("registry")
    method = "DELETE" if args.rm else "PUT"
    answer: dict[str, Any] = {}
    for tag in args.tags:
        answer = registry.call(method, f"/v1/jobs/{segment(job_id)}/tags/{segment(tag)}")
    session.emit(answer, lambda: f"{short(job_id)} tags: {' '.join(answer['tags']) or '(none)'}")
    return Exit.OK


def run_note(session: Session) -> int:
    args = session.args
    job_id = resolve(session.client, args.job)
    path = f"/v1/jobs/{segment(job_id)}/note"
    registry = session.service("registry")
    if args.text is None:
        if args.if_match:
            raise CliError("--if-match is of a change: give TEXT, the new note", Exit.USAGE)
        found = registry.get(path)
        session.emit_tagged(found, lambda: _note_text(job_id, found))
        return Exit.OK
    answer = conditional(
        "registry",
        lambda: registry.call("PUT", path, {"note": args.text}, if_match(args)),
        f"trainyard note {args.job}",
    )
    session.emit(answer, lambda: f"{short(job_id)} note: {answer['note'] or '(none)'}")
    return Exit.OK


def _note_text(job_id: str, found: dict[str, Any]) -> str:
    """A run's note, then its tags (``note JOB``)."""
    tags = " ".join(found.get("tags") or []) or "(none)"
    return f"{short(job_id)} note: {found['note'] or '(none)'}\ntags: {tags}"


def run_models(session: Session) -> int:
    args = session.args
    team = args.team or session.client.whoami()["team"]
    found = session.service("registry").get_every(
        f"/v1/models/{segment(team)}/{segment(args.name)}/versions", "versions", limit=500
    )
    rows = [
        (
            v.get("version"),
            short(str(v.get("job_id") or "-")),
            time_text(v.get("registered_at")),
            " ".join(f"{k}={_number(x)}" for k, x in sorted((v.get("metrics") or {}).items())),
        )
        for v in found.get("versions", [])
    ]
    session.emit(
        found,
        lambda: table(
            ("VERSION", "JOB", "REGISTERED", "METRICS"),
            rows,
            empty=none_yet(
                "no versions", f"trainyard model register {team}/{args.name} --job JOB", "adds one"
            ),
        ),
    )
    return Exit.OK


COST_DIMENSIONS = ("team", "project", "user", "queue", "flavor", "job")
"""What billing's ``GET /v1/costs`` groups and filters by (docs/billing.md)."""


def dimensions_arg(value: str) -> list[str]:
    """``--by``: known dimensions, comma-separated, each once."""
    dims = [d.strip() for d in value.split(",") if d.strip()]
    unknown = [d for d in dims if d not in COST_DIMENSIONS]
    if unknown or not dims:
        raise argparse.ArgumentTypeError(
            f"unknown dimension {', '.join(map(repr, unknown)) or repr(value)} "
            f"(one of {', '.join(COST_DIMENSIONS)})"
        )
    if len(set(dims)) != len(dims):
        raise argparse.ArgumentTypeError(f"{value!r} names a dimension twice")
    return dims


def run_cost(session: Session) -> int:
    args = session.args
    if args.csv and session.as_json:
        raise CliError("--json and --csv are two outputs: give one", Exit.USAGE)
    billing = session.service("billing")
    try:
        if args.job is not None:
            if args.by or args.start or args.end or args.granularity or args.csv:
                raise CliError(
                    "cost JOB takes no --by, --from, --to, --granularity or --csv", Exit.USAGE
                )
            unused(
                *((f"--{dim}", getattr(args, dim)) for dim in COST_DIMENSIONS if dim != "job"),
                form="cost JOB (one job's bill)",
            )
            job_id = resolved_job(session, args.job)
            bill = billing.get(f"/v1/jobs/{segment(job_id)}/cost")
            session.emit(bill, lambda: job_cost_text(bill))
            return Exit.OK
        params: dict[str, str | None] = {
            # Without --by, by user: billing alone would give one total per currency.
            "group_by": ",".join(args.by or ["user"]),
            "from": args.start,
            "to": args.end,
            "granularity": args.granularity,
            **{d: getattr(args, d) for d in COST_DIMENSIONS if d != "job"},
        }
        if args.csv:
            sys.stdout.write(billing_csv(billing, "/v1/costs", params))
            return Exit.OK
        report = billing.get("/v1/costs", **params)
    except TrainyardError as exc:
        raise refused(f"billing: {exc}", exc) from None
    session.emit(report, lambda: cost_report_text(report))
    return Exit.OK


def billing_csv(billing: TrainyardClient, path: str, params: dict[str, str | None]) -> str:
    """Billing's CSV report at ``path`` (``/v1/costs``, ``/v1/waste``), unchanged (its
    cells are already safe for spreadsheets). A CSV holds no ``truncated`` of its own: when
    billing's header says it left rows out past its row limit, a note on stderr says so
    and what to do, so a file cut short is not taken for the whole report."""
    answer = get_response(billing, path, format="csv", **params)
    if answer.headers.get("Trainyard-Truncated") == "true":
        note(
            "billing left rows out of this CSV: the report has more rows than its limit "
            "(10,000); ask for less at a time (a shorter --from/--to, or filters such as "
            "--team or --project) to have them all"
        )
    return answer.text


def _hours(seconds: Any) -> str:
    try:
        return f"{Decimal(str(seconds)) / 3600:.2f}"
    except (InvalidOperation, ValueError):
        return "-"


LINE_COLUMNS = (("GPU-COST", "gpu_cost"), ("CPU-COST", "cpu_cost"), ("MEM-COST", "memory_cost"))
"""The cost per resource, shown when a report has CPU or memory time (billing's rows carry
them beside the whole ``cost``)."""


def _has_cpu_or_memory(report: dict[str, Any]) -> bool:
    def some(value: Any) -> bool:
        try:
            return Decimal(str(value or 0)) != 0
        except (InvalidOperation, ValueError):
            return False

    return any(
        some(t.get("cpu_seconds")) or some(t.get("memory_gib_seconds"))
        for t in report.get("totals") or []
    )


def _total_text(t: dict[str, Any], per_resource: bool) -> str:
    text = f"{money(t['cost'])} {t['currency']} ({_hours(t['gpu_seconds'])} GPU-hours"
    if per_resource:
        text += (
            f"; GPU {money(t.get('gpu_cost'))}, CPU {money(t.get('cpu_cost'))}"
            f" for {_hours(t.get('cpu_seconds'))} CPU-hours, memory"
            f" {money(t.get('memory_cost'))} for {_hours(t.get('memory_gib_seconds'))}"
            " GiB-hours"
        )
        unpriced = [
            what
            for what, field in (
                ("CPU", "unpriced_cpu_seconds"),
                ("memory", "unpriced_memory_gib_seconds"),
            )
            if Decimal(str(t.get(field) or 0))
        ]
        if unpriced:
            text += f"; {' and '.join(unpriced)} partly unpriced, charged 0"
    return text + ")"


def cost_report_text(report: dict[str, Any]) -> str:
    """``GET /v1/costs``'s answer as a table and its totals; with the cost per resource
    (GPU, CPU, memory) when any CPU or memory time was billed."""
    dims = list(report.get("group_by") or [])
    bucketed = bool(report.get("granularity"))
    lines_shown = _has_cpu_or_memory(report)
    extra = LINE_COLUMNS if lines_shown else ()
    header = (
        *(("BUCKET",) if bucketed else ()),
        *(d.upper() for d in dims),
        "GPU-HOURS",
        *(name for name, _ in extra),
        "COST",
    )
    rows = [
        (
            *((time_text(r.get("bucket")),) if bucketed else ()),
            *((short(str(r[d])) if d == "job" and r.get(d) else r.get(d) or "-") for d in dims),
            _hours(r.get("gpu_seconds")),
            *(money(r.get(field)) for _, field in extra),
            f"{money(r.get('cost'))} {r.get('currency', '')}".rstrip(),
        )
        for r in report.get("rows") or []
    ]
    span = f"{time_text(report.get('start'))} to {time_text(report.get('end'))}"
    totals = ", ".join(_total_text(t, lines_shown) for t in report.get("totals") or [])
    lines = [table(header, rows, empty=f"nothing billed from {span}{filtered_text(report)}")]
    if rows:
        lines.append(f"\ntotal {span}: {totals or '0'}")
    if report.get("truncated"):
        lines.append("(more rows than the limit: totals cover them all)")
    return "\n".join(lines)


def filtered_text(report: dict[str, Any]) -> str:
    """What an empty report of billing's (``/v1/costs``, ``/v1/waste``) was filtered by and
    how to check those names (`` to team ml, project visoin: check the names (...)``), or
    '' when it was not: billing finds nothing for a name nothing was billed to (a
    misspelt one) rather than refuse it, so the answer must show the name asked for."""
    filters = {d: v for d, v in (report.get("filters") or {}).items() if v is not None}
    if not filters:
        return ""
    named = ", ".join(f"{d} {v}" for d, v in filters.items())
    return (
        f" to {named}: check the names (trainyard cost --by {','.join(filters)} lists those billed)"
    )


def job_cost_text(bill: dict[str, Any]) -> str:
    """``GET /v1/jobs/{id}/cost``'s answer: one row per allocation, then totals; with what
    each allocation's CPUs and memory cost when the job declared them."""
    allocations = bill.get("allocations") or []
    held = any(a.get("cpus") or a.get("memory_gib") for a in allocations)
    rows = [
        (
            attempt_number(a["attempt"]) if a.get("attempt") is not None else "-",
            a["node_id"],
            f"{a['gpus']}x {a['gpu_flavor']}",
            duration(a["started_at"], a["ended_at"]),
            a["outcome"],
            _hours(a["gpu_seconds"]),
            f"{a['price_per_gpu_hour']}/h",  # as set: up to six places
            *(
                (
                    f"{a.get('cpus', 0)} CPU {money(a.get('cpu_cost'))}, "
                    f"{a.get('memory_gib', 0)} GiB {money(a.get('memory_cost'))}",
                )
                if held
                else ()
            ),
            f"{money(a['cost'])} {a['currency']}",
        )
        for a in allocations
    ]
    totals = ", ".join(f"{money(t['cost'])} {t['currency']}" for t in bill.get("totals") or [])
    head = f"job {bill['job_id']} ({bill['team']}/{bill.get('project') or '-'}, {bill['user']})"
    return "\n".join(
        [
            head,
            table(
                (
                    *("ATTEMPT", "NODE", "GPUS", "RAN", "OUTCOME", "GPU-HOURS", "PRICE"),
                    *(("CPU-AND-MEMORY",) if held else ()),
                    "COST",
                ),
                rows,
            ),
            f"total: {totals or '0'}",
        ]
    )

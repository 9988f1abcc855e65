"""``trainyard sweep``: a hyper-parameter search over one job spec (``trainyard.sweep``).

The command packs the code once, expands the search space into trials, and keeps at most
``--parallel`` of them submitted and unfinished: as one ends, the next is submitted. Each
trial is a job of its own (the spec's name, its hyper-parameters with the trial's values, in
one experiment, labelled ``sweep=<id>`` and ``sweep-trial=<n>``), queued, placed, billed and
tracked as any job; the experiment compares them (``trainyard compare``). At the end the
trials are listed, best first by ``--metric`` (the last value each job reported).

Before the first trial is submitted, every trial is checked by the server as its submission
will be (``POST /v1/jobs?dry_run=true``, storing nothing): a trial the server would refuse (a
value with a control character, over a bound) ends the command with nothing submitted,
naming the trial, its values and each field's reason.

An API that does not answer, or answers 429, 502, 503 or 504, is waited out (tries at
growing intervals up to 30 s, or after the answer's ``Retry-After``, up to 300 s) until
``--timeout``. Interrupted (Ctrl-C, ``--timeout``, any
other error), the same command run again resumes:
trials are submitted under idempotency keys derived from the sweep, so those already
submitted are followed, not submitted twice. The loop runs in this command, not in the
platform: while no command runs, no new trial is submitted (those submitted run on), and
none is stopped early.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable
from typing import Any, TypeVar

from trainyard.cli_base import (
    ID_MAX,
    CliError,
    Exit,
    Session,
    note,
    positive_arg,
    refused,
    whole_arg,
)
from trainyard.cli_jobs import explained, prepared, scalar
from trainyard.cli_render import short, table
from trainyard.cli_tracking import metric_key_path
from trainyard.client import TERMINAL, TrainyardClient, TrainyardError, segment
from trainyard.spec import SpecFile
from trainyard.sweep import (
    Curve,
    Goal,
    SpaceError,
    curve_of,
    idempotency_key,
    median_stop,
    metric_of,
    ranked,
    space,
    sweep_id,
    trial_spec,
)

_T = TypeVar("_T")

POLL_SECONDS = 2.0
"""How often the unfinished trials are looked at."""
CURVE_POINTS = 2000
"""Points asked of a curve: downsampled, the registry keeps each bucket's min and max, so a
best value is exact."""
CELL_WIDTH = 40
"""The widest a hyper-parameter's value is shown in the table and the notes."""
RETRY_SECONDS = 30.0
"""The longest wait between tries while the API is away (``TRANSIENT``)."""
RETRY_CAP_S = 300.0
"""The longest a server's ``Retry-After`` is followed (a longer one is waited this long)."""
TRANSIENT = frozenset({0, 429, 502, 503, 504})
"""Answers a sweep waits out (0: no answer at all) rather than stopping: it may run for days,
and each try is safe to repeat (a submission is idempotent)."""


def grid_arg(value: str) -> tuple[str, list[Any]]:
    """``--grid KEY=V1,V2,...``: the values read as a spec file's plain scalars."""
    key, sep, rest = value.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{value!r} is not KEY=V1,V2,...")
    values = [scalar(text.strip()) for text in rest.split(",") if text.strip()]
    if not values:
        raise argparse.ArgumentTypeError(f"{value!r} lists no value")
    seen: set[tuple[str, Any]] = set()
    for given in values:
        if isinstance(given, float) and not math.isfinite(given):
            raise argparse.ArgumentTypeError(f"{value!r}: {given} is not a finite number")
        # By type too: 1, 1.0 and true are equal in Python, not as hyper-parameters.
        if (type(given).__name__, given) in seen:
            raise argparse.ArgumentTypeError(
                f"{value!r} lists {given!r} twice: each value is a trial (or a draw) of its own"
            )
        seen.add((type(given).__name__, given))
    return key, values


def range_arg(value: str) -> tuple[str, float, float]:
    """``--uniform KEY=LOW:HIGH`` (also ``--log-uniform``)."""
    key, sep, rest = value.partition("=")
    low, colon, high = rest.partition(":")
    try:
        if not sep or not key or not colon:
            raise ValueError
        return key, float(low), float(high)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not KEY=LOW:HIGH (numbers)") from None


def add_arguments(sub: argparse.ArgumentParser) -> None:
    """The options of ``trainyard sweep`` (the spec file's overrides are added by the caller,
    as for ``submit``)."""
    sub.add_argument(
        "--grid",
        action="append",
        type=grid_arg,
        default=[],
        metavar="K=V1,V2",
        help="try each value of hyper-parameter K (repeat for more; every combination)",
    )
    sub.add_argument(
        "--uniform",
        action="append",
        type=range_arg,
        default=[],
        metavar="K=LO:HI",
        help="with --random: draw K uniformly from [LO, HI]",
    )
    sub.add_argument(
        "--log-uniform",
        action="append",
        type=range_arg,
        default=[],
        metavar="K=LO:HI",
        help="with --random: draw K uniformly on a log scale (lr=1e-5:1e-1)",
    )
    sub.add_argument(
        "--random", type=positive_arg, metavar="N", help="draw N trials (default: the grid)"
    )
    sub.add_argument("--seed", type=int, default=0, help="the draws' seed (0)")
    sub.add_argument("--parallel", type=int, default=2, help="trials unfinished at once (2)")
    sub.add_argument("--metric", help="rank the trials by this metric's last value")
    sub.add_argument("--goal", choices=("max", "min"), default="max", help="best is (max)")
    sub.add_argument(
        "--median-stop",
        type=whole_arg(0, ID_MAX),
        metavar="STEP",
        help="from STEP on, stop a trial whose best --metric is worse than the median of the "
        "finished trials' by the same step (needs the registry and 3 finished trials)",
    )


def sweep(session: Session) -> int:
    args = session.args
    if args.parallel < 1:
        raise CliError(f"--parallel: {args.parallel}; give 1 or more", Exit.USAGE)
    fixed = [key for key, _ in getattr(args, "set", None) or []]
    try:
        trials = space(args.grid, args.uniform, args.log_uniform, fixed).trials(
            args.random, args.seed
        )
    except SpaceError as exc:
        raise CliError(str(exc), Exit.USAGE) from None
    stopper = _MedianStop.of(session) if args.median_stop is not None else None
    loaded, spec = prepared(session)
    experiment = spec.get("experiment") or f"{spec.get('name', 'job')}-sweep"[:100]
    ident = sweep_id(spec, trials)
    client = session.client  # the context first: no sweep is announced that cannot start
    note(
        f"sweep {ident}: {_count(len(trials), 'trial')} of {spec.get('name')} in experiment "
        f"{experiment}, {args.parallel} at a time (run the same command again to resume)"
    )
    deadline = time.monotonic() + args.timeout
    patient = _Patient(deadline, ident, len(trials))
    waiting = list(enumerate(trials, start=1))
    for index, params in waiting:
        # Every trial is checked as its submission will be before any is submitted: a
        # value the server refuses in trial 7 must not leave trials 1 to 6 running.
        trial = trial_spec(spec, params, ident, index, experiment)
        try:
            patient.call(client.submit_warned, trial, idempotency_key(ident, index), True)
        except TrainyardError as exc:
            raise _refused(exc, index, params, len(trials), loaded, args) from None
    running: dict[int, str] = {}
    ended: dict[int, dict[str, Any]] = {}
    try:
        while waiting or running:
            while waiting and len(running) < args.parallel:
                index, params = waiting.pop(0)
                trial = trial_spec(spec, params, ident, index, experiment)
                view = patient.call(client.submit, trial, idempotency_key(ident, index))
                note(f"trial {index}: job {short(view['id'])} {_params(params)}")
                running[index] = view["id"]
            patient.check(len(ended))
            time.sleep(POLL_SECONDS if running else 0)
            for index, job_id in list(running.items()):
                view = patient.call(client.get_job, job_id)
                if view.get("status") in TERMINAL:
                    ended[index] = view
                    del running[index]
                    note(f"trial {index}: {view['status']}{_metric_note(view, args.metric)}")
                if stopper is not None:
                    stopper.look(index, view, patient)
    except KeyboardInterrupt:
        note(f"sweep {ident} interrupted: run the same command again to resume it")
        raise
    order = ranked(list(ended.items()), args.metric, args.goal)
    stopped = stopper.stopped if stopper is not None else {}
    report = _report(ident, experiment, spec, args, order, dict(enumerate(trials, start=1)))
    for row in report["trials"]:
        row["stopped_early"] = stopped.get(row["trial"])
    session.emit(report, lambda: _text(report))
    return (
        Exit.OK if any(v.get("status") == "SUCCEEDED" for v in ended.values()) else Exit.JOB_FAILED
    )


def _refused(
    exc: TrainyardError,
    index: int,
    params: dict[str, Any],
    trials: int,
    loaded: SpecFile,
    args: argparse.Namespace,
) -> CliError:
    """The server's refusal of trial ``index`` in the check before anything is submitted: a
    first line naming the trial and its values, then, for invalid input, each field's
    reason, one the sweep set naming its option (``--grid lr: hyperparameters.lr: ...``),
    the rest as ``submit`` says them; the exit code of the refusal (``refused``)."""
    values = ", ".join(f"{k}={v!r}" for k, v in params.items())
    head = f"trial {index} of {trials} ({values}) would be refused, so no trial was submitted"
    if exc.status != 422 or not exc.errors:
        return refused(f"{head}: {exc}", exc)
    options = {
        f"hyperparameters.{key}": f"{option} {key}"
        for option, given in (
            ("--grid", args.grid),
            ("--uniform", args.uniform),
            ("--log-uniform", args.log_uniform),
        )
        for key, *_ in given
    }
    ours, theirs = [], []
    for error in exc.errors:
        field = str(error.get("field", ""))
        if field in options:
            ours.append(f"{options[field]}: {field}: {error.get('message', '')}")
        else:
            theirs.append(error)
    lines = [f"{head}:", *ours]
    if theirs:
        lines += str(explained(theirs, loaded, args)).splitlines()
    return CliError("\n".join(lines))


class _MedianStop:
    """The median stopping rule (``sweep.median_stop``) over the registry's curves of the
    sweep's metric: each finished trial's read once, a running trial's at every look."""

    def __init__(self, client: TrainyardClient, jobs: TrainyardClient, args: argparse.Namespace):
        self.registry = client
        self.jobs = jobs
        self.metric: str = args.metric
        self.goal: Goal = args.goal
        self.start_step: int = args.median_stop
        self.finished: list[Curve] = []
        self.stopped: dict[int, str] = {}

    @classmethod
    def of(cls, session: Session) -> _MedianStop:
        """The rule for the command's options; a usage error without ``--metric``, an error
        without a registry URL, both before anything is submitted."""
        if not session.args.metric:
            raise CliError("--median-stop needs --metric (the metric to compare)", Exit.USAGE)
        metric_key_path(session.args.metric)  # a key no URL can name: a usage error now
        return cls(session.service("registry"), session.client, session.args)

    def look(self, index: int, view: dict[str, Any], patient: _Patient) -> None:
        status = view.get("status")
        if status == "SUCCEEDED":
            self.finished.append(self._curve(view["id"], patient))
        elif status == "RUNNING" and index not in self.stopped:
            why = median_stop(
                self._curve(view["id"], patient), self.finished, self.goal, self.start_step
            )
            if why is not None:
                patient.call(self.jobs.cancel, view["id"])
                self.stopped[index] = why
                note(f"trial {index}: stopped early: {self.metric} {why}")

    def _curve(self, job_id: str, patient: _Patient) -> Curve:
        path = f"/v1/jobs/{segment(job_id)}/metrics/{metric_key_path(self.metric)}"
        try:
            found = patient.call(self.registry.get, path, max_points=CURVE_POINTS)
        except TrainyardError as exc:
            if exc.status == 404:  # nothing of this metric reported yet
                return []
            raise
        points = found.get("points")
        return curve_of(points) if isinstance(points, list) else []


class _Patient:
    """Calls that wait out an API that is away (``TRANSIENT``), until ``deadline``."""

    def __init__(self, deadline: float, ident: str, trials: int) -> None:
        self.deadline = deadline
        self.ident = ident
        self.trials = trials
        self.ended = 0

    def check(self, ended: int) -> None:
        """Raise ``TimeoutError`` once the deadline has passed."""
        self.ended = ended
        if time.monotonic() >= self.deadline:
            raise TimeoutError(
                f"sweep {self.ident} did not finish in time ({ended} of {self.trials} trials "
                "ended; run the same command again to resume it)"
            )

    def call(self, function: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        """``function(*args, **kwargs)``, tried again while the API is away."""
        wait = POLL_SECONDS
        while True:
            try:
                return function(*args, **kwargs)
            except TrainyardError as exc:
                if exc.status not in TRANSIENT:
                    raise
                # The server's Retry-After, when it gives one, over our own back-off.
                pause = wait if exc.retry_after is None else min(exc.retry_after, RETRY_CAP_S)
                note(f"sweep {self.ident}: {exc}; trying again in {pause:g} s")
            self.check(self.ended)
            time.sleep(pause)
            wait = min(max(2 * wait, 1.0), RETRY_SECONDS)


def _params(params: dict[str, Any]) -> str:
    return " ".join(f"{k}={_cell(v)}" for k, v in params.items())


def _cell(value: Any, width: int = CELL_WIDTH) -> str:
    """A value as a table shows it: at most ``width`` characters (a long string cut with …)."""
    text = str(value)
    return text if len(text) <= width else text[: width - 1] + "…"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _metric_note(view: dict[str, Any], metric: str | None) -> str:
    if metric is None:
        return ""
    value = metric_of(view, metric)
    return f", {metric}={_number(value)}" if value is not None else f", no {metric} reported"


def _report(
    ident: str,
    experiment: str,
    spec: dict[str, Any],
    args: argparse.Namespace,
    order: list[tuple[int, Any]],
    params_of: dict[int, dict[str, Any]],
) -> dict[str, Any]:
    """What ``--json`` prints: the sweep, its trials best first, and the best (None when no
    trial succeeded with the metric, or no metric was named)."""
    metric: str | None = args.metric
    rows = [
        {
            "trial": index,
            "job_id": view["id"],
            "status": view.get("status"),
            "hyperparameters": params_of[index],
            "metric": metric_of(view, metric) if metric else None,
        }
        for index, view in order
    ]
    best = rows[0] if rows and metric and rows[0]["metric"] is not None else None
    if best is not None and best["status"] != "SUCCEEDED":
        best = None
    return {
        "sweep": ident,
        "experiment": experiment,
        "project": spec.get("project") or "default",
        "metric": metric,
        "goal": args.goal,
        "trials": rows,
        "best": best,
    }


def _text(report: dict[str, Any]) -> str:
    """The report of ``_report`` for people: a table, the best trial, what to run next."""
    metric = report["metric"]
    rows = report["trials"]
    keys = list(rows[0]["hyperparameters"]) if rows else []
    header = ["TRIAL", "JOB", "STATUS", *[k.upper() for k in keys]]
    header += [metric.upper()] if metric else []
    lines = [
        table(
            header,
            [
                [
                    row["trial"],
                    short(row["job_id"]),
                    row["status"] + (" (stopped early)" if row.get("stopped_early") else ""),
                    *[_cell(row["hyperparameters"][k]) for k in keys],
                    *([_number(row["metric"])] if metric else []),
                ]
                for row in rows
            ],
        )
    ]
    best = report["best"]
    if best is not None:
        lines.append(
            f"best: trial {best['trial']}, job {short(best['job_id'])}: "
            f"{metric}={_number(best['metric'])} ({_params(best['hyperparameters'])})"
        )
    elif metric:
        lines.append(f"best: none (no succeeded trial reported {metric})")
    project = report["project"]
    where = "" if project == "default" else f" --project {project}"
    lines.append(
        f"compare: trainyard compare {report['experiment']}{where}   "
        f"trials: trainyard ls --label sweep={report['sweep']}"
    )
    return "\n".join(lines)


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.6g}"

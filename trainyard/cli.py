"""``trainyard``: submit, follow, list and cancel training jobs from a shell.

    trainyard submit job.yaml [--follow]     submit a job spec (and follow it to the end)
              [--workdir DIR | --no-code]    with the code of DIR (default: the spec's folder)
    trainyard status JOB_ID                  the job's status, metrics, model and cost
    trainyard logs JOB_ID [-f]               the job's output (and follow it to the end)
    trainyard list [--status S]              the team's jobs, newest first
    trainyard cancel JOB_ID                  ask for a job to be cancelled
    trainyard whoami | token ... | user ... | audit
                                             who you are; your tokens; the team's users;
                                             the audit log (``trainyard.cli_access``)

``submit`` packs the working directory into a code bundle (``trainyard.bundle``: honours
``.gitignore`` and ``.trainyardignore``), uploads it unless the team has it already, and
sets the spec's ``code``; a spec that names its own ``code`` (e.g. a git commit) is sent as
it is, and ``--no-code`` sends none.

The server and the token come from ``--url``/``--token`` or the environment
(``TRAINYARD_URL``, default ``http://127.0.0.1:8080``; ``TRAINYARD_TOKEN``). Output is for
people; ``--json`` prints the API's JSON instead. Progress notes (the bundle, log stream
headers) go to stderr. Any error is one line on stderr and exit status 1 (``submit
--follow`` also exits 1 when the job does not succeed).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NoReturn, TextIO

from pydantic import Field, SecretStr, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from trainyard import cli_access
from trainyard.bundle import DEFAULT_MAX_BYTES, BundleError, format_size, pack
from trainyard.cli_deadletters import add_deadletter_commands, run_deadletters
from trainyard.client import SETTLE_SECONDS, TrainyardClient, TrainyardError
from trainyard.spec import SpecError, SpecFile, load, schema_text

LOG_POLL_SECONDS = 1.0


class CliSettings(BaseSettings):
    """Where the CLI finds the API (env prefix ``TRAINYARD_``)."""

    model_config = SettingsConfigDict(env_prefix="TRAINYARD_")

    url: str = "http://127.0.0.1:8080"
    """Base URL of the submission API."""
    token: SecretStr | None = None
    """Bearer token (from ``bootstrap-admin`` or ``POST /v1/admin/users``)."""
    bundle_max_bytes: int = Field(default=DEFAULT_MAX_BYTES, ge=1)
    """Largest code bundle ``submit`` uploads (compressed bytes)."""


class CliError(Exception):
    """A problem to report as one line on stderr."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(1)


def _parser() -> argparse.ArgumentParser:
    common = _Parser(add_help=False)
    # SUPPRESS: an option given before the command is not reset by the command's parser.
    common.add_argument("--url", default=argparse.SUPPRESS, help="API base URL ($TRAINYARD_URL)")
    common.add_argument(
        "--token", default=argparse.SUPPRESS, help="bearer token ($TRAINYARD_TOKEN)"
    )
    common.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="print the API's JSON"
    )
    parser = _Parser(
        prog="trainyard", description="Trainyard: training jobs on shared GPUs.", parents=[common]
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    submit = commands.add_parser("submit", parents=[common], help="submit a job spec file")
    submit.add_argument("file", type=Path, help="job spec (YAML or JSON): examples/digits.job.yaml")
    submit.add_argument("--follow", action="store_true", help="follow the job until it ends")
    submit.add_argument(
        "--timeout", type=float, default=86_400.0, help="seconds --follow waits (default 1 day)"
    )
    submit.add_argument("--idempotency-key", help="submit at most once under this key")
    code = submit.add_mutually_exclusive_group()
    code.add_argument(
        "--workdir", type=Path, help="folder to pack as the job's code (default: the spec's)"
    )
    code.add_argument("--no-code", action="store_true", help="submit without a code bundle")
    status = commands.add_parser("status", parents=[common], help="show one job")
    status.add_argument("job_id")
    listing = commands.add_parser("list", parents=[common], help="list the team's jobs")
    listing.add_argument(
        "--status",
        type=_status,
        help=f"only jobs in this status, any case: {', '.join(s.lower() for s in JOB_STATUSES)}",
    )
    listing.add_argument("--limit", type=int, default=50, help="at most this many (default 50)")
    cancel = commands.add_parser("cancel", parents=[common], help="cancel a job")
    cancel.add_argument("job_id")
    logs = commands.add_parser("logs", parents=[common], help="print a job's output")
    logs.add_argument("job_id")
    logs.add_argument(
        "-f", "--follow", action="store_true", help="keep printing until the job has ended"
    )
    commands.add_parser("schema", help="print the JSON Schema of a job spec file")
    cli_access.add_commands(commands, common)
    add_deadletter_commands(commands, common)
    return parser


JOB_STATUSES = (
    "QUEUED",
    "PENDING",
    "SCHEDULED",
    "RUNNING",
    "SUCCEEDED",
    "FAILED",
    "PREEMPTED",
    "CANCELLED",
)


def _status(value: str) -> str:
    """``--status``: any case; an unknown one names the valid ones."""
    if value.upper() not in JOB_STATUSES:
        valid = ", ".join(s.lower() for s in JOB_STATUSES)
        raise argparse.ArgumentTypeError(f"{value!r} is not a status; use one of {valid}")
    return value.upper()


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "schema":
        print(schema_text(), end="")
        return 0
    try:
        settings = _settings()
        with _client(args, settings) as client:
            return _run(client, args, settings)
    except SpecError as exc:
        for line in str(exc).splitlines():
            print(f"trainyard: error: {line}", file=sys.stderr)
        return 1
    except (CliError, BundleError) as exc:
        return _fail(str(exc))
    except TrainyardError as exc:
        return _fail(str(exc))
    except TimeoutError as exc:
        return _fail(str(exc))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (``trainyard list | head -1``): not an error. Python would
        # complain again when it flushes stdout at exit, so point stdout at nothing.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as exc:  # the CLI never shows a traceback
        return _fail(f"unexpected {type(exc).__name__}: {exc}")


def _settings() -> CliSettings:
    try:
        return CliSettings()
    except ValidationError as exc:
        first = exc.errors()[0]
        name = "TRAINYARD_" + "_".join(str(part) for part in first["loc"]).upper()
        raise CliError(f"{name}: {first['msg']} (got {first['input']!r})") from None


def _client(args: argparse.Namespace, settings: CliSettings) -> TrainyardClient:
    token = getattr(args, "token", None) or (
        settings.token.get_secret_value() if settings.token else None
    )
    if not token:
        raise CliError("no token: set TRAINYARD_TOKEN or pass --token")
    return TrainyardClient(getattr(args, "url", None) or settings.url, token)


def _run(client: TrainyardClient, args: argparse.Namespace, settings: CliSettings) -> int:
    if args.command == "deadletters":
        return run_deadletters(client, args)
    as_json = getattr(args, "json", False)
    if args.command in cli_access.COMMANDS:
        shown = cli_access.run(client, args, as_json)
        print(shown if isinstance(shown, str) else _dumps(shown))
        return 0
    if args.command == "submit":
        return _submit(client, args, as_json, settings)
    if args.command == "logs":
        follower = LogFollower(client, args.job_id, as_json=as_json)
        try:
            follower.run(follow=args.follow)
        except KeyboardInterrupt:
            return 130  # quietly: the user asked to stop
        return 0
    if args.command == "status":
        view = client.get_job(args.job_id)
        print(_dumps(view) if as_json else render_job(view))
    elif args.command == "list":
        jobs = client.list_jobs(status=args.status, limit=args.limit)
        print(_dumps(jobs) if as_json else render_list(jobs))
    elif args.command == "cancel":
        view = client.cancel(args.job_id)
        print(
            _dumps(view)
            if as_json
            else f"cancellation requested for job {view['id']} (status now {view['status']})"
        )
    return 0


def _submit(
    client: TrainyardClient, args: argparse.Namespace, as_json: bool, settings: CliSettings
) -> int:
    loaded = read_spec(args.file)
    spec = loaded.spec
    if not args.no_code and "code" not in spec:
        workdir = args.workdir if args.workdir is not None else args.file.parent
        spec["code"] = upload_code(client, workdir, settings.bundle_max_bytes)
    try:
        view = client.submit(spec, idempotency_key=args.idempotency_key)
    except TrainyardError as exc:
        if exc.status == 422 and exc.errors:
            raise loaded.explain(exc.errors) from None
        raise
    if not args.follow:
        print(_dumps(view) if as_json else f"submitted job {view['id']} ({view['name']})")
        return 0
    if not as_json:
        print(f"submitted job {view['id']} ({view['name']}); following (Ctrl-C stops following)")
    printer = FollowPrinter(quiet=as_json)
    logs = None if as_json else LogFollower(client, view["id"], best_effort=True)
    try:
        final = client.wait(
            view["id"],
            timeout_s=args.timeout,
            on_change=printer,
            on_poll=None if logs is None else lambda _: logs.poll(),
        )
        if logs is not None:
            logs.run(follow=True)  # the output's last chunks
    except KeyboardInterrupt:
        raise CliError(
            f"stopped following; the job goes on: trainyard status {view['id']}"
        ) from None
    print(_dumps(final) if as_json else "\n" + render_job(final))
    if final["status"] != "SUCCEEDED":
        return _fail(f"job {final['id']} ended {final['status']}{_why(final)}")
    return 0


def upload_code(client: TrainyardClient, workdir: Path, max_bytes: int) -> dict[str, Any]:
    """Pack ``workdir``, upload the bundle unless the team has it, and return the spec's
    ``code``; says what happened in one line on stderr."""
    bundle = pack(
        workdir, max_bytes=max_bytes, warn=lambda m: print(f"warning: {m}", file=sys.stderr)
    )
    try:
        uploaded = client.upload_bundle(bundle.path, bundle.sha256)
    finally:
        bundle.path.unlink(missing_ok=True)
    what = "uploaded" if uploaded else "already stored"
    print(
        f"code: {format_size(bundle.size_bytes)} bundle {bundle.sha256[:7]} ({what})",
        file=sys.stderr,
    )
    return {"kind": "bundle", "sha256": bundle.sha256, "size_bytes": bundle.size_bytes}


class LogFollower:
    """Prints a job's output as it arrives (``GET /v1/jobs/{id}/logs``).

    Chunks go to ``out`` as they are; a ``==> stream <==`` line on ``err`` says whose output
    follows whenever the stream (attempt and node) changes. Following ends once the job has
    ended and all its streams are complete, or ``grace_s`` after the job ended (a runner
    that died never completes its streams). ``best_effort`` (for ``submit --follow``):
    an error reading the logs stops printing them instead of failing."""

    def __init__(
        self,
        client: TrainyardClient,
        job_id: str,
        *,
        as_json: bool = False,
        best_effort: bool = False,
        out: TextIO | None = None,
        err: TextIO | None = None,
        poll_s: float = LOG_POLL_SECONDS,
        grace_s: float = SETTLE_SECONDS,
        clock: Callable[[], float] | None = None,
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        self._client = client
        self._job_id = job_id
        self._as_json = as_json
        self._best_effort = best_effort
        self._out = out
        self._err = err
        self._poll_s = poll_s
        self._grace_s = grace_s
        self._clock = clock or time.monotonic
        self._sleep = sleep or time.sleep
        self.cursor = ""
        self.done = False
        self._stream: str | None = None
        self._open_line = False
        self._ended_at: float | None = None

    def run(self, follow: bool) -> None:
        """Print what there is; with ``follow``, poll until the job's output is complete."""
        while not self.poll() and follow:
            self._sleep(self._poll_s)

    def poll(self) -> bool:
        """Print every chunk available now; True once there will be no more."""
        if self.done:
            return True
        while True:
            try:
                page = self._client.logs(self._job_id, after=self.cursor)
            except TrainyardError:
                if not self._best_effort:
                    raise
                self.done = True  # e.g. a server without logs: follow the status only
                return True
            for chunk in page["chunks"]:
                self._print(chunk)
            self.cursor = page["cursor"]
            if not page["chunks"]:
                break
        if page["job_terminal"]:
            now = self._clock()
            self._ended_at = now if self._ended_at is None else self._ended_at
            if page["streams_complete"] or now - self._ended_at >= self._grace_s:
                self.done = True
        return self.done

    def _print(self, chunk: dict[str, Any]) -> None:
        out = self._out or sys.stdout
        if self._as_json:
            print(json.dumps(chunk, sort_keys=True), file=out, flush=True)
            return
        if chunk["stream"] != self._stream:
            if self._open_line:
                out.write("\n")
            out.flush()
            print(f"==> {chunk['stream']} <==", file=self._err or sys.stderr, flush=True)
            self._stream = chunk["stream"]
        text = chunk["text"]
        if text:
            out.write(text)
            out.flush()
            self._open_line = not text.endswith("\n")


def read_spec(path: Path) -> SpecFile:
    """A job spec file (YAML or JSON, ``trainyard.spec``); warnings go to stderr."""
    return load(path, warn=lambda message: print(f"warning: {message}", file=sys.stderr))


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
            lines.append(f"{_time(entry['at'])}  {entry['status']}{reason}")
        self._history = len(view["history"])
        if view.get("pending") and lines:
            lines.append(f"          {_pending(view['pending'])}")
        if view.get("step") is not None and view["step"] != self._step:
            self._step = view["step"]
            lines.append(f"          step {view['step']}: {_metrics(view['metrics'])}")
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
            lines.append(f"          cost: {_cost(view['cost'])}")
        return lines


def render_job(view: dict[str, Any]) -> str:
    """A job view for people."""
    spec = view["spec"]
    status = view["status"]
    if view.get("node"):
        gpus = ",".join(str(i) for i in view.get("gpu_indices") or []) or "none"
        status += f" (attempt {view['attempt']} on {view['node']}, GPUs {gpus})"
    if view.get("cancel_requested") and not view.get("terminal"):
        status += ", cancellation requested"
    rows = [
        ("job", f"{view['id']}  {view['name']}"),
        ("status", status),
        ("owner", f"{view['team']}/{view['user']}"),
        (
            "resources",
            f"{spec['gpus']} x {spec['gpu_flavor']}, {_program(spec)} "
            f"{' '.join(spec.get('args') or [])}".rstrip(),
        ),
        (
            "times",
            "  ".join(
                f"{label} {_time(view[key])}"
                for label, key in (
                    ("submitted", "submitted_at"),
                    ("started", "started_at"),
                    ("finished", "finished_at"),
                )
                if view.get(key)
            ),
        ),
    ]
    if spec.get("code"):
        rows.append(("code", _code(spec["code"])))
    if view.get("pending"):
        rows.append(("pending", _pending(view["pending"])))
    if view.get("step") is not None or view.get("metrics"):
        rows.append(("metrics", f"step {view.get('step')}: {_metrics(view['metrics'])}"))
    if view["checkpoints"]:
        last = view["checkpoints"][-1]
        rows.append(
            ("checkpoints", f"{len(view['checkpoints'])}, latest step {last['step']} {last['uri']}")
        )
    if view.get("model"):
        rows.append(("model", _model(view["model"])))
    rows.append(("cost", _cost(view["cost"])))
    if view.get("failure"):
        failure = view["failure"]
        code = "" if failure.get("exit_code") is None else f" (exit code {failure['exit_code']})"
        rows.append(("failure", failure["reason"] + code))
        rows.extend(("", line) for line in (failure.get("log_tail") or "").splitlines()[-10:])
    rows.append(("history", ""))
    rows.extend(
        ("", f"{_time(h['at'])}  {h['status']:<10} {h.get('reason') or ''}".rstrip())
        for h in view["history"]
    )
    return "\n".join(f"{label:<12}{value}".rstrip() for label, value in rows)


def render_list(jobs: list[dict[str, Any]]) -> str:
    """The job list as a table."""
    if not jobs:
        return "no jobs"
    header = ("ID", "NAME", "USER", "STATUS", "GPUS", "SUBMITTED", "COST")
    rows = [header] + [
        (
            j["id"],
            j["name"],
            j["user"],
            j["status"],
            f"{j['gpus']}x{j['gpu_flavor']}",
            _time(j["submitted_at"]),
            f"{j['cost']:.4f} {j['currency']}" if j.get("currency") else "-",
        )
        for j in jobs
    ]
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(header))]
    return "\n".join(
        "  ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


def _program(spec: dict[str, Any]) -> str:
    return str(spec.get("entrypoint") or shlex.join(spec.get("command") or []))


def _code(code: dict[str, Any]) -> str:
    if code.get("kind") == "bundle":
        return f"bundle {str(code['sha256'])[:7]} ({_size(int(code['size_bytes']))})"
    if code.get("kind") == "git":
        return f"git {code['repository']} @ {str(code['commit'])[:12]}"
    return json.dumps(code, sort_keys=True)


def _pending(pending: dict[str, Any]) -> str:
    parts = [pending.get("reason") or "waiting"]
    if pending.get("position") is not None:
        parts.append(f"position {pending['position']}")
    if pending.get("estimated_start"):
        parts.append(f"estimated start {_time(pending['estimated_start'])}")
    return ", ".join(parts)


def _metrics(metrics: dict[str, Any]) -> str:
    if not metrics:
        return "(none)"
    return " ".join(
        f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in sorted(metrics.items())
    )


def _model(model: dict[str, Any]) -> str:
    return f"{model['name']} v{model['version']} {model['artifact_uri']}"


def _cost(cost: dict[str, Any]) -> str:
    state = "final" if cost["final"] else "so far"
    if not cost.get("currency"):
        return f"nothing billed yet ({state})"
    hours = cost["gpu_seconds"] / 3600
    price = cost.get("price_per_gpu_hour")
    at_price = f" at {price:.2f} {cost['currency']}/GPU-hour" if price is not None else ""
    return f"{cost['cost']:.4f} {cost['currency']} for {hours:.3f} GPU-hours{at_price} ({state})"


def _size(size: int) -> str:
    return format_size(size)


def _time(value: str | None) -> str:
    if not value:
        return "-"
    try:
        return datetime.fromisoformat(value).astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")
    except ValueError:
        return value


def _why(view: dict[str, Any]) -> str:
    if view.get("failure"):
        return f": {view['failure']['reason']}"
    reasons = [h.get("reason") for h in view["history"] if h["status"] == view["status"]]
    return f": {reasons[-1]}" if reasons and reasons[-1] else ""


def _dumps(value: object) -> str:
    return json.dumps(value, indent=2, sort_keys=True)


def _fail(message: str) -> int:
    print(f"trainyard: error: {message}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())

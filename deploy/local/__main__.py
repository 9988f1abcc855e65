"""Command line of the embedded local stack: ``python -m trainyard_platform.deploy.local up|demo``.

``up``    starts the stack (``LocalStack``) in ``.trainyard/local`` (kept between runs unless
          ``--fresh``), prints the service URLs, the operator token (new at every start) and
          the first admin's token, and runs until Ctrl-C or
          SIGTERM. Meanwhile every process that dies (NATS, PostgreSQL, S3, each service)
          is reported on stderr with its exit status or signal and its log tail, and
          restarted with back-off; a crash loop is reported and, after five failures in a
          row, left down; a service that cannot start only because a dependency is away
          (exit status 75) is started again until it is back (see ``deploy.local.stack``).
``demo``  starts a fresh stack in ``.trainyard/demo``, bootstraps an admin of team
          ``ml-research``, submits ``examples/digits.job.json`` for that team through
          ``TrainyardClient``, prints each status change, waits for SUCCEEDED, then prints
          the model's name and version, its lineage and its cost, and stops everything.

Exit status: 0 on success; 1 on failure, with a message and the log tail of the failing
service; 130 after Ctrl-C and 143 after SIGTERM (the stack is stopped in every case). A
second Ctrl-C while stopping kills the process being waited for instead of its grace.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

from trainyard_platform.deploy.local.processes import ProcessFailedError
from trainyard_platform.deploy.local.stack import SERVICES, LocalStack, project_root

DEMO_TEAM = "ml-research"
DEMO_USER = "demo-admin"
OPERATOR_TEAM = "platform"
OPERATOR_USER = "operator"
DEMO_SPEC = Path("examples") / "digits.job.json"
# How lineage is printed: the keys we know first, then whatever else the registry records.
LINEAGE_ORDER = (
    "code_version",
    "code",
    "dataset",
    "data_version",
    "seed",
    "environment",
    "image",
    "dependencies",
    "hardware",
)


class Interrupted(BaseException):
    """Ctrl-C or SIGTERM arrived; carries the exit status to use.

    A ``BaseException``, like ``KeyboardInterrupt``, so no ``except Exception`` swallows it.
    """

    def __init__(self, status: int) -> None:
        super().__init__(f"interrupted (exit status {status})")
        self.status = status


class DemoFailed(Exception):
    """The demo did not reach its end; the message says why."""


def _base_dir() -> Path:
    """Where ``.trainyard/`` lives: the source checkout if we run from one, else here."""
    return project_root() or Path.cwd()


def _say(message: str) -> None:
    print(message, flush=True)


def _warn(message: str) -> None:
    """The watchdog's reports: deaths (with log tails), restarts, crash loops."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@contextmanager
def _signals_raise() -> Iterator[None]:
    """Turn SIGINT/SIGTERM into ``Interrupted`` so every ``with`` block unwinds cleanly."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise Interrupted(130 if signum == signal.SIGINT else 143)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


# --- up ------------------------------------------------------------------------------


def cmd_up(args: argparse.Namespace) -> int:
    data_dir = Path(args.data_dir).resolve() if args.data_dir else _base_dir() / ".trainyard/local"
    if args.fresh and data_dir.exists():
        shutil.rmtree(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    extra_env = {"OTEL_EXPORTER_OTLP_ENDPOINT": args.otlp_endpoint} if args.otlp_endpoint else {}
    span_file = data_dir / "spans.jsonl" if args.spans else None
    stack = LocalStack(
        data_dir,
        storage=args.storage,
        span_file=span_file,
        runner_gpus=args.gpus,
        extra_env=extra_env,
        progress=_say,
        report=_warn,
    )
    with stack:
        token: str | None
        operator: str | None
        try:
            # A kept data folder has these users already: they get new tokens.
            token = stack.bootstrap_admin(args.team, args.user, reissue=True)
            operator = stack.bootstrap_admin(
                OPERATOR_TEAM, OPERATOR_USER, role="operator", reissue=True
            )
        except RuntimeError as exc:  # e.g. the user was disabled, or has another role
            token = operator = None
            print(f"warning: no admin token: {exc}", file=sys.stderr, flush=True)
        _say("")
        _say("Trainyard is up. Ctrl-C stops it.")
        for name, url in stack.service_urls.items():
            _say(f"  {name:<11} {url}")
        _say(f"  dashboard   {stack.submission_url}/ui/  (sign in with a token below)")
        _say(f"  nats        {stack.nats_url}")
        _say(f"  database    {stack.database_url}")
        _say(f"  storage     {stack.storage_uri}")
        _say(f"  logs        {stack.log_dir}")
        if span_file is not None:
            _say(f"  spans       {span_file}  (trainyard trace JOB --file {span_file})")
        _say(f"  services' operator token: {stack.admin_token}")
        _say("              (break-glass: accepted by the scheduler, registry, billing and")
        _say("              runner APIs, never expires; rotate it by restarting)")
        if operator is not None:
            _say(f"  operator    {OPERATOR_USER} of team {OPERATOR_TEAM}, token: {operator}")
            _say(
                f"              curl -H 'Authorization: Bearer {operator}' "
                f"{stack.service_urls['scheduler']}/v1/queue"
            )
        if token is not None:
            _say(f"  admin       {args.user} of team {args.team}, token: {token}")
            _say("\nFor the trainyard CLI (a context named local, kept in a 0600 file):")
            for line in cli_hint(token, stack.service_urls):
                _say(f"  {line}")
        # The stack's watchdog reports and restarts whatever dies; a process it leaves
        # down stays down: someone may be trying out what a dead service does.
        while True:
            time.sleep(1.0)


def cli_hint(token: str, urls: dict[str, str]) -> list[str]:
    """The login command for the stack at ``urls`` (by service), then the same as
    environment variables: each names every service the CLI calls, so no command of it
    ends for want of a URL."""
    others = ("registry", "billing", "scheduler")
    login = " ".join(f"--{name}-url {urls[name]}" for name in others)
    export = " ".join(f"TRAINYARD_{name.upper()}_URL={urls[name]}" for name in others)
    return [
        f"echo {token} | trainyard login {urls['submission']} --token-stdin --name local {login}",
        f"or: export TRAINYARD_URL={urls['submission']} TRAINYARD_TOKEN={token} {export}",
    ]


# --- demo ----------------------------------------------------------------------------


def cmd_demo(args: argparse.Namespace) -> int:
    spec_path = Path(args.spec) if args.spec else _base_dir() / DEMO_SPEC
    if not spec_path.is_file():
        raise DemoFailed(f"job spec {spec_path} not found")
    spec = json.loads(spec_path.read_text())
    spec["team"] = DEMO_TEAM

    data_dir = _base_dir() / ".trainyard" / "demo"
    if data_dir.exists():
        shutil.rmtree(data_dir)  # each demo starts from nothing
    data_dir.mkdir(parents=True)
    _say(f"== starting the local stack in {data_dir}")
    started = time.monotonic()
    stack = LocalStack(
        data_dir,
        storage=args.storage,
        span_file=data_dir / "spans.jsonl",
        runner_gpus=args.gpus,
        progress=lambda m: _say(f"   {m}"),
    )
    with stack:
        _say(f"== stack ready in {time.monotonic() - started:.1f} s")
        token = stack.bootstrap_admin(DEMO_TEAM, DEMO_USER)
        _say(f"== admin {DEMO_USER!r} of team {DEMO_TEAM!r} created")
        try:
            _run_demo_job(stack, token, spec, spec_path, timeout_s=args.timeout)
        except DemoFailed:
            _print_suspect_logs(stack)
            raise
    _say(f"== done: the stack is stopped; logs and spans are in {data_dir}")
    return 0


def _run_demo_job(
    stack: LocalStack, token: str, spec: dict[str, Any], spec_path: Path, timeout_s: float
) -> None:
    try:
        from trainyard.bundle import DEFAULT_MAX_BYTES
        from trainyard.cli import upload_code
        from trainyard.client import TrainyardClient
    except ImportError as exc:
        raise DemoFailed(f"the Trainyard client cannot be imported: {exc}") from exc

    client = TrainyardClient(stack.submission_url, token)
    try:
        try:
            # What `trainyard submit` does: the spec's folder travels with the job.
            spec = {**spec, "code": upload_code(client, spec_path.parent, DEFAULT_MAX_BYTES)}
            job = client.submit(spec)
        except Exception as exc:  # the client's HTTP errors carry the field path and reason
            raise DemoFailed(f"the submission was refused: {exc}") from exc
        job_id = str(job["id"])
        _say(f"== submitted {spec_path.name} as job {job_id} (status {job.get('status')})")
        t0 = time.monotonic()
        printer = _StatusPrinter(t0)
        printer(job)
        view = _wait_watching(
            stack, lambda: client.wait(job_id, timeout_s, on_change=printer), timeout_s
        )
        if view.get("status") != "SUCCEEDED":
            raise DemoFailed(f"job {job_id} ended {view.get('status')}{_failure_text(view)}")
        _say(f"== job {job_id} SUCCEEDED after {time.monotonic() - t0:.1f} s")
        # Registry and billing consume the same events on their own: wait until both wrote.
        view = _wait_watching(stack, lambda: _wait_for_model_and_cost(client, job_id), 60.0)
        _print_result(view)
    finally:
        close = getattr(client, "close", None)
        if callable(close):
            close()


class _StatusPrinter:
    """``on_change`` callback: a line per status change (with where and why) and per new
    checkpoint; the client calls it on every change of the view, metrics included."""

    def __init__(self, t0: float) -> None:
        self._t0 = t0
        self._last: str | None = None
        self._checkpoints = 0

    def __call__(self, change: Any) -> None:
        view = change if isinstance(change, dict) else {"status": str(change)}
        status = str(view.get("status"))
        line = status
        if view.get("node"):
            line += f" on {view['node']}"
        detail = _latest_reason(view)
        if detail:
            line += f" ({detail})"
        if line != self._last:
            self._last = line
            self._print(line)
        checkpoints = view.get("checkpoints")
        if isinstance(checkpoints, list) and len(checkpoints) > self._checkpoints:
            self._checkpoints = len(checkpoints)
            newest = checkpoints[-1] if isinstance(checkpoints[-1], dict) else {}
            self._print(f"checkpoint {self._checkpoints} saved at step {newest.get('step')}")

    def _print(self, line: str) -> None:
        _say(f"   [{time.monotonic() - self._t0:6.1f} s] {line}")


def _latest_reason(view: dict[str, Any]) -> str | None:
    """Why the job is where it is: the pending reason and position, else the newest
    history entry's reason."""
    pending = view.get("pending")
    if isinstance(pending, dict) and pending.get("reason"):
        text = str(pending["reason"])
        if pending.get("position") is not None:
            text += f"; position {pending['position']}"
        return text
    history = view.get("history")
    if isinstance(history, list) and history and isinstance(history[-1], dict):
        reason = history[-1].get("reason")
        return str(reason) if reason else None
    return None


def _failure_text(view: dict[str, Any]) -> str:
    failure = view.get("failure")
    if not isinstance(failure, dict):
        return ""
    text = f": {failure.get('reason')}"
    if failure.get("exit_code") is not None:
        text += f" (exit code {failure['exit_code']})"
    if failure.get("log_tail"):
        text += f"\n--- the job's last output ---\n{str(failure['log_tail']).rstrip()}\n---"
    return text


def _wait_watching(
    stack: LocalStack, wait: Callable[[], dict[str, Any]], timeout_s: float
) -> dict[str, Any]:
    """Run a blocking wait in a thread while checking that every service stays alive.

    ``timeout_s`` is the wait's own limit; past it (plus a margin) we stop waiting for it.
    """
    result: dict[str, Any] = {}
    error: list[BaseException] = []

    def run() -> None:
        try:
            result.update(wait())
        except BaseException as exc:
            error.append(exc)

    # A daemon: if a service dies we report it at once and must not wait for the thread.
    thread = threading.Thread(target=run, name="demo-wait", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s + 30.0
    while thread.is_alive():
        thread.join(timeout=0.5)
        stack.check_alive()
        if time.monotonic() > deadline:
            raise DemoFailed(f"no answer within {timeout_s:g} s")
    if error:
        if isinstance(error[0], DemoFailed):
            raise error[0]
        raise DemoFailed(f"waiting for the job failed: {error[0]!r}") from error[0]
    return result


def _wait_for_model_and_cost(client: Any, job_id: str, timeout_s: float = 60.0) -> dict[str, Any]:
    """Poll until the model is registered and the cost is final (every allocation billed)."""
    deadline = time.monotonic() + timeout_s
    while True:
        view: dict[str, Any] = client.get_job(job_id)
        model, cost = view.get("model"), view.get("cost")
        has_model = isinstance(model, dict) and model.get("version") is not None
        has_cost = isinstance(cost, dict) and bool(cost.get("final", cost.get("gpu_seconds")))
        if has_model and has_cost:
            return view
        if time.monotonic() >= deadline:
            missing = [
                what for what, ok in (("model", has_model), ("final cost", has_cost)) if not ok
            ]
            raise DemoFailed(
                f"job {job_id} succeeded but its {' and '.join(missing)} did not appear "
                f"within {timeout_s:g} s"
            )
        time.sleep(0.5)


def _print_result(view: dict[str, Any]) -> None:
    model: dict[str, Any] = view["model"]
    cost: dict[str, Any] = view["cost"]
    _say(f"== model {model.get('name')} version {model.get('version')}")
    if model.get("metrics"):
        _field("metrics", model["metrics"])
    if model.get("artifact_uri"):
        _field("artifact", model["artifact_uri"])
    checkpoints = view.get("checkpoints")
    if isinstance(checkpoints, list):
        _field("checkpoints", len(checkpoints))
    _say("== lineage")
    lineage = model.get("lineage") or {}
    if isinstance(lineage, dict):
        keys = [k for k in LINEAGE_ORDER if k in lineage]
        keys += [k for k in lineage if k not in keys]
        for key in keys:
            value = lineage[key]
            _field(key, _environment(value) if key == "environment" else value)
        hardware = _hardware(lineage)
        if hardware:
            _field("hardware", hardware)
    else:
        _say(f"   {_compact(lineage)}")
    gpu_seconds = float(cost.get("gpu_seconds") or 0.0)
    amount = float(cost.get("cost") or 0.0)
    currency = cost.get("currency") or ""
    price = cost.get("price_per_gpu_hour")
    price_text = f"{float(price):.4f} {currency}/GPU-hour" if price is not None else "(no price)"
    _say(
        f"== cost: {gpu_seconds:.1f} GPU-seconds x {price_text} = {amount:.6f} {currency}"
        + ("" if cost.get("final", True) else " (not final yet)")
    )


def _environment(env: Any) -> Any:
    """The recorded environment without its package list, which is summarised: the whole
    list (hundreds of pins) stays in the registry's record."""
    if not isinstance(env, dict) or not isinstance(env.get("packages"), list):
        return env
    shown = {k: v for k, v in env.items() if v is not None and k != "packages"}
    digest = str(env.get("packages_sha256") or "")[:12]
    shown["packages"] = f"{len(env['packages'])} pinned" + (
        f" (sha256 {digest}…)" if digest else ""
    )
    shown.pop("packages_sha256", None)
    return shown


def _hardware(lineage: dict[str, Any]) -> str | None:
    """A one-line hardware summary from the recorded environment (when not its own key)."""
    env = lineage.get("environment")
    if "hardware" in lineage or not isinstance(env, dict) or not env.get("gpu_names"):
        return None
    names = [str(n) for n in env["gpu_names"]]
    text = f"{len(names)} x {env.get('gpu_flavor', 'gpu')} ({', '.join(sorted(set(names)))})"
    if env.get("node_id"):
        text += f" on node {env['node_id']}"
    if env.get("cuda"):
        text += f", CUDA {env['cuda']}"
    return text


def _field(label: str, value: Any) -> None:
    _say(f"   {label:<18} {_compact(value)}")


def _compact(value: Any) -> str:
    if isinstance(value, dict | list):
        return json.dumps(value, sort_keys=True, default=str)
    return str(value)


def _print_suspect_logs(stack: LocalStack) -> None:
    """After a failure: tails of the services whose logs show errors (else the runner's)."""
    suspects = [
        name
        for name in stack.process_names
        if any(mark in stack.log_tail(name, 200) for mark in ("Traceback", "ERROR", "CRITICAL"))
    ]
    for name in suspects or ["runner"]:
        if name in SERVICES or name in stack.process_names:
            print(
                f"--- last lines of {stack.log_path(name)} ---\n{stack.log_tail(name)}\n---",
                file=sys.stderr,
                flush=True,
            )


# --- entry ---------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m trainyard_platform.deploy.local",
        description="Trainyard's embedded local stack.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--storage", choices=["file", "s3"], default="file", help="object store")
        p.add_argument("--gpus", type=int, default=2, help="virtual GPUs of the runner")

    up = sub.add_parser("up", help="start the stack and keep it running until Ctrl-C")
    common(up)
    up.add_argument("--data-dir", help="state folder (default .trainyard/local)")
    up.add_argument("--fresh", action="store_true", help="delete the state folder first")
    up.add_argument("--team", default=DEMO_TEAM, help="team of the bootstrapped admin")
    up.add_argument("--user", default="admin", help="name of the bootstrapped admin")
    up.add_argument("--otlp-endpoint", help="export traces here, e.g. http://127.0.0.1:4318")
    up.add_argument(
        "--no-spans",
        dest="spans",
        action="store_false",
        help="do not write spans to spans.jsonl in the data folder (read by trainyard trace)",
    )

    demo = sub.add_parser("demo", help="run one training job end to end on a fresh stack")
    common(demo)
    demo.add_argument("--spec", help=f"job spec (default {DEMO_SPEC})")
    demo.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for the job")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    command = cmd_up if args.command == "up" else cmd_demo
    try:
        with _signals_raise():
            return command(args)
    except Interrupted as exc:
        print("\nstopped", file=sys.stderr)
        return exc.status
    except KeyboardInterrupt:
        return 130
    except (DemoFailed, ProcessFailedError, RuntimeError, OSError) as exc:
        print(f"\nFAILED: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

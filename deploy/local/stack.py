"""The whole platform on one machine: infrastructure and services as local processes.

``LocalStack(data_dir)`` is a context manager. Entering it starts, in order, NATS with
JetStream, PostgreSQL (database ``trainyard``), a moto S3 endpoint with bucket
``trainyard`` when ``storage="s3"``, then the five services and one runner (node
``local-node-1``, flavor ``cpu``, ``runner_gpus`` virtual GPUs), each as
``python -m trainyard_platform.services.<name>`` on its own free loopback port. The services are launched
together (as compose would) and the stack returns once every ``/readyz`` answers 200; a
service that exits or is not ready in time raises ``ProcessFailedError`` carrying the tail
of its log. Leaving the context stops everything in reverse order, also on exceptions and
Ctrl-C: services get SIGTERM and ``shutdown_grace_s`` to drain (passed to them as
``TRAINYARD_<SERVICE>_SHUTDOWN_GRACE_SECONDS``; the runner's jobs get three quarters of it
as ``TRAINYARD_RUNNER_DRAIN_TIMEOUT_SECONDS``), and SIGKILL 5 s after that.

Layout under ``data_dir``: ``nats/`` (JetStream store and ``nats.conf``), ``postgres/`` (PGDATA),
``objects/`` (file storage), ``runners/<node>/`` (runner work dirs) and
``logs/<name>.log`` for every process (``logs/postgres.log`` links to the server log).

The stack makes one random operator token at construction (``admin_token``) and gives it to
every service as ``TRAINYARD_<SERVICE>_ADMIN_TOKEN``: their operator endpoints (and the
runner's ``/v1/node``) accept ``Authorization: Bearer <admin_token>``. Each of those services
also gets ``TRAINYARD_<SERVICE>_IDENTITY_URL`` (the submission service), so users' own tokens
work there too, within their role. The web dashboard on the submission service is told the
scheduler's, registry's and billing's URLs, and those three allow its origin (CORS).

Every child gets this process's environment without any inherited ``TRAINYARD_*``
variable, then the stack's settings (``env``: infrastructure plus ``extra_env``), then its
own ``TRAINYARD_<SERVICE>_*`` settings; ``extra_env`` is applied last and so wins. A
runner's jobs run as uids it derives from its node id, taking the next free range when a
runner of another stack holds that one, so stacks with data folders of their own run side
by side on one host.

``service_argv(kind)`` says how a service starts (default ``python -m trainyard_platform.services.<kind>``);
tests replace it with stand-ins, and ``bootstrap_admin`` appends its sub-command to it.

Supervision: once started, a watchdog thread (``deploy.local.processes.Watchdog``) watches
every process of the stack: NATS, PostgreSQL, the S3 endpoint and each service and runner.
Every unexpected exit is reported through ``report`` (default: ``progress``) with the
name, the exit status or signal and the last lines of its log, and kept in ``deaths``;
the process is then started again after a back-off (``restart_policy``: 1 s doubling to
30 s; the count resets once it stays up 30 s; from the second failure in a row the report
says "crash loop", and the fifth leaves the process down, saying so). A service that exits
with status 75 (it could not start only because PostgreSQL or the object store is away) is
no crash: it is started again with that back-off for as long as it takes, each exit
reported in one line saying why. NATS and PostgreSQL come back on the same port
(socket) with the same data folder, a service on the same port with the same
environment, the S3 endpoint on the same port (empty: moto keeps buckets in memory; the
bucket is created again). ``check_alive`` raises when a process is down for good (a
crash loop given up, or a crash with automatic restarts off).

Intentional stops are no crashes and are not restarted: ``stop()`` (Ctrl-C),
``stop_service`` (SIGTERM, then SIGKILL after the grace) and ``kill_service`` (SIGKILL at
once); ``start_service`` starts such a service again on its port. ``add_runner`` starts a
second node. For fault tests (chaos):

* ``kill(name, sig=SIGKILL)`` signals a process's group *as a fault*: the watchdog sees a
  crash, reports it and restarts it;
* ``pause(name)``/``resume(name)`` send SIGSTOP/SIGCONT (a hung process; not a death);
* ``restart(name)`` stops and starts a process on purpose (also one left down) and waits
  until it serves;
* ``set_auto_restart(name, False)`` leaves a crashed process down (still reported) until
  ``restart`` or ``set_auto_restart(name, True)``; ``LocalStack(..., auto_restart=False)``
  does so for every process.

``name`` is ``"nats"``, ``"postgres"``, ``"s3"`` or a process name (``process_names``).

NATS lets in only its users: the stack makes one per service (one per runner node, also for
``add_runner``) with a random password and the permissions of
``deploy.local.nats.service_permissions``, and gives each service process only its own as
``TRAINYARD_NATS_USER``/``TRAINYARD_NATS_PASSWORD``; ``nats_url`` has no credentials.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Final, Literal

from trainyard_platform.deploy.local.nats import (
    NatsServer,
    NatsUser,
    service_user,
    service_user_name,
)
from trainyard_platform.deploy.local.ports import LOOPBACK, free_port
from trainyard_platform.deploy.local.postgres import PostgresServer
from trainyard_platform.deploy.local.processes import (
    Death,
    ManagedProcess,
    ProcessFailedError,
    RestartPolicy,
    Supervisor,
    Watchdog,
    read_log_tail,
)

if TYPE_CHECKING:
    from trainyard_platform.deploy.local.s3 import S3Server

SERVICES: Final[tuple[str, ...]] = ("registry", "billing", "scheduler", "runner", "submission")
"""Start order (stop order is the reverse): the HTTP entry point last, so it is the last to
come up and the first to stop taking work; runners stop while the scheduler still listens."""

ADMIN_TOKEN_SERVICES: Final = frozenset({"registry", "billing", "scheduler", "runner"})
"""The services with operator endpoints, which require ``TRAINYARD_<SERVICE>_ADMIN_TOKEN``
(submission authenticates its users' tokens instead)."""
_DASHBOARD_APIS: Final = ("scheduler", "registry", "billing")
"""The APIs the web dashboard (``/ui/`` on submission) calls from the browser: submission gets
their URLs (``TRAINYARD_SUBMISSION_<API>_PUBLIC_URL``), they get submission's origin as
``TRAINYARD_CORS_ORIGINS``."""

RUNNER_NODE_ID: Final = "local-node-1"
RUNNER_FLAVOR: Final = "cpu"
BUCKET: Final = "trainyard"
_PORT_ATTEMPTS: Final = 3
_KILL_MARGIN_S: Final = 5.0  # beyond the service's own drain time before SIGKILL

StorageKind = Literal["file", "s3"]


def project_root() -> Path | None:
    """The source checkout this package runs from, when it is one (editable installs)."""
    candidate = Path(__file__).resolve().parents[2]
    return candidate if (candidate / "pyproject.toml").is_file() else None


def default_service_argv(kind: str) -> list[str]:
    """How a service starts: ``python -m trainyard_platform.services.<kind>`` with this interpreter."""
    return [sys.executable, "-m", f"trainyard_platform.services.{kind}"]


def http_ready(url: str, timeout_s: float = 1.0) -> bool:
    """True when ``GET url`` answers 200 (proxies from the environment are ignored)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=timeout_s) as response:
            return int(response.status) == 200
    except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException):
        return False


class LocalStack:
    """NATS, PostgreSQL, optional S3 and all services as processes (see module docstring)."""

    def __init__(
        self,
        data_dir: Path,
        storage: StorageKind = "file",
        span_file: Path | None = None,
        runner_gpus: int = 2,
        extra_env: Mapping[str, str] | None = None,
        *,
        ready_timeout_s: float = 120.0,
        shutdown_grace_s: float = 20.0,
        progress: Callable[[str], None] | None = None,
        service_argv: Callable[[str], Sequence[str]] | None = None,
        report: Callable[[str], None] | None = None,
        restart_policy: RestartPolicy | None = None,
        auto_restart: bool = True,
    ) -> None:
        if storage not in ("file", "s3"):
            raise ValueError(f"storage must be 'file' or 's3', not {storage!r}")
        self.data_dir = Path(data_dir).resolve()
        self.storage: StorageKind = storage
        self.span_file = Path(span_file).resolve() if span_file is not None else None
        self.runner_gpus = runner_gpus
        self.extra_env = dict(extra_env or {})
        self.ready_timeout_s = ready_timeout_s
        self.shutdown_grace_s = shutdown_grace_s
        self.timings: dict[str, float] = {}
        """Seconds each component took to become ready, by name."""
        self.admin_token = secrets.token_urlsafe(32)
        """The operator token every service of this stack requires (see module docstring)."""
        self._progress = progress
        self._report = report or progress
        self.restart_policy = restart_policy or RestartPolicy()
        """When the watchdog restarts a crashed process (see module docstring)."""
        self.auto_restart = auto_restart
        """Whether crashed processes are restarted at all (``set_auto_restart`` per process);
        off, a chaos suite decides when things come back (deaths are reported all the same)."""
        self._service_argv = service_argv or default_service_argv
        self._nats: NatsServer | None = None
        self._postgres: PostgresServer | None = None
        self._s3: S3Server | None = None
        self._supervisor = Supervisor(grace_s=shutdown_grace_s + _KILL_MARGIN_S)
        self._ports: dict[str, int] = {}
        self._kinds: dict[str, str] = {}  # process name -> service package
        self._own_env: dict[str, dict[str, str]] = {}  # process name -> its own settings
        self._infra_env: dict[str, str] = {}
        self._nats_users: dict[str, NatsUser] = {}  # user name -> user, one per service
        self._launched_at: dict[str, float] = {}
        self._exit_stack: contextlib.ExitStack | None = None
        self._watchdog = Watchdog(self.restart_policy, report=self._report)
        self._paused: set[str] = set()

    # --- lifecycle -------------------------------------------------------------------

    def __enter__(self) -> LocalStack:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Start everything and wait until every service is ready (see module docstring)."""
        if self._exit_stack is not None:
            raise RuntimeError("the stack is already started")
        self._exit_stack = contextlib.ExitStack()
        self._supervisor = Supervisor(grace_s=self.shutdown_grace_s + _KILL_MARGIN_S)
        self._watchdog = Watchdog(self.restart_policy, report=self._report)
        self._paused.clear()
        self._ports.clear()
        self._kinds.clear()
        self._own_env.clear()
        try:
            # First registered, so last run: the watchdog's thread outlives what it started.
            self._exit_stack.callback(self._watchdog.close)
            self._start_infrastructure(self._exit_stack)
            # Registered after the infrastructure, so services stop before it does.
            self._exit_stack.callback(self._supervisor.stop_all)
            for name in SERVICES:
                self._define_service(name, name, self._service_env_for(name))
            for name in SERVICES:
                self._launch(name)
            for name in SERVICES:
                self._wait_ready(name)
                self._watch_service(name)
            self._watchdog.start()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop services (reverse order), then S3, PostgreSQL and NATS. Safe to repeat."""
        exit_stack, self._exit_stack = self._exit_stack, None
        if exit_stack is not None:
            self._say("stopping the stack")
            self._watchdog.quiesce()  # what stops now is no crash
            for name in list(self._paused):
                with contextlib.suppress(Exception):
                    self.resume(name)
            exit_stack.close()

    def _start_infrastructure(self, exit_stack: contextlib.ExitStack) -> None:
        # Jobs run as other users: they may pass through the data folder to their sandbox
        # (under runners/) but never list it or read the stack's objects, logs or events.
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.data_dir.chmod(0o711)
        self.log_dir.mkdir(mode=0o700, parents=True, exist_ok=True)

        # One user with a fresh random password per service (per runner node), each allowed
        # only its own subjects; the configuration file is 0600 in the closed nats/ folder.
        self._nats_users = {
            user.name: user
            for user in (
                service_user(kind, RUNNER_NODE_ID if kind == "runner" else None)
                for kind in SERVICES
            )
        }
        nats = NatsServer(
            self.data_dir / "nats",
            log_path=self.log_path("nats"),
            users=list(self._nats_users.values()),
        )
        exit_stack.callback(nats.stop)
        self._nats = nats
        self._timed("nats", nats.start)
        self._watchdog.watch(
            "nats",
            exited=nats.unexpected_exit,
            revive=nats.start,
            log_path=nats.log_path,
            auto_restart=self.auto_restart,
        )
        self._say(f"nats ready at {nats.url} ({self.timings['nats']:.1f} s)")
        (self.data_dir / "nats").chmod(0o700)  # the event store, closed to jobs

        postgres = PostgresServer(self.data_dir / "postgres")
        exit_stack.callback(postgres.stop)
        self._postgres = postgres
        self._timed("postgres", postgres.start)
        self._watchdog.watch(
            "postgres",
            exited=postgres.unexpected_exit,
            revive=postgres.recover,
            log_path=postgres.log_path,
            auto_restart=self.auto_restart,
        )
        self._link_log("postgres", postgres.log_path)
        self._say(f"postgres ready in {postgres.pgdata} ({self.timings['postgres']:.1f} s)")

        env = {
            "TRAINYARD_NATS_URL": nats.address,
            "TRAINYARD_DATABASE_URL": postgres.dsn,
        }
        if self.storage == "s3":
            # Imported lazily: moto is a local/dev extra, and the file path needs none of it.
            from trainyard_platform.deploy.local.s3 import S3Server

            s3 = S3Server(log_dir=self.log_dir)
            exit_stack.callback(s3.stop)
            self._s3 = s3
            self._timed("s3", s3.start)
            self._ensure_bucket(s3)
            self._watchdog.watch(
                "s3",
                exited=s3.unexpected_exit,
                revive=partial(self._start_s3, s3),
                log_path=s3.log_path,
                auto_restart=self.auto_restart,
            )
            env.update(s3.storage_env(f"s3://{BUCKET}"))
            self._say(f"s3 ready at {s3.url}, bucket {BUCKET} ({self.timings['s3']:.1f} s)")
        else:
            objects = self.data_dir / "objects"
            objects.mkdir(mode=0o700, parents=True, exist_ok=True)
            env["TRAINYARD_STORAGE_URI"] = objects.as_uri()
        if self.span_file is not None:
            self.span_file.parent.mkdir(parents=True, exist_ok=True)
            env["TRAINYARD_TELEMETRY_SPAN_FILE"] = str(self.span_file)
        self._infra_env = env

    # --- what callers read -----------------------------------------------------------

    @property
    def log_dir(self) -> Path:
        return self.data_dir / "logs"

    def log_path(self, name: str) -> Path:
        return self.log_dir / f"{name}.log"

    def log_tail(self, name: str, lines: int = 40) -> str:
        return read_log_tail(self.log_path(name), lines)

    @property
    def env(self) -> dict[str, str]:
        """The settings every service gets: infrastructure locations plus ``extra_env``."""
        return {**self._infra_env, **self.extra_env}

    @property
    def nats(self) -> NatsServer:
        if self._nats is None:
            raise RuntimeError("the stack is not started")
        return self._nats

    @property
    def postgres(self) -> PostgresServer:
        if self._postgres is None:
            raise RuntimeError("the stack is not started")
        return self._postgres

    @property
    def s3(self) -> S3Server | None:
        return self._s3

    @property
    def nats_url(self) -> str:
        """The NATS address, without credentials: each service has its own user."""
        return self.nats.address

    @property
    def database_url(self) -> str:
        return self.postgres.dsn

    @property
    def storage_uri(self) -> str:
        return self.env["TRAINYARD_STORAGE_URI"]

    @property
    def service_urls(self) -> dict[str, str]:
        """``http://127.0.0.1:PORT`` of every service process, by process name."""
        return {name: f"http://{LOOPBACK}:{port}" for name, port in self._ports.items()}

    @property
    def submission_url(self) -> str:
        return self.service_urls["submission"]

    @property
    def process_names(self) -> list[str]:
        return self._supervisor.names

    def process(self, name: str) -> ManagedProcess:
        return self._supervisor[name]

    # --- operations ------------------------------------------------------------------

    def bootstrap_admin(
        self,
        team: str,
        user: str,
        timeout_s: float = 120.0,
        role: str = "admin",
        reissue: bool = False,
    ) -> str:
        """Create the first admin of ``team`` (or, with ``role="operator"``, a platform
        operator) and return its bearer token; with ``reissue``, a user that exists already
        (a kept data folder) gets a new token instead of a refusal."""
        argv = [*self._service_argv("submission"), "bootstrap-admin"]
        argv += ["--team", team, "--user", user, "--role", role]
        argv += ["--reissue"] if reissue else []
        result = subprocess.run(
            argv,
            env=self._child_env("submission"),
            cwd=project_root(),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
        lines = [line.strip() for line in result.stdout.splitlines() if line.strip()]
        if result.returncode != 0 or len(lines) != 1 or " " in lines[0]:
            raise RuntimeError(
                f"bootstrap-admin failed (exit status {result.returncode}); it must print "
                f"only the token on stdout.\n--- stdout ---\n{result.stdout.rstrip()}\n"
                f"--- stderr ---\n{result.stderr.rstrip()}\n---"
            )
        return lines[0]

    def stop_service(self, name: str, grace_s: float | None = None) -> int | None:
        """SIGTERM a service (SIGKILL after the grace); returns its exit status. On purpose:
        it stays down until ``start_service``."""
        self._say(f"stopping {name}")
        self._watchdog.hold(name)
        self._paused.discard(name)
        return self._supervisor.stop(name, grace_s)

    def kill_service(self, name: str) -> int | None:
        """SIGKILL a service and its children at once, on purpose: it stays down until
        ``start_service`` (``kill`` is the crash the watchdog restarts)."""
        self._say(f"killing {name}")
        self._watchdog.hold(name)
        self._paused.discard(name)
        return self._supervisor.kill(name)

    def start_service(self, name: str, *, wait: bool = True) -> None:
        """Start a stopped service again on its old port; waits for ``/readyz`` by default."""
        if name not in self._kinds:
            raise KeyError(f"no service named {name!r} (known: {', '.join(self._kinds)})")
        self._watchdog.hold(name)
        try:
            self._launch(name)
            if wait:
                self._wait_ready(name)
        finally:
            self._watch_service(name)

    def add_runner(self, node_id: str, gpus: int | None = None, *, wait: bool = True) -> str:
        """Start another runner node; returns its process name ``runner-<node_id>``."""
        if self._exit_stack is None:
            raise RuntimeError("the stack is not started")
        name = f"runner-{node_id}"
        env = self._service_env_for("runner", node_id=node_id, gpus=gpus)
        self._define_service(name, "runner", env)
        self._launch(name)
        try:
            if wait:
                self._wait_ready(name)
        finally:
            self._watch_service(name)
        return name

    # --- supervision and faults ------------------------------------------------------

    @property
    def deaths(self) -> list[Death]:
        """Every unexpected exit the watchdog reported, oldest first."""
        return self._watchdog.deaths

    def check_alive(self) -> None:
        """Raise ``ProcessFailedError`` if a process is down and will not come back on its
        own (a crash loop given up, or automatic restarts off for it); every such process
        is named. A crash being restarted is reported, not raised."""
        self._watchdog.poll()  # notice what died since the watchdog's last round
        down = self._watchdog.down()
        if not down:
            return
        first = down[0]
        reason = first.summary.removeprefix(f"{first.name} ")
        if len(down) > 1:
            reason += "; also down: " + "; ".join(d.summary for d in down[1:])
        raise ProcessFailedError(
            first.name, reason, first.log_path or self.log_path(first.name), first.log_tail
        )

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to a process's group as a fault would: the watchdog reports the
        death and restarts it (unless ``set_auto_restart(name, False)``)."""
        self._say(f"sending {signal.Signals(sig).name} to {name}")
        self._signal(name, sig)

    def pause(self, name: str) -> None:
        """SIGSTOP a process's group: it hangs (not a death); ``resume`` undoes it."""
        self._signal(name, signal.SIGSTOP)
        self._paused.add(name)

    def resume(self, name: str) -> None:
        """SIGCONT a process's group paused by ``pause``."""
        self._paused.discard(name)
        with contextlib.suppress(ProcessLookupError):
            self._signal(name, signal.SIGCONT)

    def set_auto_restart(self, name: str, enabled: bool) -> None:
        """Whether the watchdog restarts ``name`` after a crash (on by default). Off, a
        crash is still reported and the process stays down until ``restart``."""
        self._watchdog.set_auto_restart(name, enabled)

    def restart(self, name: str, *, wait: bool = True) -> None:
        """Stop ``name`` if it runs and start it again, on purpose (same port, data and
        environment; its crash record is cleared); waits until it serves by default."""
        self._say(f"restarting {name}")
        if name in self._kinds:
            self._watchdog.hold(name)
            self.resume(name)
            self._supervisor.stop(name)
            self.start_service(name, wait=wait)
            return
        self._watchdog.hold(name)
        self.resume(name)
        try:
            if name == "nats":
                self.nats.stop()
                self.nats.start()
            elif name == "postgres":
                self.postgres.recover()
            elif name == "s3" and self._s3 is not None:
                self._s3.stop()
                self._start_s3(self._s3)
            else:
                raise KeyError(f"no process named {name!r} (known: {self._known_names()})")
        finally:
            self._watchdog.release(name)

    # --- internals -------------------------------------------------------------------

    def _say(self, message: str) -> None:
        if self._progress is not None:
            self._progress(message)

    def _known_names(self) -> str:
        return ", ".join(self._watchdog.names) or "none"

    def _signal(self, name: str, sig: int) -> None:
        if name in self._kinds:
            self._supervisor[name].send_signal(sig)
        elif name == "nats":
            self.nats.send_signal(sig)
        elif name == "postgres":
            self.postgres.send_signal(sig)
        elif name == "s3" and self._s3 is not None:
            self._s3.send_signal(sig)
        else:
            raise KeyError(f"no process named {name!r} (known: {self._known_names()})")

    def _watch_service(self, name: str) -> None:
        """Hand a started service to the watchdog: restarted on its port and environment,
        ready again when its ``/readyz`` answers. One watched already gets a clean record
        (and keeps its ``set_auto_restart`` choice)."""
        if name in self._watchdog:
            self._watchdog.release(name)
            return
        self._watchdog.watch(
            name,
            exited=lambda: self._supervisor[name].unexpected_exit(),
            revive=partial(self._launch, name),
            log_path=self.log_path(name),
            ready=lambda: http_ready(f"{self.service_urls[name]}/readyz"),
            auto_restart=self.auto_restart,
        )

    def _start_s3(self, s3: S3Server) -> None:
        """(Re)start the S3 endpoint on its port and create the bucket (moto forgets it)."""
        s3.start()
        self._ensure_bucket(s3)

    def _timed(self, name: str, start: Callable[[], object]) -> None:
        started = time.monotonic()
        start()
        self.timings[name] = time.monotonic() - started

    def _link_log(self, name: str, target: Path) -> None:
        link = self.log_path(name)
        with contextlib.suppress(OSError):
            if link.is_symlink() or link.exists():
                link.unlink()
            link.symlink_to(target)

    def _ensure_bucket(self, s3: S3Server) -> None:
        """Create the bucket once, before services race each other to create it."""
        from minio import Minio

        client = Minio(
            s3.endpoint,
            access_key=s3.access_key,
            secret_key=s3.secret_key,
            secure=False,
            region=s3.region,
        )
        if not client.bucket_exists(BUCKET):
            client.make_bucket(BUCKET)

    def _service_env_for(
        self, kind: str, *, node_id: str = RUNNER_NODE_ID, gpus: int | None = None
    ) -> dict[str, str]:
        """A service's own ``TRAINYARD_<SERVICE>_*`` settings (the port is added later)."""
        prefix = f"TRAINYARD_{kind.upper()}_"
        env = {
            f"{prefix}HOST": LOOPBACK,
            f"{prefix}SHUTDOWN_GRACE_SECONDS": f"{self.shutdown_grace_s:g}",
        }
        if kind in ADMIN_TOKEN_SERVICES:
            env[f"{prefix}ADMIN_TOKEN"] = self.admin_token
        if kind == "runner":
            work_dir = self.data_dir / "runners" / node_id
            work_dir.mkdir(parents=True, exist_ok=True)
            work_dir.parent.chmod(0o711)
            env.update(
                {
                    # The runner insists that its jobs' drain ends before its own grace does.
                    "TRAINYARD_RUNNER_DRAIN_TIMEOUT_SECONDS": f"{self.shutdown_grace_s * 0.75:g}",
                    "TRAINYARD_RUNNER_NODE_ID": node_id,
                    "TRAINYARD_RUNNER_GPU_FLAVOR": RUNNER_FLAVOR,
                    "TRAINYARD_RUNNER_VIRTUAL_GPUS": str(
                        self.runner_gpus if gpus is None else gpus
                    ),
                    "TRAINYARD_RUNNER_WORK_DIR": str(work_dir),
                }
            )
        env.update(self._nats_env(kind, node_id))
        return env

    def _nats_env(self, kind: str, node_id: str) -> dict[str, str]:
        """The service's own NATS user and password (a new runner node's user is added to
        the running server first)."""
        name = service_user_name(kind, node_id if kind == "runner" else None)
        user = self._nats_users.get(name)
        if user is None:
            user = service_user(kind, node_id if kind == "runner" else None)
            self.nats.add_user(user)
            self._nats_users[name] = user
        return {"TRAINYARD_NATS_USER": user.name, "TRAINYARD_NATS_PASSWORD": user.password}

    def _define_service(self, name: str, kind: str, own_env: dict[str, str]) -> None:
        if name in self._kinds:
            raise ValueError(f"a process named {name!r} exists already")
        self._kinds[name] = kind
        self._own_env[name] = own_env
        self._ports[name] = self._new_port()

    def _new_port(self) -> int:
        """A free port that no other process of this stack has been given."""
        taken = set(self._ports.values())
        if self._nats is not None:
            taken.add(self._nats.port)
        while (port := free_port()) in taken:
            pass
        return port

    def _child_env(self, name: str) -> dict[str, str]:
        kind = self._kinds.get(name, name)
        env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINYARD_")}
        env.update(self._infra_env)
        if kind == "runner":
            # It has no database: a node taken over must not hold every service's tables
            # (docs/security.md, "Threat model").
            env.pop("TRAINYARD_DATABASE_URL", None)
        env.update(self._own_env.get(name, {}))
        if name in self._ports:
            env[f"TRAINYARD_{kind.upper()}_PORT"] = str(self._ports[name])
        if kind in ADMIN_TOKEN_SERVICES and "submission" in self._ports:
            # They check user tokens with the submission service (shared.identity).
            env[f"TRAINYARD_{kind.upper()}_IDENTITY_URL"] = self.submission_url
        if kind in _DASHBOARD_APIS and "submission" in self._ports:
            # The web dashboard (served by submission) calls these APIs from the browser.
            env["TRAINYARD_CORS_ORIGINS"] = self.submission_url
        if kind == "submission":
            for api in _DASHBOARD_APIS:
                if api in self._ports:
                    env[f"TRAINYARD_SUBMISSION_{api.upper()}_PUBLIC_URL"] = self.service_urls[api]
            if "registry" in self._ports:
                # Jobs naming datasets or a parent model are admitted after the registry
                # says the user may read them (services/submission/data_admission.py).
                env["TRAINYARD_SUBMISSION_REGISTRY_URL"] = self.service_urls["registry"]
        # Logs must reach the file as they happen, not when a buffer fills.
        env["PYTHONUNBUFFERED"] = "1"
        no_proxy = ",".join(p for p in (env.get("NO_PROXY"), LOOPBACK, "localhost") if p)
        env["NO_PROXY"] = env["no_proxy"] = no_proxy
        env.update(self.extra_env)
        return env

    def _launch(self, name: str) -> None:
        self._launched_at[name] = time.monotonic()
        self._supervisor.start(
            name,
            self._service_argv(self._kinds[name]),
            env=self._child_env(name),
            log_path=self.log_path(name),
            cwd=project_root(),
        )

    def _wait_ready(self, name: str) -> None:
        for attempt in range(1, _PORT_ATTEMPTS + 1):
            process = self._supervisor[name]
            url = f"{self.service_urls[name]}/readyz"
            # The budget counts from the launch: services start together, waits run in turn.
            launched = self._launched_at.get(name, time.monotonic())
            left = max(1.0, self.ready_timeout_s - (time.monotonic() - launched))
            try:
                process.wait_until(partial(http_ready, url), timeout_s=left, what="ready")
            except ProcessFailedError as exc:
                # The port chosen for it was taken before it could bind: try a new one.
                lost_port = "address already in use" in exc.log_tail.lower()
                if not lost_port or attempt == _PORT_ATTEMPTS:
                    raise
                process.stop(self.shutdown_grace_s)
                self._ports[name] = self._new_port()
                self._launch(name)
                continue
            took = time.monotonic() - launched
            self.timings[name] = took
            self._say(f"{name} ready at {self.service_urls[name]} ({took:.1f} s)")
            return

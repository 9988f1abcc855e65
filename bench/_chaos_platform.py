"""The platform under chaos: the local stack with several runners, each service's NATS
connection through a proxy of its own, and the faults the suite drives.

``ChaosPlatform(data_dir, PlatformConfig(...))`` is a context manager around
``deploy.local.stack.LocalStack`` (file object store, virtual GPUs). Every service and every
runner node reaches NATS through its own ``TcpProxy`` (``bench._chaos_launch`` routes it),
so one of them can be cut off the bus while the others keep it. An admin NATS user is added
for the checks (reading the streams) and for publishing poison messages.

The stack's watchdog restarts any process that dies (as a production supervisor would) and
reports it; a process the suite kills is left down (``set_auto_restart``) until the suite
starts it again, so the injector decides how long an outage lasts. ``deaths()`` lists the
exits the suite did not cause.

Faults (each returns at once): ``kill(name)``/``restart(name)`` for a service, a runner,
``"nats"`` (its file store stays) or ``"postgres"`` (the postmaster's group: it and its
backends; crash recovery on start): SIGKILL, then started again on its old port, folder and
socket; ``pause(name)``/``resume(name)`` (SIGSTOP/SIGCONT of a process and every descendant:
a frozen node, jobs included, or of PostgreSQL's postmaster and backends: a hung database); ``lose_jetstream`` (NATS killed, its JetStream store deleted,
started empty: broker data loss); ``cut(name)``/``heal(name)`` (the proxy drops the
process's NATS connections and refuses new ones).
"""

from __future__ import annotations

import contextlib
import http.client
import shutil
import signal
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import psutil

from bench._chaos_launch import ROUTES
from bench._chaos_proxy import LOOPBACK, TcpProxy
from trainyard_platform.deploy.local.nats import NatsUser, admin_user
from trainyard_platform.deploy.local.stack import RUNNER_NODE_ID, LocalStack, http_ready

DB_SERVICES = ("submission", "scheduler", "registry", "billing")


@dataclass(frozen=True)
class PlatformConfig:
    """How the stack under chaos is set up (recorded with the results)."""

    runners: int = 3
    gpus_per_runner: int = 2
    node_timeout_s: float = 6.0
    heartbeat_s: float = 1.0
    restart_backoff_s: float = 0.5
    ack_wait_s: float = 10.0
    outage_retry_max_s: float = 5.0
    preemption_grace_s: float = 15.0
    min_runtime_s: float = 5.0
    """The scheduler's anti-thrash minimum runtime: its minutes-long default would keep most
    preemptions out of a short run."""
    shutdown_grace_s: float = 8.0
    extra_env: dict[str, str] = field(default_factory=dict)

    def env(self) -> dict[str, str]:
        return {
            "TRAINYARD_SCHEDULER_NODE_TIMEOUT_SECONDS": f"{self.node_timeout_s:g}",
            "TRAINYARD_SCHEDULER_NODE_CHECK_INTERVAL_SECONDS": "1",
            "TRAINYARD_RUNNER_HEARTBEAT_INTERVAL_SECONDS": f"{self.heartbeat_s:g}",
            "TRAINYARD_SCHEDULER_RESTART_BACKOFF_SECONDS": f"{self.restart_backoff_s:g}",
            "TRAINYARD_SCHEDULER_RESTART_BACKOFF_MAX_SECONDS": f"{self.restart_backoff_s * 4:g}",
            "TRAINYARD_SCHEDULER_PREEMPTION_GRACE_SECONDS": f"{self.preemption_grace_s:g}",
            "TRAINYARD_SCHEDULER_MIN_RUNTIME_SECONDS": f"{self.min_runtime_s:g}",
            "TRAINYARD_SCHEDULER_REVOKE_GRACE_SECONDS": "10",
            "TRAINYARD_RUNNER_KILL_GRACE_SECONDS": "5",
            "TRAINYARD_NATS_ACK_WAIT_SECONDS": f"{self.ack_wait_s:g}",
            "TRAINYARD_NATS_OUTAGE_RETRY_MAX_SECONDS": f"{self.outage_retry_max_s:g}",
            **self.extra_env,
        }

    def summary(self) -> dict[str, object]:
        return {
            "runners": self.runners,
            "gpus_per_runner": self.gpus_per_runner,
            "node_timeout_s": self.node_timeout_s,
            "heartbeat_s": self.heartbeat_s,
            "ack_wait_s": self.ack_wait_s,
            "outage_retry_max_s": self.outage_retry_max_s,
            "preemption_grace_s": self.preemption_grace_s,
            "min_runtime_s": self.min_runtime_s,
        }


def node_ids(runners: int) -> list[str]:
    return [RUNNER_NODE_ID, *(f"chaos-{i}" for i in range(2, runners + 1))]


class NotReadyError(TimeoutError):
    """Processes still not ready at a deadline, with what each ``/readyz`` answered then."""

    def __init__(self, timeout_s: float, answers: dict[str, str]) -> None:
        self.answers = answers
        listed = "; ".join(f"{name}: {answer}" for name, answer in answers.items())
        super().__init__(f"not ready after {timeout_s:g} s: {listed}")


def runner_process(node_id: str) -> str:
    """The stack's process name of a runner node."""
    return "runner" if node_id == RUNNER_NODE_ID else f"runner-{node_id}"


def launch_argv(kind: str) -> list[str]:
    return [sys.executable, "-m", "bench._chaos_launch", kind]


class ChaosPlatform:
    """The stack under chaos and its faults (see the module docstring)."""

    def __init__(
        self,
        data_dir: Path,
        config: PlatformConfig | None = None,
        progress: Callable[[str], None] | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.config = config or PlatformConfig()
        self._progress = progress
        self.nodes = node_ids(self.config.runners)
        self.runners = [runner_process(n) for n in self.nodes]
        self.services = list(DB_SERVICES)
        self.proxies: dict[str, TcpProxy] = {}
        self.admin: NatsUser = admin_user()
        self._stack: LocalStack | None = None
        self._paused: dict[str, list[psutil.Process]] = {}
        self._caused: list[tuple[str, float, float | None]] = []  # (name, from, until)
        self.reports: list[str] = []

    # --- life ----------------------------------------------------------------------------

    def __enter__(self) -> ChaosPlatform:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def stack(self) -> LocalStack:
        if self._stack is None:
            raise RuntimeError("the platform is not started")
        return self._stack

    def start(self) -> None:
        def nats_port() -> tuple[str, int]:
            return LOOPBACK, self.stack.nats.port

        for key in [*DB_SERVICES, *self.nodes]:
            self.proxies[self.process_of(key)] = TcpProxy(nats_port, name=f"proxy-{key}").start()
        routes = ",".join(
            f"{key}={self.proxies[self.process_of(key)].url}"
            for key in [
                *DB_SERVICES,
                *self.nodes,
            ]
        )
        self._stack = LocalStack(
            self.data_dir,
            storage="file",
            runner_gpus=self.config.gpus_per_runner,
            extra_env={**self.config.env(), ROUTES: routes},
            shutdown_grace_s=self.config.shutdown_grace_s,
            progress=self._progress,
            service_argv=launch_argv,
            report=self.reports.append,
        )
        try:
            self.stack.start()
            for node in self.nodes[1:]:
                self.stack.add_runner(node, gpus=self.config.gpus_per_runner)
            self.stack.nats.add_user(self.admin)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        for name in list(self._paused):
            with contextlib.suppress(Exception):
                self.resume(name)
        for proxy in self.proxies.values():
            proxy.heal()
        if self._stack is not None:
            with contextlib.suppress(Exception):
                if not self._stack.nats.is_running():
                    self._stack.nats.start()
            self._stack.stop()
        for proxy in self.proxies.values():
            proxy.stop()

    @staticmethod
    def process_of(key: str) -> str:
        return key if key in DB_SERVICES else runner_process(key)

    # --- what the suite reads ------------------------------------------------------------

    @property
    def processes(self) -> list[str]:
        return [*self.services, *self.runners]

    @property
    def admin_nats_url(self) -> str:
        return f"nats://{self.admin.name}:{self.admin.password}@{LOOPBACK}:{self.stack.nats.port}"

    @property
    def objects_dir(self) -> Path:
        return self.data_dir / "objects"

    def ready(self, name: str) -> bool:
        return http_ready(f"{self.stack.service_urls[name]}/readyz", timeout_s=2.0)

    def not_ready(self) -> list[str]:
        return [name for name in self.processes if not self.ready(name)]

    def readiness(self, name: str) -> str:
        """What ``name``'s ``/readyz`` answers now (status and body), or why nothing came."""
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(f"{self.stack.service_urls[name]}/readyz", timeout=2.0) as answer:
                return f"{answer.status} {answer.read(500).decode(errors='replace')}"
        except urllib.error.HTTPError as exc:
            return f"{exc.code} {exc.read(500).decode(errors='replace')}"
        except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as exc:
            return f"no answer ({exc!r})"

    def log_tail(self, name: str, lines: int = 40) -> str:
        return self.stack.log_tail(name, lines)

    def running(self, name: str) -> bool:
        return self.stack.process(name).is_running()

    # --- faults --------------------------------------------------------------------------

    def kill(self, name: str) -> None:
        """SIGKILL ``name`` (a process, ``"nats"``, ``"postgres"``); it stays down."""
        self.stack.set_auto_restart(name, False)
        self._caused.append((name, time.time(), None))
        self.stack.kill(name)

    def restart(self, name: str) -> None:
        """Start a killed process again (a service: not waiting until it serves)."""
        self.stack.restart(name, wait=False)
        self.stack.set_auto_restart(name, True)
        self._caused = [
            (n, since, time.time() if n == name and until is None else until)
            for n, since, until in self._caused
        ]

    def deaths(self) -> list[str]:
        """Exits of processes the suite did not kill (each as the watchdog reported it)."""
        return [
            f"{d.name}: {d.how} after {d.uptime_s:.0f} s"
            for d in self.stack.deaths
            if not any(
                d.name == name and since <= d.at <= (until or time.time()) + 5.0
                for name, since, until in self._caused
            )
        ]

    def pause(self, name: str) -> None:
        """SIGSTOP ``name``: a runner with every process under it (its jobs), or
        ``"postgres"`` (the postmaster and every backend), until ``resume``."""
        if name == "postgres":
            self.stack.pause(name)
            self._paused[name] = []  # so that stop() resumes it
            return
        pid = self.stack.process(name).pid
        assert pid is not None
        root = psutil.Process(pid)
        tree = [root, *root.children(recursive=True)]
        for proc in tree:
            with contextlib.suppress(psutil.Error):
                proc.send_signal(signal.SIGSTOP)
        self._paused[name] = tree

    def resume(self, name: str) -> None:
        if name == "postgres":
            self._paused.pop(name, None)
            self.stack.resume(name)
            return
        for proc in self._paused.pop(name, []):
            with contextlib.suppress(psutil.Error):
                proc.send_signal(signal.SIGCONT)

    def lose_jetstream(self) -> None:
        """Kill NATS, delete its JetStream store (streams, consumers, messages), start it."""
        self.kill("nats")
        deadline = time.monotonic() + 10
        while self.stack.nats.is_running() and time.monotonic() < deadline:
            time.sleep(0.05)
        shutil.rmtree(self.stack.nats.store_dir / "jetstream", ignore_errors=True)
        self.restart("nats")

    def cut(self, name: str) -> None:
        self.proxies[name].cut()

    def heal(self, name: str) -> None:
        self.proxies[name].heal()

    def wait_ready(self, timeout_s: float = 120.0) -> float:
        """Seconds until every process answers ``/readyz`` 200 (raises after ``timeout_s``)."""
        started = time.monotonic()
        while True:
            missing = self.not_ready()
            if not missing:
                return time.monotonic() - started
            if time.monotonic() - started > timeout_s:
                raise NotReadyError(timeout_s, {name: self.readiness(name) for name in missing})
            time.sleep(0.25)

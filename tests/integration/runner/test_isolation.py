"""A hostile job of team B against team A's data, the runner and the database.

Team A's job commits a checkpoint. Team B's job then tries, from inside its sandbox, what
a tenant who read the platform's source would try: read, list and overwrite A's objects in
the store's folder, read the runner's environment through ``/proc``, find credentials in
its own environment, reach PostgreSQL's socket, peek into other sandboxes, and make the
runner upload A's checkpoint into B's prefix (a staged link to A's object) or publish a
checkpoint under A's URI. Every attempt must fail and A's data must be unchanged.
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import json
import os
import socket
import subprocess
import textwrap
import time
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

from tests.integration.runner.conftest import (
    EventLog,
    StartRunner,
    grant,
    launched,
    publish,
    upload_bundle,
)
from trainyard_platform.deploy.local.postgres import PostgresServer
from trainyard_platform.services.runner.config import Settings
from trainyard_platform.services.runner.launch import sandbox_name
from trainyard_platform.services.runner.supervisor import MAX_CONTROL_CONNECTIONS
from trainyard_platform.shared.bus import Bus
from trainyard_platform.shared.events.payloads import (
    AllocationRevoked,
    CheckpointSaved,
    JobFailed,
    JobMetrics,
    JobSucceeded,
)
from trainyard_platform.shared.storage import open_store

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        not hasattr(os, "geteuid") or os.geteuid() != 0,
        reason="jobs run as users of their own only under a runner started as root",
    ),
]

HOSTILE_JOB = textwrap.dedent(
    '''
    """Team B's job: tries everything, reports what worked."""
    import hashlib, json, os, socket, sys
    from urllib.parse import unquote, urlparse

    victim_object, victim_uri, pg_socket, sandboxes = sys.argv[1:5]
    objects = victim_object.split("/jobs/")[0]
    report = {}

    def attempt(name, action):
        try:
            action()
            report[name] = "ALLOWED"
        except Exception as exc:
            report[name] = f"denied ({type(exc).__name__})"

    def overwrite():
        with open(victim_object, "wb") as f:
            f.write(b"zeroed")

    def connect_database():
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(pg_socket)

    attempt("read victim checkpoint", lambda: open(victim_object, "rb").read())
    attempt("list the object store", lambda: os.listdir(objects))
    attempt("overwrite victim checkpoint", overwrite)
    attempt("read runner environ", lambda: open(f"/proc/{os.getppid()}/environ", "rb").read())
    attempt("connect to the database", connect_database)
    attempt("list other sandboxes", lambda: os.listdir(sandboxes))

    def leave_cgroup(point):
        with open(os.path.join(point, "cgroup.procs"), "w") as f:  # the hierarchy's root
            f.write(str(os.getpid()))

    for line in open("/proc/self/mountinfo"):  # out of its attempt's cgroup, its limits
        mine, _, theirs = line.partition(" - ")
        if theirs.split()[:1] in (["cgroup"], ["cgroup2"]):
            point = mine.split()[4]
            attempt(f"leave its cgroup ({point})", lambda: leave_cgroup(point))
    report["platform variables"] = sorted(
        k for k in os.environ
        if k.startswith(("TRAINYARD_STORAGE", "TRAINYARD_NATS", "TRAINYARD_DATABASE", "AWS_"))
    )

    control = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    control.connect(os.environ["TRAINYARD_CONTROL_SOCKET"])
    staging = unquote(urlparse(os.environ["TRAINYARD_CHECKPOINT_URI"]).path)
    # Swap the staging folder for a link elsewhere, so the runner (root) reads through it.
    attempt("replace the staging folder", lambda: os.rename(staging, staging + ".old"))
    attempt("replace the control socket", lambda: os.unlink(os.environ["TRAINYARD_CONTROL_SOCKET"]))

    def stage(step, data=None, link=None):
        folder = os.path.join(staging, f"step-{step:08d}")
        os.makedirs(folder)
        target = os.path.join(folder, "checkpoint.pt")
        if link:
            os.symlink(link, target)
            data = b"zeroed"
        else:
            with open(target, "wb") as f:
                f.write(data)
        digest = hashlib.sha256(data).hexdigest()
        with open(os.path.join(folder, "manifest.json"), "w") as f:
            json.dump({"step": step, "object": f"step-{step:08d}/checkpoint.pt",
                       "size_bytes": len(data), "sha256": digest}, f)
        ref = {"uri": victim_uri, "manifest_uri": victim_uri, "step": step,
               "size_bytes": len(data), "sha256": digest}
        control.sendall((json.dumps({"kind": "checkpoint", "checkpoint": ref}) + "\\n").encode())

    stage(1, link=victim_object)        # "upload A's checkpoint for me"
    stage(2, data=b"mine, at A's URI")  # "publish this under A's URI"
    print("REPORT " + json.dumps(report), flush=True)
    '''
)


async def test_a_job_of_team_b_touches_nothing_of_team_a(
    settings: Settings,
    start_runner: StartRunner,
    bus: Bus,
    events: EventLog,
    launches: Path,
    tmp_path: Path,
    postgres_server: PostgresServer,
) -> None:
    await start_runner(settings)
    store = open_store(settings.storage.uri)

    victim = grant(settings.node_id, ["succeed", str(launches)])
    await publish(bus, victim, settings.node_id)
    done = await events.first(JobSucceeded, victim.job_id)
    assert done.artifact is not None
    victim_bytes = store.get_bytes(done.artifact.uri.removeprefix(store.root_uri + "/"))

    hostile_code = tmp_path / "hostile"
    hostile_code.mkdir()
    (hostile_code / "attack.py").write_text(HOSTILE_JOB)
    code = upload_bundle(store, "team-b", hostile_code)
    pg_socket = Path(unquote(urlparse(postgres_server.dsn).query.split("host=")[1]))
    attacker = grant(
        settings.node_id,
        [
            unquote(urlparse(done.artifact.uri).path),
            done.artifact.uri,
            str(pg_socket / ".s.PGSQL.5432"),
            str(settings.sandboxes_dir),
        ],
        entrypoint="attack.py",
        code=code,
    )
    attacker = attacker.model_copy(
        update={"spec": attacker.spec.model_copy(update={"team": "team-b", "user": "mallory"})}
    )
    await publish(bus, attacker, settings.node_id)
    await events.first(JobSucceeded, attacker.job_id)

    stream = f"logs/{attacker.job_id}/a0001-{settings.node_id}"
    output = b"".join(
        store.get_bytes(k) for k in store.list(f"{stream}/") if k.endswith(".log")
    ).decode()
    [line] = [x for x in output.splitlines() if x.startswith("REPORT ")]
    report = json.loads(line.removeprefix("REPORT "))
    allowed = [name for name, result in report.items() if result == "ALLOWED"]
    assert allowed == [], f"the hostile job could: {allowed} ({report})"
    assert report["platform variables"] == []

    # The runner refused the link, and put the other checkpoint in B's own prefix only.
    saved = events.of(CheckpointSaved, attacker.job_id)
    assert [s.checkpoint.step for s in saved] == [2]
    assert saved[0].checkpoint.uri.startswith(store.uri_for(f"jobs/{attacker.job_id}") + "/")
    assert store.get_bytes(done.artifact.uri.removeprefix(store.root_uri + "/")) == victim_bytes
    assert not store.list(f"jobs/{attacker.job_id}/checkpoints/step-00000001")
    assert launched(launches) == [victim.allocation_id]


# Modules a bundle may put beside its entrypoint under the names of standard modules: the
# job's own ``python script.py`` imports them (its folder comes first on its path), which
# is its business; nothing the runner itself runs may import them.
SHADOWING_MODULE = textwrap.dedent(
    """
    import os, sys
    _folder = sys.argv[-1] if len(sys.argv) > 1 else ""
    _marker = os.path.join(os.environ.get("TRAINYARD_TEST_MARKERS", "/nonexistent"),
                           f"{os.getpid()}-uid{os.getuid()}")
    try:
        with open(_marker, "w") as _f:
            _f.write(" ".join(sorted(os.environ)))
    except OSError:
        pass
    """
)


async def test_the_runner_imports_nothing_of_a_jobs_code(
    settings: Settings,
    start_runner: StartRunner,
    bus: Bus,
    events: EventLog,
    launches: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A bundle holding ``json.py``, ``platform.py``, ``re.py``...: whatever the runner runs
    to prepare the job (probes of its interpreter, its environment) never imports them, so
    no code of a tenant runs as the runner's user or sees the runner's environment."""
    monkeypatch.setenv("TRAINYARD_TEST_MARKERS", str(launches))
    monkeypatch.setenv("TRAINYARD_STORAGE_SECRET_KEY", "not-for-jobs")
    await start_runner(settings)
    store = open_store(settings.storage.uri)
    code_folder = tmp_path / "shadowing"
    code_folder.mkdir()
    for name in ("json", "platform", "re", "pathlib", "importlib", "email", "zipfile", "csv"):
        (code_folder / f"{name}.py").write_text(SHADOWING_MODULE)
    (code_folder / "main.py").write_text("print('ran')\n")
    code = upload_bundle(store, "team-b", code_folder)
    job = grant(settings.node_id, [], entrypoint="main.py", code=code)
    job = job.model_copy(
        update={"spec": job.spec.model_copy(update={"team": "team-b", "user": "mallory"})}
    )
    await publish(bus, job, settings.node_id)
    await events.wait_for(
        lambda: events.of(JobSucceeded, job.job_id) or events.of(JobFailed, job.job_id),
        what="the job's end",
    )
    as_runner = [n for n in os.listdir(launches) if n.endswith(f"-uid{os.geteuid()}")]
    assert as_runner == [], f"a tenant's module ran as the runner: {as_runner}"


LEAVING_JOB = textwrap.dedent(
    """
    import os, sys
    tag = sys.argv[1]
    for folder in ("/tmp", "/var/tmp", "/dev/shm"):
        if os.path.isdir(folder):
            with open(os.path.join(folder, tag), "w") as f:
                f.write("team A's secret")
            os.mkdir(os.path.join(folder, tag + ".d"))
            with open(os.path.join(folder, tag + ".d", "inside"), "w") as f:
                f.write("team A's secret")
    print("left", flush=True)
    """
)


async def test_what_a_job_left_in_shared_temp_folders_goes_with_it(
    settings: Settings,
    start_runner: StartRunner,
    bus: Bus,
    events: EventLog,
    tmp_path: Path,
) -> None:
    """Jobs of different teams run as the same uid, one after the other (a uid per slot): a
    file a job leaves where every user may write (``/tmp``, ``/var/tmp``, ``/dev/shm``) would
    be the next job's to read. It is removed when the job ends."""
    await start_runner(settings)
    store = open_store(settings.storage.uri)
    code_folder = tmp_path / "leaving"
    code_folder.mkdir()
    (code_folder / "leave.py").write_text(LEAVING_JOB)
    code = upload_bundle(store, "team-a", code_folder)
    tag = f"trainyard-test-{os.urandom(6).hex()}"
    job = grant(settings.node_id, [tag], entrypoint="leave.py", code=code)
    await publish(bus, job, settings.node_id)
    await events.first(JobSucceeded, job.job_id)
    assert _left_by(tag) == [], f"the job's files outlived it: {_left_by(tag)}"


EVERYWHERE_JOB = textwrap.dedent(
    """
    import os, stat, sys
    tag, wrote = sys.argv[1], []
    pending = [("/", 3)]
    while pending:
        folder, left = pending.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            if entry.path in ("/proc", "/sys") or not entry.is_dir(follow_symlinks=False):
                continue
            if entry.stat(follow_symlinks=False).st_mode & stat.S_IWOTH:
                try:
                    with open(os.path.join(entry.path, tag), "w") as f:
                        f.write("team A's secret")
                    wrote.append(os.path.join(entry.path, tag))
                except OSError:
                    pass
            elif left > 1:
                pending.append((entry.path, left - 1))
    print("WROTE", *wrote, flush=True)
    """
)


async def test_what_a_job_left_in_any_folder_everyone_may_write_to_goes_with_it(
    settings: Settings,
    start_runner: StartRunner,
    bus: Bus,
    events: EventLog,
    tmp_path: Path,
) -> None:
    """Hosts have more folders every user may write to than ``/tmp``, ``/var/tmp`` and
    ``/dev/shm`` (``/run/lock``, ``/var/crash``, ...): what a job leaves in any of them goes
    with it too."""
    await start_runner(settings)
    store = open_store(settings.storage.uri)
    code_folder = tmp_path / "everywhere"
    code_folder.mkdir()
    (code_folder / "everywhere.py").write_text(EVERYWHERE_JOB)
    code = upload_bundle(store, "team-a", code_folder)
    tag = f"trainyard-test-{os.urandom(6).hex()}"
    job = grant(settings.node_id, [tag], entrypoint="everywhere.py", code=code)
    await publish(bus, job, settings.node_id)
    await events.first(JobSucceeded, job.job_id)
    stream = f"logs/{job.job_id}/a0001-{settings.node_id}"
    output = b"".join(
        store.get_bytes(k) for k in store.list(f"{stream}/") if k.endswith(".log")
    ).decode()
    [wrote] = [line.split()[1:] for line in output.splitlines() if line.startswith("WROTE")]
    assert wrote, output
    left = _remove_remaining(wrote)
    assert left == [], f"the job's files outlived it: {left}"


def _remove_remaining(paths: list[str]) -> list[str]:
    """Which of ``paths`` still exist (removed now, so a failure leaves nothing behind)."""
    left = [path for path in paths if os.path.lexists(path)]
    for path in left:
        os.unlink(path)
    return left


def _left_by(tag: str) -> list[str]:
    return [
        str(path)
        for folder in ("/tmp", "/var/tmp", "/dev/shm")
        for path in (Path(folder) / tag, Path(folder) / f"{tag}.d")
        if os.path.lexists(path)
    ]


PRIVATE_FILES_JOB = textwrap.dedent(
    """
    import os, stat, sys
    path = os.path.join("/dev/shm" if os.path.isdir("/dev/shm") else "/tmp", sys.argv[1])
    with open(path, "w") as f:
        f.write("team A's batch")
    print("MODE", oct(stat.S_IMODE(os.stat(path).st_mode)), flush=True)
    """
)


async def test_files_a_job_makes_are_its_own_to_read(
    settings: Settings,
    start_runner: StartRunner,
    bus: Bus,
    events: EventLog,
    tmp_path: Path,
) -> None:
    """Jobs of other teams run beside it as other uids: a file a job writes where every user
    may read (``/dev/shm``, where data loaders and NCCL put theirs; ``/tmp``) is created
    readable by its own uid only (umask 077)."""
    await start_runner(settings)
    store = open_store(settings.storage.uri)
    code_folder = tmp_path / "private"
    code_folder.mkdir()
    (code_folder / "write.py").write_text(PRIVATE_FILES_JOB)
    code = upload_bundle(store, "team-a", code_folder)
    job = grant(
        settings.node_id,
        [f"trainyard-test-{os.urandom(6).hex()}"],
        entrypoint="write.py",
        code=code,
    )
    await publish(bus, job, settings.node_id)
    await events.first(JobSucceeded, job.job_id)
    stream = f"logs/{job.job_id}/a0001-{settings.node_id}"
    output = b"".join(
        store.get_bytes(k) for k in store.list(f"{stream}/") if k.endswith(".log")
    ).decode()
    assert "MODE 0o600" in output, output


SOCKET_KNOCKER = textwrap.dedent(
    """
    import json, socket, sys
    try:
        control = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        control.connect(sys.argv[1])
        line = {"kind": "metrics", "step": 4242, "metrics": {"loss": -1.0}}
        control.sendall((json.dumps(line) + "\\n").encode())
        control.close()
        print("KNOCK ALLOWED", flush=True)
    except OSError as exc:
        print("KNOCK denied", type(exc).__name__, flush=True)
    """
)


async def test_no_job_reaches_another_jobs_control_socket(
    settings: Settings,
    start_runner: StartRunner,
    bus: Bus,
    events: EventLog,
    launches: Path,
    tmp_path: Path,
) -> None:
    """A job's control socket is its own uid's alone, whatever the runner's umask: another
    job that finds its path (the sandbox root may be passed through) cannot report metrics
    or checkpoints in its name."""
    old = os.umask(0)  # a runner started with a lax umask
    try:
        await start_runner(settings)
        victim = grant(settings.node_id, ["wait", str(launches)], gpu_indices=[0])
        await publish(bus, victim, settings.node_id)
        await events.wait_for(lambda: events.of(JobMetrics, settings.node_id), what="metrics")
    finally:
        os.umask(old)
    victim_socket = settings.sandboxes_dir / sandbox_name(victim.allocation_id) / "control.sock"
    store = open_store(settings.storage.uri)
    code_folder = tmp_path / "knocker"
    code_folder.mkdir()
    (code_folder / "knock.py").write_text(SOCKET_KNOCKER)
    code = upload_bundle(store, "team-b", code_folder)
    attacker = grant(settings.node_id, [str(victim_socket)], entrypoint="knock.py", code=code)
    attacker = attacker.model_copy(
        update={"spec": attacker.spec.model_copy(update={"team": "team-b", "user": "mallory"})}
    )
    await publish(bus, attacker, settings.node_id)
    await events.first(JobSucceeded, attacker.job_id)
    await publish(
        bus,
        AllocationRevoked(
            allocation_id=victim.allocation_id,
            job_id=victim.job_id,
            node_id=settings.node_id,
            epoch=victim.epoch,
            reason="cancelled",
            grace_seconds=5,
        ),
        settings.node_id,
    )
    await events.wait_for(
        lambda: [
            e
            for e in events.events
            if e.envelope.subject == victim.job_id
            and e.envelope.type.endswith(
                ("preempted.v1", "cancelled.v1", "failed.v1", "succeeded.v1")
            )
        ],
        what="the victim's end",
    )
    stream = f"logs/{attacker.job_id}/a0001-{settings.node_id}"
    output = b"".join(
        store.get_bytes(k) for k in store.list(f"{stream}/") if k.endswith(".log")
    ).decode()
    assert "KNOCK denied" in output, output
    steps = [
        p.step
        for m in events.of(JobMetrics, settings.node_id)
        for p in m.points
        if m.job_id == victim.job_id
    ]
    assert 4242 not in steps


IPC_JOB = textwrap.dedent(
    """
    import ctypes, sys
    libc = ctypes.CDLL(None, use_errno=True)
    key, IPC_CREAT = int(sys.argv[1]), 0o1000
    ids = (
        libc.shmget(key, 1 << 20, IPC_CREAT | 0o600),
        libc.semget(key, 1, IPC_CREAT | 0o600),
        libc.msgget(key, IPC_CREAT | 0o600),
    )
    print("IPC", *ids, flush=True)
    """
)


async def test_system_v_ipc_a_job_made_goes_with_it(
    settings: Settings,
    start_runner: StartRunner,
    bus: Bus,
    events: EventLog,
    tmp_path: Path,
) -> None:
    """A System V shared memory segment (or semaphore set, or message queue) outlives the
    process that made it: it would keep its memory after the job, and the next job of the
    same uid (another team's) could attach it. It is removed when the job ends."""
    await start_runner(settings)
    store = open_store(settings.storage.uri)
    code_folder = tmp_path / "ipc"
    code_folder.mkdir()
    (code_folder / "ipc.py").write_text(IPC_JOB)
    code = upload_bundle(store, "team-a", code_folder)
    key = int.from_bytes(os.urandom(3), "big") + 1
    job = grant(settings.node_id, [str(key)], entrypoint="ipc.py", code=code)
    await publish(bus, job, settings.node_id)
    await events.first(JobSucceeded, job.job_id)
    stream = f"logs/{job.job_id}/a0001-{settings.node_id}"
    output = b"".join(
        store.get_bytes(k) for k in store.list(f"{stream}/") if k.endswith(".log")
    ).decode()
    [made] = [line.split()[1:] for line in output.splitlines() if line.startswith("IPC ")]
    assert all(int(ident) >= 0 for ident in made), output
    assert _ipc_with_key(key) == [], "the job's System V IPC objects outlived it"


HOARD_JOB = textwrap.dedent(
    """
    import os, select, socket, sys, time
    wanted = int(sys.argv[1])
    held = []
    for _ in range(wanted):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(os.environ["TRAINYARD_CONTROL_SOCKET"])
        held.append(sock)
    # A connection the runner closed reads as end of file; wait (a while) for it to close
    # all it means to close.
    closed = set()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and len(closed) < wanted - 64:
        ready, _, _ = select.select([s for s in held if s not in closed], [], [], 0.5)
        closed.update(s for s in ready if s.recv(1) == b"")
    print("CLOSED", len(closed), flush=True)
    """
)


async def test_a_job_cannot_hold_the_runners_descriptors_with_control_connections(
    settings: Settings,
    start_runner: StartRunner,
    bus: Bus,
    events: EventLog,
    tmp_path: Path,
) -> None:
    """Each control connection costs the runner a descriptor and a line buffer: a job that
    opens hundreds keeps only ``MAX_CONTROL_CONNECTIONS`` of them; the rest are closed."""
    await start_runner(settings)
    store = open_store(settings.storage.uri)
    code_folder = tmp_path / "hoard"
    code_folder.mkdir()
    (code_folder / "hoard.py").write_text(HOARD_JOB)
    code = upload_bundle(store, "team-a", code_folder)
    job = grant(settings.node_id, ["300"], entrypoint="hoard.py", code=code)
    await publish(bus, job, settings.node_id)
    await events.first(JobSucceeded, job.job_id, timeout=60)
    stream = f"logs/{job.job_id}/a0001-{settings.node_id}"
    output = b"".join(
        store.get_bytes(k) for k in store.list(f"{stream}/") if k.endswith(".log")
    ).decode()
    [closed] = [int(line.split()[1]) for line in output.splitlines() if line.startswith("CLOSED")]
    assert closed >= 300 - MAX_CONTROL_CONNECTIONS, output


KEYRING_JOB = textwrap.dedent(
    """
    import ctypes, sys
    libc = ctypes.CDLL(None, use_errno=True)
    ADD_KEY, REQUEST_KEY, KEYCTL, KEYCTL_READ, USER_KEYRING = 248, 249, 250, 11, -4
    if sys.argv[1] == "add":
        made = libc.syscall(ADD_KEY, b"user", b"team-a-secret", b"s3cr3t", 6, USER_KEYRING)
        print("ADDED", made, flush=True)
    else:
        found = libc.syscall(REQUEST_KEY, b"user", b"team-a-secret", None, 0)
        text = ctypes.create_string_buffer(64)
        size = libc.syscall(KEYCTL, KEYCTL_READ, found, text, 64) if found > 0 else -1
        print("FOUND", text.raw[: max(size, 0)].decode() or "nothing", flush=True)
    """
)


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the job uses x86-64 syscall numbers")
async def test_a_key_a_job_left_in_its_users_keyring_goes_with_it(
    settings: Settings,
    start_runner: StartRunner,
    bus: Bus,
    events: EventLog,
    tmp_path: Path,
) -> None:
    """The kernel keeps a uid's user keyring beyond its processes: a key one job adds to
    it would be read by the next job of its slot (another team's). It is cleared."""
    await start_runner(settings)
    store = open_store(settings.storage.uri)
    code_folder = tmp_path / "keys"
    code_folder.mkdir()
    (code_folder / "keys.py").write_text(KEYRING_JOB)
    code = upload_bundle(store, "team-a", code_folder)

    async def run(arg: str) -> str:
        job = grant(settings.node_id, [arg], entrypoint="keys.py", code=code)
        await publish(bus, job, settings.node_id)
        await events.first(JobSucceeded, job.job_id)
        stream = f"logs/{job.job_id}/a0001-{settings.node_id}"
        return b"".join(
            store.get_bytes(k) for k in store.list(f"{stream}/") if k.endswith(".log")
        ).decode()

    added = await run("add")
    assert "ADDED" in added and "ADDED -1" not in added, added
    found = await run("find")  # the same slot, so the same uid
    assert "FOUND nothing" in found, found


FORKING_JOB = textwrap.dedent(
    """
    import os, signal, sys, time
    children, refused = [], 0
    for _ in range(int(sys.argv[1])):
        try:
            pid = os.fork()
        except BlockingIOError:
            refused += 1
            continue
        if pid == 0:
            time.sleep(60)
            os._exit(0)
        children.append(pid)
    print("FORKED", len(children), "REFUSED", refused, flush=True)
    for pid in children:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    """
)


async def test_a_fork_bomb_spends_the_jobs_own_process_budget(
    settings: Settings,
    start_runner: StartRunner,
    bus: Bus,
    events: EventLog,
    tmp_path: Path,
) -> None:
    """A job's user may have ``job_max_processes`` processes at once: a job forking without
    end is refused past it, and the host's process table (the runner's, every job's) is
    left alone."""
    settings = settings.model_copy(update={"job_max_processes": 40})
    await start_runner(settings)
    store = open_store(settings.storage.uri)
    code_folder = tmp_path / "forking"
    code_folder.mkdir()
    (code_folder / "fork.py").write_text(FORKING_JOB)
    code = upload_bundle(store, "team-a", code_folder)
    job = grant(settings.node_id, ["100"], entrypoint="fork.py", code=code)
    await publish(bus, job, settings.node_id)
    await events.first(JobSucceeded, job.job_id)
    stream = f"logs/{job.job_id}/a0001-{settings.node_id}"
    output = b"".join(
        store.get_bytes(k) for k in store.list(f"{stream}/") if k.endswith(".log")
    ).decode()
    [line] = [line.split() for line in output.splitlines() if line.startswith("FORKED")]
    forked, refused = int(line[1]), int(line[3])
    assert forked < 40 and refused > 60, output


MQUEUE_JOB = textwrap.dedent(
    """
    import ctypes, os, sys
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mq_open.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
    fd = libc.mq_open(sys.argv[1].encode(), os.O_CREAT | os.O_RDWR, 0o600, None)
    print("MQ", fd, ctypes.get_errno(), flush=True)
    """
)


async def test_posix_message_queues_a_job_made_go_with_it(
    settings: Settings,
    start_runner: StartRunner,
    bus: Bus,
    events: EventLog,
    tmp_path: Path,
) -> None:
    """A POSIX message queue outlives the process that made it, with its messages: the next
    job of the same uid (another team's) could open it. It is removed when the job ends."""
    await start_runner(settings)
    store = open_store(settings.storage.uri)
    code_folder = tmp_path / "mqueue"
    code_folder.mkdir()
    (code_folder / "mq.py").write_text(MQUEUE_JOB)
    code = upload_bundle(store, "team-a", code_folder)
    name = f"/trainyard-test-{os.urandom(6).hex()}"
    job = grant(settings.node_id, [name], entrypoint="mq.py", code=code)
    await publish(bus, job, settings.node_id)
    await events.first(JobSucceeded, job.job_id)
    stream = f"logs/{job.job_id}/a0001-{settings.node_id}"
    output = b"".join(
        store.get_bytes(k) for k in store.list(f"{stream}/") if k.endswith(".log")
    ).decode()
    [made] = [line.split()[1:] for line in output.splitlines() if line.startswith("MQ ")]
    assert int(made[0]) >= 0, output
    try:
        assert not _mqueue_exists(name), "the job's POSIX message queue outlived it"
    finally:
        ctypes.CDLL(None).mq_unlink(name.encode())


def _mqueue_exists(name: str) -> bool:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mq_open.argtypes = [ctypes.c_char_p, ctypes.c_int]
    fd = libc.mq_open(name.encode(), os.O_RDONLY)
    if fd < 0:
        assert ctypes.get_errno() == errno.ENOENT
        return False
    os.close(fd)
    return True


def _ipc_with_key(key: int) -> list[str]:
    found = []
    for kind in ("shm", "sem", "msg"):
        for line in Path(f"/proc/sysvipc/{kind}").read_text().splitlines()[1:]:
            if int(line.split()[0]) == key:
                found.append(f"{kind}: {line.split()[1]}")
    return found


async def test_a_setuid_program_the_job_left_dies_with_it(
    settings: Settings,
    start_runner: StartRunner,
    bus: Bus,
    events: EventLog,
    reachable_tmp: Path,
    tmp_path: Path,
) -> None:
    """A program the job runs that is setuid root has the job's real uid but root's
    effective one (and its /proc entry is root's): it is the job's all the same, and dies
    with it even when it left the job's session."""
    setuid_sleep, launches = _setuid_sleep(reachable_tmp)
    await start_runner(settings)
    store = open_store(settings.storage.uri)
    code_folder = tmp_path / "setuid"
    code_folder.mkdir()
    (code_folder / "leave.py").write_text(
        "import subprocess, sys\n"
        "child = subprocess.Popen([sys.argv[1], '600'], start_new_session=True)\n"
        "open(sys.argv[2] + '/pid', 'w').write(str(child.pid))\n"
    )
    code = upload_bundle(store, "team-a", code_folder)
    job = grant(
        settings.node_id, [str(setuid_sleep), str(launches)], entrypoint="leave.py", code=code
    )
    await publish(bus, job, settings.node_id)
    await events.first(JobSucceeded, job.job_id)
    pid = int((launches / "pid").read_text())
    alive = _alive(pid)
    if alive:
        os.kill(pid, 9)
    assert not alive, "the job's setuid program outlived it"


def _setuid_sleep(folder: Path) -> tuple[Path, Path]:
    """A copy of ``sleep`` that is setuid root, and a folder the job may write to."""
    setuid_sleep = folder / "sleep"
    setuid_sleep.write_bytes(Path("/bin/sleep").read_bytes())
    setuid_sleep.chmod(0o4755)
    launches = folder / "pids"
    launches.mkdir(mode=0o777)
    launches.chmod(0o777)
    return setuid_sleep, launches


def _alive(pid: int) -> bool:
    try:
        return "zombie" not in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False


HOPPING_JOB = textwrap.dedent(
    """
    import os, signal, subprocess, sys, time
    beat = sys.argv[1]
    hop = (
        "import os, signal, sys, time\\n"
        "signal.signal(15, signal.SIG_IGN)\\n"
        "while True:\\n"
        "    if os.fork():\\n"
        "        os._exit(0)\\n"
        "    with open(sys.argv[1], 'w') as f:\\n"
        "        f.write(str(os.getpid()))\\n"
        "    time.sleep(0.001)\\n"
    )
    subprocess.Popen([sys.executable, "-c", hop, beat], start_new_session=True)
    time.sleep(0.5)
    """
)


async def test_a_process_that_keeps_changing_its_pid_dies_with_the_job(
    settings: Settings,
    start_runner: StartRunner,
    bus: Bus,
    events: EventLog,
    reachable_tmp: Path,
    tmp_path: Path,
) -> None:
    """A process that forks and lets its parent exit, again and again, is never at the pid
    a kill by listed pids finds (it was seen running 40 minutes after its job): every
    process of the job's uid is killed at once, so it dies with its job too."""
    beats = reachable_tmp / "beats"
    beats.mkdir(mode=0o777)
    beats.chmod(0o777)
    beat = beats / "beat"
    await start_runner(settings)
    store = open_store(settings.storage.uri)
    code_folder = tmp_path / "hopping"
    code_folder.mkdir()
    (code_folder / "hop.py").write_text(HOPPING_JOB)
    code = upload_bundle(store, "team-a", code_folder)
    job = grant(settings.node_id, [str(beat)], entrypoint="hop.py", code=code)
    await publish(bus, job, settings.node_id)
    await events.first(JobSucceeded, job.job_id)
    uid = int(beat.stat().st_uid)
    still_beating = await asyncio.to_thread(_beating, beat, 2.0, uid)
    assert not still_beating, "a process of the job kept running after it"


def _beating(beat: Path, over_s: float, uid: int) -> bool:
    """Whether ``beat`` is still being written ``over_s`` from now (then every process of
    ``uid`` is killed: it must not go on running on the machine)."""
    before = beat.stat().st_mtime_ns
    time.sleep(over_s)
    beating = beat.stat().st_mtime_ns != before
    if beating:
        subprocess.run(["/bin/kill", "-9", "-1"], user=uid, group=uid, extra_groups=[], check=False)
    return beating


PORT_PROBE = textwrap.dedent(
    """
    import socket, sys
    report = {}
    for name, port in (("host listener", int(sys.argv[1])), ("nats", int(sys.argv[2]))):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
            report[name] = "REACHED"
        except OSError as exc:
            report[name] = f"refused ({exc.errno})"
    own = socket.socket()  # what torchrun's store and gloo do between a job's ranks
    own.bind(("127.0.0.1", 0))
    own.listen()
    socket.create_connection(own.getsockname(), timeout=5).close()
    report["own loopback"] = "REACHED"
    print("PORTS " + " | ".join(f"{k}: {v}" for k, v in sorted(report.items())), flush=True)
    """
)


@pytest.mark.parametrize("network", ["loopback", "host"])
async def test_a_job_on_one_node_reaches_no_port_of_the_host(
    settings: Settings,
    start_runner: StartRunner,
    bus: Bus,
    events: EventLog,
    tmp_path: Path,
    network: str,
) -> None:
    """In a network of its own (``job_network`` ``loopback``, the default) a job reaches
    neither a port the host listens on at 127.0.0.1 nor NATS, yet its own processes still
    reach each other on its loopback; with ``host`` it shares the host's network (so this
    test tells the two apart)."""
    settings = settings.model_copy(update={"job_network": network})
    await start_runner(settings)
    store = open_store(settings.storage.uri)
    listener = socket.create_server(("127.0.0.1", 0))
    try:
        code_folder = tmp_path / "prober"
        code_folder.mkdir()
        (code_folder / "probe.py").write_text(PORT_PROBE)
        code = upload_bundle(store, "team-a", code_folder)
        nats_port = str(urlparse(settings.nats.url).port)
        prober = grant(
            settings.node_id,
            [str(listener.getsockname()[1]), nats_port],
            entrypoint="probe.py",
            code=code,
        )
        await publish(bus, prober, settings.node_id)
        await events.first(JobSucceeded, prober.job_id)
    finally:
        listener.close()
    stream = f"logs/{prober.job_id}/a0001-{settings.node_id}"
    output = b"".join(
        store.get_bytes(k) for k in store.list(f"{stream}/") if k.endswith(".log")
    ).decode()
    [line] = [x for x in output.splitlines() if x.startswith("PORTS ")]
    reached = "host listener: REACHED" in line, "nats: REACHED" in line
    assert reached == ((False, False) if network == "loopback" else (True, True)), line
    assert "own loopback: REACHED" in line

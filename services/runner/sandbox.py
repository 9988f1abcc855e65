"""A job's sandbox: its own folder, its own unprivileged user, its code, and nothing else.

Layout of ``<sandboxes>/<allocation>/`` (the runner's, mode 0711; each folder in it 0700 and
the job user's, so the job can neither list another sandbox nor swap its own
``checkpoints/`` for a link to somewhere else)::

    code/          the job's code: the verified bundle, unpacked (the working directory)
    home/          HOME
    tmp/           TMPDIR
    checkpoints/   staging: the job commits checkpoints here, the runner uploads them;
                   before start it holds the verified checkpoint to resume from
    control.sock   the runner's control socket (made by the supervisor: 0600, the job's,
                   bound elsewhere and moved here, so no other uid ever connects)

Users. A runner started as root runs each job as an unprivileged uid of its own range,
``uid_base + slot``, where the slot is free among this node's running jobs: jobs never share
a uid with the runner or with each other, so ``/proc/<runner>/environ``, other sandboxes and
the runner's files are closed to them. The uids need no passwd entry. A runner that is not
root cannot switch users: jobs then run as the runner's user (a warning at start says so),
with the same clean environment and the runner made non-dumpable (``/proc/<pid>/environ``
unreadable to same-uid processes).

Code. A bundle is fetched from ``bundles/<team>/<sha256>.tar.gz`` of the job's own team, its
sha256 verified before anything is unpacked, checked by the same rule as at upload
(``shared.bundle_archive.check_bundle``: no absolute paths, no ``..``, no links leaving the
bundle, no devices, no name a file system cannot hold, bounded size), and unpacked with the
``data`` filter too. What the node's file system still refuses of its names (a path too long
with the node's folder before it, an encoding it does not take: ``BUNDLE_ERRNOS``) fails the
job as its own error naming the entry; the node's disk failing (full, read-only, I/O
errors) is the node's. A git source is fetched, only by https or git (never ssh: a job has
no keys) and only from a public address unless the operator allows the network
(``git_remote``), and the named commit checked out and verified. A bundle the object store
cannot serve now (unreachable, not answering: ``bus.infrastructure_fault``) is no fault of the
job: that error is raised as it is, and the runner lets the grant come again instead of
failing it.

Blocking: call through ``asyncio.to_thread``.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import logging
import os
import pwd
import re
import resource
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from trainyard_platform.services.runner import as_uid, orphans
from trainyard_platform.services.runner.cgroups import JobCgroup
from trainyard_platform.services.runner.checkpoints import file_sha256
from trainyard_platform.services.runner.deadline import cap_timeout, platform_time
from trainyard_platform.services.runner.git_faults import (
    COMMIT,
    REPOSITORY,
    git_fault,
    git_not_run,
)
from trainyard_platform.services.runner.git_remote import (
    GIT_PATH,
    PUBLIC_ONLY,
    FetchPlan,
    HostNotFound,
    HostUnresolved,
    PrivateAllowed,
    RemoteRefused,
    fetch_plan,
    installed_git,
    unpinned_git,
)
from trainyard_platform.services.runner.netns import enter_own_network
from trainyard_platform.services.runner.node_faults import NODE_ERRNOS, node_fault
from trainyard_platform.shared.bundle_archive import (
    MAX_BUNDLE_MEMBERS,
    MAX_UNPACKED_BYTES,
    NAME_MAX,
    PATH_MAX,
    BundleRefused,
    check_bundle,
    shown,
)
from trainyard_platform.shared.bus import infrastructure_fault
from trainyard_platform.shared.events.payloads import CodeBundle, CodeGit, FailureKind, JobSpec
from trainyard_platform.shared.runtime import StartupRefused
from trainyard_platform.shared.storage import ObjectNotFound, ObjectStore, ObjectTooLarge

log = logging.getLogger(__name__)


class PlatformError(RuntimeError):
    """The job could not be started through no fault of its running code (code not
    fetched or verified, environment not built, process not spawned): it fails as
    ``platform_error``, which the scheduler retries (on a budget apart from the job's
    ``max_restarts``), unless it is a ``JobInputError``. A plain one is never held against
    the node (``counts_against_node``): it follows what the job asked for (its git host, its
    command, its requirements), which a tenant chooses; only a ``NodeFault`` is."""


class NodeFault(PlatformError):
    """The job could not be started because this node itself failed, whatever the job
    asked for: its GPUs, its disk, its interpreter or runtime, its cgroups, its own
    credentials to the object store. A ``platform_error`` that counts towards the node's
    automatic cordon (``JobFailed.node_fault``)."""


class JobInputError(PlatformError):
    """The job could not be started because of what its own spec names, and would fail the
    same way on any node at any time: a repository or commit that cannot be fetched, a
    bundle that cannot be unpacked, requirements the index cannot meet. Its message starts
    with the spec field at fault and says why. It fails as ``user_error`` without an exit
    code, which the scheduler neither restarts nor retries (``failure_kind``)."""


def failure_kind(exc: BaseException) -> FailureKind:
    """How a job that could not start because of ``exc`` failed: ``user_error`` for its own
    input (``JobInputError``), else ``platform_error``."""
    return "user_error" if isinstance(exc, JobInputError) else "platform_error"


def counts_against_node(exc: BaseException) -> bool:
    """Whether a job that could not start because of ``exc`` counts towards this node's
    cordon: a ``NodeFault``, or an error the runner did not classify whose cause is this
    node's own storage or descriptors (``node_faults.node_fault``: a full or read-only
    disk). Anything else is not: a ``PlatformError`` that is no ``NodeFault`` follows the
    job's own input, and an error nobody classified may be one a tenant's input provoked."""
    if isinstance(exc, PlatformError):
        return isinstance(exc, NodeFault)
    return node_fault(exc) is not None


@dataclass(frozen=True)
class JobUser:
    """Who a job runs as; ``uid`` None: the runner's own user (no isolation by user)."""

    uid: int | None
    gid: int | None

    @property
    def isolated(self) -> bool:
        return self.uid is not None


def can_switch_users() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


RUNNER_LOCKS = Path("/run/trainyard")
"""Host-wide locks of root runners (``/run``: root's, in memory, empty after a reboot)."""


class UidsInUse(PlatformError, StartupRefused):
    """Another live runner on this host runs its jobs as the same uids, or an account of the
    host has one of them (the runner does not start: ``runtime.run_service``)."""


def refuse_account_uids(uids: range) -> None:
    """Raise ``UidsInUse`` when an account of this host (its passwd database) has one of
    ``uids``. A root runner kills every process of its job uids when a job ends and when it
    starts (``kill_user``: ``kill(-1)`` sent as the uid), so a range overlapping a real
    account would kill that account's processes, and the account would share its files
    with every job."""
    account = _account_among(uids)
    if account is not None:
        uid, name = account
        raise UidsInUse(
            f"job uid {uid} is the uid of the host's account {name!r}: set "
            f"TRAINYARD_RUNNER_JOB_UID_BASE to the first of {len(uids)} uids no account has"
        )


def _account_among(uids: range) -> tuple[int, str] | None:
    """The first uid of ``uids`` that an account of the host has, with its name."""
    for uid in uids:
        try:
            return uid, pwd.getpwuid(uid).pw_name
        except KeyError:
            continue
    return None


@contextlib.contextmanager
def claim_job_uids(choices: Sequence[range], lock_dir: Path | None = None) -> Iterator[range]:
    """Hold the first of ``choices`` that no live runner on this host holds, for this runner
    alone, for as long as the block runs; yields the range held.

    Jobs run as these uids, and a runner that starts kills every process of them
    (``kill_leftovers``): two runners on one host with the same range would run jobs as one
    user and kill each other's jobs. The claim is an exclusive ``flock`` on a file named
    after the range in ``RUNNER_LOCKS`` (root's alone: in a world-writable folder a job, or
    a process one left behind, could take the lock first and keep every later runner from
    starting); the kernel drops it when the process dies, so a crashed runner never blocks
    its successor, and a restarted runner gets its first choice back.

    One choice (a range the operator set) is held or refused: ``UidsInUse`` when a live
    runner holds it or an account of the host has one of its uids
    (``refuse_account_uids``). Several (a range derived from the node id, then the rest)
    pass over those to the next, so two runners whose node ids hash alike both start;
    ``UidsInUse`` only when none is free."""
    if len(choices) == 1:
        refuse_account_uids(choices[0])
    folder = lock_dir or RUNNER_LOCKS
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    for uids in choices:
        if len(choices) > 1 and _account_among(uids) is not None:
            continue
        path = folder / f"trainyard-job-uids-{uids.start}-{uids.stop - 1}.lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        try:
            yield uids
        finally:
            os.close(fd)
        return
    held = choices[0] if len(choices) == 1 else range(choices[0].start, choices[-1].stop)
    raise UidsInUse(
        f"job uids {held.start}-{held.stop - 1} are held by "
        f"{'another runner' if len(choices) == 1 else 'other runners'} on this host "
        f"({folder}): give each runner its own node id, or set TRAINYARD_RUNNER_JOB_UID_BASE"
    )


def remembered_first(choices: Sequence[range], record: Path) -> list[range]:
    """``choices`` with the range this node's runner held last (``remember_job_uids``) put
    first. A runner that took a later choice because its first was held, then was killed,
    would otherwise take its first back once free, leaving the earlier runner's job
    processes, under uids no runner then holds, for nobody to kill (``kill_leftovers``
    kills only the uids it claims). A single choice (set by the operator) is kept as is;
    an unreadable record, or one naming no choice, changes nothing."""
    if len(choices) < 2:
        return list(choices)
    try:
        start = int(record.read_text().strip())
    except (OSError, ValueError):
        return list(choices)
    last = [c for c in choices if c.start == start]
    return last + [c for c in choices if c.start != start]


def remember_job_uids(record: Path, uids: range) -> None:
    """Record ``uids`` as this node's (``remembered_first``), replacing the record whole."""
    partial = record.with_name(record.name + ".partial")
    partial.write_text(f"{uids.start}\n")
    partial.replace(record)


PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38


def job_preexec(
    max_processes: int | None,
    user: JobUser | None = None,
    cgroup: JobCgroup | None = None,
    own_network: bool = False,
) -> Callable[[], None] | None:
    """What a process run as the job does before its program: the job's own
    (``process.JobProcess``) and whatever else runs as the job (``AsJob.run``), so this is
    the one place its confinement is set. In this order:

    - it joins the attempt's ``cgroup`` (its memory and process limits, ``cgroups``) while
      it is still the runner's root (the cgroup's files are root's alone: the job can
      neither leave it nor move into another), and whatever it starts is born inside, so
      nothing of the job ever runs outside;
    - with ``own_network``, it leaves the host's network for a namespace holding only its
      own loopback (``netns.enter_own_network``), still root, since that needs it;
    - it becomes ``user`` when that is a user of its own (no supplementary groups, its own
      gid): the switch is done here, not by ``subprocess``, so it comes after the join;
    - it caps the processes (and threads) of that user at ``max_processes`` (None: no cap;
      ``RLIMIT_NPROC`` counts every task of the uid, which is the job's alone when it runs
      as a user of its own: a fork bomb then exhausts its own budget, not the host's
      process table);
    - on Linux, it gives up gaining privileges for good (``PR_SET_NO_NEW_PRIVS``, as the
      container executor's ``no-new-privileges``): neither it nor anything it starts gains
      a uid or capability by running a setuid program or one with file capabilities
      (``fusermount``, which would let the job mount a file system of its own making, that
      never answers, where the runner reads as root; ``pkexec`` and the like);
    - forked from the main thread on Linux, it asks for SIGKILL when the runner dies (after
      the switch of user, which would clear it).

    Anything failing raises, so the program never runs: the spawn fails instead."""
    limit = None
    if max_processes is not None:
        limit = (max_processes, max_processes)
    # The death signal fires when the forking *thread* exits, so only from the main thread.
    death_signal = sys.platform.startswith("linux") and (
        threading.current_thread() is threading.main_thread()
    )
    switch = user is not None and user.uid is not None and user.gid is not None
    join = cgroup.procs_files if cgroup is not None else ()
    no_new_privileges = sys.platform.startswith("linux")
    if not (limit or death_signal or switch or join or own_network or no_new_privileges):
        return None
    # Loaded in the parent: loading a library after fork in a threaded parent can hang.
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()
    uid = user.uid if user is not None else None
    gid = user.gid if user is not None else None

    def preexec() -> None:
        for procs in join:
            fd = os.open(procs, os.O_WRONLY)
            try:
                os.write(fd, b"0")  # 0: the writing process itself
            finally:
                os.close(fd)
        if own_network:
            enter_own_network()
        if uid is not None and gid is not None:
            os.setgroups([])
            os.setregid(gid, gid)
            os.setreuid(uid, uid)
        if limit is not None:
            resource.setrlimit(resource.RLIMIT_NPROC, limit)
        if no_new_privileges and prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "could not set no_new_privs for the job")
        if death_signal:
            prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL))
            if os.getppid() != parent:  # the runner died before prctl took effect
                os._exit(1)

    return preexec


@dataclass(frozen=True)
class AsJob:
    """The privileges of one job: its user and its environment (built from nothing).

    Whatever the runner runs that reads what a tenant controls (the job's interpreter and
    the packages of its environment, whose ``.pth`` files run at every start; git in the
    job's code) runs through :meth:`run`, never as the runner: a bundle with a ``json.py``
    beside the probe's working directory, or a wheel with a ``.pth``, would otherwise run
    as root with the runner's bus, database and store credentials in its environment."""

    user: JobUser
    env: Mapping[str, str]
    max_processes: int | None = None
    """Processes and threads the user may have meanwhile (``RLIMIT_NPROC``, as the job's own
    processes: ``process.JobProcess``); None: no limit. Only for a user of its own."""
    cgroup: JobCgroup | None = None
    """The attempt's cgroup (its memory and process limits), None where there is none."""
    own_network: bool = False
    """Whether it runs in a network of its own, as the job's own processes do
    (``Sandbox.own_network``): what runs tenant code (the probe of its interpreter, which
    runs its packages' ``.pth`` files) reaches no more than the job. Never for fetching
    the job's repository, which needs the network."""

    def run(
        self, argv: Sequence[str], *, cwd: Path, timeout: float
    ) -> subprocess.CompletedProcess[bytes]:
        """Run ``argv`` as the job would be run: its user (no supplementary groups) and its
        cgroup (``job_preexec``), exactly its environment, stdin closed, in a session (and
        process group) of its own, without a controlling terminal; stdout and stderr
        captured, each up to ``MAX_AS_JOB_OUTPUT_BYTES``.
        Run in a launch, it is killed at the launch's deadline if ``timeout`` is later
        (``deadline.cap_timeout``). Whatever it leaves running is killed before this returns.
        Raises ``OSError``,
        ``subprocess.SubprocessError`` (the process could not join its cgroup or become its
        user), ``subprocess.TimeoutExpired`` like ``subprocess.run``, and ``OutputTooLarge``
        (a ``SubprocessError``) once it has printed more than the bound, its group killed."""
        limit = self.max_processes if self.user.isolated else None
        timeout = cap_timeout(timeout)  # a launch's deadline kills it too
        try:
            with subprocess.Popen(
                list(argv),
                cwd=cwd,
                env=dict(self.env),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,  # no controlling terminal (process.JobProcess)
                umask=0o077,  # as the job's own processes (process.JOB_UMASK)
                preexec_fn=job_preexec(limit, self.user, self.cgroup, self.own_network),
            ) as process:
                try:
                    stdout, stderr = _bounded_output(process, argv, timeout)
                except BaseException:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(process.pid, signal.SIGKILL)
                    raise
                return subprocess.CompletedProcess(list(argv), process.wait(), stdout, stderr)
        finally:
            if self.user.uid is not None:
                kill_leftovers(range(self.user.uid, self.user.uid + 1), [])


MAX_AS_JOB_OUTPUT_BYTES = 32 * 1024 * 1024
"""What ``AsJob.run`` keeps of each of stdout and stderr. What runs as the job prints what
the tenant chose (its environment's ``.pth`` files run in the interpreter's probe; git
prints what the tenant's server sends, and a diff of the code the tenant brought): without a
bound the runner, root, would keep all of it in its memory."""


class OutputTooLarge(subprocess.SubprocessError):
    """What ran as the job printed more than ``MAX_AS_JOB_OUTPUT_BYTES`` on one stream."""


def _bounded_output(
    process: subprocess.Popen[bytes], argv: Sequence[str], timeout: float
) -> tuple[bytes, bytes]:
    """Read ``process``'s stdout and stderr to their end, each up to
    ``MAX_AS_JOB_OUTPUT_BYTES`` (``OutputTooLarge`` past it), within ``timeout`` seconds
    (``subprocess.TimeoutExpired``); then wait for it within what is left."""
    assert process.stdout is not None and process.stderr is not None
    deadline = time.monotonic() + timeout
    streams = {process.stdout.fileno(): "stdout", process.stderr.fileno(): "stderr"}
    kept = {fd: bytearray() for fd in streams}
    with selectors.DefaultSelector() as selector:
        for fd in streams:
            selector.register(fd, selectors.EVENT_READ)
        while selector.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired(list(argv), timeout)
            for key, _ in selector.select(left):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    selector.unregister(key.fd)
                    continue
                kept[key.fd] += chunk
                if len(kept[key.fd]) > MAX_AS_JOB_OUTPUT_BYTES:
                    raise OutputTooLarge(
                        f"{argv[0]} printed more than {MAX_AS_JOB_OUTPUT_BYTES} bytes on "
                        f"{streams[key.fd]}"
                    )
    try:
        process.wait(max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        raise subprocess.TimeoutExpired(list(argv), timeout) from None
    out, err = (bytes(kept[fd]) for fd in (process.stdout.fileno(), process.stderr.fileno()))
    return out, err


def job_user(uid_base: int, slot: int) -> JobUser:
    """The user of the job in ``slot``, or the runner's own when it cannot switch users."""
    if not can_switch_users():
        return JobUser(None, None)
    uid = uid_base + slot
    return JobUser(uid, uid)


@dataclass(frozen=True)
class Sandbox:
    root: Path
    user: JobUser
    cgroup: JobCgroup | None = None
    """The attempt's cgroup, which every process run as the job joins (``job_preexec``)."""
    own_network: bool = False
    """Whether the job's own processes run in a network of their own, only its loopback
    (``netns``; ``launch.own_network`` decides)."""

    @property
    def code(self) -> Path:
        return self.root / "code"

    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def tmp(self) -> Path:
        return self.root / "tmp"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def control_socket(self) -> Path:
        return self.root / "control.sock"

    @property
    def rank_output(self) -> Path:
        """The folder of the named pipes a job of several processes writes each rank's
        output to (``process.RankPipes``), made when it starts."""
        return self.root / "output"


def create_sandbox(
    parent: Path,
    name: str,
    user: JobUser,
    cgroup: JobCgroup | None = None,
    own_network: bool = False,
) -> Sandbox:
    """A fresh, empty sandbox (an old one of the same name is removed first)."""
    parent.mkdir(parents=True, exist_ok=True)
    # Others may pass through (a job reaches its own sandbox) but never list the folder.
    parent.chmod(0o711)
    root = parent / name
    remove_sandbox(root)
    # The root stays the runner's (0711 when a job user passes through it, else 0700): the
    # job owns what is inside but cannot rename or replace ``checkpoints/`` or the control
    # socket, which the runner (root) reaches by path.
    root.mkdir(mode=0o711 if user.isolated else 0o700)
    box = Sandbox(root, user, cgroup, own_network)
    for folder in (box.code, box.home, box.tmp, box.checkpoints):
        folder.mkdir(mode=0o700)
    return box


def hand_over(box: Sandbox) -> None:
    """Give the sandbox's folders, and all they hold, to the job's user (after the runner
    has filled them); the sandbox's root stays the runner's."""
    if box.user.uid is None or box.user.gid is None:
        return
    for top in (box.code, box.home, box.tmp, box.checkpoints):
        for folder, dirs, files in os.walk(top):
            os.lchown(folder, box.user.uid, box.user.gid)
            for name in (*dirs, *files):
                os.lchown(os.path.join(folder, name), box.user.uid, box.user.gid)


def remove_sandbox(root: Path) -> None:
    if root.is_symlink():
        root.unlink()
    elif root.exists():
        shutil.rmtree(root, ignore_errors=True)


# --- code ----------------------------------------------------------------------------


def bundle_key(team: str, sha256: str) -> str:
    return f"bundles/{team}/{sha256}.tar.gz"


def fetch_code(
    spec: JobSpec,
    store: ObjectStore,
    box: Sandbox,
    max_processes: int | None = None,
    private_allowed: PrivateAllowed = PUBLIC_ONLY,
) -> str | None:
    """Put the job's code into ``box.code``; returns the code's identity (``sha256:...`` or
    ``git:<commit>``), None when the spec names no code. Raises ``PlatformError``.
    ``max_processes``: the job's process budget, which git, run as the job, has too;
    ``private_allowed``: what git may fetch from although not public (``git_remote``)."""
    code = spec.code
    if code is None:
        return None
    if isinstance(code, CodeBundle):
        fetch_bundle(store, spec.team, code, box.code)
        return f"sha256:{code.sha256}"
    assert isinstance(code, CodeGit)
    checkout_git(code, box.code, box.user, box.home, max_processes, box.cgroup, private_allowed)
    return f"git:{code.commit}"


def fetch_bundle(
    store: ObjectStore,
    team: str,
    bundle: CodeBundle,
    dest: Path,
    max_unpacked: int = MAX_UNPACKED_BYTES,
) -> None:
    key = bundle_key(team, bundle.sha256)
    with tempfile.TemporaryDirectory(prefix="bundle-") as scratch:
        archive = Path(scratch) / "bundle.tar.gz"
        try:
            # No more than the spec says it holds: a larger object cannot be the bundle it
            # names, and would take the node's disk before its sha256 said so. The
            # object store's time is the platform's, not the job's (``deadline``).
            with platform_time():
                store.get_file(key, archive, max_bytes=bundle.size_bytes)
        except ObjectTooLarge as exc:
            raise JobInputError(
                f"spec.code.size_bytes: code bundle {bundle.sha256[:12]} is {exc.size} in "
                f"the object store, more than the {bundle.size_bytes} bytes the spec gives: "
                "not downloaded"
            ) from None
        except ObjectNotFound:
            # Which object the job names is its own input: no node would find it either.
            raise PlatformError(
                f"spec.code.sha256: code bundle {bundle.sha256[:12]} of team {team} is not "
                "in the object store"
            ) from None
        except Exception as exc:
            if infrastructure_fault(exc) is not None:
                raise  # the store away or not answering: the grant is tried again, not failed
            # The store refused this node (its credentials), or its disk failed.
            raise NodeFault(
                f"spec.code.sha256: could not fetch code bundle {bundle.sha256[:12]}: {exc}"
            ) from exc
        digest = file_sha256(archive)
        if digest != bundle.sha256:
            # The object's bytes are the same on every node: not this node's fault.
            raise PlatformError(
                f"spec.code.sha256: code bundle {bundle.sha256[:12]} failed verification: "
                f"its sha256 is {digest}"
            )
        try:
            with tarfile.open(archive, "r:gz") as tar:
                members = tar.getmembers()  # headers only: sizes are known before writing
                unpacked = sum(m.size for m in members)
                if unpacked > max_unpacked or len(members) > MAX_BUNDLE_MEMBERS:
                    raise JobInputError(
                        f"spec.code.sha256: code bundle {bundle.sha256[:12]} would unpack to "
                        f"{unpacked} bytes in {len(members)} entries; at most {max_unpacked} "
                        f"bytes and {MAX_BUNDLE_MEMBERS} entries are allowed"
                    )
                with archive.open("rb") as raw:  # the upload's rule, checked again
                    check_bundle(raw, max_unpacked=max_unpacked)
                tar.extractall(dest, members=members, filter="data")
        except (tarfile.TarError, EOFError, BundleRefused) as exc:
            # Its bytes are the ones uploaded (the sha256 matched): the archive itself is
            # refused, and would be on any node, every time.
            raise JobInputError(
                f"spec.code.sha256: code bundle {bundle.sha256[:12]} cannot be unpacked: {exc}"
            ) from exc
        except OSError as exc:
            # This node's disk (full, read-only, failing) is not the bundle's fault, and
            # counts against the node (the bundle's size is bounded).
            if exc.errno in NODE_ERRNOS:
                raise NodeFault(
                    f"spec.code.sha256: code bundle {bundle.sha256[:12]} could not be "
                    f"unpacked on this node: {exc}"
                ) from exc
            # A name or path the file system refuses is the bundle's own, and would be on
            # every node (the upload's rule catches what any file system would refuse).
            why = BUNDLE_ERRNOS.get(exc.errno) if exc.errno is not None else None
            if why is not None:
                raise JobInputError(
                    f"spec.code.sha256: code bundle {bundle.sha256[:12]} cannot be unpacked: "
                    f"{_entry(exc.filename, dest)}: {exc.strerror} ({why})"
                ) from exc
            # Anything else (a broken gzip stream, a permission of the node's) is the
            # platform's, but not surely the node's.
            raise PlatformError(
                f"spec.code.sha256: code bundle {bundle.sha256[:12]} could not be unpacked "
                f"on this node: {exc}"
            ) from exc


BUNDLE_ERRNOS: dict[int, str] = {
    errno.ENAMETOOLONG: (
        f"a name or path longer than this node's file system holds: at most {NAME_MAX} bytes "
        f"a name, {PATH_MAX} a path, the folder the code is unpacked in included"
    ),
    errno.EILSEQ: "a name this node's file system refuses: not valid in its encoding",
    errno.EINVAL: "a name this node's file system refuses",
    errno.EMLINK: "too many entries in one folder for this node's file system",
    errno.ENOTDIR: "a name that is both a file and a folder in the bundle",
    errno.EEXIST: "a name that is both a file and a folder in the bundle",
    errno.EISDIR: "a name that is both a file and a folder in the bundle",
    errno.EFBIG: "a file larger than this node's file system holds",
    errno.ELOOP: "too many symbolic links in a row",
}
"""Errors unpacking a bundle that follow from its names and contents, whatever the node
(the folder it is unpacked in is new and empty), with what they mean: the job's input."""


def _entry(filename: object, dest: Path) -> str:
    """The bundle's entry an error names (``filename``, a path under ``dest``), quoted
    without the node's own folders; "an entry" when it names none."""
    if isinstance(filename, str | bytes):
        path = os.fsdecode(filename)
        root = os.path.join(os.fsdecode(dest), "")
        if path.startswith(root) and len(path) > len(root):
            return shown(path[len(root) :])
    return "an entry"


def checkout_git(
    code: CodeGit,
    dest: Path,
    user: JobUser,
    home: Path,
    max_processes: int | None = None,
    cgroup: JobCgroup | None = None,
    private_allowed: PrivateAllowed = PUBLIC_ONLY,
    git_version: tuple[int, ...] | None = None,
) -> None:
    """Fetch ``code.commit`` of ``code.repository`` into ``dest`` (empty) as the job's
    ``user`` (``home`` its HOME), never as the runner: the repository is the tenant's
    choice, so git must reach only what the job itself could, never with the runner's SSH
    keys or the host's credential helpers (``GIT_CONFIG_NOSYSTEM``; the job's uid has no
    keys), nor parse what a hostile server sends with the runner's privileges. It runs
    under the job's own limits too (``max_processes`` and its ``cgroup``: ``AsJob``,
    ``job_preexec``): what the tenant's server or repository makes git do spends the job's
    budget, not the host's. git runs in the host's network, so before it runs the
    repository is judged and git held to what was judged (``git_remote.fetch_plan``: its
    transport, its host's addresses, public or in ``private_allowed``): one refused fails as
    the job's input, naming the field and why, and nothing is sent to its host. A git older
    than 2.37 (``git_version``, this node's by default: ``git_remote.installed_git``) could
    not be held to the address judged, so nothing is fetched with it (after the judgement: a
    refused repository is the job's on any node): a ``NodeFault``, the operator's to fix."""
    if code.repository.startswith("-"):
        # The API refuses it, but a grant may come from another producer: given to git
        # fetch, ``--upload-pack=<command>`` runs a command, in the host's network.
        raise JobInputError(
            f"{REPOSITORY}: {code.repository[:100]!r} starts with '-': a repository is a URL "
            "or a path, never an option of git"
        )
    plan = _fetch_plan(code.repository, private_allowed)
    unpinned = unpinned_git(git_version or installed_git())
    if unpinned is not None:
        raise NodeFault(f"{REPOSITORY}: not fetched: {unpinned}")
    if user.uid is not None and user.gid is not None:
        os.chown(dest, user.uid, user.gid)
    as_job = AsJob(
        user,
        {
            "PATH": GIT_PATH,
            "HOME": str(home),
            "LANG": "C.UTF-8",
            "GIT_TERMINAL_PROMPT": "0",
            "GIT_CONFIG_NOSYSTEM": "1",
            **plan.env,
        },
        max_processes=max_processes,
        cgroup=cgroup,
    )
    # On git's command line, where no config of the repository's can change them.
    options = [arg for option in plan.options for arg in ("-c", option)]

    def git(*args: str) -> str:
        # Every reason names the spec field and what happened (``git_faults``).
        try:
            result = as_job.run(["git", *options, *args], cwd=dest, timeout=600)
        except OutputTooLarge as exc:  # what the tenant's server or repository made it say
            raise JobInputError(
                f"{REPOSITORY}: git {args[0]} of {code.repository}: {exc}"
            ) from None
        except (OSError, subprocess.SubprocessError) as exc:  # a timeout, a failed preexec
            timed_out = isinstance(exc, subprocess.TimeoutExpired)
            fault = git_not_run(args[0], str(exc), timed_out=timed_out)
            failed = fault.reason(f"git {args[0]} of {code.repository}")
            raise (NodeFault if fault.node else PlatformError)(failed) from None
        if result.returncode != 0:
            stderr = result.stderr.decode(errors="replace").strip()
            fault = git_fault(args[0], stderr)
            failed = fault.reason(f"git {args[0]} of {code.repository} failed: {stderr[-500:]}")
            error = JobInputError if fault.job_input else NodeFault if fault.node else PlatformError
            raise error(failed)
        return result.stdout.decode(errors="replace").strip()

    git("init", "-q")
    git("fetch", "-q", "--depth", "1", "--", plan.url, code.commit)  # never an option
    git("checkout", "-q", "FETCH_HEAD")
    head = git("rev-parse", "HEAD")
    if head != code.commit:
        # What the repository serves under the commit's id (an annotated tag's id names
        # no commit of its own): it follows the job's input, not held against the node.
        raise PlatformError(
            f"{COMMIT}: the checkout of {code.repository} on this node gave {head}, "
            f"not {code.commit} (is it the id of a tag rather than of a commit?)"
        )


def _fetch_plan(repository: str, private_allowed: PrivateAllowed) -> FetchPlan:
    """``git_remote.fetch_plan``, its refusal and a host that does not exist the job's
    input, a host the resolver failed to look up the platform's, each naming the field."""
    try:
        return fetch_plan(repository, private_allowed)
    except RemoteRefused as exc:
        raise JobInputError(f"{REPOSITORY}: {repository[:200]!r} {exc}") from None
    except HostNotFound as exc:
        raise JobInputError(f"{REPOSITORY}: {repository[:200]!r}: {exc}") from None
    except HostUnresolved as exc:
        raise PlatformError(f"{REPOSITORY}: {repository[:200]!r}: {exc}; retried") from None


# --- processes left behind -----------------------------------------------------------


@dataclass(frozen=True)
class ProcessGroupRecord:
    """A job's process group as recorded at launch: its id and its leader's start time
    (clock ticks since boot), so a recycled group id is never mistaken for the job's."""

    pgid: int
    started: int


def _stat_fields(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ")".
    return text[text.rindex(")") + 2 :].split()


def process_start_time(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[19]) if fields else None


def process_uids(pid: int) -> set[int] | None:
    """The real, effective, saved and file-system uids of ``pid``, None when it is gone.
    Not the owner of ``/proc/<pid>``: that is the effective uid, root's for a setuid
    program the job started (whose real uid is still the job's)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("Uid:"):
            return {int(uid) for uid in line.split()[1:]}
    return None


def leftover_processes(
    uids: range | None, groups: list[ProcessGroupRecord], allocations: Sequence[str] = ()
) -> list[int]:
    """Pids of processes earlier incarnations of this runner left: any process with any of
    its uids (real, effective, saved) in ``uids`` (jobs run as their own users), any
    process of a recorded group that started no earlier than the group's leader, and any
    process whose environment holds the allocation id of one of ``allocations``
    (``orphans.carries``: what a job without a uid of its own moved out of its group)."""
    wanted = {g.pgid: g.started for g in groups}
    markers = frozenset(orphans.marker(allocation) for allocation in allocations)
    found: list[int] = []
    proc = Path("/proc")
    if not proc.is_dir():
        return found
    me = os.getpid()
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        pid = int(entry.name)
        ids = process_uids(pid)
        if ids is None:
            continue  # gone meanwhile
        if uids is not None and any(uid in uids for uid in ids):
            found.append(pid)
            continue
        fields = _stat_fields(pid)
        if fields is None:
            continue
        pgid, started = int(fields[2]), int(fields[19])
        if (pgid in wanted and started >= wanted[pgid]) or orphans.carries(pid, markers):
            found.append(pid)
    return found


def kill_user(uid: int) -> None:
    """SIGKILL every process of ``uid`` at once: ``kill(-1)`` sent by a process of that uid,
    which the kernel applies to every process whose real or saved uid is ``uid`` while no
    process can fork. A kill by listed pids cannot do it: a process that forks and lets its
    parent exit, again and again, is never at the pid that was listed (one was seen running
    40 minutes after its job). The sender is a process switched to ``uid`` (and its own
    gid, no other groups) that spares only itself (``_act_as``)."""
    kill_users(range(uid, uid + 1))


def kill_users(uids: range) -> None:
    """``kill_user`` for each of ``uids``."""
    _act_as(uids, "kill")


def _act_as(uids: range, action: str) -> None:
    """Do ``action`` (``kill``: ``kill(-1)``; ``clear_keyrings``: ``clear_keyrings_of``) as
    each of ``uids`` in turn: what only a process of that uid may do to its own. Failures
    are ignored: the caller's effect is checked elsewhere, or best effort.

    One uid (a job's end) is acted as by a child of this process (``_act_as_one``). More (a
    runner's start: its 64 uids, for each action) by the children of one fresh interpreter
    (``as_uid.HELPER``, which runs ``as_uid``: the same code either way): a fork copies the
    forking process's memory map, and the runner's is large, so a fork of it cost up to
    ~20 ms against ~2 ms for the small helper, whose own start (~40 ms) is paid once."""
    if len(uids) == 1:
        _act_as_one(uids[0], as_uid.ACTIONS[action])
        return
    if not uids:
        return
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run(
            [sys.executable, "-I", "-S", "-c", as_uid.HELPER, action] + [str(uid) for uid in uids],
            env={},  # (its children run as the job uids: none of the runner's settings)
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=30 + len(uids),
            check=False,
        )


def _act_as_one(uid: int, action: Callable[[], None]) -> None:
    """Run ``action`` in a child switched to ``uid`` (and its own gid, no other groups),
    before it runs ``/bin/true`` with an empty environment: once it has run a program, a
    process of that uid may read its environment, and the runner's holds its credentials."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run(
            ["/bin/true"],
            env={},
            user=uid,
            group=uid,
            extra_groups=[],
            preexec_fn=action,  # runs after the switch of user
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=30,
            check=False,
        )


def kill_leftovers(
    uids: range | None, groups: list[ProcessGroupRecord], allocations: Sequence[str] = ()
) -> int:
    """SIGKILL every process of ``uids`` (``kill_user``, when this process may switch
    users) and every process ``leftover_processes`` finds; returns how many it found."""
    if uids is not None and can_switch_users():
        kill_users(uids)
    killed = 0
    for pid in leftover_processes(uids, groups, allocations):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
            killed += 1
    return killed


SHARED_TEMP_FOLDERS = (Path("/tmp"), Path("/var/tmp"), Path("/dev/shm"))
"""Folders every user may write to on any host, where a job's files would outlive it."""
_MAX_DEPTH = 32
_SHARED_SEARCH_DEPTH = 3
_NOT_SEARCHED = frozenset({"/proc", "/sys"})
_NETWORK_FILE_SYSTEMS = frozenset(
    {
        "nfs", "nfs4", "cifs", "smb3", "smbfs", "ceph", "glusterfs", "lustre", "gpfs",
        "beegfs", "afs", "9p", "virtiofs", "orangefs", "ocfs2", "gfs2", "davfs", "autofs",
    }
)  # fmt: skip
"""File systems other hosts may share: the same job uid runs on every node (one per slot),
so a file of that uid there may be another node's running job's."""


def network_mounts(mountinfo: Path = Path("/proc/self/mountinfo")) -> frozenset[Path]:
    """The mount points of file systems other hosts may share (``_NETWORK_FILE_SYSTEMS``,
    and FUSE file systems but the overlay one, which may be anything, a network's too)."""
    try:
        lines = mountinfo.read_text().splitlines()
    except OSError:
        return frozenset()
    found = set()
    for line in lines:
        mine, _, theirs = line.partition(" - ")
        fields, kind = mine.split(), (theirs.split() or [""])[0]
        if len(fields) < 5:
            continue
        remote = kind in _NETWORK_FILE_SYSTEMS or (
            kind.startswith("fuse") and "overlay" not in kind
        )
        if remote:
            # mountinfo writes space, tab, newline and backslash as octal escapes.
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
            found.add(Path(point))
    return frozenset(found)


def shared_folders(top: Path = Path("/"), depth: int = _SHARED_SEARCH_DEPTH) -> list[Path]:
    """``SHARED_TEMP_FOLDERS`` and every other folder everyone may write to, up to ``depth``
    levels below ``top`` (``/proc`` and ``/sys`` not searched, links not followed): hosts
    have more of them than the three every host has (``/run/lock``, ``/var/crash``, a
    mounted ``/dev/mqueue``), and a job's files in any of them would outlive it. Folders on
    a file system other hosts may share (``network_mounts``) are neither listed nor
    searched: a file of the job's uid there may be another node's job's."""
    shared = network_mounts()

    def on_a_network(path: Path) -> bool:
        return any(path.is_relative_to(mount) for mount in shared)

    found = [f for f in SHARED_TEMP_FOLDERS if f.is_dir() and not on_a_network(f)]
    pending = [(top, depth)]
    while pending:
        folder, left = pending.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            try:
                if not entry.is_dir(follow_symlinks=False) or entry.path in _NOT_SEARCHED:
                    continue
                if on_a_network(Path(entry.path)):
                    continue
                mode = entry.stat(follow_symlinks=False).st_mode
            except OSError:
                continue
            path = Path(entry.path)
            if mode & stat.S_IWOTH:
                # Searched whole by remove_files_of (with what everyone may write below it).
                if path not in found:
                    found.append(path)
            elif left > 1:
                pending.append((path, left - 1))
    return found


def remove_files_of(uids: range, folders: Sequence[Path] | None = None) -> int:
    """Remove what users ``uids`` own in ``folders`` (default: ``shared_folders()``), which
    every user may write to; returns how many entries (a folder of theirs counts once, with
    all it holds). Call it once no
    process of ``uids`` runs: jobs of different teams run as the same uid one after the
    other (one per slot), so a file a job left in ``/dev/shm`` would be the next one's to
    read.

    A uid can write only where it owns the folder or everyone may write, so only folders
    everyone may write to are searched, to ``_MAX_DEPTH``. Every step goes through folder
    descriptors opened without following links (the folders are others' to change while
    this runs: a path swapped for a link never leads out)."""
    removed = 0
    for folder in shared_folders() if folders is None else folders:
        try:
            fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            removed += _remove_files_in(fd, uids, _MAX_DEPTH, os.fstat(fd).st_dev)
        finally:
            os.close(fd)
    return removed


def _remove_files_in(folder_fd: int, uids: range, depth: int, device: int) -> int:
    """Remove what ``uids`` own in the folder, and below in what everyone may write, never
    leaving the file system ``device`` (a mount below may be one other hosts share)."""
    removed = 0
    try:
        with os.scandir(folder_fd) as entries:
            names = [entry.name for entry in entries]
    except OSError:
        return 0
    for name in names:
        try:
            st = os.stat(name, dir_fd=folder_fd, follow_symlinks=False)
            if st.st_dev != device:
                continue  # a mount point: another file system, maybe a shared one
            if st.st_uid in uids:
                if stat.S_ISDIR(st.st_mode):
                    shutil.rmtree(name, dir_fd=folder_fd)
                else:
                    os.unlink(name, dir_fd=folder_fd)
                removed += 1
            elif stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_IWOTH and depth > 0:
                fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=folder_fd)
                try:
                    removed += _remove_files_in(fd, uids, depth - 1, device)
                finally:
                    os.close(fd)
        except OSError:
            continue  # gone meanwhile, or not ours to touch
    return removed


_SYSV_IPC = (("shm", "shmid"), ("sem", "semid"), ("msg", "msqid"))
_IPC_RMID = 0


def remove_ipc_of(uids: range, listing: Path = Path("/proc/sysvipc")) -> int:
    """Remove the System V shared memory segments, semaphore sets and message queues that
    users ``uids`` own or created; returns how many. They outlive the processes that made
    them: a segment keeps its memory after the job, and the next job of the same uid (maybe
    another team's) could attach it. Call it once no process of ``uids`` runs."""
    if not listing.is_dir():
        return 0
    libc = ctypes.CDLL(None, use_errno=True)
    removed = 0
    for kind, id_column in _SYSV_IPC:
        try:
            header, *rows = (listing / kind).read_text().splitlines()
        except (OSError, ValueError):
            continue
        columns = header.split()
        for row in rows:
            fields = dict(zip(columns, row.split(), strict=False))
            try:
                ident = int(fields[id_column])
                owners = {int(fields["uid"]), int(fields["cuid"])}
            except (KeyError, ValueError):
                continue
            if not owners & set(uids):
                continue
            if kind == "shm":
                done = libc.shmctl(ident, _IPC_RMID, None)
            elif kind == "sem":
                done = libc.semctl(ident, 0, _IPC_RMID)
            else:
                done = libc.msgctl(ident, _IPC_RMID, None)
            removed += done == 0
    return removed


_MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 2, 4, 8
_MNT_DETACH = 2
_mqueue_unreachable_said = False


def remove_mqueues_of(uids: range) -> int:
    """Remove the POSIX message queues users ``uids`` own; returns how many. Like System V
    IPC they outlive their processes, with their messages, for the next job of the uid.

    Queues live in the IPC namespace's ``mqueue`` file system whether or not a host mounts
    it (at ``/dev/mqueue``), so the runner mounts that file system itself, in a folder of
    its own, for as long as it takes ``remove_files_of`` to remove the uids' entries. Only
    a root runner can (mount needs ``CAP_SYS_ADMIN``; one that cannot says so once)."""
    global _mqueue_unreachable_said
    if not can_switch_users():
        return 0
    libc = ctypes.CDLL(None, use_errno=True)
    flags = _MS_NOSUID | _MS_NODEV | _MS_NOEXEC
    with tempfile.TemporaryDirectory(prefix="trainyard-mqueue-") as folder:
        target = folder.encode()
        if libc.mount(b"mqueue", target, b"mqueue", flags, None) != 0:
            if not _mqueue_unreachable_said:
                _mqueue_unreachable_said = True
                log.warning(
                    "POSIX message queues of jobs cannot be removed: mounting the mqueue "
                    "file system failed (%s)",
                    os.strerror(ctypes.get_errno()),
                )
            return 0
        try:
            return remove_files_of(uids, [Path(folder)])
        finally:
            libc.umount2(target, _MNT_DETACH)


def clear_keyrings_of(uids: range) -> None:
    """Empty the kernel keyrings each of ``uids`` keeps beyond its processes: its user and
    user-session keyrings and its persistent keyring. A key a job adds to them (``keyctl add
    user name secret @u``) would otherwise be the next job's of the uid to read, another
    team's maybe. Like ``kill_user``, a child switched to the uid does it (a keyring is its
    owner's to clear) before it runs ``/bin/true``. Call it once no process of ``uids`` runs;
    only a root runner can (and needs to)."""
    if as_uid.SYS_KEYCTL is None or not can_switch_users():
        return
    _act_as(uids, "clear_keyrings")


def remove_leftovers_of(uids: range) -> int:
    """What users ``uids`` left that outlives processes: their files where every user may
    write (``remove_files_of``), their System V IPC objects (``remove_ipc_of``), their
    POSIX message queues (``remove_mqueues_of``) and their keys (``clear_keyrings_of``).
    Call it once no process of ``uids`` runs; returns how many files, IPC objects and
    queues were removed."""
    clear_keyrings_of(uids)
    return remove_files_of(uids) + remove_ipc_of(uids) + remove_mqueues_of(uids)

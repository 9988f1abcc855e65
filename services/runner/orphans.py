"""What a job leaves running where it has no uid of its own (a runner that is not root):
the processes it moved out of its process group, found and killed when it ends.

Without a uid or a cgroup of its own, a job's processes are found only by its process group
(``process.JobProcess.kill_group``), and a process the job starts in a session of its own
(``setsid``, a double fork) is outside it. Such a runner therefore makes itself a child
subreaper (``become_subreaper``: ``PR_SET_CHILD_SUBREAPER``, Linux only) before it starts a
job: a process whose parent dies is then re-parented to the runner, not to init, and stays
where the runner can find it (its child) until it is killed.

Contract:
- ``kill_orphans`` SIGKILLs every living child of this process whose environment (as it
  was at its start, ``/proc/<pid>/environ``) holds the job's marker
  ``TRAINYARD_ALLOCATION_ID=<allocation>``, which every process of the job inherits unless
  it replaces its environment; what they leave is re-parented to this process in turn and
  killed by the next pass, until a pass finds nothing left (or a bound of
  ``SWEEP_LIMIT_S``). Several jobs at once: each has its own allocation id, so one job's
  end never kills another's processes, nor anything of the runner's or its host's.
- It reaps (``waitpid`` of each pid, never of any child at all) what it killed, and every child
  that exited and that no code of this process waits for: a zombie whose session is
  neither this process's (the children the runner starts without a session of their own)
  nor its own (the jobs and what runs as a job, ``sandbox.AsJob``, which lead one), so an
  orphan that exited by itself does not stay a zombie of the runner.
- A runner that restarts after it died kills, before it accepts work, every process that
  carries the marker of an allocation its ledger has unfinished
  (``sandbox.kill_leftovers``): what those jobs left was re-parented to init (or to a
  subreaper above the runner) when the runner died.
- Not covered: an orphan that replaced its environment (``env -i``, ``execve`` with another
  one) or made itself non-dumpable (its environment then unreadable) is not recognised and
  runs on, at its job's end as after a restart; an orphan that leads a session of its own
  and exits by itself while its job still runs stays a zombie of the runner (it cannot be
  told from a job's main process or ``sandbox.AsJob``'s, which their waiters are about to
  reap); a job whose allocation the ledger has finished is not looked for by a restarted
  runner.

Blocking: call ``kill_orphans`` through ``asyncio.to_thread``.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from trainyard_platform.shared.control import ENV_ALLOCATION_ID

PR_SET_CHILD_SUBREAPER = 36
SWEEP_LIMIT_S = 5.0
"""How long ``kill_orphans`` goes on killing what re-appears (a process that forks as it is
killed) before it gives up for this job."""
_PASS_INTERVAL_S = 0.02


def become_subreaper() -> bool:
    """Make this process the child subreaper of its descendants (Linux; idempotent);
    False where that is not available."""
    if not sys.platform.startswith("linux"):
        return False
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    return bool(prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)


@dataclass(frozen=True)
class Child:
    """A child process: its pid, its state (``Z``: exited, not reaped) and its session."""

    pid: int
    state: str
    session: int


def children_of(parent: int, proc: Path = Path("/proc")) -> list[Child]:
    """The children of ``parent`` (from ``/proc/<pid>/stat``)."""
    found: list[Child] = []
    with contextlib.suppress(OSError):
        for entry in proc.iterdir():
            if not entry.name.isdigit():
                continue
            try:
                text = (entry / "stat").read_text()
            except OSError:
                continue  # gone meanwhile
            # The command name (field 2) may hold spaces and parentheses.
            fields = text[text.rindex(")") + 2 :].split()
            if int(fields[1]) == parent:
                found.append(Child(int(entry.name), fields[0], int(fields[3])))
    return found


def marker(allocation_id: str) -> bytes:
    """The variable every process of the allocation's job has in its environment."""
    return f"{ENV_ALLOCATION_ID}={allocation_id}".encode()


def carries(pid: int, markers: frozenset[bytes]) -> bool:
    """Whether the environment ``pid`` started with holds one of ``markers`` (``marker``)."""
    if not markers:
        return False
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return not markers.isdisjoint(environ.split(b"\0"))


def kill_orphans(allocation_id: str, limit_s: float = SWEEP_LIMIT_S) -> int:
    """SIGKILL and reap this process's children of the job ``allocation_id`` (see the
    module docstring), and reap its orphans that exited; returns how many it killed."""
    me = os.getpid()
    session = os.getsid(0)
    markers = frozenset({marker(allocation_id)})
    killing: set[int] = set()
    """Killed and not yet reaped (a reaped pid may be reused at once)."""
    killed = 0
    give_up = time.monotonic() + limit_s
    while True:
        again = False
        for child in children_of(me):
            mine = child.pid in killing
            if child.state == "Z":
                if mine or child.session not in (session, child.pid):
                    with contextlib.suppress(ChildProcessError):
                        os.waitpid(child.pid, os.WNOHANG)
                if mine:
                    killing.discard(child.pid)
                    again = True  # what it left was re-parented here first: look again
            elif mine or carries(child.pid, markers):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(child.pid, signal.SIGKILL)
                killed += not mine
                killing.add(child.pid)
                again = True
        if not again or time.monotonic() >= give_up:
            return killed
        time.sleep(_PASS_INTERVAL_S)

"""A small process supervisor for the local stack: start children, wait for them, stop them.

Contract:

* ``ManagedProcess`` is one child: started with exactly the environment it is given, its
  stdout and stderr appended to a log file, stdin closed. Each child leads its own process
  group, so a Ctrl-C in the terminal reaches only the parent, which then stops the
  children in order instead of all of them dying at once.
* ``stop(grace_s)`` sends SIGTERM to the child, waits up to ``grace_s`` seconds, then
  SIGKILLs its whole process group; whatever the child left behind in its group is killed
  too, so no grandchild outlives a stop. ``kill()`` skips the grace (crash simulation).
* On Linux a child started from the main thread also gets SIGTERM if the parent dies
  without cleaning up (``PR_SET_PDEATHSIG``), so a SIGKILLed parent leaves no orphans.
* ``wait_until`` polls a readiness check and fails fast, with the tail of the child's log,
  when the child exits or the time runs out.
* ``Supervisor`` keeps children by name and stops them all in reverse order of their
  first start (a restarted child keeps its place). A stop that is interrupted (a second Ctrl-C) kills the child it was waiting for and still
  stops the rest before the interrupt is raised again.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType

DEFAULT_GRACE_S = 10.0
_PR_SET_PDEATHSIG = 1
_TAIL_BYTES = 64 * 1024


class ProcessFailedError(RuntimeError):
    """A child exited, or was not ready in time; the message carries its log tail."""

    def __init__(self, name: str, reason: str, log_path: Path, log_tail: str) -> None:
        self.name = name
        self.reason = reason
        self.log_path = log_path
        self.log_tail = log_tail
        super().__init__(
            f"{name}: {reason}\n--- last lines of {log_path} ---\n{log_tail.rstrip()}\n---"
        )


def read_log_tail(path: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of a log file (empty if there is none yet)."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - _TAIL_BYTES))
            data = f.read()
    except FileNotFoundError:
        return ""
    text = data.decode("utf-8", errors="replace")
    return "\n".join(text.splitlines()[-lines:])


def _death_signal_preexec() -> Callable[[], None] | None:
    """A ``preexec_fn`` that asks Linux to SIGTERM the child when its parent dies.

    Only from the main thread: the death signal fires when the *thread* that forked exits,
    so a child forked from a short-lived worker thread would be killed far too early.
    """
    if not sys.platform.startswith("linux"):
        return None
    if threading.current_thread() is not threading.main_thread():
        return None
    # Load libc in the parent: loading libraries after fork in a threaded parent can hang.
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent_pid = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM))
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os._exit(1)

    return preexec


class ManagedProcess:
    """One supervised child process (see the module docstring for the contract)."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        log_path: Path,
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.env = dict(env)
        self.log_path = log_path
        self.cwd = cwd
        self._popen: subprocess.Popen[bytes] | None = None
        self._stopping = False

    @property
    def pid(self) -> int | None:
        return self._popen.pid if self._popen is not None else None

    @property
    def returncode(self) -> int | None:
        """Exit status once the child has exited (negative: killed by that signal)."""
        return self._popen.poll() if self._popen is not None else None

    def is_running(self) -> bool:
        return self._popen is not None and self._popen.poll() is None

    def exited_unexpectedly(self) -> bool:
        """True when the child is gone although nobody asked it to stop."""
        return self._popen is not None and not self._stopping and self._popen.poll() is not None

    def start(self) -> None:
        """Start the child (again, if it ran before); its log is appended to, not replaced."""
        if self.is_running():
            raise RuntimeError(f"{self.name} is already running (pid {self.pid})")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S")
            command = shlex.join(self.argv).replace("\n", "\\n")  # one line, always
            log.write(f"=== {stamp} starting {self.name}: {command}\n".encode())
            log.flush()
            # The child holds its own copy of the log descriptor; ours closes with the block.
            self._popen = subprocess.Popen(
                self.argv,
                env=self.env,
                cwd=self.cwd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                process_group=0,
                preexec_fn=_death_signal_preexec(),
            )
        self._stopping = False

    def stop(self, grace_s: float = DEFAULT_GRACE_S) -> int | None:
        """SIGTERM, wait ``grace_s``, then SIGKILL the group; returns the exit status."""
        popen = self._popen
        if popen is None:
            return None
        self._stopping = True
        try:
            if popen.poll() is None:
                self._signal_leader(signal.SIGTERM)
                try:
                    popen.wait(timeout=grace_s)
                except subprocess.TimeoutExpired:
                    self._kill_group()
        except BaseException:
            # Interrupted while waiting (Ctrl-C again): never leave the child behind.
            self._kill_group()
            raise
        # The leader is gone; anything it left in its group goes with it.
        self._kill_group()
        return popen.returncode

    def kill(self) -> int | None:
        """SIGKILL the child's whole process group at once, as a crash would."""
        if self._popen is None:
            return None
        self._stopping = True
        self._kill_group()
        return self._popen.returncode

    def log_tail(self, lines: int = 40) -> str:
        return read_log_tail(self.log_path, lines)

    def _signal_leader(self, sig: signal.Signals) -> None:
        assert self._popen is not None
        with contextlib.suppress(ProcessLookupError):
            self._popen.send_signal(sig)

    def _kill_group(self) -> None:
        popen = self._popen
        assert popen is not None
        with contextlib.suppress(ProcessLookupError, PermissionError):  # group already empty
            os.killpg(popen.pid, signal.SIGKILL)
        if popen.poll() is None:
            popen.wait(timeout=10)

    def wait_until(
        self,
        ready: Callable[[], bool],
        *,
        timeout_s: float,
        what: str = "ready",
        interval_s: float = 0.1,
    ) -> float:
        """Poll ``ready()`` until true; returns the seconds it took.

        Raises ``ProcessFailedError`` (with the log tail) when the child exits first or
        ``timeout_s`` passes.
        """
        started = time.monotonic()
        deadline = started + timeout_s
        while True:
            if ready():
                return time.monotonic() - started
            code = self.returncode
            if code is not None:
                raise ProcessFailedError(
                    self.name,
                    f"exited with status {code} before it was {what}",
                    self.log_path,
                    self.log_tail(),
                )
            if time.monotonic() >= deadline:
                raise ProcessFailedError(
                    self.name,
                    f"was not {what} within {timeout_s:g} s",
                    self.log_path,
                    self.log_tail(),
                )
            time.sleep(interval_s)


class Supervisor:
    """Named children, stopped together in reverse start order."""

    def __init__(self, grace_s: float = DEFAULT_GRACE_S) -> None:
        self.grace_s = grace_s
        self._children: dict[str, ManagedProcess] = {}

    def __enter__(self) -> Supervisor:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop_all()

    def __contains__(self, name: object) -> bool:
        return name in self._children

    def __getitem__(self, name: str) -> ManagedProcess:
        try:
            return self._children[name]
        except KeyError:
            known = ", ".join(self._children) or "none"
            raise KeyError(f"no process named {name!r} (known: {known})") from None

    def __iter__(self) -> Iterator[ManagedProcess]:
        return iter(list(self._children.values()))

    @property
    def names(self) -> list[str]:
        return list(self._children)

    def start(
        self,
        name: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        log_path: Path,
        cwd: Path | None = None,
    ) -> ManagedProcess:
        """Start a new named child; the name must not be running already."""
        existing = self._children.get(name)
        if existing is not None and existing.is_running():
            raise RuntimeError(f"{name} is already running (pid {existing.pid})")
        proc = ManagedProcess(name, argv, env=env, log_path=log_path, cwd=cwd)
        # A restarted name keeps its place in the stop order; a new name goes last.
        self._children[name] = proc
        proc.start()
        return proc

    def restart(self, name: str) -> ManagedProcess:
        """Start a stopped child again with its original command, env and log."""
        proc = self[name]
        if proc.is_running():
            raise RuntimeError(f"{name} is still running (pid {proc.pid})")
        return self.start(name, proc.argv, env=proc.env, log_path=proc.log_path, cwd=proc.cwd)

    def stop(self, name: str, grace_s: float | None = None) -> int | None:
        return self[name].stop(self.grace_s if grace_s is None else grace_s)

    def kill(self, name: str) -> int | None:
        return self[name].kill()

    def first_unexpected_exit(self) -> ManagedProcess | None:
        """The first child that died without being asked to, if any."""
        for proc in self._children.values():
            if proc.exited_unexpectedly():
                return proc
        return None

    def stop_all(self, grace_s: float | None = None) -> None:
        """Stop every child, newest first; an interrupt is re-raised after all are stopped."""
        interrupt: BaseException | None = None
        for proc in reversed(list(self._children.values())):
            try:
                proc.stop(self.grace_s if grace_s is None else grace_s)
            except BaseException as exc:  # keep going: the others must stop too
                if interrupt is None:
                    interrupt = exc
        if interrupt is not None:
            raise interrupt

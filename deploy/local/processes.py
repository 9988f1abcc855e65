"""A small process supervisor for the local stack: start children, watch them, restart
them after a crash, stop them.

Contract:

* ``ManagedProcess`` is one child: started with exactly the environment it is given, its
  stdout and stderr appended to a log file, stdin closed. Each child leads its own process
  group, so a Ctrl-C in the terminal reaches only the parent, which then stops the
  children in order instead of all of them dying at once.
* ``stop(grace_s)`` sends SIGTERM (and SIGCONT, in case it is paused) to the child, waits up
  to ``grace_s`` seconds, then SIGKILLs its whole process group; whatever the child left
  behind in its group is killed too, so no grandchild outlives a stop. ``kill()`` skips the
  grace. Both are intentional: ``unexpected_exit()`` stays ``None`` after them.
  ``send_signal(sig)`` signals the group without any intent (a fault, a pause).
* On Linux a child started from the main thread (or from a ``Watchdog`` thread, which lives
  until its children are stopped) also gets SIGTERM if the parent dies without cleaning up
  (``PR_SET_PDEATHSIG``), so a SIGKILLed parent leaves no orphans.
* ``wait_until`` polls a readiness check and fails fast, with the tail of the child's log,
  when the child exits or the time runs out.
* ``Supervisor`` keeps children by name and stops them all in reverse order of their
  first start (a restarted child keeps its place). A stop that is interrupted (a second
  Ctrl-C) kills the child it was waiting for and still stops the rest before the interrupt
  is raised again.
* ``Watchdog`` watches named units (a child, or a server such as PostgreSQL that is not
  one) from a thread: every unexpected exit becomes a ``Death`` (name, how it ended, the
  log tail), reported and kept in ``deaths``, and the unit is started again after a
  back-off (``RestartPolicy``: 1 s doubling to 30 s; the count of failures in a row resets
  once a start stays up 30 s; after 5 failures in a row it is left down and said so). A
  unit that exits with ``DEPENDENCY_WAIT_STATUS`` (75: a service that could not start only
  because PostgreSQL or the object store is unavailable now) is no crash: it is started
  again with the same back-off for as long as it takes, never given up on, each exit
  reported in one line with its log's last line (the whole tail on the first of a row and
  every ``WAIT_TAIL_EVERY``-th).
  ``hold(name)`` before an intentional stop and ``release(name)`` after an intentional
  start keep those from counting as crashes; ``set_auto_restart(name, False)`` leaves a
  crashed unit down (reported all the same) until someone starts it.
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
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

DEFAULT_GRACE_S = 10.0
DEPENDENCY_WAIT_STATUS = os.EX_TEMPFAIL
"""A child's exit status (75, EX_TEMPFAIL of sysexits.h) saying it could not start only
because a dependency is unavailable now (``shared.runtime.DEPENDENCY_UNAVAILABLE_STATUS``):
``Watchdog`` waits it out instead of counting a crash loop."""
WAIT_TAIL_EVERY = 10
"""Of a row of such exits, every this-many-th report has the log's tail again."""
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


def describe_exit(returncode: int | None) -> str:
    """``exit status 3``, ``killed by SIGKILL``, or, for a process that is not our child
    (PostgreSQL runs detached), that its status is unknown."""
    if returncode is None:
        return "exited (exit status unknown: not a child of this process)"
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit status {returncode}"


@dataclass(frozen=True)
class Exit:
    """How a process ended: its exit status (negative: the signal), ``None`` if unknown."""

    returncode: int | None = None

    def __str__(self) -> str:
        return describe_exit(self.returncode)


def _death_signal_preexec() -> Callable[[], None] | None:
    """A ``preexec_fn`` that asks Linux to SIGTERM the child when its parent dies.

    Only from the main thread or a thread marked ``outlives_its_children`` (the watchdog's):
    the death signal fires when the *thread* that forked exits, so a child forked from a
    short-lived worker thread would be killed far too early.
    """
    if not sys.platform.startswith("linux"):
        return None
    current = threading.current_thread()
    if current is not threading.main_thread() and not getattr(
        current, "outlives_its_children", False
    ):
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
        self.started_at: float | None = None
        """``time.monotonic()`` of the latest start."""

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

    def unexpected_exit(self) -> Exit | None:
        """How the child ended if it exited without being asked to, else ``None``."""
        if self._popen is None or self._stopping:
            return None
        code = self._popen.poll()
        return Exit(code) if code is not None else None

    def send_signal(self, sig: int) -> None:
        """Signal the child's whole process group, with no intent recorded: a SIGKILL sent
        here is a crash to whoever watches, a SIGSTOP a hang (``stop()`` still works)."""
        if self._popen is None or self._popen.poll() is not None:
            raise ProcessLookupError(f"{self.name} is not running")
        os.killpg(self._popen.pid, sig)

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
        self.started_at = time.monotonic()

    def stop(self, grace_s: float = DEFAULT_GRACE_S) -> int | None:
        """SIGTERM, wait ``grace_s``, then SIGKILL the group; returns the exit status."""
        popen = self._popen
        if popen is None:
            return None
        self._stopping = True
        try:
            if popen.poll() is None:
                self._signal_leader(signal.SIGTERM)
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(popen.pid, signal.SIGCONT)  # a paused group must see the SIGTERM
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


# --- the watchdog ----------------------------------------------------------------------


@dataclass(frozen=True)
class RestartPolicy:
    """When ``Watchdog`` starts a crashed unit again.

    The n-th failure in a row waits ``first_delay_s * 2**(n-1)`` seconds (at most
    ``max_delay_s``) before the next start. A death after the unit stayed up
    ``stable_after_s`` starts a new row; the ``max_failures``-th failure in a row is a
    crash loop the watchdog gives up on (the unit stays down until someone starts it).
    An exit with ``DEPENDENCY_WAIT_STATUS`` is no failure: such exits make a row of their
    own, backed off the same way, which is never given up on.
    """

    first_delay_s: float = 1.0
    max_delay_s: float = 30.0
    stable_after_s: float = 30.0
    max_failures: int = 5

    def __post_init__(self) -> None:
        if self.first_delay_s < 0 or self.max_delay_s < self.first_delay_s:
            raise ValueError("need 0 <= first_delay_s <= max_delay_s")
        if self.max_failures < 1:
            raise ValueError("max_failures must be at least 1")

    def delay_s(self, failures: int) -> float:
        """Seconds to wait before the start that follows the ``failures``-th in a row."""
        return float(min(self.max_delay_s, self.first_delay_s * 2 ** max(0, failures - 1)))


@dataclass(frozen=True)
class Death:
    """One unexpected exit (or failed restart) of a watched unit, as it was reported."""

    name: str
    how: str
    """``exit status 3``, ``killed by SIGKILL``, or why a restart failed."""
    returncode: int | None
    """The exit status (negative: the signal); ``None`` when unknown or not started."""
    uptime_s: float
    failures: int
    """Failures in a row, this one included (see ``RestartPolicy``)."""
    log_path: Path | None
    log_tail: str
    restart_in_s: float | None
    """When it is started again; ``None``: it stays down (see the two flags)."""
    gave_up: bool = False
    """A crash loop of ``RestartPolicy.max_failures`` failures: no more restarts."""
    restarts_off: bool = False
    """Automatic restarts are off for this unit."""
    start_failed: bool = False
    """The watchdog's restart itself failed (``how`` says why)."""
    waiting: bool = False
    """It exited with ``DEPENDENCY_WAIT_STATUS``: a dependency is unavailable; no crash."""
    waits: int = 0
    """Such exits in a row, this one included."""
    show_tail: bool = True
    """Whether its report carries the log's tail (else one line with the last line)."""
    stable_after_s: float = 0.0
    at: float = field(default_factory=time.time)

    @property
    def crash_loop(self) -> bool:
        return self.failures > 1

    @property
    def summary(self) -> str:
        """One line: who, how, after how long, and what happens next."""
        if self.waiting:
            lines = [line.strip() for line in self.log_tail.splitlines() if line.strip()]
            said = f"; its log: {lines[-1][:300]}" if lines else ""
            text = (
                f"{self.name} cannot start yet, a dependency is unavailable ({self.how}, "
                f"after {self.uptime_s:.1f} s){said}"
            )
            if self.restarts_off:
                return f"{text}; automatic restarts are off for it, it stays down"
            return (
                f"{text}; waiting for it: starting it again in {self.restart_in_s:g} s "
                f"({self.waits} in a row)"
            )
        if self.start_failed:
            text = f"{self.name} could not be started again: {self.how}"
        else:
            text = f"{self.name} exited unexpectedly: {self.how}, after {self.uptime_s:.1f} s"
        loop = ""
        if self.crash_loop:
            loop = (
                f"crash loop: {self.failures} failures in a row "
                f"(each within {self.stable_after_s:g} s of its start); "
            )
        if self.gave_up:
            return f"{text}; {loop}not restarting it any more"
        if self.restarts_off:
            return f"{text}; {loop}automatic restarts are off for it, it stays down"
        return f"{text}; {loop}restarting it in {self.restart_in_s:g} s"

    def __str__(self) -> str:
        if not self.show_tail:
            return self.summary
        where = self.log_path if self.log_path is not None else "its log"
        tail = self.log_tail.rstrip() or "(empty)"
        return f"{self.summary}\n--- last lines of {where} ---\n{tail}\n---"


@dataclass
class _Unit:
    name: str
    exited: Callable[[], Exit | None]
    revive: Callable[[], object]
    log_path: Path | None
    ready: Callable[[], bool] | None
    auto_restart: bool
    up_since: float
    held: bool = False
    failures: int = 0
    waits: int = 0  # exits with DEPENDENCY_WAIT_STATUS in a row
    down: Death | None = None  # the death it has not come back from yet
    restart_at: float | None = None
    restarted_at: float | None = None  # restarted, not yet seen ready
    restarts: int = 0


class _KeeperThread(threading.Thread):
    """The watchdog's thread: it lives until the children it starts are stopped, so they
    may have the parent-death signal (see ``_death_signal_preexec``)."""

    outlives_its_children = True


class Watchdog:
    """Watches named units, reports every unexpected exit and restarts with back-off.

    A unit is given as callables: ``exited()`` says how it ended if it is down without
    having been asked to (``None`` while it runs or after an intentional stop),
    ``revive()`` starts it again (same port, data, environment) or raises, ``ready()``
    (optional) says when a restarted unit serves again. ``poll()`` does one round: first
    it notices and reports every death, then it restarts what is due, then it reports
    restarted units that became ready. ``start()`` polls from a thread every
    ``interval_s``; ``quiesce()`` stops all of it (before the units are stopped) and
    ``close()`` also ends the thread.
    """

    def __init__(
        self,
        policy: RestartPolicy | None = None,
        *,
        report: Callable[[str], None] | None = None,
        interval_s: float = 0.25,
        log_lines: int = 20,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.policy = policy or RestartPolicy()
        self.interval_s = interval_s
        self.log_lines = log_lines
        self._report = report or (lambda _message: None)
        self._clock = clock
        self._lock = threading.RLock()
        self._units: dict[str, _Unit] = {}
        self._deaths: list[Death] = []
        self._quiet = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __contains__(self, name: object) -> bool:
        return name in self._units

    @property
    def names(self) -> list[str]:
        return list(self._units)

    @property
    def deaths(self) -> list[Death]:
        """Every death reported so far, oldest first."""
        with self._lock:
            return list(self._deaths)

    def watch(
        self,
        name: str,
        *,
        exited: Callable[[], Exit | None],
        revive: Callable[[], object],
        log_path: Path | None = None,
        ready: Callable[[], bool] | None = None,
        auto_restart: bool = True,
    ) -> None:
        """Watch a unit that is running now (replaces a unit of that name)."""
        with self._lock:
            self._units[name] = _Unit(
                name, exited, revive, log_path, ready, auto_restart, up_since=self._clock()
            )

    def hold(self, name: str) -> None:
        """Someone stops or starts ``name`` on purpose: ignore it until ``release``."""
        with self._lock:
            unit = self._units.get(name)
            if unit is not None:
                unit.held = True
                unit.down = unit.restart_at = unit.restarted_at = None

    def release(self, name: str) -> None:
        """``name`` was started on purpose: watch it again, with a clean record."""
        with self._lock:
            unit = self._units.get(name)
            if unit is not None:
                unit.held = False
                unit.failures = 0
                unit.down = unit.restart_at = unit.restarted_at = None
                unit.up_since = self._clock()

    def set_auto_restart(self, name: str, enabled: bool) -> None:
        """Turn automatic restarts of ``name`` off (a crash leaves it down, reported) or on
        again (a unit left down for that reason is restarted at the next poll)."""
        with self._lock:
            unit = self._unit(name)
            unit.auto_restart = enabled
            if not enabled:
                unit.restart_at = None
            elif unit.down is not None and unit.down.restarts_off and not unit.held:
                unit.restart_at = self._clock()

    def down(self) -> list[Death]:
        """The deaths of units that are down and will not come back on their own."""
        with self._lock:
            return [
                unit.down
                for unit in self._units.values()
                if unit.down is not None and unit.restart_at is None and not unit.held
            ]

    def poll(self) -> list[Death]:
        """One round (see the class docstring); returns the deaths it reported."""
        with self._lock:
            if self._quiet:
                return []
            found: list[Death] = []
            for unit in self._units.values():
                if unit.held or unit.down is not None:
                    continue
                try:
                    ended = unit.exited()
                except Exception:  # cannot tell right now; ask again next round
                    continue
                if ended is not None:
                    found.append(self._died(unit, str(ended), ended.returncode))
            for unit in list(self._units.values()):
                due = unit.restart_at is not None and self._clock() >= unit.restart_at
                if due and not unit.held:
                    death = self._restart(unit)
                    if death is not None:
                        found.append(death)
            for unit in self._units.values():
                if unit.restarted_at is None or unit.ready is None or unit.held:
                    continue
                with contextlib.suppress(Exception):
                    if unit.ready():
                        took = self._clock() - unit.restarted_at
                        unit.restarted_at = None
                        self._report(f"{unit.name} is ready again ({took:.1f} s after its restart)")
            return found

    def start(self) -> None:
        """Poll from a thread every ``interval_s`` until ``close``."""
        if self._thread is not None:
            return
        self._thread = _KeeperThread(target=self._run, name="local-stack-watchdog", daemon=True)
        self._thread.start()

    def quiesce(self) -> None:
        """No more reports or restarts (the units are about to be stopped)."""
        with self._lock:
            self._quiet = True

    def close(self) -> None:
        self.quiesce()
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=10)

    # --- internals -----------------------------------------------------------------

    def _unit(self, name: str) -> _Unit:
        try:
            return self._units[name]
        except KeyError:
            known = ", ".join(self._units) or "none"
            raise KeyError(f"no process named {name!r} is watched (known: {known})") from None

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.poll()
            except Exception as exc:  # the watchdog itself must not die
                self._report(f"watchdog: {exc!r}")

    def _died(
        self, unit: _Unit, how: str, returncode: int | None, *, start_failed: bool = False
    ) -> Death:
        now = self._clock()
        uptime = max(0.0, now - unit.up_since)
        stable = uptime >= self.policy.stable_after_s
        # A dependency away (PostgreSQL, the object store) is waited out, however long: it
        # is no failure of the unit's own, so it never counts toward giving up.
        waiting = returncode == DEPENDENCY_WAIT_STATUS and not start_failed
        if waiting:
            unit.waits = 1 if stable else unit.waits + 1
            if stable:
                unit.failures = 0
        else:
            unit.waits = 0
            unit.failures = 1 if stable else unit.failures + 1
        delay: float | None = None
        gave_up = restarts_off = False
        if not unit.auto_restart:
            restarts_off = True
        elif waiting:
            delay = self.policy.delay_s(unit.waits)
        elif unit.failures >= self.policy.max_failures:
            gave_up = True
        else:
            delay = self.policy.delay_s(unit.failures)
        unit.restart_at = now + delay if delay is not None else None
        unit.restarted_at = None
        tail = read_log_tail(unit.log_path, self.log_lines) if unit.log_path is not None else ""
        death = Death(
            name=unit.name,
            how=how,
            returncode=returncode,
            uptime_s=uptime,
            failures=unit.failures,
            log_path=unit.log_path,
            log_tail=tail,
            restart_in_s=delay,
            gave_up=gave_up,
            restarts_off=restarts_off,
            start_failed=start_failed,
            waiting=waiting,
            waits=unit.waits,
            show_tail=not waiting or unit.waits == 1 or unit.waits % WAIT_TAIL_EVERY == 0,
            stable_after_s=self.policy.stable_after_s,
        )
        unit.down = death
        self._deaths.append(death)
        self._report(str(death))
        return death

    def _restart(self, unit: _Unit) -> Death | None:
        unit.restart_at = None
        unit.restarts += 1
        started = self._clock()
        try:
            unit.revive()
        except Exception as exc:
            unit.up_since = started
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            return self._died(unit, reason, None, start_failed=True)
        unit.down = None
        unit.up_since = self._clock()
        unit.restarted_at = unit.up_since if unit.ready is not None else None
        took = unit.up_since - started
        again = "" if unit.ready is not None else f", up again after {took:.1f} s"
        self._report(f"{unit.name} restarted (restart {unit.restarts}{again})")
        return None

"""What only a process of a job's uid may do to that uid's own: SIGKILL every process of it
(``kill(-1)``) and empty its kernel keyrings. The one copy of that logic, used two ways
(``sandbox._act_as``):

- in a child of the runner switched to one uid (a job's end): the runner calls
  ``ACTIONS[action]`` there;
- for many uids (a runner's start: its 64 uids), in one fresh, small interpreter
  (``python -I -S``, an empty environment) that runs this file (``HELPER``) and forks a
  child per uid (``act_as_each``): a fork of the runner copies its large memory map, a
  fork of the helper does not.

Standard library only, and nothing of the platform imported: the helper interpreter runs
without ``site`` (no installed package is on its path) and reads only this file.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
import signal
import sys
from collections.abc import Callable, Sequence

SYS_KEYCTL = {"x86_64": 250, "aarch64": 219}.get(platform.machine())
"""The ``keyctl`` system call's number on this machine; None where it is not known."""
KEYCTL_GET_PERSISTENT, KEYCTL_CLEAR = 22, 7
KEY_SPEC_PROCESS_KEYRING, KEY_SPEC_USER_KEYRING, KEY_SPEC_USER_SESSION_KEYRING = -2, -4, -5


def kill_all_of_mine() -> None:
    """SIGKILL every process of this process's uid but itself (``kill(-1)``)."""
    with contextlib.suppress(OSError):  # ESRCH: nothing of this uid runs
        os.kill(-1, signal.SIGKILL)


def clear_my_keyrings() -> None:
    """Empty this uid's user, user-session and persistent keyrings (a keyring is its
    owner's to clear). Call only where ``SYS_KEYCTL`` is known."""
    libc = ctypes.CDLL(None, use_errno=True)
    persistent = libc.syscall(SYS_KEYCTL, KEYCTL_GET_PERSISTENT, -1, KEY_SPEC_PROCESS_KEYRING)
    for keyring in (KEY_SPEC_USER_KEYRING, KEY_SPEC_USER_SESSION_KEYRING, persistent):
        if keyring != -1:
            libc.syscall(SYS_KEYCTL, KEYCTL_CLEAR, keyring)


ACTIONS: dict[str, Callable[[], None]] = {
    "kill": kill_all_of_mine,
    "clear_keyrings": clear_my_keyrings,
}


def act_as_each(action: str, uids: Sequence[int]) -> None:
    """Do ``ACTIONS[action]`` as each of ``uids``, one after the other, each in a child of
    this process switched to the uid (and its own gid, no other groups); a uid whose child
    cannot be forked now (out of processes) is skipped, the next one tried all the same."""
    do = ACTIONS[action]
    for uid in uids:
        try:
            pid = os.fork()
        except OSError:
            continue
        if pid == 0:
            try:
                os.setgroups([])
                os.setgid(uid)
                os.setuid(uid)
                do()
            finally:
                os._exit(0)
        os.waitpid(pid, 0)


def main(argv: Sequence[str]) -> None:
    """``<action> <uid>...``: ``act_as_each``."""
    act_as_each(argv[0], [int(uid) for uid in argv[1:]])


HELPER = f"import runpy, sys; runpy.run_path({os.path.abspath(__file__)!r})['main'](sys.argv[1:])"
"""The program of the helper interpreter (``python -I -S -c HELPER <action> <uid>...``): it
runs this file and calls ``main``; the logic is only here."""


if __name__ == "__main__":  # pragma: no cover - ``python -I -S as_uid.py <action> <uid>...``
    main(sys.argv[1:])

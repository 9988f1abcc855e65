"""A job's own network: a network namespace that holds nothing but its own loopback.

A job run in one (``Settings.job_network`` ``loopback``, a job on one node) reaches no port
of the host or of any other job, not NATS, PostgreSQL, the object store, the runner's API,
another team's torchrun store or the network beyond: only what its own processes listen on
at ``127.0.0.1``/``::1``, which is all a job on one node needs (torchrun's store, gloo and
NCCL's bootstrap between its ranks). Files are not networks: its control socket (a Unix
socket in its sandbox) and its output pipes reach the runner as before.

Contract:
- ``enter_own_network()`` runs in a child between fork and exec, while it is still root (it
  needs ``CAP_SYS_ADMIN``): the process leaves the host's network namespace for a new one
  and brings that one's loopback up. What it then starts is born inside. The namespace
  goes away with the job's last process. Raises ``OSError`` when either step fails, so the
  program never runs outside what it was promised.
- ``available()``: whether this runner can give jobs a namespace (a runner that is not root,
  or a container that forbids ``unshare``, cannot). Probed once, in a child process that
  does exactly what a job's start does, so the runner's own namespace is never touched.
"""

from __future__ import annotations

import ctypes
import fcntl
import functools
import socket
import struct
import subprocess

CLONE_NEWNET = 0x40000000
SIOCGIFFLAGS, SIOCSIFFLAGS = 0x8913, 0x8914
IFF_UP = 0x1
_IFREQ = struct.Struct("16sH22x")
"""``struct ifreq`` as the flag ioctls read it: the interface's name, then its flags."""
_PROBE_TIMEOUT_S = 30.0

# Loaded here, in the runner: loading a library after fork in a threaded parent can hang.
_unshare = ctypes.CDLL(None, use_errno=True).unshare


def enter_own_network() -> None:
    """Move this process into a new network namespace with its loopback up (see the
    module's contract)."""
    if _unshare(CLONE_NEWNET) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"could not make the job's network namespace: unshare: errno {errno}")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        # A new namespace's loopback is down: nothing, not even 127.0.0.1, would answer.
        got = fcntl.ioctl(sock, SIOCGIFFLAGS, _IFREQ.pack(b"lo", 0))
        flags = _IFREQ.unpack(got)[1]
        fcntl.ioctl(sock, SIOCSIFFLAGS, _IFREQ.pack(b"lo", flags | IFF_UP))


@functools.cache
def available() -> bool:
    """Whether jobs can be given a network of their own here (probed once, in a child)."""
    try:
        done = subprocess.run(
            ["/bin/true"],
            preexec_fn=enter_own_network,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=_PROBE_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):  # the preexec failed: no namespace here
        return False
    return done.returncode == 0

"""Which failures are this node's own files failing (a full disk, a read-only or broken file
system, no descriptors left), as against an outage of the bus, the database or the object
store.

``shared.bus.infrastructure_fault`` calls every ``OSError`` but a few of a path an outage,
which a grant's launch waits out: right for a socket, wrong for the runner's own disk,
which does not come back by waiting (and a launch that waits holds its slot and GPUs).
A grant whose preparation fails this way ends as ``platform_error`` instead: the scheduler
retries it (on another node, maybe) and cordons a node that keeps failing.
"""

from __future__ import annotations

import errno

from trainyard_platform.shared.exception_chain import exception_chain
from trainyard_platform.shared.logs import error_text

NODE_ERRNOS = frozenset(
    {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO, errno.EMFILE, errno.ENFILE}
)
"""Errors of this node's own storage and descriptors: no outage of another service says them."""


def node_fault(exc: BaseException) -> str | None:
    """What failed on this node when ``exc`` (or what it was raised from, or a member of an
    exception group) is an ``OSError`` of ``NODE_ERRNOS``; None otherwise."""
    for current in exception_chain(exc):
        if isinstance(current, OSError) and current.errno in NODE_ERRNOS:
            return f"this node's disk or files failed: {error_text(current)}"
    return None

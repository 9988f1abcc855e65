"""Which failures are this node's own files failing, not an outage to wait out."""

from __future__ import annotations

import errno

from trainyard_platform.services.runner.node_faults import node_fault


def test_a_full_disk_is_the_nodes_fault_even_when_wrapped() -> None:
    full = OSError(errno.ENOSPC, "No space left on device")
    assert (
        node_fault(full) == "this node's disk or files failed: [Errno 28] No space left on device"
    )
    try:
        try:
            raise full
        except OSError as exc:
            raise RuntimeError("could not write") from exc
    except RuntimeError as wrapped:
        assert node_fault(wrapped) is not None
    assert node_fault(ExceptionGroup("both", [ValueError("x"), OSError(errno.EROFS, "ro")]))


def test_a_connection_or_anything_else_is_not() -> None:
    assert node_fault(ConnectionRefusedError(errno.ECONNREFUSED, "refused")) is None
    assert node_fault(TimeoutError()) is None
    assert node_fault(ValueError("bad")) is None

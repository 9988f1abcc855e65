"""A job's local output and metric series leave the node's disk once the store has them."""

from __future__ import annotations

import asyncio
from pathlib import Path

from trainyard_platform.services.runner.logstream import LogShipper, remove_shipped
from trainyard_platform.shared.storage import LocalStore


class _Refusing(LocalStore):
    def put_bytes(self, key: str, data: bytes) -> None:  # type: ignore[override]
        raise OSError("the store refused (injected)")


def test_a_stream_wholly_shipped_says_so_and_its_local_file_goes(tmp_path: Path) -> None:
    # Before: close() said nothing and the supervisor left every attempt's output (up to
    # max_output_bytes, 2 GiB, and as much of metrics) under work_dir/jobs for good: a
    # tenant's loud jobs filled the node's disk, failing later jobs as the node's fault.
    store = LocalStore(tmp_path / "store")
    folder = tmp_path / "jobs" / "job-1"
    folder.mkdir(parents=True)
    log = folder / "alloc-1.log"
    log.write_bytes(b"hello\n" * 1000)
    series = folder / "alloc-1.metrics.jsonl"
    series.write_bytes(b"{}\n")
    shippers = [LogShipper(store, "logs/job-1/a0000-n1", log), LogShipper(store, "m", series)]
    assert all(asyncio.run(s.close()) for s in shippers)
    assert b"".join(store.get_bytes(k) for k in sorted(store.list("logs/job-1/"))) == (
        b"hello\n" * 1000
    )
    remove_shipped([log, series])
    assert not folder.exists()


def test_a_stream_the_store_did_not_take_is_kept_locally(tmp_path: Path) -> None:
    folder = tmp_path / "jobs" / "job-1"
    folder.mkdir(parents=True)
    log = folder / "alloc-1.log"
    log.write_bytes(b"only copy\n")
    assert asyncio.run(LogShipper(_Refusing(tmp_path / "store"), "logs/x", log).close()) is False
    other = folder / "alloc-2.log"
    other.write_bytes(b"")
    remove_shipped([other])  # another attempt's file stays, and so does the folder
    assert log.read_bytes() == b"only copy\n" and folder.is_dir()

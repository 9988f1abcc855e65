"""An S3 endpoint that takes connections and never answers (its server paused with
SIGSTOP, as a hung MinIO or a stalled network path looks to a client): every store call
fails within the settings' timeouts as the object store unreachable (an outage: waited
out by handlers, 503 to requests), instead of holding its caller (a runner uploading a
checkpoint, a request downloading a bundle) for MinIO's client's 5 minutes, six times
over; and the readiness check keeps at most one call in flight, so probes of a hung store
do not fill the thread pool every ``asyncio.to_thread`` of the service shares."""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from trainyard_platform.deploy.local.s3 import S3Server
from trainyard_platform.shared.bus import infrastructure_fault
from trainyard_platform.shared.runtime import store_answers
from trainyard_platform.shared.storage import S3Store, open_store

pytestmark = pytest.mark.integration

BOUND_S = 30.0
"""Far past what the short timeouts below allow (1 s to connect, 1 s to read, one retry
of a read); MinIO's client alone waited 5 minutes a try."""


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """An S3 server of this module's own, since its tests pause it."""
    with S3Server(log_dir=tmp_path_factory.mktemp("s3-stalled")) as server:
        yield server


class Counted(S3Store):
    """The S3 store, counting the readiness checks' calls in flight."""

    in_flight = 0
    most = 0
    _lock = threading.Lock()

    def exists(self, key: str) -> bool:
        with self._lock:
            Counted.in_flight += 1
            Counted.most = max(Counted.most, Counted.in_flight)
        try:
            return super().exists(key)
        finally:
            with self._lock:
                Counted.in_flight -= 1


def _store(s3: S3Server) -> S3Store:
    settings = s3.storage_settings(f"s3://stalled-{uuid.uuid4().hex[:12]}").model_copy(
        update={"s3_connect_timeout_seconds": 1.0, "s3_read_timeout_seconds": 1.0}
    )
    store = open_store(settings.uri, settings)
    assert isinstance(store, S3Store)
    return store


async def _fails_in_time(call: Callable[[], Any]) -> BaseException:
    """The error ``call`` raises in a thread, which must come within ``BOUND_S``."""
    try:
        async with asyncio.timeout(BOUND_S):
            await asyncio.to_thread(call)
    except TimeoutError:
        pytest.fail(f"the store call was still waiting after {BOUND_S:g} s")
    except Exception as exc:  # what the call raised
        return exc
    pytest.fail("the store call succeeded against a paused server")


async def test_every_call_to_a_stalled_store_fails_in_time_as_an_outage(
    s3: S3Server, tmp_path: Path
) -> None:
    store = _store(s3)
    store.put_bytes("ckpt/0", b"before")
    (tmp_path / "ckpt").write_bytes(b"x" * 1024)
    s3.send_signal(signal.SIGSTOP)
    try:
        calls: dict[str, Callable[[], Any]] = {
            "exists": lambda: store.exists("ckpt/0"),
            "size": lambda: store.size("ckpt/0"),
            "get_bytes": lambda: store.get_bytes("ckpt/0"),
            "get_file": lambda: store.get_file("ckpt/0", tmp_path / "got"),
            "put_bytes": lambda: store.put_bytes("ckpt/1", b"during"),
            "put_file": lambda: store.put_file("ckpt/2", tmp_path / "ckpt"),
            "list": lambda: store.list("ckpt/"),
        }
        for name, call in calls.items():
            error = await _fails_in_time(call)
            fault = infrastructure_fault(error)
            assert fault is not None and fault.startswith("object store unreachable"), (
                name,
                error,
            )
    finally:
        s3.send_signal(signal.SIGCONT)
    assert store.get_bytes("ckpt/0") == b"before"  # the same client works again


async def test_readiness_keeps_one_check_of_a_stalled_store_in_flight(s3: S3Server) -> None:
    plain = _store(s3)
    store = Counted(plain._client, plain.bucket)  # the same client and bucket, counted
    Counted.in_flight = Counted.most = 0
    s3.send_signal(signal.SIGSTOP)
    try:
        for _ in range(5):  # probes every 0.2 s, each given up after 0.2 s (as /readyz does)
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.2):
                    await store_answers(store)
        assert Counted.most == 1
    finally:
        s3.send_signal(signal.SIGCONT)
    async with asyncio.timeout(BOUND_S):
        while not await _ready(store):
            await asyncio.sleep(0.2)


async def _ready(store: S3Store) -> bool:
    try:
        return await store_answers(store)
    except Exception:
        return False


async def test_readiness_logs_the_store_away_in_one_line_and_back_in_another(
    s3: S3Server, caplog: pytest.LogCaptureFixture
) -> None:
    """While the object store hung, a service's log said nothing of it (urllib3's retry
    warning at most, which names no setting), though ``/readyz`` failed its ``storage``."""
    store = _store(s3)
    caplog.set_level(logging.WARNING)
    s3.send_signal(signal.SIGSTOP)
    try:
        for _ in range(3):  # probes, each waiting for the check's answer (a read timeout)
            assert not await _ready(store)
    finally:
        s3.send_signal(signal.SIGCONT)
    async with asyncio.timeout(BOUND_S):
        while not await _ready(store):
            await asyncio.sleep(0.2)
    ours = [r for r in caplog.records if r.name == "trainyard_platform.shared.outages"]
    messages = [r.getMessage() for r in ours]
    assert len(messages) == 2, messages
    assert messages[0].startswith("the object store (TRAINYARD_STORAGE_URI) unavailable: ")
    assert messages[1].startswith("the object store (TRAINYARD_STORAGE_URI) answers again after ")
    assert all(r.exc_info is None for r in ours)

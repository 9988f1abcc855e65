"""``/readyz`` answers within the probes' timeouts: a check that hangs (NATS frozen, a
database that takes the connection but never answers) is a failed check, not a request
that outlives the probe.

On a local stack with NATS stopped (SIGSTOP), every service's ``/readyz`` answered nothing
within 5 s: the checks ran one after another, the database's for up to 2 s, then NATS's
``stream_info`` for the client's 5 s, while the manifests' probe gives up after 3 s and
compose's after 2 s."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest
import urllib3.exceptions
from minio.error import S3Error

from trainyard_platform.shared.runtime import (
    READINESS_TIMEOUT_SECONDS,
    ServiceRuntime,
    store_answers,
)
from trainyard_platform.shared.settings import ServiceSettings
from trainyard_platform.shared.storage import LocalStore, ObjectStore, S3Store


async def test_a_hanging_check_fails_and_the_others_are_still_read() -> None:
    runtime = ServiceRuntime("test", ServiceSettings(port=0))
    answered: list[str] = []

    async def hangs() -> bool:
        await asyncio.Event().wait()
        return True

    async def answers() -> bool:
        answered.append("yes")
        return True

    async def raises() -> bool:
        raise ConnectionRefusedError(111, "refused")

    runtime.add_readiness_check("database", hangs)
    runtime.add_readiness_check("nats", answers)
    runtime.add_readiness_check("storage", raises)

    # A guard, not a timing assertion: before, this waited for ever.
    checks = await asyncio.wait_for(runtime.is_ready(), 30)

    assert checks == {"database": False, "nats": True, "storage": False}
    assert answered == ["yes"]


async def test_the_answer_does_not_wait_for_a_given_up_check_to_clean_up() -> None:
    """A check cancelled inside ``async with pool.acquire()`` ends only once asyncpg has
    handed the connection back: against a PostgreSQL that did not answer, ``/readyz``
    answered after 3.5 s (the check's 1.5 s and the ping's 2 s acquire timeout), past
    compose's 2 s probe."""
    runtime = ServiceRuntime("test", ServiceSettings(port=0))
    handed_back = asyncio.Event()
    cleaned: list[bool] = []

    async def slow_to_clean_up() -> bool:
        try:
            await asyncio.Event().wait()
        finally:
            await handed_back.wait()  # the clean-up: set only once /readyz has answered
            cleaned.append(True)
        return True

    runtime.add_readiness_check("database", slow_to_clean_up)

    # A guard, not a timing assertion: before, the answer waited for the clean-up, for ever.
    checks = await asyncio.wait_for(runtime.is_ready(), 30)

    assert checks == {"database": False}
    assert cleaned == []
    handed_back.set()
    async with asyncio.timeout(30):
        while not cleaned:  # the clean-up still ran to its end
            await asyncio.sleep(0.01)


async def test_a_local_folder_that_hangs_holds_one_thread_not_one_per_probe(
    tmp_path: Path,
) -> None:
    """A local store on a network mount that hangs: each probe's ``is_dir`` held a thread of
    the default pool for as long as the mount hung, one more per probe, until the pool every
    ``asyncio.to_thread`` of the service shares was full."""
    release = threading.Event()
    in_flight: list[int] = []

    class HungFolder(type(tmp_path)):  # type: ignore[misc]
        def is_dir(self) -> bool:
            in_flight.append(1)
            release.wait(30)
            return True

    class HungStore(LocalStore):
        @property
        def root(self) -> Path:
            return HungFolder(tmp_path)

    store = HungStore(tmp_path)
    try:
        for _ in range(5):  # probes, each given up after 0.2 s (as /readyz does)
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.2):
                    await store_answers(store)
        assert len(in_flight) == 1
    finally:
        release.set()
    assert await asyncio.wait_for(store_answers(store), 30)  # answers once the mount does


def test_the_checks_fit_in_the_shortest_probe_timeout() -> None:
    """compose's healthcheck reads /readyz with a 2 s timeout, the manifests' probe 3 s."""
    assert READINESS_TIMEOUT_SECONDS < 2


async def test_the_object_store_check_says_whether_the_store_answers(tmp_path: Path) -> None:
    """docs/operations.md promised 503 while the object store is unreachable; no service
    checked it, so an idle registry or submission stayed ready with S3 away."""

    class Client:
        def __init__(self, fault: Exception) -> None:
            self.fault = fault

        def stat_object(self, bucket: str, name: str) -> None:
            raise self.fault

    missing = S3Error(None, "NoSuchKey", "no such key", "/b/k", "r", "h")  # type: ignore[arg-type]
    away = urllib3.exceptions.MaxRetryError(None, "/b", None)  # type: ignore[arg-type]
    answers = S3Store(Client(missing), "b", create=False)  # type: ignore[arg-type]
    unreachable = S3Store(Client(away), "b", create=False)  # type: ignore[arg-type]

    async def ready(store: ObjectStore) -> bool:
        runtime = ServiceRuntime("test", ServiceSettings(port=0))
        runtime.add_readiness_check("storage", lambda: store_answers(store))
        return (await runtime.is_ready())["storage"]

    assert await ready(LocalStore(tmp_path)) is True
    assert await ready(LocalStore(tmp_path / "gone")) is False
    assert await ready(answers) is True
    assert await ready(unreachable) is False


def test_the_services_with_a_store_check_it_for_readiness() -> None:
    services = Path(__file__).resolve().parents[3] / "services"
    for name in ("registry", "runner", "submission"):
        source = (services / name / "service.py").read_text()
        assert 'add_readiness_check("storage", lambda: store_answers(store))' in source, name

"""``/readyz`` answers within the probes' timeouts: a check that hangs (NATS frozen, a
database that takes the connection but never answers) is a failed check, not a request
that outlives the probe.

On a local stack with NATS stopped (SIGSTOP), every service's ``/readyz`` answered nothing
within 5 s: the checks ran one after another, the database's for up to 2 s, then NATS's
``stream_info`` for the client's 5 s, while the manifests' probe gives up after 3 s and
compose's after 2 s."""

from __future__ import annotations

import asyncio

from trainyard_platform.shared.runtime import READINESS_TIMEOUT_SECONDS, ServiceRuntime
from trainyard_platform.shared.settings import ServiceSettings


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


def test_the_checks_fit_in_the_shortest_probe_timeout() -> None:
    """compose's healthcheck reads /readyz with a 2 s timeout, the manifests' probe 3 s."""
    assert READINESS_TIMEOUT_SECONDS < 2

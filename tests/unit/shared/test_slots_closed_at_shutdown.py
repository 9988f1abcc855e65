"""Every ``shared.slots.Slots`` a service's app makes is closed when the app stops: no place
of it is left held (its row deleted) and no renewer runs on. The registry's comparison
places and submission's upload places were never closed: only the process's exit ended
their renewers, and a place held at the stop stayed in the table until its lease ran out.

The five apps are built as ``service.serve`` builds them (``test_api_docs.apps``), each
``Slots`` over a stand-in for its database that keeps the rows in memory; a place of every
one is taken while the app runs, then the app stops."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any

import pytest

from tests.unit.shared.test_api_docs import apps
from trainyard_platform.shared import slots as slots_module
from trainyard_platform.shared.slots import Slots


class Rows:
    """``held_slots`` in memory: what ``Slots`` asks of its pool (take, renew, give back)."""

    def __init__(self) -> None:
        self.held: set[tuple[str, str, int, str]] = set()

    async def fetchrow(self, query: str, kind: str, scope: str, most: int, holder: str, *_: Any):
        taken = {n for k, s, n, _ in self.held if (k, s) == (kind, scope)}
        free = [n for n in range(most) if n not in taken]
        if free:
            self.held.add((kind, scope, free[0], holder))
        return {"slot": free[0] if free else None, "any_free": bool(free)}

    async def execute(self, query: str, *args: Any) -> str:
        if query == slots_module._GIVE_BACK:
            self.held.discard((args[0], args[1], args[2], args[3]))
        return "OK"


@pytest.fixture
def made(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Slots, Rows]]:
    """Every ``Slots`` made from now on, each over rows of its own."""
    found: list[tuple[Slots, Rows]] = []
    init = Slots.__init__

    def recorded(self: Slots, pool: Any, kind: str, **options: Any) -> None:
        rows = Rows()
        init(self, rows, kind, **options)  # type: ignore[arg-type]
        found.append((self, rows))

    monkeypatch.setattr(Slots, "__init__", recorded)
    return found


@pytest.mark.parametrize("service", ["submission", "registry"])
async def test_a_stopped_app_holds_no_place_and_renews_nothing(
    service: str, made: list[tuple[Slots, Rows]], tmp_path: Path
) -> None:
    app = apps(tmp_path)[service]
    mine = [(s, rows) for s, rows in made if s.kind.startswith(service)]
    assert mine, f"{service} makes no places any more: nothing to check"
    async with app.lifespan():  # its start and its stop, in this loop
        for slots, rows in mine:
            assert await slots.take("team:1", 2) is not None
            assert rows.held and slots._renewer is not None
    left = {s.kind: sorted(rows.held) for s, rows in mine if rows.held}
    renewing = [s.kind for s, _ in mine if s._renewer is not None and not s._renewer.done()]
    assert (left, renewing) == ({}, [])


async def test_a_served_app_runs_its_shutdown_hooks_when_the_service_stops() -> None:
    """``ServiceRuntime.run`` served the app with uvicorn's lifespan off, so no app's
    ``on_shutdown`` ever ran outside tests: the registry's transfer places were closed in
    tests alone. It runs the app's start and stop around serving: the stop once the server
    has stopped, before the service's pool closes."""
    from litestar import Litestar

    from trainyard_platform.shared.http_app import head_routes
    from trainyard_platform.shared.runtime import ServiceRuntime
    from trainyard_platform.shared.settings import ServiceSettings

    ran: list[str] = []
    settings = ServiceSettings(host="127.0.0.1", port=_free_port())
    async with ServiceRuntime("billing", settings) as runtime:
        app = Litestar(
            route_handlers=head_routes(runtime.health_handlers()),
            on_startup=[lambda: ran.append("start")],
            on_shutdown=[lambda: ran.append("stop")],
        )
        serving = asyncio.create_task(runtime.run(app))
        async with asyncio.timeout(30):
            while not ran:
                await asyncio.sleep(0.01)
        assert ran == ["start"]
        runtime.stopping.set()
        assert await asyncio.wait_for(serving, 30) == 0
    assert ran == ["start", "stop"]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port

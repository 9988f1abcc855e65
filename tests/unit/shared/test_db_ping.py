"""Readiness's ping and the PostgreSQL outage it tells (``db.ping``, ``outages.POSTGRES``)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from trainyard_platform.shared import db, outages


class _Pool:
    """A pool whose acquire times out: full (every connection in use) or not."""

    def __init__(self, size: int, max_size: int, idle: int) -> None:
        self._size, self._max, self._idle = size, max_size, idle

    def get_size(self) -> int:
        return self._size

    def get_max_size(self) -> int:
        return self._max

    def get_idle_size(self) -> int:
        return self._idle

    @contextlib.asynccontextmanager
    async def acquire(self, timeout: float) -> AsyncIterator[Any]:
        raise TimeoutError
        yield  # pragma: no cover


@pytest.fixture(autouse=True)
def _fresh() -> None:
    outages.forget()


async def test_a_pool_with_every_connection_in_use_is_not_ready_but_no_outage() -> None:
    # It was told as "PostgreSQL unavailable" (and trainyard_dependency_away, whose alert
    # fires after 2 minutes) while PostgreSQL answered the busy connections.
    with pytest.raises(TimeoutError):
        await db.ping(_Pool(size=10, max_size=10, idle=0))  # type: ignore[arg-type]
    assert not outages.POSTGRES.away


async def test_no_connection_to_be_made_is_an_outage() -> None:
    with pytest.raises(TimeoutError):
        await db.ping(_Pool(size=1, max_size=10, idle=0))  # type: ignore[arg-type]
    assert outages.POSTGRES.away
    outages.forget()

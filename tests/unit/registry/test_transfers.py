"""Places for artifact transfers: a team's share, the registry's whole, given back however
a transfer ends."""

from __future__ import annotations

import asyncio
import threading

import pytest
from litestar.exceptions import HTTPException

from trainyard_platform.services.registry.transfers import Transfers


async def test_a_team_past_its_share_gets_429_and_all_past_the_most_503() -> None:
    transfers = Transfers(most=3, per_team=2)
    release = threading.Event()
    try:
        held = [asyncio.create_task(transfers.run(t, release.wait, 10)) for t in ("a", "a", "b")]
        await asyncio.sleep(0)
        assert transfers.held("a") == 2 and transfers.held("b") == 1
        with pytest.raises(HTTPException) as team:
            await transfers.run("a", lambda: None)
        assert team.value.status_code == 429 and "team 'a'" in team.value.detail
        assert team.value.headers == {"Retry-After": "5"}
        with pytest.raises(HTTPException) as busy:
            await transfers.run("c", lambda: None)
        assert busy.value.status_code == 503
        assert "MAX_TRANSFERS" in busy.value.detail
        release.set()
        assert await asyncio.gather(*held) == [True, True, True]
        assert transfers.held("a") == 0
        assert await transfers.run("c", lambda: 7) == 7
    finally:
        release.set()
        transfers.close()


async def test_a_failed_transfer_gives_its_place_back() -> None:
    transfers = Transfers(most=1, per_team=1)

    def fail() -> None:
        raise OSError("disk full")

    with pytest.raises(OSError):
        await transfers.run(None, fail)
    assert transfers.held(None) == 0
    assert await transfers.run(None, lambda: "ok") == "ok"
    transfers.close()


async def test_a_transfer_whose_caller_went_away_holds_its_place_until_its_thread_ends() -> None:
    # A client that disconnects cancels the request, not the thread reading the artifact:
    # the place stays taken while that thread still fills the disk, or a team could start,
    # abandon and start again past its share.
    transfers = Transfers(most=2, per_team=1)
    release = threading.Event()
    try:
        request = asyncio.create_task(transfers.run("a", release.wait, 10))
        await asyncio.sleep(0.05)
        request.cancel()
        with pytest.raises(asyncio.CancelledError):
            await request
        assert transfers.held("a") == 1
        with pytest.raises(HTTPException) as again:
            await transfers.run("a", lambda: None)
        assert again.value.status_code == 429
        release.set()
        for _ in range(200):
            if transfers.held("a") == 0:
                break
            await asyncio.sleep(0.01)
        assert transfers.held("a") == 0
        assert await transfers.run("a", lambda: 3) == 3
    finally:
        release.set()
        transfers.close()

"""The client's plain-list reads (tokens, users) follow the ``Link: <...>; rel="next"``
header page after page: before, ``TrainyardClient.tokens`` and ``.users`` returned the first
page only."""

from __future__ import annotations

import httpx
import pytest

from trainyard.client import TrainyardClient


def route(request: httpx.Request) -> httpx.Response:
    """Two pages of each list; the second's URL (from the Link header) keeps the filters."""
    path = request.url.path.removeprefix("/api")
    after = request.url.params.get("after")
    if after is None:
        link = f'<{path}?team=ml&limit=2&after=c2>; rel="next"'
        return httpx.Response(200, json=[{"name": "a"}, {"name": "b"}], headers={"Link": link})
    assert after == "c2" and request.url.params.get("team") == "ml"
    return httpx.Response(200, json=[{"name": "c"}])


@pytest.mark.parametrize("read", ["tokens", "users"])
def test_every_page_is_read(read: str) -> None:
    client = TrainyardClient(
        "http://submission.test/api", "ty_a", 5, transport=httpx.MockTransport(route)
    )
    rows = getattr(client, read)(team="ml")
    assert [r["name"] for r in rows] == ["a", "b", "c"]

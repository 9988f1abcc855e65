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


def test_the_audit_log_is_read_up_to_its_limit_across_pages() -> None:
    """``GET /v1/audit`` pages with the platform's cursor (``Link``) like every plain list:
    ``trainyard audit --limit 3`` reads pages until it has 3 entries, and no more pages."""
    asked: list[httpx.Request] = []

    def audit(request: httpx.Request) -> httpx.Response:
        asked.append(request)
        after = int(request.url.params.get("after") or 100)
        ids = [i for i in range(after - 1, after - 3, -1) if i > 0]
        link = f'</v1/audit?limit=2&before=100&after={ids[-1]}>; rel="next"' if ids else ""
        headers = {"Link": link} if link else {}
        return httpx.Response(200, json=[{"id": i} for i in ids], headers=headers)

    client = TrainyardClient("http://s.test", "ty_a", 5, transport=httpx.MockTransport(audit))
    assert [e["id"] for e in client.audit(before=100, limit=3)] == [99, 98, 97]
    assert len(asked) == 2 and asked[0].url.params["before"] == "100"


def test_an_audit_export_reads_every_page_of_its_window() -> None:
    """``trainyard audit --all --since T --until T``: every entry of the window, in pages of
    the most the server gives, each page asked with the window (the ``Link`` carries it)."""
    asked: list[httpx.Request] = []

    def audit(request: httpx.Request) -> httpx.Response:
        asked.append(request)
        after = int(request.url.params.get("after") or 5)
        ids = list(range(after - 1, max(after - 3, 0), -1))
        window = "since=2026-03-01T00%3A00%3A00Z&until=2026-04-01T00%3A00%3A00Z"
        link = f'</v1/audit?limit=1000&{window}&after={ids[-1]}>; rel="next"'
        headers = {"Link": link} if ids[-1] > 1 else {}
        return httpx.Response(200, json=[{"id": i} for i in ids], headers=headers)

    client = TrainyardClient("http://s.test", "ty_a", 5, transport=httpx.MockTransport(audit))
    entries = client.audit(limit=None, since="2026-03-01T00:00:00Z", until="2026-04-01T00:00:00Z")

    assert [e["id"] for e in entries] == [4, 3, 2, 1]
    assert asked[0].url.params["limit"] == "1000"
    assert all(r.url.params["since"] == "2026-03-01T00:00:00Z" for r in asked)
    assert all(r.url.params["until"] == "2026-04-01T00:00:00Z" for r in asked)

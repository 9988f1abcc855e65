"""Exporting the audit log (``GET /v1/audit``): time windows, and paging that neither skips
nor repeats an entry while new ones are written."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import httpx
import pytest
from pydantic import SecretStr

from tests.fixtures.tcp_proxy import TcpProxy
from trainyard_platform.shared import audit
from trainyard_platform.shared.access import service_guard
from trainyard_platform.shared.db import DATABASE_FAULTS, open_pool
from trainyard_platform.shared.http_app import service_app
from trainyard_platform.shared.identity import operator_token_principal
from trainyard_platform.shared.settings import DatabaseSettings

pytestmark = pytest.mark.integration

TOKEN = "op-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
T0 = datetime(2026, 3, 1, tzinfo=UTC)


@pytest.fixture
async def http(pool: asyncpg.Pool) -> AsyncIterator[httpx.AsyncClient]:
    app = service_app("test", [audit.audit_route(pool, "test")], service_guard(SecretStr(TOKEN)))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        yield client


async def _write(pool: asyncpg.Pool, target: str, at: datetime | None = None) -> None:
    async with pool.acquire() as conn:
        if at is None:
            await audit.record(conn, operator_token_principal(), "put queue", target)
        else:
            await conn.execute(
                "INSERT INTO audit_log (at, actor, role, action, target) "
                "VALUES ($1, 'ops', 'operator', 'put queue', $2)",
                at,
                target,
            )


async def _export(http: httpx.AsyncClient, first: str, between: Any = None) -> list[str]:
    """Every page from ``first`` on, following ``Link``; ``between(page)`` runs after each."""
    targets: list[str] = []
    url: str | None = first
    while url is not None:
        answer = await http.get(url, headers=AUTH)
        assert answer.status_code == 200, answer.text
        targets += [e["target"] for e in answer.json()]
        url = answer.links.get("next", {}).get("url")
        if between is not None:
            await between(len(targets))
    return targets


async def test_since_and_until_bound_the_window_and_follow_the_pages(
    pool: asyncpg.Pool, http: httpx.AsyncClient
) -> None:
    for hour in range(6):
        await _write(pool, f"h{hour}", T0 + timedelta(hours=hour))

    window = await _export(
        http, "/v1/audit?limit=1&since=2026-03-01T01:00:00Z&until=2026-03-01T04:00:00Z"
    )
    # since is inclusive, until exclusive: consecutive windows share no entry.
    assert window == ["h3", "h2", "h1"]
    offset = await _export(http, "/v1/audit?limit=2&since=2026-03-01T05:30:00%2B02:00")
    assert offset == ["h5", "h4"]


async def test_an_export_neither_skips_nor_repeats_while_entries_are_written(
    pool: asyncpg.Pool, http: httpx.AsyncClient
) -> None:
    for i in range(7):
        await _write(pool, f"before-{i}")

    async def write_more(_: int) -> None:
        await _write(pool, "during")

    exported = await _export(http, "/v1/audit?limit=2", between=write_more)

    assert exported == [f"before-{i}" for i in reversed(range(7))]


@pytest.mark.parametrize(
    ("query", "name"),
    [
        ("since=yesterday", "since"),
        ("until=2026-03-01T00:00:00", "until"),
        ("since=2026-02-30T00:00:00Z", "since"),
        ("until=0001-01-01T00:00:00%2B01:00", "until"),
        # A reversed window: an empty page would pass an export of it for done.
        ("since=2026-03-02T00:00:00Z&until=2026-03-01T23:59:59Z", "until"),
    ],
)
async def test_a_bad_time_is_a_422_naming_the_parameter(
    http: httpx.AsyncClient, query: str, name: str
) -> None:
    answer = await http.get(f"/v1/audit?{query}", headers=AUTH)

    assert answer.status_code == 422, answer.text
    assert [e["field"] for e in answer.json()["errors"]] == [name]
    assert "Traceback" not in answer.text


async def test_the_openapi_document_types_the_window(http: httpx.AsyncClient) -> None:
    document = (await http.get("/schema/openapi.json", headers=AUTH)).json()
    parameters = {p["name"]: p for p in document["paths"]["/v1/audit"]["get"]["parameters"]}

    for name in ("since", "until"):
        schema = parameters[name]["schema"]
        kinds = schema.get("oneOf", [schema])
        assert any(k.get("format") == "date-time" for k in kinds), schema


NDJSON_ACCEPT = {**AUTH, "Accept": "application/x-ndjson"}


async def _ndjson(http: httpx.AsyncClient, url: str) -> list[dict[str, Any]]:
    """The NDJSON export at ``url``, read as a stream, each line an entry."""
    lines: list[dict[str, Any]] = []
    async with http.stream("GET", url, headers=NDJSON_ACCEPT) as answer:
        assert answer.status_code == 200, await answer.aread()
        assert answer.headers["content-type"].startswith("application/x-ndjson")
        assert "link" not in answer.headers  # every entry, no next page
        async for line in answer.aiter_lines():
            if line:
                lines.append(json.loads(line))
    return lines


async def test_the_ndjson_export_streams_the_window_oldest_first(
    pool: asyncpg.Pool, http: httpx.AsyncClient
) -> None:
    for hour in (3, 0, 5, 1, 4, 2):  # ids in another order than the times
        await _write(pool, f"h{hour}", T0 + timedelta(hours=hour))

    window = await _ndjson(http, "/v1/audit?since=2026-03-01T01:00:00Z&until=2026-03-01T04:00:00Z")
    # In id order (the order they were written), since inclusive, until exclusive.
    assert [e["target"] for e in window] == ["h3", "h1", "h2"]
    assert [e["id"] for e in window] == sorted(e["id"] for e in window)
    assert set(window[0]) == set(audit.AuditEntry.model_fields)
    everything = await _ndjson(http, "/v1/audit")
    assert [e["target"] for e in everything] == ["h3", "h0", "h5", "h1", "h4", "h2"]
    below = await _ndjson(http, f"/v1/audit?before={everything[2]['id']}")
    assert [e["target"] for e in below] == ["h3", "h0"]
    assert await _ndjson(http, "/v1/audit?since=2027-01-01T00:00:00Z") == []
    # A JSON page is still the default, newest first.
    page = await http.get("/v1/audit?limit=2", headers=AUTH)
    assert [e["target"] for e in page.json()] == ["h2", "h4"]


async def test_the_ndjson_export_reads_page_after_page(
    pool: asyncpg.Pool, http: httpx.AsyncClient
) -> None:
    total = 2 * audit.EXPORT_PAGE + 7  # three keyset pages, the last one short
    async with pool.acquire() as conn:
        await conn.executemany(
            "INSERT INTO audit_log (at, actor, role, action, target) "
            "VALUES ($1, 'ops', 'operator', 'put queue', $2)",
            [(T0, f"e{i}") for i in range(total)],
        )

    exported = await _ndjson(http, "/v1/audit")

    assert [e["target"] for e in exported] == [f"e{i}" for i in range(total)]
    ids = [e["id"] for e in exported]
    assert ids == sorted(set(ids))


async def test_an_export_leaves_entries_written_after_it_began_for_the_next(
    pool: asyncpg.Pool,
) -> None:
    # Read as the route streams it (httpx's in-process transport would buffer the answer):
    # a page at a time, entries written between pages are above where it stops.
    for i in range(5):
        await _write(pool, f"before-{i}")
    chunks = []
    async for chunk in audit.export_lines(pool, None, None, None, page=2):
        chunks.append(chunk)
        await _write(pool, "during")

    lines = [json.loads(line) for chunk in chunks for line in chunk.splitlines()]
    assert [e["target"] for e in lines] == [f"before-{i}" for i in range(5)]
    assert [len(chunk.splitlines()) for chunk in chunks] == [2, 2, 1]


@pytest.mark.parametrize(
    ("query", "name"),
    [
        ("since=yesterday", "since"),
        ("until=2026-03-01T00:00:00", "until"),
        ("since=2026-03-02T00:00:00Z&until=2026-03-01T23:59:59Z", "until"),
        ("limit=10", "limit"),
        ("after=abc", "after"),
    ],
)
async def test_the_ndjson_export_refuses_a_bad_window_or_paging_with_422(
    http: httpx.AsyncClient, query: str, name: str
) -> None:
    answer = await http.get(f"/v1/audit?{query}", headers=NDJSON_ACCEPT)

    assert answer.status_code == 422, answer.text
    assert answer.headers["content-type"].startswith("application/json")
    assert [e["field"] for e in answer.json()["errors"]] == [name]


async def test_the_ndjson_export_is_for_operators_only(
    pool: asyncpg.Pool, http: httpx.AsyncClient
) -> None:
    await _write(pool, "secret")
    for headers in (
        {"Accept": "application/x-ndjson"},
        {"Accept": "application/x-ndjson", "Authorization": "Bearer not-the-token"},
    ):
        answer = await http.get("/v1/audit", headers=headers)
        assert answer.status_code == 401
        assert "secret" not in answer.text


async def test_the_ndjson_export_s_head_and_document(
    pool: asyncpg.Pool, http: httpx.AsyncClient
) -> None:
    await _write(pool, "one")
    head = await http.head("/v1/audit", headers=NDJSON_ACCEPT)
    assert head.status_code == 200 and not head.content
    assert head.headers["content-type"].startswith("application/x-ndjson")
    document = (await http.get("/schema/openapi.json", headers=AUTH)).json()
    content = document["paths"]["/v1/audit"]["get"]["responses"]["200"]["content"]
    assert set(content) == {"application/json", "application/x-ndjson"}


@pytest.fixture
async def proxy(database_url: str) -> AsyncIterator[TcpProxy]:
    """A proxy to the test database's socket: cut it and the service has lost its database."""
    async with TcpProxy.to_postgres(database_url) as started:
        yield started


@pytest.fixture
async def proxied_pool(
    pool: asyncpg.Pool, database_url: str, proxy: TcpProxy
) -> AsyncIterator[asyncpg.Pool]:
    """A pool on the same schema (migrated by ``pool``), through ``proxy``."""
    settings = DatabaseSettings(
        url=proxy.postgres_url(database_url),
        pool_min_size=1,
        connect_timeout_seconds=5.0,
        acquire_timeout_seconds=5.0,
    )
    async with open_pool(settings, "t") as proxied:
        yield proxied
        proxy.restore()  # so the pool closes its connections as usual


async def test_an_export_begun_without_its_database_is_a_503(
    pool: asyncpg.Pool, proxied_pool: asyncpg.Pool, proxy: TcpProxy
) -> None:
    """The export's first read came after its 200 was said: with the database unavailable
    when it began, the answer was a 200 that broke off before its first line (in process,
    the app's exception), where every other route answers 503, try again."""
    await _write(pool, "one")
    app = service_app(
        "test", [audit.audit_route(proxied_pool, "test")], service_guard(SecretStr(TOKEN))
    )
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
        assert [e["target"] for e in await _ndjson(http, "/v1/audit")] == ["one"]
        await proxy.cut()
        answer = await http.get("/v1/audit", headers=NDJSON_ACCEPT)
        assert answer.status_code == 503, answer.text
        assert "try again" in answer.json()["detail"]
        assert "retry-after" in answer.headers
        proxy.restore()
        assert [e["target"] for e in await _ndjson(http, "/v1/audit")] == ["one"]


async def test_an_export_that_loses_its_database_midway_fails_and_never_ends_short(
    pool: asyncpg.Pool, proxied_pool: asyncpg.Pool, proxy: TcpProxy
) -> None:
    """Read as the route streams it: the database lost after the first page is a failure of
    the stream (the server then ends the answer without its last chunk), never an end that
    would pass a short export for a whole one."""
    for i in range(5):
        await _write(pool, f"e{i}")
    lines = audit.export_lines(proxied_pool, None, None, None, page=2)
    first = await anext(lines)
    assert [json.loads(line)["target"] for line in first.splitlines()] == ["e0", "e1"]
    await proxy.cut()
    with pytest.raises(DATABASE_FAULTS):  # not StopAsyncIteration, a whole export's end
        await anext(lines)

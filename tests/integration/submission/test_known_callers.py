"""``POST /v1/jobs`` of a token that submitted before is one statement
(``known_callers``, ``repository.insert_job_if_caller``): the guard lets the request in on
what the token's last check read, and the statement stores the job only where the token,
its caller and the team's screening are still what was read. Everything that changed in
between is answered as the full check answers it, with nothing stored."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import httpx
import pytest

from tests.integration.submission.conftest import SPEC
from trainyard_platform.services.submission import identity
from trainyard_platform.services.submission import repository as repo
from trainyard_platform.services.submission.api import AppDeps, create_app
from trainyard_platform.services.submission.config import Settings
from trainyard_platform.services.submission.governance import current_month
from trainyard_platform.services.submission.service import NAME
from trainyard_platform.shared.auth import hash_token
from trainyard_platform.shared.db import open_pool
from trainyard_platform.shared.storage import open_store

pytestmark = pytest.mark.integration


class Statements:
    """The statements the app's own pool sends to PostgreSQL (asyncpg's query logger)."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def __call__(self, record: Any) -> None:
        self.seen.append(record.query)

    def taken(self) -> list[str]:
        seen, self.seen = self.seen, []
        return seen


async def _client(settings: Settings, front: asyncpg.Pool) -> httpx.AsyncClient:
    store = open_store(settings.storage.uri, settings.storage)
    app = create_app(settings, AppDeps(pool=front, store=store))
    transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
    return httpx.AsyncClient(transport=transport, base_url="http://submission")


async def _member(client: httpx.AsyncClient, admin: str, name: str = "carol") -> str:
    response = await client.post(
        "/v1/admin/users",
        json={"name": name, "role": "member"},
        headers={"Authorization": f"Bearer {admin}"},
    )
    assert response.status_code == 201, response.text
    token: str = response.json()["token"]
    return token


def _post(
    client: httpx.AsyncClient, token: str, spec: dict[str, Any] | None = None
) -> Awaitable[httpx.Response]:
    return client.post("/v1/jobs", json=spec or SPEC, headers={"Authorization": f"Bearer {token}"})


async def _stored(pool: asyncpg.Pool) -> tuple[int, int]:
    jobs = await pool.fetchval("SELECT count(*) FROM jobs")
    events = await pool.fetchval("SELECT count(*) FROM outbox WHERE subject LIKE '%submitted%'")
    return int(jobs), int(events)


async def test_a_known_token_submits_in_one_statement(
    settings: Settings, pool: asyncpg.Pool
) -> None:
    statements = Statements()
    admin = await identity.bootstrap_user(pool, "ml", "alice")
    async with open_pool(settings.database, NAME) as front, await _client(settings, front) as c:
        member = await _member(c, admin)
        for conn in [await front.acquire() for _ in range(front.get_size())]:
            conn.add_query_logger(statements)
            await front.release(conn)
        statements.taken()
        first = await _post(c, member)
        assert first.status_code == 201, first.text
        assert len(statements.taken()) == 2  # the token's check, then the job's statement
        second = await _post(c, member)
        assert second.status_code == 201, second.text
        sent = statements.taken()
        assert len(sent) == 1, sent
        assert "WITH caller AS" in sent[0]
    assert await _stored(pool) == (2, 2)


async def test_a_known_tokens_replay_locates_the_job_it_replays(
    settings: Settings, pool: asyncpg.Pool
) -> None:
    admin = await identity.bootstrap_user(pool, "ml", "alice")
    async with open_pool(settings.database, NAME) as front, await _client(settings, front) as c:
        member = await _member(c, admin)
        headers = {"Authorization": f"Bearer {member}", "Idempotency-Key": "nightly-1"}
        first = await c.post("/v1/jobs", json=SPEC, headers=headers)
        assert first.status_code == 201, first.text
        again = await c.post("/v1/jobs", json=SPEC, headers=headers)  # the one statement
        assert again.status_code == 200, again.text
        job = first.json()["id"]
        assert again.json()["id"] == job
        # Not the id the replayed request was prepared with (never stored).
        assert first.headers["Location"] == again.headers["Location"] == f"/v1/jobs/{job}"
        assert (await c.get(again.headers["Location"], headers=headers)).status_code == 200
    assert await _stored(pool) == (1, 1)


async def test_a_known_tokens_201_is_the_full_paths_answer(
    settings: Settings, pool: asyncpg.Pool
) -> None:
    """The one statement's 201 (encoded from a template, ``views.submitted_job_json``) is the
    answer the full path gives (a ``JobView`` Litestar encodes), but for the job's own
    fields."""
    spec = {
        **SPEC,
        "args": ["--note", "d\u00e9j\u00e0 vu \u2603", "tab\there"],
        "hyperparameters": {"lr": 1e-05, "wd": 0.1, "steps": 2**53, "on": True, "name": "x"},
        "seed": 2**31,
        "max_restarts": 0,
        "cpus_per_gpu": 2,
    }
    admin = await identity.bootstrap_user(pool, "ml", "alice")
    async with open_pool(settings.database, NAME) as front, await _client(settings, front) as c:
        member = await _member(c, admin)
        full = await _post(c, member, spec)  # the token's first request: the full path
        known = await _post(c, member, spec)  # remembered: the one statement
    assert (full.status_code, known.status_code) == (201, 201), known.text
    assert full.headers["content-type"] == known.headers["content-type"]
    assert sorted(full.headers) == sorted(known.headers)
    answers = [r.json() for r in (full, known)]
    for answer, response in zip(answers, (full, known), strict=True):
        assert response.headers["Location"] == f"/v1/jobs/{answer['id']}"
        assert answer["history"][0]["at"] == answer["updated_at"] == answer["submitted_at"]
    # Byte for byte, once the known job's id, time and trace (each request its own, where an
    # earlier test of the process installed a tracer provider) are the first one's.
    first, second = answers
    assert (first["trace_id"] is None) == (second["trace_id"] is None)
    same = known.content
    for field in ("id", "submitted_at", "trace_id"):
        if second[field] is not None:
            same = same.replace(second[field].encode(), first[field].encode())
    assert same == full.content


Change = Callable[[asyncpg.Pool, str], Awaitable[Any]]


async def _admin_caller(pool: asyncpg.Pool) -> tuple[str, Any, Any, Any, str]:
    """A new admin alice of team ml, as ``repository.insert_job_if_caller`` takes its caller:
    (token hash, token id, user id, team id, role)."""
    token = await identity.bootstrap_user(pool, "ml", "alice")
    row = await pool.fetchrow(
        "SELECT k.id, u.id AS user_id, u.team_id FROM tokens k JOIN users u ON u.id = k.user_id"
    )
    assert row is not None
    return (hash_token(token), row["id"], row["user_id"], row["team_id"], "admin")


async def _revoke(pool: asyncpg.Pool, token: str) -> None:
    await pool.execute(
        "UPDATE tokens SET revoked_at = now() WHERE token_hash = $1", hash_token(token)
    )


async def _expire(pool: asyncpg.Pool, token: str) -> None:
    await pool.execute(
        "UPDATE tokens SET expires_at = now() - interval '1 second' WHERE token_hash = $1",
        hash_token(token),
    )


async def _disable(pool: asyncpg.Pool, token: str) -> None:
    await pool.execute(
        "UPDATE users SET disabled_at = now() WHERE id = "
        "(SELECT user_id FROM tokens WHERE token_hash = $1)",
        hash_token(token),
    )


async def _demote(pool: asyncpg.Pool, token: str) -> None:
    await pool.execute(
        "UPDATE users SET role = 'viewer' WHERE id = "
        "(SELECT user_id FROM tokens WHERE token_hash = $1)",
        hash_token(token),
    )


async def _budget_spent(pool: asyncpg.Pool, token: str) -> None:
    await pool.execute(
        """INSERT INTO budget_replica (team, project, month, amount, spent, currency, policy,
                                      exhausted, deleted, revision)
           VALUES ('ml', '', $1, '10', '11', 'USD', 'refuse', true, false, 1)""",
        current_month(),
    )


async def _flavor_retired(pool: asyncpg.Pool, token: str) -> None:
    await pool.execute(
        "INSERT INTO flavor_replica (name, revision, retired, changed_at) "
        "VALUES ('cpu', 1, true, now())"
    )


@pytest.mark.parametrize(
    ("change", "status"),
    [
        (_revoke, 401),
        (_expire, 401),
        (_disable, 401),
        (_demote, 403),
        (_budget_spent, 409),
        (_flavor_retired, 422),
    ],
)
async def test_what_changed_since_the_last_check_is_answered_as_the_check_answers(
    settings: Settings, pool: asyncpg.Pool, change: Change, status: int
) -> None:
    admin = await identity.bootstrap_user(pool, "ml", "alice")
    async with open_pool(settings.database, NAME) as front, await _client(settings, front) as c:
        member = await _member(c, admin)
        assert (await _post(c, member)).status_code == 201  # remembered from here on
        await change(pool, member)
        refused = await _post(c, member)
        assert refused.status_code == status, refused.text
        assert front.get_idle_size() == front.get_size()
    assert await _stored(pool) == (1, 1)


@pytest.mark.parametrize(
    ("spec", "headers"),
    [
        ({**SPEC, "gpus": "two"}, {}),  # refused by validation (422)
        ({**SPEC, "name": "a\x00b"}, {}),  # a NUL character (422)
        (SPEC, {"Content-Type": "text/plain"}),  # 415
    ],
)
async def test_a_revoked_known_token_is_401_whatever_its_body(
    settings: Settings, pool: asyncpg.Pool, spec: dict[str, Any], headers: dict[str, str]
) -> None:
    admin = await identity.bootstrap_user(pool, "ml", "alice")
    async with open_pool(settings.database, NAME) as front, await _client(settings, front) as c:
        member = await _member(c, admin)
        assert (await _post(c, member)).status_code == 201
        await _revoke(pool, member)
        refused = await c.post(
            "/v1/jobs", json=spec, headers={"Authorization": f"Bearer {member}", **headers}
        )
        assert refused.status_code == 401, refused.text
    assert await _stored(pool) == (1, 1)


async def test_the_statement_stores_nothing_for_a_screening_that_changed(
    pool: asyncpg.Pool,
) -> None:
    caller = await _admin_caller(pool)
    event = ("e1", "trainyard.job.submitted.j1", b"{}", {})
    job = (
        "j1",
        "n",
        {"name": "n"},
        None,
        await pool.fetchval("SELECT now()"),
        None,
        "submitted",
        None,
    )
    month = current_month()
    async with pool.acquire() as conn:
        # The catalogue retired no flavor and declared none; the remembered one says "x" was.
        stale = (month, ["x"], [], "[]")
        assert await repo.insert_job_if_caller(conn, caller, stale, job, event) == (False, False)
        wrong_role = (*caller[:4], "member")
        fresh = (month, [], [], "[]")
        assert await repo.insert_job_if_caller(conn, wrong_role, fresh, job, event) == (
            False,
            False,
        )
        assert await _stored(pool) == (0, 0)
        assert await repo.insert_job_if_caller(conn, caller, fresh, job, event) == (True, True)
        await conn.execute("UPDATE tokens SET revoked_at = now()")
        again = ("j2", "n", {"name": "n"}, None, job[4], None, "submitted", None)
        other = ("e2", *event[1:])
        assert await repo.insert_job_if_caller(conn, caller, fresh, again, other) == (False, False)
    assert await _stored(pool) == (1, 1)

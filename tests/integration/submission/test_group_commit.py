"""Remembered callers' submissions that arrive while others are being written are written
together (``group_commit``): one statement for the batch, each row answered as if it had
been written alone, in arrival order.

The tests hold the write under way (the single-row statement waits on a gate) until the
submissions they want in the next batch are queued: which rows form a batch never depends
on timing."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import asyncpg
import httpx
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from tests.integration.submission.conftest import SPEC, eventually
from tests.integration.submission.test_known_callers import _member, _revoke, _stored
from trainyard_platform.services.submission import identity
from trainyard_platform.services.submission import repository as repo
from trainyard_platform.services.submission.api import AppDeps, create_app
from trainyard_platform.services.submission.config import Settings
from trainyard_platform.services.submission.governance import screening_columns
from trainyard_platform.services.submission.group_commit import GroupCommit
from trainyard_platform.services.submission.service import NAME
from trainyard_platform.shared.db import open_pool
from trainyard_platform.shared.storage import open_store
from trainyard_platform.shared.telemetry import instrument_database

pytestmark = pytest.mark.integration


@dataclass
class Front:
    """The app over its own pool, its writer, and a gate the single-row statement waits
    on."""

    client: httpx.AsyncClient
    writer: GroupCommit
    gate: asyncio.Event
    entered: asyncio.Event
    members: list[str]

    def post(
        self, token: str, spec: dict[str, Any] | None = None, key: str | None = None
    ) -> asyncio.Task[httpx.Response]:
        headers = {"Authorization": f"Bearer {token}"}
        if key is not None:
            headers["Idempotency-Key"] = key
        return asyncio.create_task(self.client.post("/v1/jobs", json=spec or SPEC, headers=headers))

    async def hold_one_write(self) -> asyncio.Task[httpx.Response]:
        """A submission of the last member whose single-row statement waits on the gate."""
        held = self.post(self.members[-1])
        await eventually(self._entered, 30)
        return held

    async def queue(self, post: Callable[[], asyncio.Task[httpx.Response]]) -> Any:
        """Start ``post`` and return once its submission is queued behind the held write."""
        before = self.writer.queued
        task = post()

        async def queued() -> bool:
            return self.writer.queued == before + 1

        await eventually(queued, 30)
        return task

    async def _entered(self) -> bool:
        return self.entered.is_set()


@pytest.fixture
async def front(
    request: pytest.FixtureRequest,
    settings: Settings,
    pool: asyncpg.Pool,
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[Front]:
    """The app with the default writer, or one made with the test's ``params``."""
    admin = await identity.bootstrap_user(pool, "ml", "alice")
    gate, entered = asyncio.Event(), asyncio.Event()
    alone = repo.insert_job_if_caller

    async def gated(*args: Any) -> tuple[bool, bool]:
        entered.set()
        await gate.wait()
        return await alone(*args)

    async with open_pool(settings.database, NAME) as own:
        writer = GroupCommit(own, **getattr(request, "param", {}))
        store = open_store(settings.storage.uri, settings.storage)
        app = create_app(settings, AppDeps(pool=own, store=store, group_commit=writer))
        transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=transport, base_url="http://submission") as c:
            members = [await _member(c, admin, f"m{i}") for i in range(4)]
            for token in members:  # each token's first submission: the full check, remembered
                first = await c.post(
                    "/v1/jobs", json=SPEC, headers={"Authorization": f"Bearer {token}"}
                )
                assert first.status_code == 201, first.text
            monkeypatch.setattr(repo, "insert_job_if_caller", gated)
            yield Front(c, writer, gate, entered, members)
            gate.set()


async def _history(pool: asyncpg.Pool) -> int:
    return int(await pool.fetchval("SELECT count(*) FROM job_history WHERE reason = 'submitted'"))


async def test_concurrent_submissions_are_one_statement_and_all_durable(
    front: Front, pool: asyncpg.Pool
) -> None:
    held = await front.hold_one_write()
    queued = [await front.queue(lambda t=t: front.post(t)) for t in front.members[:3] * 2]
    front.gate.set()
    answers = await asyncio.gather(held, *queued)
    assert [a.status_code for a in answers] == [201] * 7, [a.text for a in answers]
    assert (front.writer.batches, front.writer.batched_rows) == (1, 6)
    ids = {a.json()["id"] for a in answers}
    assert len(ids) == 7
    found = await pool.fetchval("SELECT count(*) FROM jobs WHERE id = ANY($1::text[])", list(ids))
    assert found == 7
    assert await _stored(pool) == (4 + 7, 4 + 7)
    assert await _history(pool) == 4 + 7
    for answer in answers[1:]:
        view = (await front.client.get(answer.headers["Location"], headers=_auth(front))).json()
        assert view["status"] == "QUEUED"
        assert view["history"][0]["at"] == view["submitted_at"] == answer.json()["submitted_at"]


def _auth(front: Front) -> dict[str, str]:
    return {"Authorization": f"Bearer {front.members[0]}"}


async def test_a_row_whose_token_was_revoked_meanwhile_is_not_stored(
    front: Front, pool: asyncpg.Pool
) -> None:
    first, revoked, third = front.members[:3]
    held = await front.hold_one_write()
    queued = [await front.queue(lambda t=t: front.post(t)) for t in (first, revoked, third)]
    await _revoke(pool, revoked)
    front.gate.set()
    answers = await asyncio.gather(held, *queued)
    assert [a.status_code for a in answers] == [201, 201, 401, 201], [a.text for a in answers]
    assert (front.writer.batches, front.writer.batched_rows) == (1, 3)
    assert await _stored(pool) == (4 + 3, 4 + 3)


@pytest.mark.parametrize("front", [{"max_rows": 2}], indirect=True)
async def test_a_full_batch_does_not_wait_for_the_write_under_way(
    front: Front, pool: asyncpg.Pool
) -> None:
    held = await front.hold_one_write()
    first = await front.queue(lambda: front.post(front.members[0]))
    second = front.post(front.members[1])  # the queue is full: written at once
    answers = await asyncio.gather(first, second)
    assert [a.status_code for a in answers] == [201, 201]
    assert not held.done()
    front.gate.set()
    assert (await held).status_code == 201
    assert (front.writer.batches, front.writer.batched_rows) == (1, 2)
    assert await _stored(pool) == (4 + 3, 4 + 3)


async def test_a_repeated_idempotency_key_in_one_batch_answers_as_if_second(
    front: Front, pool: asyncpg.Pool
) -> None:
    alice, bob = front.members[:2]
    other = {**SPEC, "seed": 8}
    held = await front.hold_one_write()
    queued = [
        await front.queue(lambda: front.post(alice, key="k1")),
        await front.queue(lambda: front.post(alice, key="k1")),  # same spec: the replay
        await front.queue(lambda: front.post(bob, key="k1")),  # another user's key
        await front.queue(lambda: front.post(bob, other, key="k1")),  # another spec: 409
    ]
    front.gate.set()
    answers = await asyncio.gather(held, *queued)
    assert [a.status_code for a in answers] == [201, 201, 200, 201, 409], [a.text for a in answers]
    assert front.writer.batches == 1
    first, replay = answers[1].json(), answers[2].json()
    assert replay["id"] == first["id"]
    assert answers[2].headers["Location"] == f"/v1/jobs/{first['id']}"
    assert await _stored(pool) == (4 + 3, 4 + 3)


async def test_a_batch_that_fails_is_written_again_row_by_row(
    front: Front, pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(conn: asyncpg.Connection, submissions: Any) -> Any:
        return await conn.fetch("SELECT 1 / 0")  # the whole statement fails

    monkeypatch.setattr(repo, "insert_jobs_if_callers", broken)
    alice, revoked, carol = front.members[:3]
    held = await front.hold_one_write()
    queued = [
        await front.queue(lambda: front.post(alice, key="k1")),
        await front.queue(lambda: front.post(alice, key="k1")),
        await front.queue(lambda: front.post(revoked)),
        await front.queue(lambda: front.post(carol)),
    ]
    await _revoke(pool, revoked)
    front.gate.set()
    answers = await asyncio.gather(held, *queued)
    assert [a.status_code for a in answers] == [201, 201, 200, 401, 201], [a.text for a in answers]
    assert answers[2].json()["id"] == answers[1].json()["id"]
    assert front.writer.batches == 0
    assert await _stored(pool) == (4 + 3, 4 + 3)


async def test_a_batch_that_committed_but_lost_its_answer_answers_each_row_once(
    front: Front, pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The connection lost after the batch's commit: each row written again alone finds its
    own job already there (its job id, or its idempotency key) and answers with it; nothing
    is stored twice, no request fails."""
    batch = repo.insert_jobs_if_callers

    async def committed_then_lost(conn: asyncpg.Connection, submissions: Any) -> Any:
        await batch(conn, submissions)
        raise asyncpg.ConnectionDoesNotExistError("connection was closed in the middle")

    monkeypatch.setattr(repo, "insert_jobs_if_callers", committed_then_lost)
    alice, bob = front.members[:2]
    held = await front.hold_one_write()
    queued = [
        await front.queue(lambda: front.post(alice)),
        await front.queue(lambda: front.post(bob, key="k1")),
    ]
    front.gate.set()
    answers = await asyncio.gather(held, *queued)
    assert [a.status_code for a in answers] == [201, 201, 200], [a.text for a in answers]
    assert await _stored(pool) == (4 + 3, 4 + 3)
    for answer in answers:
        view = await front.client.get(answer.headers["Location"], headers=_auth(front))
        assert view.status_code == 200


async def test_a_request_cancelled_while_queued_writes_nothing_and_holds_no_one(
    front: Front, pool: asyncpg.Pool
) -> None:
    alice, bob = front.members[:2]
    held = await front.hold_one_write()
    cancelled = await front.queue(lambda: front.post(alice, {**SPEC, "name": "cancelled"}))
    kept = await front.queue(lambda: front.post(bob))
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    assert front.writer.queued == 1
    front.gate.set()
    answers = await asyncio.gather(held, kept)
    assert [a.status_code for a in answers] == [201, 201]
    assert await _stored(pool) == (4 + 2, 4 + 2)
    assert not await pool.fetchval("SELECT count(*) FROM jobs WHERE name = 'cancelled'")
    # A batch of one is its own request's single-row write; the slot came back.
    again = await front.post(alice)
    assert again.status_code == 201


async def test_the_batch_statement_checks_and_stores_each_row(pool: asyncpg.Pool) -> None:
    """``repository.insert_jobs_if_callers`` on its own: per-row answers in order."""
    caller, now, month = await _batch_caller(pool)
    fresh: repo.ScreeningKey = (month, [], [], "[]")
    stale: repo.ScreeningKey = (month, ['x"\\'], [], "[]")

    def row(n: int, key: str | None, screening: repo.ScreeningKey) -> repo.Submission:
        job = (f"j{n}", "n", {"name": "n", "n": n}, key, now, None, "submitted", None)
        return caller, screening, job, (f"e{n}", "trainyard.job.submitted.x", b"{}", {"a": "b"})

    submissions = [row(1, "k", fresh), row(2, "k", fresh), row(3, None, stale), row(4, None, fresh)]
    async with pool.acquire() as conn:
        answers = await repo.insert_jobs_if_callers(conn, submissions)
    assert answers == [(True, True), (True, False), (False, False), (True, True)]
    stored = await pool.fetch("SELECT id, spec FROM jobs ORDER BY id")
    assert [(r["id"], r["spec"]) for r in stored] == [
        ("j1", {"name": "n", "n": 1}),
        ("j4", {"name": "n", "n": 4}),
    ]
    headers = await pool.fetch("SELECT event_id, headers FROM outbox ORDER BY seq")
    assert [(r["event_id"], r["headers"]) for r in headers] == [
        ("e1", {"a": "b"}),
        ("e4", {"a": "b"}),
    ]


async def test_a_batch_is_one_database_span_linked_to_its_requests(
    spans: InMemorySpanExporter, front: Front
) -> None:
    assert instrument_database(trace.get_tracer_provider())
    held = await front.hold_one_write()
    queued = [await front.queue(lambda t=t: front.post(t)) for t in front.members[:3]]
    front.gate.set()
    answers = await asyncio.gather(held, *queued)
    assert [a.status_code for a in answers] == [201] * 4
    traces = [a.json()["trace_id"] for a in answers]
    finished = spans.get_finished_spans()
    [batch] = [s for s in finished if s.name == "submission group commit"]
    assert batch.parent is None and batch.context is not None
    assert (batch.attributes or {})["trainyard.group_commit.rows"] == 3
    assert sorted(format(link.context.trace_id, "032x") for link in batch.links) == sorted(
        traces[1:]
    )
    client = [s for s in finished if s.kind is SpanKind.CLIENT and s.context is not None]
    [statement] = [s for s in client if s.parent and s.parent.span_id == batch.context.span_id]
    assert statement.context is not None
    assert statement.context.trace_id == batch.context.trace_id
    by_trace = {format(s.context.trace_id, "032x") for s in client if s.context is not None}
    assert traces[0] in by_trace  # written alone: its statement is in its request's trace
    assert not by_trace & set(traces[1:])  # batched: no database span in theirs


async def _batch_caller(pool: asyncpg.Pool) -> tuple[repo.CallerKey, Any, str]:
    """An admin's caller key (``bootstrap_user``), the database's now and this month."""
    await identity.bootstrap_user(pool, "ml", "alice")
    token = await pool.fetchrow(
        "SELECT k.token_hash, k.id, u.id AS user_id, u.team_id FROM tokens k "
        "JOIN users u ON u.id = k.user_id"
    )
    assert token is not None
    caller = (token["token_hash"], token["id"], token["user_id"], token["team_id"], "admin")
    now = await pool.fetchval("SELECT now()")
    month = await pool.fetchval("SELECT to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM')")
    return caller, now, month


def _submission(
    caller: repo.CallerKey,
    screening: repo.ScreeningKey,
    job_id: str,
    now: Any,
    spec: dict[str, Any] | None = None,
    key: str | None = None,
) -> repo.Submission:
    job = (job_id, "n", spec or {"name": "n"}, key, now, None, "submitted", None)
    return caller, screening, job, (f"e-{job_id}", "trainyard.job.submitted.x", b"{}", {})


async def test_the_batch_holds_a_screening_whatever_its_flavor_names(pool: asyncpg.Pool) -> None:
    """The declared and retired flavors travel as array literals: every name a flavor can
    have (quotes, backslashes, braces, commas, blanks, 'NULL', the empty name, non-ASCII) must
    read back as itself, or the screening of every row with it would never hold."""
    caller, now, month = await _batch_caller(pool)
    names = ['a"b', "c\\d", "\\", '"', "{e,f}", " g ", "NULL", "null", "", "h i", "é✓𝄞", "'"]
    for n, name in enumerate(names):
        await pool.execute(
            "INSERT INTO flavor_replica (name, revision, retired, changed_at) "
            "VALUES ($1, 1, $2, now())",
            name,
            n % 3 == 0,
        )
    row = await pool.fetchrow(f"SELECT {screening_columns('$1', '$2')}", "ml", month)
    assert row is not None
    declared, retired = sorted(row["screen_declared"]), sorted(row["screen_retired"])
    assert sorted(declared + retired) == sorted(names)
    screening: repo.ScreeningKey = (month, declared, retired, row["screen_budgets"])
    async with pool.acquire() as conn:
        alone = await repo.insert_job_if_caller(conn, *_submission(caller, screening, "j0", now))
        batch = [_submission(caller, screening, f"j{n}", now) for n in (1, 2)]
        answers = await repo.insert_jobs_if_callers(conn, batch)
    assert alone == (True, True)
    assert answers == [(True, True), (True, True)]


async def test_the_batch_stores_each_spec_as_the_single_row_statement_does(
    pool: asyncpg.Pool,
) -> None:
    """The batch sends the spec as JSON text cast to jsonb, the single row through the pool's
    jsonb codec: the same value stored for numbers, non-ASCII and escapes."""
    caller, now, month = await _batch_caller(pool)
    screening: repo.ScreeningKey = (month, [], [], "[]")
    specs: list[dict[str, Any]] = [
        {"name": "big", "n": 2**70, "m": -(2**63), "z": 0, "neg": -0.0},
        {"name": "floats", "a": 1e-05, "b": 1.5e300, "c": 0.1, "d": 5e-324, "e": 1.0},
        {"name": "text", "s": "é✓𝄞 \u2028\u00a0", "q": 'a"b\\c/</script>\n\t\r\b\f'},
        {"name": "nested", "x": [[], {}, [1, [2, {"k": None, "t": True}]]], "": "empty key"},
    ]
    async with pool.acquire() as conn:
        for n, spec in enumerate(specs):
            await repo.insert_job_if_caller(
                conn, *_submission(caller, screening, f"a{n}", now, spec)
            )
        batch = [_submission(caller, screening, f"b{n}", now, spec) for n, spec in enumerate(specs)]
        assert await repo.insert_jobs_if_callers(conn, batch) == [(True, True)] * len(specs)
    stored = {r["id"]: r for r in await pool.fetch("SELECT id, spec, spec::text AS text FROM jobs")}
    for n in range(len(specs)):
        alone, batched = stored[f"a{n}"], stored[f"b{n}"]
        assert batched["text"] == alone["text"]
        assert batched["spec"] == alone["spec"]


async def test_the_batch_stores_the_first_in_arrival_order_not_in_id_order(
    pool: asyncpg.Pool,
) -> None:
    """A full batch whose job ids sort against arrival order, each key used twice and far
    apart: the first of each pair (in arrival order) is the one stored."""
    caller, now, month = await _batch_caller(pool)
    screening: repo.ScreeningKey = (month, [], [], "[]")
    batch = [
        _submission(caller, screening, f"j{99 - n:02d}", now, {"name": "n", "n": n}, f"k{n % 32}")
        for n in range(64)
    ]
    async with pool.acquire() as conn:
        answers = await repo.insert_jobs_if_callers(conn, batch)
    assert answers == [(True, True)] * 32 + [(True, False)] * 32
    stored = await pool.fetch("SELECT idempotency_key, spec FROM jobs")
    assert {r["idempotency_key"]: r["spec"]["n"] for r in stored} == {f"k{n}": n for n in range(32)}


async def test_two_batches_with_one_users_keys_crossed_do_not_deadlock(
    pool: asyncpg.Pool,
) -> None:
    """Two batches under way at once (a full queue starts a second), one user's two keys in
    opposite orders in them: each waits for the other's key only if it inserts in arrival
    order. A transaction holding a third key makes the waits happen in that order, without
    timing."""
    caller, now, month = await _batch_caller(pool)
    screening: repo.ScreeningKey = (month, [], [], "[]")

    def rows(*pairs: tuple[str, str]) -> list[repo.Submission]:
        return [_submission(caller, screening, job, now, key=key) for job, key in pairs]

    async def waiting(conn: asyncpg.Connection) -> bool:
        pid = conn.get_server_pid()
        query = "SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1"
        return bool(await pool.fetchval(query, pid) == "Lock")

    async with pool.acquire() as c0, pool.acquire() as c1, pool.acquire() as c2:
        holding = c0.transaction()
        await holding.start()
        await repo.insert_job_if_caller(c0, *_submission(caller, screening, "z0", now, key="Z"))
        first = asyncio.create_task(
            repo.insert_jobs_if_callers(c1, rows(("x1", "X"), ("z1", "Z"), ("y1", "Y")))
        )
        await eventually(lambda: waiting(c1), 30)  # on Z, X (and, sorted, Y) inserted
        second = asyncio.create_task(
            repo.insert_jobs_if_callers(c2, rows(("y2", "Y"), ("x2", "X")))
        )
        await eventually(lambda: waiting(c2), 30)
        await holding.rollback()
        answers = await asyncio.gather(first, second, return_exceptions=True)
    assert answers == [[(True, True)] * 3, [(True, False)] * 2]

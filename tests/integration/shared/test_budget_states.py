"""``shared.budget_states.keep``: the one upsert of a ``budget.updated`` into a service's
replica (the scheduler's ``budget_states`` and submission's ``budget_replica`` each had
their own copy of it), on PostgreSQL: the highest revision stays, whatever order the
states come in."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime

import asyncpg
import pytest

from trainyard_platform.shared.budget_states import FIELDS, OPTIONAL, keep
from trainyard_platform.shared.events import Envelope, parse_envelope
from trainyard_platform.shared.events.payloads import BudgetUpdated

pytestmark = pytest.mark.integration

COLUMNS = """team text NOT NULL, project text NOT NULL, month text NOT NULL,
    amount text NOT NULL, spent text NOT NULL, currency text NOT NULL, policy text NOT NULL,
    {extra} exhausted boolean NOT NULL, deleted boolean NOT NULL, revision bigint NOT NULL,
    PRIMARY KEY (team, project)"""


def state(revision: int, **changes: object) -> BudgetUpdated:
    fields: dict[str, object] = {
        "team": "ml",
        "month": "2026-12",
        "amount": "100",
        "spent": "10",
        "currency": "EUR",
        "policy": "refuse",
        "exhausted": False,
        "revision": revision,
        **changes,
    }
    return BudgetUpdated.model_validate(fields)


async def test_the_highest_revision_is_kept_whatever_the_order(pool: asyncpg.Pool) -> None:
    await pool.execute(
        f"CREATE TABLE replica ({COLUMNS.format(extra='on_exhausted text NOT NULL,')})"
    )
    async with pool.acquire() as conn:
        assert await keep(conn, "replica", state(5, on_exhausted="stop")) is True
        assert await keep(conn, "replica", state(5, spent="99")) is False  # redelivered
        assert await keep(conn, "replica", state(3, amount="1")) is False  # older
        assert await keep(conn, "replica", state(7, project="vision", spent="1")) is True
        assert await keep(conn, "replica", state(9, spent="100", exhausted=True)) is True
    rows = await pool.fetch("SELECT * FROM replica ORDER BY project")
    assert [dict(r) for r in rows] == [
        {
            "team": "ml",
            "project": "",  # the team's own budget
            "month": "2026-12",
            "amount": "100",
            "spent": "100",
            "currency": "EUR",
            "policy": "refuse",
            "on_exhausted": "finish",  # as revision 9 said
            "exhausted": True,
            "deleted": False,
            "revision": 9,
        },
        {
            "team": "ml",
            "project": "vision",
            "month": "2026-12",
            "amount": "100",
            "spent": "1",
            "currency": "EUR",
            "policy": "refuse",
            "on_exhausted": "finish",
            "exhausted": False,
            "deleted": False,
            "revision": 7,
        },
    ]


async def test_a_replica_keeps_only_the_fields_it_names(pool: asyncpg.Pool) -> None:
    await pool.execute(f"CREATE TABLE narrow ({COLUMNS.format(extra='')})")
    fields = [f for f in FIELDS if f != "on_exhausted"]
    async with pool.acquire() as conn:
        assert await keep(conn, "narrow", state(2, on_exhausted="stop"), fields) is True
        assert await keep(conn, "narrow", state(4, deleted=True), fields) is True
        for table, names in (("narrow; DROP TABLE narrow", fields), ("narrow", ["colour"])):
            with pytest.raises(ValueError):
                await keep(conn, table, state(6), names)
    row = await pool.fetchrow("SELECT deleted, revision FROM narrow")
    assert row is not None and (row["deleted"], row["revision"]) == (True, 4)


async def test_a_state_with_unreadable_rates_is_kept_with_the_rates_the_row_had(
    pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture
) -> None:
    """A ``budget.updated`` whose rates do not validate (``rates_unread``) was refused whole,
    and the replica kept the state before it: a budget that became spent held nothing. It is
    kept now, every other field with it, and the row keeps the rates it had (a new row none:
    it reserves nothing), with a warning naming the budget, the field and why."""
    await pool.execute(
        f"CREATE TABLE reserving ({COLUMNS.format(extra='on_exhausted text, rates jsonb,')})"
    )
    fields = (*FIELDS, "rates")
    readable = {"a100": {"gpu_hour": "2.5", "cpu_hour": "0", "memory_gib_hour": "0"}}
    unreadable = {"a100": {"gpu_hour": "2.5e3"}}
    async with pool.acquire() as conn:
        assert await keep(conn, "reserving", state(3, rates=readable), fields) is True
        spent = read(state(5, spent="100", exhausted=True), rates=unreadable)
        assert await keep(conn, "reserving", spent, fields) is True
        new = read(state(6, project="nlp", exhausted=True), rates=unreadable)
        assert await keep(conn, "reserving", new, fields) is True
    rows = await pool.fetch(
        "SELECT project, exhausted, spent, rates, revision FROM reserving ORDER BY project"
    )
    assert [
        (r["project"], r["exhausted"], r["spent"], r["rates"], r["revision"]) for r in rows
    ] == [("", True, "100", readable, 5), ("nlp", True, "10", None, 6)]
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 2
    assert "budget of team ml revision 5: kept without its rates" in warned[0]
    assert "rates.a100.gpu_hour: must match the pattern" in warned[0]


def read(fresh: BudgetUpdated, **data: object) -> BudgetUpdated:
    """``fresh`` as a consumer reads it off the wire, with ``data`` changed in its payload."""
    raw = json.loads(Envelope.wrap(fresh, source="trainyard/billing", subject="ml").to_json())
    raw["data"].update(data)
    parsed = parse_envelope(json.dumps(raw).encode()).data
    assert isinstance(parsed, BudgetUpdated)
    return parsed


async def test_the_optional_fields_are_kept_as_json_and_an_instant(pool: asyncpg.Pool) -> None:
    """``rates`` and ``accruing`` in ``jsonb`` columns, ``spent_at`` in a ``timestamptz``
    one; a state without them keeps nulls (a state said before they existed)."""
    extra = "rates jsonb, spent_at timestamptz, accruing jsonb,"
    await pool.execute(f"CREATE TABLE wide ({COLUMNS.format(extra=extra)})")
    names = tuple(f for f in (*FIELDS, *OPTIONAL) if f != "on_exhausted")
    at = datetime(2026, 12, 7, 8, 30, 0, 123456, tzinfo=UTC)
    said = state(2, spent_at=at, accruing=["a-1", "a-2"], rates={"a100": {"gpu_hour": "2.5"}})
    async with pool.acquire() as conn:
        assert await keep(conn, "wide", said, names) is True
        row = await conn.fetchrow("SELECT rates, spent_at, accruing FROM wide")
        assert row is not None
        assert dict(row) == {
            "rates": {"a100": {"gpu_hour": "2.5", "cpu_hour": "0", "memory_gib_hour": "0"}},
            "spent_at": at,
            "accruing": ["a-1", "a-2"],
        }
        assert await keep(conn, "wide", state(3), names) is True
        row = await conn.fetchrow("SELECT rates, spent_at, accruing FROM wide")
        assert row is not None and tuple(row) == (None, None, None)

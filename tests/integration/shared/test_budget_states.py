"""``shared.budget_states.keep``: the one upsert of a ``budget.updated`` into a service's
replica (the scheduler's ``budget_states`` and submission's ``budget_replica`` each had
their own copy of it), on PostgreSQL: the highest revision stays, whatever order the
states come in."""

from __future__ import annotations

from datetime import UTC, datetime

import asyncpg
import pytest

from trainyard_platform.shared.budget_states import FIELDS, OPTIONAL, keep
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

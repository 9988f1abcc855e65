"""Billing's SQL for its replica of the flavor catalogue and its dated price book (tables
``flavors``, ``prices`` (per GPU-hour) and ``resource_prices`` (per CPU-hour and GiB-hour of
memory) of the ``billing`` schema). One function per query."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from decimal import Decimal
from typing import Any

import asyncpg

from trainyard_platform.services.billing.domain import Price
from trainyard_platform.services.billing.prices import (
    BEGINNING,
    DatedPrice,
    DatedResourcePrice,
    PriceSchedule,
    Resource,
)

Row = Mapping[str, Any]


async def apply_flavor(
    conn: asyncpg.Connection,
    name: str,
    description: str,
    revision: int,
    retired: bool,
    at: datetime,
) -> bool:
    """Record the catalogue's change of ``name`` unless a later revision is held; True when
    it was applied."""
    applied = await conn.fetchval(
        """INSERT INTO flavors (name, description, revision, retired, changed_at)
           VALUES ($1, $2, $3, $4, $5)
           ON CONFLICT (name) DO UPDATE SET description = EXCLUDED.description,
               revision = EXCLUDED.revision, retired = EXCLUDED.retired,
               changed_at = EXCLUDED.changed_at
           WHERE flavors.revision < EXCLUDED.revision
           RETURNING true""",
        name,
        description,
        revision,
        retired,
        at,
    )
    return bool(applied)


async def flavors(conn: asyncpg.Connection) -> list[Row]:
    rows: list[Row] = await conn.fetch(
        "SELECT name, description, revision, retired, changed_at FROM flavors ORDER BY name"
    )
    return rows


async def flavor(conn: asyncpg.Connection, name: str) -> Row | None:
    row: Row | None = await conn.fetchrow(
        "SELECT name, description, revision, retired, changed_at FROM flavors WHERE name = $1",
        name,
    )
    return row


async def seed_prices(conn: asyncpg.Connection, prices: Iterable[Price], now: datetime) -> int:
    """Give each of ``prices`` from the beginning to its flavor when the flavor has no price
    at all (the bootstrap of a fresh install); return how many were given."""
    seeded = 0
    for p in prices:
        done = await conn.fetchval(
            """INSERT INTO prices (flavor, effective_from, price_per_gpu_hour, currency,
                                   set_by, recorded_at)
               SELECT $1, $2, $3, $4, 'settings', $5
               WHERE NOT EXISTS (SELECT 1 FROM prices WHERE flavor = $1)
               RETURNING true""",
            p.flavor,
            BEGINNING,
            p.per_gpu_hour,
            p.currency,
            now,
        )
        seeded += bool(done)
    return seeded


async def currencies(conn: asyncpg.Connection) -> tuple[dict[str, int], dict[str, int]]:
    """How many prices (GPU, CPU and memory) and how many budgets there are per currency."""
    book = await conn.fetch(
        """SELECT currency, count(*) AS n FROM (
               SELECT currency FROM prices UNION ALL SELECT currency FROM resource_prices) p
            GROUP BY currency"""
    )
    budgets = await conn.fetch("SELECT currency, count(*) AS n FROM budgets GROUP BY currency")
    return {r["currency"]: r["n"] for r in book}, {r["currency"]: r["n"] for r in budgets}


async def set_price(
    conn: asyncpg.Connection,
    flavor: str,
    effective_from: datetime,
    per_gpu_hour: Decimal,
    currency: str,
    by: str,
    now: datetime,
) -> bool:
    """Add a price taking effect at ``effective_from`` (after ``now``: the caller checks);
    a price already set for that flavor and instant, which has not taken effect yet either,
    is replaced. True when it was new."""
    created: bool = await conn.fetchval(
        """INSERT INTO prices (flavor, effective_from, price_per_gpu_hour, currency, set_by,
                               recorded_at)
           VALUES ($1, $2, $3, $4, $5, $6)
           ON CONFLICT (flavor, effective_from) DO UPDATE SET
               price_per_gpu_hour = EXCLUDED.price_per_gpu_hour, set_by = EXCLUDED.set_by,
               recorded_at = EXCLUDED.recorded_at
           RETURNING xmax = 0""",
        flavor,
        effective_from,
        per_gpu_hour,
        currency,
        by,
        now,
    )
    return created


async def set_resource_price(
    conn: asyncpg.Connection,
    flavor: str,
    resource: Resource,
    effective_from: datetime,
    per_unit_hour: Decimal,
    currency: str,
    by: str,
    now: datetime,
) -> bool:
    """``set_price`` for a flavor's CPU (``cpu``) or memory (``memory``) price."""
    created: bool = await conn.fetchval(
        """INSERT INTO resource_prices (flavor, resource, effective_from, price_per_unit_hour,
                                        currency, set_by, recorded_at)
           VALUES ($1, $2, $3, $4, $5, $6, $7)
           ON CONFLICT (flavor, resource, effective_from) DO UPDATE SET
               price_per_unit_hour = EXCLUDED.price_per_unit_hour, set_by = EXCLUDED.set_by,
               recorded_at = EXCLUDED.recorded_at
           RETURNING xmax = 0""",
        flavor,
        resource,
        effective_from,
        per_unit_hour,
        currency,
        by,
        now,
    )
    return created


async def resource_price_rows(conn: asyncpg.Connection, flavor: str | None = None) -> list[Row]:
    rows: list[Row] = await conn.fetch(
        "SELECT flavor, resource, effective_from, price_per_unit_hour, currency, set_by, "
        "recorded_at FROM resource_prices WHERE $1::text IS NULL OR flavor = $1 "
        "ORDER BY flavor, resource, effective_from",
        flavor,
    )
    return rows


PriceKey = tuple[str, datetime, int]
"""A row's place in the price book's listing: flavor, effective_from, resource rank."""


async def price_book_page(
    conn: asyncpg.Connection,
    flavor: str | None,
    now: datetime,
    limit: int | None,
    after: PriceKey | None,
) -> list[Row]:
    """At most ``limit`` (None: every one) prices of the book (of ``flavor``, or every one), GPU, CPU and
    memory alike, by flavor, date and resource (``rank``: GPU 0, CPU 1, memory 2), after the
    key ``after``; each with ``in_force``: whether it is its resource's price at ``now``."""
    rows: list[Row] = await conn.fetch(
        """WITH book AS (
               SELECT flavor, 'gpu' AS resource, 0 AS rank, effective_from,
                      price_per_gpu_hour AS price, currency, set_by,
                      (SELECT max(o.effective_from) FROM prices o
                        WHERE o.flavor = p.flavor AND o.effective_from <= $2) AS current
                 FROM prices p
               UNION ALL
               SELECT flavor, resource, CASE resource WHEN 'cpu' THEN 1 ELSE 2 END,
                      effective_from, price_per_unit_hour, currency, set_by,
                      (SELECT max(o.effective_from) FROM resource_prices o
                        WHERE o.flavor = r.flavor AND o.resource = r.resource
                          AND o.effective_from <= $2)
                 FROM resource_prices r)
           SELECT flavor, resource, rank, effective_from, price, currency, set_by,
                  (effective_from = current) IS TRUE AS in_force
             FROM book
            WHERE ($1::text IS NULL OR flavor = $1)
              AND ($4::text IS NULL
                   OR (flavor, effective_from, rank) > ($4::text, $5::timestamptz, $6::int))
            ORDER BY flavor, effective_from, rank
            LIMIT $3""",
        flavor,
        now,
        limit,
        *(after if after else (None, None, None)),
    )
    return rows


async def lock_prices(conn: asyncpg.Connection, flavor: str) -> None:
    """Hold ``flavor``'s prices alone until the transaction ends: a price change reads them
    (its ``If-Match``) and writes them in turn with any other, and after every bill being
    made by them has committed (``hold_prices``)."""
    await conn.execute(
        "SELECT pg_advisory_xact_lock(hashtextextended('billing:prices:' || $1, 0))", flavor
    )


async def lock_new_flavors(conn: asyncpg.Connection) -> None:
    """Price a new flavor alone until the transaction ends: the book's count of flavors
    (``priced_flavors``) is read and grown in turn with any other new flavor, so two at once
    cannot both pass its bound."""
    await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended('billing:new-flavor', 0))")


async def priced_flavors(conn: asyncpg.Connection) -> int:
    """How many flavors have a GPU price (each one of the ``rates`` a budget says)."""
    count: int = await conn.fetchval("SELECT count(DISTINCT flavor) FROM prices")
    return count


async def hold_prices(conn: asyncpg.Connection, flavor: str) -> None:
    """Hold ``flavor``'s prices unchanged until the transaction ends (shared with other
    bills, exclusive of a price change, ``lock_prices``): a bill made by the book it reads
    commits before a change of the flavor's prices is made, or is made by the changed book.
    So no bill priced by the old book can commit after a change that reprices its time."""
    await conn.execute(
        "SELECT pg_advisory_xact_lock_shared(hashtextextended('billing:prices:' || $1, 0))",
        flavor,
    )


async def billed_until(conn: asyncpg.Connection, flavor: str, after: datetime) -> datetime | None:
    """The latest end of ``flavor``'s usage billed in the ledger, when it is after ``after``
    (an allocation released by a scheduler whose clock is ahead); else None. Read under
    ``lock_prices``, so every bill made by the current prices is counted."""
    until: datetime | None = await conn.fetchval(
        "SELECT max(ended_at) FROM ledger_entries WHERE ended_at > $2 AND gpu_flavor = $1",
        flavor,
        after,
    )
    return until


async def price_rows(conn: asyncpg.Connection, flavor: str | None = None) -> list[Row]:
    rows: list[Row] = await conn.fetch(
        "SELECT flavor, effective_from, price_per_gpu_hour, currency, set_by, recorded_at "
        "FROM prices WHERE $1::text IS NULL OR flavor = $1 ORDER BY flavor, effective_from",
        flavor,
    )
    return rows


async def schedule(conn: asyncpg.Connection, flavor: str | None = None) -> PriceSchedule:
    """The dated price book (of one flavor, or all): GPU, CPU and memory prices, read in one
    statement, so from one snapshot whatever the transaction's isolation: a price change
    committing meanwhile (``lock_prices``; it may change a flavor's GPU and CPU prices
    together) is in the book whole or not at all, never its GPU price without its CPU price."""
    rows = await conn.fetch(
        """SELECT flavor, NULL::text AS resource, effective_from,
                  price_per_gpu_hour AS price, currency
             FROM prices WHERE $1::text IS NULL OR flavor = $1
           UNION ALL
           SELECT flavor, resource, effective_from, price_per_unit_hour, currency
             FROM resource_prices WHERE $1::text IS NULL OR flavor = $1
           ORDER BY 1, 2 NULLS FIRST, 3""",
        flavor,
    )
    return PriceSchedule.of(
        (
            DatedPrice(r["effective_from"], Price(r["flavor"], Decimal(r["price"]), r["currency"]))
            for r in rows
            if r["resource"] is None
        ),
        (
            DatedResourcePrice(
                r["flavor"], r["resource"], r["effective_from"], Decimal(r["price"]), r["currency"]
            )
            for r in rows
            if r["resource"] is not None
        ),
    )

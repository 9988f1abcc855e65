"""Billing's composition root: ``serve(settings)`` runs it until SIGTERM."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path

import asyncpg

from trainyard_platform.services.billing import budget_watch
from trainyard_platform.services.billing import budgets_repository as budgets_repo
from trainyard_platform.services.billing import catalogue_repository as catalogue
from trainyard_platform.services.billing import ledger_repository as ledger
from trainyard_platform.services.billing.api import create_app
from trainyard_platform.services.billing.budget_accrual import BudgetAccrual
from trainyard_platform.services.billing.budgets import Budget
from trainyard_platform.services.billing.config import Settings
from trainyard_platform.services.billing.domain import PriceBook
from trainyard_platform.services.billing.handlers import SUBJECTS, BillingHandlers
from trainyard_platform.services.billing.metrics import billing_readings
from trainyard_platform.services.billing.prices import currency_refusal
from trainyard_platform.shared.access import guard_for
from trainyard_platform.shared.bus import Bus
from trainyard_platform.shared.db import migrate, open_pool, ping
from trainyard_platform.shared.deadletters import deadletter_routes
from trainyard_platform.shared.events.payloads import MAX_PRICED_FLAVORS
from trainyard_platform.shared.inbox import idempotent
from trainyard_platform.shared.outbox import OutboxRelay
from trainyard_platform.shared.retention import Retention
from trainyard_platform.shared.runtime import ServiceRuntime, StartupRefused
from trainyard_platform.shared.settings import DatabaseSettings

log = logging.getLogger(__name__)

NAME = "billing"
MIGRATIONS = Path(__file__).parent / "migrations"


async def seed_prices(pool: asyncpg.Pool, settings: Settings) -> None:
    """Give the configured prices, from the beginning, to flavors the price book has no
    price for (see ``Settings.prices``); prices already there are kept. ``StartupRefused``
    (one line: ``prices.currency_refusal``) when the book or the budgets hold another
    currency than ``settings.currency``: the setting changed on a running installation, or
    when the flavors it would price take the book past ``MAX_PRICED_FLAVORS`` (nothing is
    seeded then; the price API keeps the bound too)."""
    book = PriceBook.from_settings(settings.prices, settings.currency)
    async with pool.acquire() as conn, conn.transaction():
        refusal = currency_refusal(settings.currency, *await catalogue.currencies(conn))
        if refusal is not None:
            raise StartupRefused(refusal)
        seeded = await catalogue.seed_prices(conn, book.prices.values(), datetime.now(UTC))
        flavors = await catalogue.priced_flavors(conn)
        if seeded and flavors > MAX_PRICED_FLAVORS:
            raise StartupRefused(
                f"TRAINYARD_BILLING_PRICES would price {seeded} new flavors, {flavors} in all: "
                f"the price book holds at most {MAX_PRICED_FLAVORS} (each budget that reserves "
                "says the rates of every one in one event); list fewer new flavors"
            )
    if seeded:
        log.info("price book: %d flavors priced from the settings", seeded)


SAY_AT_START_BATCH = 100
"""How many budgets one transaction of ``say_budgets`` says (and holds the scopes of)."""


async def say_budgets(pool: asyncpg.Pool, batch: int = SAY_AT_START_BATCH) -> None:
    """Say every budget's state again (``budget_watch.say_again``), once per start, a
    ``batch`` of budgets per transaction (each holds its budgets' scopes: a bounded number of
    locks, and bills wait for one batch at most): a replica's rows kept before it gained a
    field (submission's and the scheduler's ``rates``) hold it once the outbox relays these,
    with no bill or change needed. Each is said with the next revision, so no replica drops
    it as old. A batch with a budget that reserves under a book priced past
    ``MAX_PRICED_FLAVORS`` (before it was bounded) is rolled back whole, none of its budgets
    said, and logged at error level with their number and what to do; the start goes on
    (bills are kept whatever the book: ``budget_watch.say_state_or_log``)."""
    said, after = 0, None
    while True:
        async with pool.acquire() as conn:
            page: list[Budget] = []
            try:
                async with conn.transaction():
                    page = await budgets_repo.of_teams(conn, None, limit=batch, after=after)
                    said += await budget_watch.say_again(conn, page, datetime.now(UTC))
            except budget_watch.BookTooLarge as exc:
                # Raised out of the transaction, which rolls back every state the batch
                # said before it: the count logged is exact.
                log.error("budgets: %d not said again at start: %s", len(page), exc)
        if len(page) < batch:
            break
        after = (page[-1].team, page[-1].project or "")
    if said:
        log.info("budgets: the state of %d said again at start", said)


async def ensure_rollups(database: DatabaseSettings) -> None:
    """Build the rollups from the ledger when they are stale (``ledger.rollups_stale``: the
    ledger has entries and they have none, the first start after the migration that turned
    earlier bills into ledger entries; or a migration marked them stale).

    Runs on a pool of its own whose statements have no time bound
    (``open_pool(long_statements=True)``): a rebuild reads the whole ledger, and a replica
    starting beside one waits on the rollups' lock until it commits, either of which may
    outlast ``TRAINYARD_DATABASE_QUERY_TIMEOUT_SECONDS`` and would fail every start."""
    async with (
        open_pool(database, NAME, long_statements=True) as pool,
        pool.acquire() as conn,
        conn.transaction(),
    ):
        if await ledger.rollups_stale(conn):
            log.info("cost rollups are stale: rebuilding them from the ledger")
            folded = await ledger.rebuild_rollups(conn)
            log.info("cost rollups built from %d ledger entries", folded)


async def prepare(pool: asyncpg.Pool, settings: Settings) -> None:
    """What billing's start does once migrated, before it listens, in this order: the
    price book seeded (``seed_prices``), the cost rollups rebuilt when stale
    (``ensure_rollups``), then every budget's state said again (``say_budgets``). The
    states read what is spent from those rollups: said before the rebuild (rollups stale,
    or none yet beside a ledger), a spent budget would be said unspent, with a revision
    every replica keeps, and hold nothing until its next bill or change."""
    await seed_prices(pool, settings)
    await ensure_rollups(settings.database)
    await say_budgets(pool)


async def serve(settings: Settings) -> int:
    async with ServiceRuntime(NAME, settings) as rt:
        pool = await rt.open_pool(settings.database, NAME)
        await migrate(pool, NAME, MIGRATIONS)
        await prepare(pool, settings)
        bus = await rt.resources.enter_async_context(Bus.connect(settings.nats, NAME))
        rt.add_readiness_check("database", lambda: ping(pool))
        rt.add_readiness_check("nats", bus.ping)
        handlers = BillingHandlers()
        rt.spawn(OutboxRelay(pool, bus).run(rt.stopping), "outbox-relay")
        rt.spawn(
            Retention(
                pool,
                settings.nats.retention_hours,
                audit_days=settings.audit_retention_days,
            ).run(rt.stopping),
            "retention",
        )
        rt.spawn(BudgetAccrual(pool).run(rt.stopping), "budget-accrual")
        rt.spawn(
            bus.consume_batches(
                NAME,
                SUBJECTS,
                idempotent(pool, NAME, handlers.dispatch),
                rt.stopping,
            ),
            "events",
        )
        billing_readings(rt.sample_metrics(bus, NAME, pool), pool)
        guard = await rt.resources.enter_async_context(guard_for(settings))
        routes = [*rt.health_handlers(), *deadletter_routes(bus, NAME, pool)]
        return await rt.run(
            create_app(
                pool,
                guard,
                routes,
                settings.cors_origins,
                settings.currency,
            )
        )

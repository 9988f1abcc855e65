"""Budgets watched as bills are made: thresholds crossed, and the state submission keeps.

Contract:
- ``after_charges(conn, entries, now)`` runs in the transaction that appended ``entries``
  (and their rollups): for each budget of the entries' teams (the team's, and the project's
  of an entry) and each UTC month the entries touch, every threshold the month's spending
  has reached and that was not recorded yet is recorded (``budget_crossings``, one row per
  budget, month and threshold) and said as ``budget.threshold_crossed`` with a fixed event
  id; then the budget's state is said (``budget.updated``). The primary key and the
  consumer's inbox make each crossing said once, under any redelivery. Spending that goes
  down (a reversal) un-crosses nothing; when the entries lower it (an attempt's charges
  moved to the platform), each budget's state is said, so a budget they had exhausted is
  said not to be. A budget the scheduler reserves against (``budgets.reserves``) is said
  after every bill of the current month while it was not said spent (``must_say``). The
  state is also said whenever the current month's spending makes the
  budget's state other than what was last said of that month (``state_changed``),
  whatever its thresholds: a budget without a threshold of 100 %, or raised after its
  thresholds were crossed this month, is still said exhausted once spent; one said spent
  by what its running allocations had accrued is said not spent when their bills come in
  smaller (an allocation billed up to its lost node's last heartbeat, before the check
  that counted it) or are the platform's (``recheck``, after a release the team pays
  nothing for).
- ``say_state(conn, budget, now, deleted=False)`` says a budget's state for the current
  month (after a change through the API, or a crossing): the amount, what is spent, whether
  it is exhausted (spent >= amount), its policy and ``on_exhausted``, with the next budget
  revision; for a budget the scheduler reserves against, the ``rates`` it reserves at (the
  book's highest prices per hour from ``now`` on), and which running allocations' accrued
  cost ``spent`` counts (``accruing``), with the instant it was measured (``spent_at``:
  ``now``). ``reserving(conn, now)`` says again the
  state of every such budget, in a price change's transaction; ``say_again(conn, budgets,
  now)`` says again the state of each of ``budgets`` (at billing's start, every budget, so
  replicas converge after an upgrade without waiting for a change or a bill), the price
  book read once for all (the rates, and what their running allocations have accrued).
- Under a book priced past ``MAX_PRICED_FLAVORS`` before the bound, the state of a budget
  that reserves cannot be said (``BookTooLarge``, raised before anything is said): a change
  through the API is refused with it (``governance_api``: 409), while a bill and the
  accrual check say the state with ``say_state_or_log``, which leaves it unsaid and logs
  why: a bill is never lost (nor dead-lettered) for a state it cannot say.
- Every transaction that says a budget's state holds the budget's scope
  (``budgets_repository.lock``) from before it reads the budget until it commits: a bill,
  a change or deletion through the API, the accrual check. So states are said in turns,
  each read after the one before committed, and the highest revision (what submission
  keeps) is always the budget as last changed, with every bill committed before it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from decimal import ROUND_CEILING, Decimal

import asyncpg

from trainyard_platform.services.billing import budgets_repository as repo
from trainyard_platform.services.billing import catalogue_repository as catalogue
from trainyard_platform.services.billing.budgets import (
    Budget,
    month_label,
    month_start,
    reached,
    reserves,
)
from trainyard_platform.services.billing.ledger import LedgerEntry
from trainyard_platform.services.billing.prices import PriceSchedule
from trainyard_platform.shared import outbox
from trainyard_platform.shared.events import Envelope, Payload
from trainyard_platform.shared.events.payloads import (
    MAX_ACCRUING,
    MAX_PRICED_FLAVORS,
    BudgetThresholdCrossed,
    BudgetUpdated,
    ReservationRates,
)

log = logging.getLogger(__name__)

SOURCE = "trainyard/billing"


def _months(entries: Sequence[LedgerEntry]) -> set[datetime]:
    months = set()
    for e in entries:
        start = month_start(e.started_at)
        last = month_start(max(e.started_at, e.ended_at - timedelta(microseconds=1)))
        while start <= last:
            months.add(start)
            start = month_start(start + timedelta(days=32))
    return months


async def after_charges(
    conn: asyncpg.Connection, entries: Sequence[LedgerEntry], now: datetime
) -> None:
    """Record and say the thresholds the new entries made budgets cross (module contract)."""
    scopes = {(e.team, None) for e in entries} | {
        (e.team, e.project) for e in entries if e.project is not None
    }
    months = sorted(_months(entries))
    lowered = sum((e.cost for e in entries), Decimal(0)) < 0
    await repo.lock(conn, scopes)  # read each budget after any change to it committed
    for team, project in sorted(scopes, key=lambda s: (s[0], s[1] or "")):
        budget = await repo.get(conn, team, project)
        if budget is None:
            continue
        crossed = await check(conn, budget, months, now)
        this_month = month_start(now) in months
        if crossed or lowered or (this_month and await must_say(conn, budget, now)):
            await say_state_or_log(conn, budget, now)


async def state_changed(conn: asyncpg.Connection, budget: Budget, now: datetime) -> bool:
    """Whether ``budget``'s state this month differs from what was last said of this month
    (nothing said: not exhausted), either way, so it must be said, a threshold crossed or
    not: exhausted now and said not, or said exhausted and not now. The latter happens with
    no charge lowered: what running allocations had accrued when the budget was said spent
    was counted up to that check, and a bill may come in smaller (a lost node's allocation
    is billed up to its last heartbeat) or not at all (the platform pays for an attempt
    that failed through it)."""
    month = month_start(now)
    said = await repo.said_exhausted(conn, budget, month)
    return said != (await repo.spent(conn, budget, month, now) >= budget.amount)


async def must_say(conn: asyncpg.Connection, budget: Budget, now: datetime) -> bool:
    """Whether a bill of this month must say ``budget``'s state though it crossed nothing:
    its state changed (``state_changed``), or the scheduler reserves against it
    (``reserves``) and it was not said spent: the scheduler stops reserving an allocation's
    worst case once it ends, and counts its bill from the state said after it
    (docs/scheduling.md, "Budgets that hold queued jobs"). A budget said spent holds its
    jobs whole; it is said again only when that changes."""
    if await state_changed(conn, budget, now):
        return True
    return reserves(budget) and not await repo.said_exhausted(conn, budget, month_start(now))


async def recheck(
    conn: asyncpg.Connection, scopes: Iterable[tuple[str, str | None]], now: datetime
) -> None:
    """Say the state of each budget of ``scopes`` (a team and a project, None for the
    team's) whose state this month is no longer what was last said (``state_changed``):
    after a change of its spending that is no charge, such as a running allocation the
    platform pays for, billed at last with nothing of the team's."""
    wanted = set(scopes)
    await repo.lock(conn, wanted)
    for team, project in sorted(wanted, key=lambda s: (s[0], s[1] or "")):
        budget = await repo.get(conn, team, project)
        if budget is not None and await state_changed(conn, budget, now):
            await say_state_or_log(conn, budget, now)


async def check(
    conn: asyncpg.Connection, budget: Budget, months: Sequence[datetime], now: datetime
) -> bool:
    """Record and say every threshold of ``budget`` reached in ``months`` and not recorded
    yet; True when there was one."""
    crossed_any = False
    for month in months:
        spent = await repo.spent(conn, budget, month, now)
        for threshold in reached(budget.amount, spent, budget.thresholds):
            if not await repo.record_crossing(conn, budget, month, threshold, spent, now):
                continue
            crossed_any = True
            label = month_label(month)
            crossed = BudgetThresholdCrossed(
                team=budget.team,
                project=budget.project,
                month=label,
                threshold_percent=threshold,
                amount=str(budget.amount),
                spent=str(spent),
                currency=budget.currency,
                policy=budget.policy,
                crossed_at=now,
            )
            event_id = f"budget:{budget.team}:{budget.project or ''}:{label}:{threshold}"
            await _say(conn, crossed, budget.team, event_id)
            log.info(
                "budget of %s%s: %s%% of %s %s reached in %s (spent %s)",
                budget.team,
                f"/{budget.project}" if budget.project else "",
                threshold,
                budget.amount,
                budget.currency,
                label,
                spent,
            )
    return crossed_any


async def say_state(
    conn: asyncpg.Connection,
    budget: Budget,
    now: datetime,
    deleted: bool = False,
    rates_now: Mapping[str, ReservationRates] | None = None,
    book: PriceSchedule | None = None,
) -> Decimal:
    """Say the budget's state this month (module contract); return what is spent.
    ``rates_now``: ``rates(conn, now)`` read already in this transaction, and ``book``: the
    price book read in it (a caller saying many budgets reads the book once); else they are
    read here when needed. ``BookTooLarge`` for a budget that reserves under a book past
    ``MAX_PRICED_FLAVORS``, raised before a revision is taken or anything is said."""
    month = month_start(now)
    reserved_against = not deleted and reserves(budget)
    said_rates = None
    if reserved_against:
        said_rates = dict(rates_now) if rates_now is not None else await rates(conn, now, book)
    spent, accruing = await repo.spent_accruing(conn, budget, month, now, book)
    revision = await repo.next_revision(conn)
    state = BudgetUpdated(
        team=budget.team,
        project=budget.project,
        month=month_label(month),
        amount=str(budget.amount),
        spent=str(spent),
        currency=budget.currency,
        policy=budget.policy,
        exhausted=spent >= budget.amount,
        deleted=deleted,
        revision=revision,
        on_exhausted=budget.on_exhausted,
        rates=said_rates,
        spent_at=None if deleted else now,
        # What the scheduler needs to reserve a running job only its worst case after
        # ``now``; past ``MAX_ACCRUING`` it reserves each whole (said None).
        accruing=accruing if reserved_against and len(accruing) <= MAX_ACCRUING else None,
    )
    await _say(conn, state, budget.team, f"budget:{budget.team}:{budget.project or ''}:{revision}")
    if not deleted:
        await repo.mark_said(conn, budget, month, state.exhausted)
    return spent


async def say_state_or_log(conn: asyncpg.Connection, budget: Budget, now: datetime) -> None:
    """``say_state``, for a bill or the accrual check, which must not fail for a state that
    cannot be said: under a book priced past ``MAX_PRICED_FLAVORS`` (``BookTooLarge``) the
    budget is left unsaid, logged at error level with what to do, and the rest of the
    transaction (the bill, its thresholds crossed) commits. A bill lost would be worse than
    a state not said: the budget is not marked said, so its next bill (or the accrual
    check) says it again once the book is within its bound."""
    try:
        await say_state(conn, budget, now)
    except BookTooLarge as exc:
        log.error(
            "budget of %s%s: state not said: %s; its bills are kept, and it is said at its "
            "next bill or check once the book is within its bound",
            budget.team,
            f"/{budget.project}" if budget.project else "",
            exc,
        )


async def rates(
    conn: asyncpg.Connection, now: datetime, book: PriceSchedule | None = None
) -> dict[str, ReservationRates]:
    """What the scheduler reserves a job of each priced flavor at (``ReservationRates``):
    the highest GPU, CPU and memory prices per hour from ``now`` on, by ``book`` (read here
    when None). ``BookTooLarge`` when there are more than ``MAX_PRICED_FLAVORS`` (a book
    priced past them before the price API and the settings bounded it): no state can say
    them."""
    if book is None:
        book = await catalogue.schedule(conn)
    highest = book.highest_from(now)
    if len(highest) > MAX_PRICED_FLAVORS:
        raise BookTooLarge(len(highest))
    return {
        flavor: ReservationRates(
            gpu_hour=_text(gpu), cpu_hour=_text(cpu), memory_gib_hour=_text(mem)
        )
        for flavor, (gpu, cpu, mem) in sorted(highest.items())
    }


class BookTooLarge(ValueError):
    """The price book has more flavors (``flavors``) than a budget's ``rates`` can say
    (``rates``); the message says so and what to do."""

    def __init__(self, flavors: int) -> None:
        super().__init__(
            f"the price book has {flavors} flavors with a GPU price, more than the "
            f"{MAX_PRICED_FLAVORS} a budget's rates can say: the state of a budget that "
            "reserves (policy refuse, or on_exhausted stop) cannot be said until flavors "
            "are taken out of billing's tables prices and resource_prices, or the budget "
            "reserves no more"
        )
        self.flavors = flavors


_MICRO = Decimal("0.000001")


def _text(price: Decimal) -> str:
    """``price`` as a rate says it: at most six decimals (``ReservationRates``), a price finer
    than that (the settings' bootstrap prices bound no decimal places) rounded up, so that a
    reservation at it still covers what is billed."""
    if not price:
        return "0"
    return format(price.quantize(_MICRO, rounding=ROUND_CEILING).normalize(), "f")


async def reserving(conn: asyncpg.Connection, now: datetime) -> None:
    """Say again the state of every budget the scheduler reserves against (``reserves``),
    after a change of the price book: the rates it reserves at are the book's. In the
    change's transaction, holding each budget's scope (in turns with bills)."""
    await say_again(conn, [b for b in await repo.of_teams(conn, None) if reserves(b)], now)


async def say_again(conn: asyncpg.Connection, budgets: Sequence[Budget], now: datetime) -> int:
    """Say again the state of each of ``budgets`` that still exists (as it is now, read
    under its scope, which is held until the transaction ends: in turns with bills), the
    book read once for all; return how many were said. Each is said with the next
    revision, so every replica keeps it, and nothing said after it is older."""
    if not budgets:
        return 0
    await repo.lock(conn, [(b.team, b.project) for b in budgets])
    # One book for all, read once (one snapshot), not once per budget: for the rates, and
    # for what each budget's running allocations have accrued.
    book = await catalogue.schedule(conn)
    said = await rates(conn, now, book) if any(reserves(b) for b in budgets) else None
    count = 0
    for budget in budgets:
        current = await repo.get(conn, budget.team, budget.project)
        if current is not None:
            await say_state(conn, current, now, rates_now=said, book=book)
            count += 1
    return count


async def _say(conn: asyncpg.Connection, payload: Payload, subject: str, event_id: str) -> None:
    envelope = Envelope.wrap(payload, source=SOURCE, subject=subject, event_id=event_id)
    await outbox.enqueue(conn, envelope)

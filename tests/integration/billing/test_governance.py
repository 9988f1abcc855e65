"""The price book with effective dates, the cost estimate and budgets, over billing's real
consumer (inbox, handlers, ledger) on PostgreSQL, its HTTP app, and, for the events budgets
say, the real bus.

User tokens are checked by the real guard and identity client; only the submission
service's answer to ``GET /v1/me`` is stood in for (an httpx transport)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import asyncpg
import httpx
import pytest
from pydantic import SecretStr

from tests.integration.billing.conftest import Billing, feed, grant_of, release_event, until
from trainyard_platform.services.billing import budget_watch
from trainyard_platform.services.billing import budgets_repository as budgets_repo
from trainyard_platform.services.billing import catalogue_repository as catalogue
from trainyard_platform.services.billing import ledger_repository as ledger_repo
from trainyard_platform.services.billing.api import create_app
from trainyard_platform.services.billing.budgets import month_start
from trainyard_platform.services.billing.config import Settings
from trainyard_platform.services.billing.handlers import BillingHandlers
from trainyard_platform.services.billing.service import prepare, say_budgets
from trainyard_platform.shared.access import service_guard
from trainyard_platform.shared.bus import DEFAULT_MAX_PAYLOAD
from trainyard_platform.shared.events import Envelope, Payload, parse_envelope
from trainyard_platform.shared.events.payloads import (
    MAX_PRICED_FLAVORS,
    AllocationReleased,
    BudgetThresholdCrossed,
    BudgetUpdated,
    FlavorDeclared,
    FlavorRetired,
    JobFailed,
)
from trainyard_platform.shared.events.trust import RUNNER, owner
from trainyard_platform.shared.identity import IdentityClient
from trainyard_platform.shared.settings import DatabaseSettings
from trainyard_platform.shared.worst_case import KILL_GRACE_SECONDS

pytestmark = pytest.mark.integration

OPERATOR = {"Authorization": "Bearer s3cret"}
ML_VIEWER = {"Authorization": "Bearer ml-viewer"}
ML_ADMIN = {"Authorization": "Bearer ml-admin"}
VISION_ADMIN = {"Authorization": "Bearer vision-admin"}
OPERATOR_USER = {"Authorization": "Bearer op-user"}
USERS = {
    "op-user": {"user": "root", "team": "platform", "role": "operator", "token_id": 4},
    "ml-viewer": {"user": "ada", "team": "ml", "role": "viewer", "token_id": 1},
    "ml-admin": {"user": "bo", "team": "ml", "role": "admin", "token_id": 2},
    "vision-admin": {"user": "cy", "team": "vision", "role": "admin", "token_id": 3},
}


def _me(request: httpx.Request) -> httpx.Response:
    """Submission's ``/v1/me`` and ``/v1/teams/{team}`` for ``USERS``."""
    token = request.headers.get("authorization", "").removeprefix("Bearer ")
    if token not in USERS:
        return httpx.Response(401, json={"detail": "unknown token"})
    team = request.url.path.removeprefix("/v1/teams/")
    if team != request.url.path:
        known = {u["team"] for u in USERS.values()}
        return httpx.Response(200, json={"team": team}) if team in known else httpx.Response(404)
    return httpx.Response(200, json=USERS[token])


@pytest.fixture
async def client(pool: asyncpg.Pool) -> AsyncIterator[httpx.AsyncClient]:
    """Billing's app (prices from the fixture: a100 2.5, cpu 0.1, from 1970)."""
    identity = IdentityClient(
        "http://submission",
        http=httpx.AsyncClient(transport=httpx.MockTransport(_me), base_url="http://submission"),
    )
    app = create_app(pool, service_guard(SecretStr("s3cret"), identity), [])
    transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=transport, base_url="http://billing") as c:
        yield c
    await identity.aclose()


def released(
    allocation_id: str,
    start: datetime,
    length: timedelta,
    *,
    gpus: int = 2,
    flavor: str = "a100",
    team: str = "ml",
    job_id: str | None = None,
) -> AllocationReleased:
    return AllocationReleased(
        allocation_id=allocation_id,
        job_id=job_id or f"job-{allocation_id}",
        node_id="node-1",
        team=team,
        user="ada",
        gpu_flavor=flavor,
        gpus=gpus,
        granted_at=start,
        released_at=start + length,
        outcome="succeeded",
    )


def catalogue_event(payload: Payload, key: str) -> Envelope[Payload]:
    return Envelope.wrap(payload, source=owner(payload), subject=key)


def errors(response: httpx.Response) -> dict[str, str]:
    assert response.status_code == 422, response.text
    return {e["field"]: e["message"] for e in response.json()["errors"]}


# --- prices ----------------------------------------------------------------------------


async def test_a_bill_straddling_a_price_change_is_split_at_the_change(
    pool: asyncpg.Pool, client: httpx.AsyncClient
) -> None:
    change = (datetime.now(UTC) + timedelta(hours=2)).replace(microsecond=0)
    answer = await client.put(
        "/v1/prices/a100",
        json={"price_per_gpu_hour": "4.00", "effective_from": change.isoformat()},
        headers=OPERATOR,
    )
    assert answer.status_code == 201, answer.text
    assert answer.json()["in_force"] is False

    # 2 GPUs from an hour before the change to an hour after: 2 GPU-h at 2.5, 2 at 4.
    straddling = released("s1", change - timedelta(hours=1), timedelta(hours=2))
    before = released("b1", change - timedelta(hours=3), timedelta(hours=1))
    for r in (straddling, before):
        await feed(pool, grant_of(r), release_event(r))

    entries = await pool.fetch(
        "SELECT allocation_id, segment, started_at, ended_at, price_per_gpu_hour, cost "
        "FROM ledger_entries ORDER BY allocation_id, segment"
    )
    assert [
        (e["allocation_id"], e["segment"], e["price_per_gpu_hour"], e["cost"]) for e in entries
    ] == [
        ("b1", 0, Decimal("2.5"), Decimal("5.000000")),  # all before: its old price
        ("s1", 0, Decimal("2.5"), Decimal("5.000000")),
        ("s1", 1, Decimal("4.00"), Decimal("8.000000")),
    ]
    assert entries[1]["ended_at"] == change == entries[2]["started_at"]
    bill = await pool.fetchrow("SELECT cost FROM usage_ledger WHERE allocation_id = 's1'")
    assert bill["cost"] == Decimal("13.000000")
    rolled = await pool.fetchval(
        "SELECT sum(cost) FROM cost_rollups WHERE granularity = 'hour' AND team = 'ml'"
    )
    assert rolled == Decimal("18.000000")  # the rollups hold both parts, and b1

    job = (await client.get("/v1/jobs/job-s1/cost", headers=ML_VIEWER)).json()
    (allocation,) = job["allocations"]
    assert Decimal(allocation["cost"]) == Decimal(13)
    assert [Decimal(p["price_per_gpu_hour"]) for p in allocation["prices"]] == [
        Decimal("2.5"),
        Decimal(4),
    ]
    prices = (await client.get("/v1/prices", params={"flavor": "a100"}, headers=ML_VIEWER)).json()
    assert [(Decimal(p["price_per_gpu_hour"]), p["in_force"]) for p in prices] == [
        (Decimal("2.5"), True),
        (Decimal(4), False),
    ]


async def _ledger_disagrees_with_book(pool: asyncpg.Pool, flavor: str) -> list[str]:
    """Each bill of ``flavor`` whose latest charges are not what the price book prices its
    interval at now (interval, price and cost of each segment)."""
    async with pool.acquire() as conn:
        book = await catalogue.schedule(conn)
        bills = await conn.fetch(
            "SELECT * FROM usage_ledger WHERE gpu_flavor = $1 ORDER BY allocation_id", flavor
        )
        wrong = []
        for bill in bills:
            charges = await ledger_repo.latest_charges(conn, bill["allocation_id"])
            charged = [(c.started_at, c.ended_at, c.price_per_gpu_hour, c.cost) for c in charges]
            priced = [
                (g.started_at, g.ended_at, g.price_per_gpu_hour, g.cost)
                for g in book.segments(flavor, bill["gpus"], bill["started_at"], bill["ended_at"])
            ]
            if charged != priced:
                wrong.append(f"{bill['allocation_id']}: charged {charged}, the book {priced}")
    return wrong


async def test_a_price_change_made_while_a_bill_is_made_agrees_with_the_bill(
    pool: asyncpg.Pool, client: httpx.AsyncClient
) -> None:
    """Two transactions at once: a release being billed (it read a100 at 2.5) and a price
    change of a100 without a date. Before, the change took effect from the moment its
    request came and committed while the bill was still open: the bill then committed the
    old price for its time after that moment, and the ledger disagreed with the price book
    (4.00 from the change on). Now the change waits for the bill, and takes effect after
    the usage billed (here the release ends after the request came: a scheduler's clock a
    little ahead), so every bill is what the book prices it at."""
    now = datetime.now(UTC).replace(microsecond=0)
    bill = released("race", now - timedelta(hours=1), timedelta(hours=1, minutes=5))
    async with pool.acquire() as conn:
        tx = conn.transaction()
        await tx.start()
        try:
            handlers = BillingHandlers()
            await handlers.dispatch(grant_of(bill), conn)
            await handlers.dispatch(release_event(bill), conn)  # read the book: 2.5
            change = asyncio.create_task(
                client.put("/v1/prices/a100", json={"price_per_gpu_hour": "4.00"}, headers=OPERATOR)
            )

            async def change_done_or_waiting() -> bool:
                return change.done() or await _lock_waiters(pool) >= 1

            await until(change_done_or_waiting)
        finally:
            await tx.commit()
    answer = await change
    assert answer.status_code == 201, answer.text
    assert await _ledger_disagrees_with_book(pool, "a100") == []
    assert answer.json()["effective_from"] == bill.released_at.isoformat().replace("+00:00", "Z")

    # A date before usage billed already is refused: that usage keeps its price.
    early = bill.released_at - timedelta(minutes=1)
    said = errors(
        await client.put(
            "/v1/prices/a100",
            json={"price_per_gpu_hour": "5", "effective_from": early.isoformat()},
            headers=OPERATOR,
        )
    )
    assert "is billed already and keeps its price" in said["effective_from"]

    # A bill made once the change has committed is priced by the changed book, split at it.
    after = released("after", now - timedelta(minutes=30), timedelta(hours=1))
    await feed(pool, grant_of(after), release_event(after))
    assert await _ledger_disagrees_with_book(pool, "a100") == []
    prices = await pool.fetch(
        "SELECT price_per_gpu_hour FROM ledger_entries WHERE allocation_id = 'after' "
        "ORDER BY segment"
    )
    assert [p["price_per_gpu_hour"] for p in prices] == [Decimal("2.5"), Decimal("4.00")]


async def test_prices_are_set_by_operators_for_catalogue_flavors_from_now_on(
    pool: asyncpg.Pool, client: httpx.AsyncClient
) -> None:
    past = (datetime.now(UTC) - timedelta(hours=1)).isoformat()
    assert "effective_from" in errors(
        await client.put(
            "/v1/prices/a100",
            json={"price_per_gpu_hour": "1", "effective_from": past},
            headers=OPERATOR,
        )
    )
    bad = await client.put("/v1/prices/a100", json={"price_per_gpu_hour": "-1"}, headers=OPERATOR)
    assert "price_per_gpu_hour" in errors(bad)
    refused = await client.put(
        "/v1/prices/a100", json={"price_per_gpu_hour": "1"}, headers=ML_ADMIN
    )
    assert refused.status_code == 403

    unknown = await client.put(
        "/v1/prices/l40s", json={"price_per_gpu_hour": "3"}, headers=OPERATOR
    )
    assert "declares it first" in errors(unknown)["flavor"]
    at = datetime.now(UTC)
    await feed(
        pool,
        catalogue_event(FlavorDeclared(name="l40s", revision=3, declared_at=at), "l40s"),
        # An older retirement delivered late changes nothing.
        catalogue_event(FlavorRetired(name="l40s", revision=2, retired_at=at), "l40s"),
    )
    known = await client.put("/v1/prices/l40s", json={"price_per_gpu_hour": "3"}, headers=OPERATOR)
    assert known.status_code == 201, known.text
    # Its first price covers all its usage (nothing of it was billed before).
    assert known.json()["effective_from"].startswith("1970-01-01")

    # A release of the new flavor, even of before, is billed at that price.
    later = released("l1", datetime.now(UTC) - timedelta(days=1), timedelta(hours=1))
    later = later.model_copy(update={"gpu_flavor": "l40s", "gpus": 1})
    await feed(pool, grant_of(later), release_event(later))
    cost = await pool.fetchval("SELECT cost FROM usage_ledger WHERE allocation_id = 'l1'")
    assert cost == Decimal("3.000000")


async def test_a_price_change_with_a_stale_etag_is_412_and_the_fresh_one_proceeds(
    pool: asyncpg.Pool, client: httpx.AsyncClient
) -> None:
    """``GET /v1/prices/{flavor}`` is the flavor's book with its ``ETag``; ``PUT`` with
    ``If-Match: <it>`` proceeds while the book is as it was read and is 412, naming
    ``If-Match`` and that it changed, once another operator priced the flavor since; its
    answer carries the new tag. Without a condition, as before. (Before, there was no such
    ``GET`` nor tag, and ``PUT`` ignored both headers.)"""
    assert (await client.get("/v1/prices/l40s", headers=ML_VIEWER)).status_code == 404
    read = await client.get("/v1/prices/a100", headers=ML_VIEWER)
    assert read.status_code == 200, read.text
    assert {p["flavor"] for p in read.json()} == {"a100"}
    tag = read.headers["ETag"]
    later = (datetime.now(UTC) + timedelta(days=1)).isoformat()
    other = await client.put(
        "/v1/prices/a100",
        json={"price_per_gpu_hour": "3", "effective_from": later},
        headers={**OPERATOR, "If-Match": tag},
    )
    assert other.status_code == 201, other.text
    assert other.headers["ETag"] not in (tag, None)
    assert (await client.get("/v1/prices/a100", headers=ML_VIEWER)).headers[
        "ETag"
    ] == other.headers["ETag"]
    book = (await client.get("/v1/prices/a100", headers=ML_VIEWER)).json()
    stale = await client.put(
        "/v1/prices/a100",
        json={"price_per_gpu_hour": "4", "effective_from": later},
        headers={**OPERATOR, "If-Match": tag},
    )
    message = precondition_failed(stale)["If-Match"]
    assert "the prices of flavor a100 was changed since it was read" in message, message
    assert other.headers["ETag"] in message
    assert (await client.get("/v1/prices/a100", headers=ML_VIEWER)).json() == book
    first = await client.put(
        "/v1/prices/a100",
        json={"price_per_gpu_hour": "4"},
        headers={**OPERATOR, "If-None-Match": "*"},
    )
    assert "exists already" in precondition_failed(first)["If-None-Match"]
    fresh = await client.put(
        "/v1/prices/a100",
        json={"price_per_gpu_hour": "4", "effective_from": later},
        headers={**OPERATOR, "If-Match": other.headers["ETag"]},
    )
    assert fresh.status_code == 200, fresh.text
    # Without a condition, as before.
    plain = await client.put(
        "/v1/prices/a100",
        json={"price_per_gpu_hour": "5", "effective_from": later},
        headers=OPERATOR,
    )
    assert plain.status_code == 200, plain.text
    actions = await pool.fetch("SELECT action FROM audit_log WHERE target = 'a100'")
    assert [r["action"] for r in actions] == ["put price"] * 3


# --- the estimate ----------------------------------------------------------------------


async def test_a_job_spec_is_estimated_from_its_resources_runtime_and_restarts(
    client: httpx.AsyncClient,
) -> None:
    spec = {
        "name": "train",
        "entrypoint": "train",
        "gpus": 2,
        "gpu_flavor": "a100",
        "max_runtime_seconds": 1800 - KILL_GRACE_SECONDS,  # an attempt: 30 min with the grace
        "max_restarts": 1,
    }
    answer = await client.post("/v1/costs/estimate", json=spec, headers=ML_VIEWER)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert Decimal(body["gpu_seconds"]) == 3600  # 2 GPUs x 30 min, the kill grace included
    assert Decimal(body["estimated_cost"]) == Decimal("2.5")
    # The attempt and its restart (the platform's retries are the platform's to pay).
    assert "attempts_at_most" not in body
    assert Decimal(body["worst_case_cost"]) == Decimal("5")
    assert body["currency"] == "USD"

    unpriced = await client.post(
        "/v1/costs/estimate", json={**spec, "gpu_flavor": "tpu"}, headers=ML_VIEWER
    )
    assert "no price for 'tpu'" in errors(unpriced)["gpu_flavor"]
    assert "gpus" in errors(
        await client.post("/v1/costs/estimate", json={**spec, "gpus": 0}, headers=ML_VIEWER)
    )
    anonymous = await client.post("/v1/costs/estimate", json=spec)
    assert anonymous.status_code == 401


async def test_an_attempt_that_failed_through_the_platform_is_not_charged_nor_estimated(
    pool: asyncpg.Pool, client: httpx.AsyncClient
) -> None:
    """A job failing with ``platform_error`` is run again up to the scheduler's
    ``platform_retries`` times apart from ``max_restarts``. Billing charged each such
    attempt to the team (2.5 here), and its estimate counted 1 + ``max_restarts`` + a
    setting kept equal to the scheduler's by hand (4 attempts with no restart). Now such an
    attempt is charged to the platform (the team pays 0), and the worst case is 1 +
    ``max_restarts`` attempts."""
    attempt = released("p1", datetime.now(UTC) - timedelta(hours=2), timedelta(minutes=30))
    attempt = attempt.model_copy(update={"outcome": "failed"})
    report = JobFailed(
        job_id=attempt.job_id,
        allocation_id="p1",
        node_id="node-1",
        epoch=1,
        finished_at=attempt.released_at,
        exit_code=None,
        reason="the node's disk is full",
        failure_kind="platform_error",
    )
    await feed(
        pool,
        grant_of(attempt),
        Envelope.wrap(report, source=RUNNER, subject=attempt.job_id),
        release_event(attempt),
    )
    bill = await pool.fetchrow(
        "SELECT cost, charged_to FROM usage_ledger WHERE allocation_id = 'p1'"
    )
    assert (bill["cost"], bill["charged_to"]) == (Decimal("2.500000"), "platform")
    charged = await pool.fetchval(
        "SELECT coalesce(sum(cost), 0) FROM ledger_entries WHERE allocation_id = 'p1'"
    )
    assert charged == 0  # the team's

    spec = {"gpus": 2, "gpu_flavor": "a100", "max_runtime_seconds": 1800 - KILL_GRACE_SECONDS}
    for restarts, attempts in ((0, 1), (2, 3)):
        answer = await client.post(
            "/v1/costs/estimate", json={**spec, "max_restarts": restarts}, headers=ML_VIEWER
        )
        assert answer.status_code == 200, answer.text
        assert Decimal(answer.json()["worst_case_cost"]) == Decimal("2.5") * attempts


async def test_an_unpriced_flavors_estimate_names_the_priced_ones(
    client: httpx.AsyncClient,
) -> None:
    """``gpu_flavor: a100x`` (a typo) answered "no price for 'a100x' in the price book
    (priced: none)" while a100 and cpu had prices: the estimate read the book of the asked
    flavor only, so the list a user could pick from was always empty."""
    spec = {"name": "t", "entrypoint": "t", "gpus": 1, "gpu_flavor": "a100x"}
    answer = await client.post("/v1/costs/estimate", json=spec, headers=ML_VIEWER)
    assert answer.status_code == 422
    assert errors(answer)["gpu_flavor"] == (
        "no price for 'a100x' in the price book (priced: a100, cpu)"
    )


# --- budgets ---------------------------------------------------------------------------


async def test_a_budget_crossing_its_thresholds_says_each_once(
    billing: Billing, client: httpx.AsyncClient
) -> None:
    put = await client.put(
        "/v1/budgets/ml",
        json={"amount": "10", "thresholds": [100, 50], "policy": "refuse"},
        headers=ML_ADMIN,
    )
    assert put.status_code == 201, put.text
    assert put.json()["thresholds"] == [50, 100]
    start = month_start(datetime.now(UTC)) + timedelta(minutes=1)

    # 6.0 (2 a100 x 1.2 h): past 50 %, then the same event again (redelivered)
    first = released("r1", start, timedelta(minutes=72))
    envelope = release_event(first)
    await feed(billing.pool, grant_of(first), envelope)
    await feed(billing.pool, envelope)  # the inbox drops it
    # 5.0 more: past 100 %; and a release of another team changes nothing of ml's budget
    await billing.send(released("r2", start + timedelta(hours=2), timedelta(hours=1)))
    await billing.send(released("v1", start, timedelta(hours=9), team="vision"))

    def crossings() -> list[BudgetThresholdCrossed]:
        return [e.data for e in billing.seen if isinstance(e.data, BudgetThresholdCrossed)]

    def states() -> list[BudgetUpdated]:
        return [e.data for e in billing.seen if isinstance(e.data, BudgetUpdated)]

    await until(lambda: len(crossings()) == 2 and states() and states()[-1].exhausted)
    assert [(c.team, c.threshold_percent, Decimal(c.spent)) for c in crossings()] == [
        ("ml", 50, Decimal(6)),
        ("ml", 100, Decimal(11)),
    ]
    assert [(s.revision > 0, s.exhausted, s.policy) for s in states()] == [
        (True, False, "refuse"),  # when it was set
        (True, False, "refuse"),  # 50 % crossed
        (True, True, "refuse"),  # 100 % crossed
    ]
    rows = await billing.pool.fetch(
        "SELECT threshold_percent FROM budget_crossings ORDER BY threshold_percent"
    )
    assert [r["threshold_percent"] for r in rows] == [50, 100]

    (view,) = (await client.get("/v1/budgets", headers=ML_VIEWER)).json()
    assert (view["team"], view["project"], Decimal(view["spent"])) == ("ml", None, Decimal(11))
    assert view["exhausted"] is True and view["runs_out_at"] is None
    assert view["forecast"] == "spent: the budget ran out this month"


async def test_a_budget_says_what_happens_to_its_running_jobs(
    billing: Billing, client: httpx.AsyncClient
) -> None:
    body = {"amount": "10", "policy": "warn", "on_exhausted": "stop"}
    put = await client.put("/v1/budgets/ml", json=body, headers=ML_ADMIN)
    assert put.status_code == 201, put.text
    assert put.json()["on_exhausted"] == "stop"

    def states() -> list[BudgetUpdated]:
        return [e.data for e in billing.seen if isinstance(e.data, BudgetUpdated)]

    await until(lambda: bool(states()))
    assert [s.on_exhausted for s in states()] == ["stop"]
    default = await client.put("/v1/budgets/ml/nlp", json={"amount": "5"}, headers=ML_ADMIN)
    assert default.json()["on_exhausted"] == "finish"
    invalid = await client.put(
        "/v1/budgets/ml", json={**body, "on_exhausted": "kill"}, headers=ML_ADMIN
    )
    assert invalid.status_code == 422 and set(errors(invalid)) == {"on_exhausted"}
    (view, _) = (await client.get("/v1/budgets", headers=ML_VIEWER)).json()
    assert view["on_exhausted"] == "stop"


async def _lock_waiters(pool: asyncpg.Pool) -> int:
    return int(
        await pool.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND datname = current_database()"
        )
    )


async def test_a_budget_changed_while_a_bill_is_made_is_said_last_as_changed(
    pool: asyncpg.Pool, client: httpx.AsyncClient
) -> None:
    """A bill (5.0) that crosses ml's budget of 4 is being made when an admin raises the
    budget to 1000. Before, the bill's transaction read the budget of 4 before the change
    committed and drew its state's revision after the change had said its own: submission
    kept (highest revision) a state of 4, exhausted, while the budget was 1000, and refused
    ml's jobs. Now the state said last, with the highest revision, is the budget as changed.

    The bill is held between reading the budget and saying its state by a test transaction
    holding the row of its first crossing; the change is made while it waits."""
    put = await client.put(
        "/v1/budgets/ml", json={"amount": "4", "policy": "refuse"}, headers=ML_ADMIN
    )
    assert put.status_code == 201, put.text
    month = month_start(datetime.now(UTC))
    bill = released("r1", month + timedelta(minutes=1), timedelta(hours=1))  # 2 a100 x 1 h
    async with pool.acquire() as holder:
        hold = holder.transaction()
        await hold.start()
        await holder.execute(
            "INSERT INTO budget_crossings VALUES ('ml', '', $1, 50, 0, now())", month.date()
        )
        billing = asyncio.create_task(feed(pool, grant_of(bill), release_event(bill)))
        await until(lambda: _lock_waiters(pool))  # the bill waits for the crossing's row
        assert not billing.done()
        change = asyncio.create_task(
            client.put(
                "/v1/budgets/ml", json={"amount": "1000", "policy": "refuse"}, headers=ML_ADMIN
            )
        )

        async def change_done_or_waiting() -> bool:
            return change.done() or await _lock_waiters(pool) >= 2

        await until(change_done_or_waiting)
        await hold.rollback()
    await billing
    assert (await change).status_code == 200
    states = [
        parse_envelope(r["body"]).data
        for r in await pool.fetch("SELECT body FROM outbox WHERE event_id LIKE 'budget:ml:%'")
    ]
    last = max((s for s in states if isinstance(s, BudgetUpdated)), key=lambda s: s.revision)
    assert (Decimal(last.amount), Decimal(last.spent), last.exhausted) == (
        Decimal(1000),
        Decimal(5),
        False,
    )


async def test_two_admins_patching_different_fields_at_once_both_keep_their_change(
    pool: asyncpg.Pool, client: httpx.AsyncClient
) -> None:
    """One admin raises ml's amount while another sets its policy. Before, a change of some
    fields was a read of the budget and a ``PUT`` of it whole: the write made last put back
    the other field as it was read, and one change was lost. Now each sends a ``PATCH`` of
    its field, read and written under the budget's lock: both are kept.

    A test transaction holds the budget's lock until both patches wait for it."""
    body = {"amount": "100", "policy": "warn", "on_exhausted": "stop"}
    made = await client.put("/v1/budgets/ml", json=body, headers=ML_ADMIN)
    assert made.status_code == 201, made.text
    async with pool.acquire() as holder:
        hold = holder.transaction()
        await hold.start()
        await budgets_repo.lock(holder, [("ml", None)])
        amount = asyncio.create_task(
            client.patch("/v1/budgets/ml", json={"amount": "500"}, headers=ML_ADMIN)
        )
        policy = asyncio.create_task(
            client.patch(
                "/v1/budgets/ml",
                content=b'{"policy": "refuse"}',
                headers={**OPERATOR_USER, "Content-Type": "application/merge-patch+json"},
            )
        )

        async def both_wait() -> bool:
            return amount.done() or policy.done() or await _lock_waiters(pool) >= 2

        await until(both_wait)
        await hold.rollback()
    for answer in (await amount, await policy):
        assert answer.status_code == 200, answer.text
    kept = (await client.get("/v1/budgets/ml", headers=ML_VIEWER)).json()
    assert (kept["amount"], kept["policy"], kept["on_exhausted"]) == (
        "500.000000",
        "refuse",
        "stop",
    )
    assert kept["thresholds"] == [50, 80, 100]
    states = [
        parse_envelope(r["body"]).data
        for r in await pool.fetch("SELECT body FROM outbox WHERE event_id LIKE 'budget:ml:%'")
    ]
    last = max((s for s in states if isinstance(s, BudgetUpdated)), key=lambda s: s.revision)
    assert (Decimal(last.amount), last.policy, last.on_exhausted) == (
        Decimal(500),
        "refuse",
        "stop",
    )
    actions = await pool.fetch(
        "SELECT action, detail FROM audit_log WHERE target = 'team ml' ORDER BY id"
    )
    assert [r["action"] for r in actions] == ["put budget", "patch budget", "patch budget"]


async def test_a_budget_patch_is_judged_as_the_put_it_makes(client: httpx.AsyncClient) -> None:
    """A patch names only what changes; ``null`` puts a field back to its default; the
    result is judged as a ``PUT`` of it would be (422 naming each bad field); a patch never
    creates a budget (404) and is written by the team's admins only."""
    body = {"amount": "100", "thresholds": [90], "policy": "refuse"}
    made = await client.put("/v1/budgets/ml/nlp", json=body, headers=ML_ADMIN)
    assert made.status_code == 201, made.text
    reset = await client.patch(
        "/v1/budgets/ml/nlp", json={"thresholds": None, "on_exhausted": "stop"}, headers=ML_ADMIN
    )
    assert reset.status_code == 200, reset.text
    assert (reset.json()["thresholds"], reset.json()["policy"]) == ([50, 80, 100], "refuse")
    assert reset.json()["on_exhausted"] == "stop"

    invalid = await client.patch(
        "/v1/budgets/ml/nlp",
        json={"amount": "0", "thresholds": [5, 5], "colour": 1},
        headers=ML_ADMIN,
    )
    assert set(errors(invalid)) == {"amount", "thresholds", "colour"}
    no_amount = await client.patch("/v1/budgets/ml/nlp", json={"amount": None}, headers=ML_ADMIN)
    assert set(errors(no_amount)) == {"amount"}
    not_object = await client.patch("/v1/budgets/ml/nlp", json=[1], headers=ML_ADMIN)
    assert set(errors(not_object)) == {"body"}
    kept = (await client.get("/v1/budgets/ml/nlp", headers=ML_VIEWER)).json()
    assert (kept["amount"], kept["on_exhausted"]) == ("100.000000", "stop")

    missing = await client.patch("/v1/budgets/ml/cv", json={"amount": "5"}, headers=ML_ADMIN)
    assert missing.status_code == 404, missing.text
    assert "PUT /v1/budgets/ml/cv" in missing.json()["detail"]
    assert (await client.get("/v1/budgets/ml/cv", headers=ML_VIEWER)).status_code == 404
    change = {"amount": "1"}
    viewer = await client.patch("/v1/budgets/ml/nlp", json=change, headers=ML_VIEWER)
    assert viewer.status_code == 403
    other = await client.patch("/v1/budgets/ml/nlp", json=change, headers=VISION_ADMIN)
    assert other.status_code == 404
    text = await client.patch(
        "/v1/budgets/ml/nlp",
        content=b'{"amount": "1"}',
        headers={**ML_ADMIN, "Content-Type": "text/plain"},
    )
    assert text.status_code == 415


async def test_a_put_with_if_none_match_creates_a_budget_and_never_replaces_one(
    pool: asyncpg.Pool, client: httpx.AsyncClient
) -> None:
    """``If-None-Match: *`` makes a ``PUT`` create only: another admin's budget, made since
    the caller found none, is answered 412 and kept as it is, so that caller can patch it."""
    create_only = {**ML_ADMIN, "If-None-Match": "*"}
    made = await client.put("/v1/budgets/ml", json={"amount": "5"}, headers=create_only)
    assert made.status_code == 201, made.text
    again = await client.put(
        "/v1/budgets/ml", json={"amount": "9", "policy": "refuse"}, headers=create_only
    )
    assert again.status_code == 412, again.text
    assert "PATCH" in again.json()["detail"]
    kept = (await client.get("/v1/budgets/ml", headers=ML_VIEWER)).json()
    assert (kept["amount"], kept["policy"]) == ("5.000000", "warn")
    odd = await client.put(
        "/v1/budgets/ml", json={"amount": "9"}, headers={**ML_ADMIN, "If-None-Match": '"v1"'}
    )
    assert odd.status_code == 422 and "If-None-Match" in errors(odd), odd.text
    actions = await pool.fetch("SELECT action FROM audit_log WHERE target = 'team ml'")
    assert [r["action"] for r in actions] == ["put budget"]


def precondition_failed(response: httpx.Response) -> dict[str, str]:
    """A 412's errors by field (the header that failed), its detail naming it too."""
    assert response.status_code == 412, response.text
    body = response.json()
    assert len(body["errors"]) == 1 and body["errors"][0]["field"] in body["detail"], body
    return {e["field"]: e["message"] for e in body["errors"]}


async def test_if_none_match_and_if_match_hold_on_every_write_of_a_budget(
    pool: asyncpg.Pool, client: httpx.AsyncClient
) -> None:
    """RFC 9110: ``If-None-Match: *`` proceeds only when there is no budget, ``If-Match: *``
    only when there is one, on ``PUT``, ``PATCH`` and ``DELETE`` alike: a false one is 412
    naming the header and why, nothing changed. (Before, ``PATCH`` and ``DELETE`` ignored
    both headers, and ``PUT`` ignored ``If-Match``: it created.)"""
    assert (
        await client.put("/v1/budgets/ml", json={"amount": "5"}, headers=ML_ADMIN)
    ).status_code == 201
    absent_only = {**ML_ADMIN, "If-None-Match": "*"}
    patched = await client.patch("/v1/budgets/ml", json={"amount": "9"}, headers=absent_only)
    assert "exists already" in precondition_failed(patched)["If-None-Match"]
    deleted = await client.delete("/v1/budgets/ml", headers=absent_only)
    assert "exists already" in precondition_failed(deleted)["If-None-Match"]
    kept = (await client.get("/v1/budgets/ml", headers=ML_VIEWER)).json()
    assert kept["amount"] == "5.000000"
    # If-Match: * of a budget that is not there: a PUT does not create it.
    existing_only = {**ML_ADMIN, "If-Match": "*"}
    created = await client.put("/v1/budgets/ml/nlp", json={"amount": "3"}, headers=existing_only)
    assert "does not exist" in precondition_failed(created)["If-Match"]
    assert (await client.get("/v1/budgets/ml/nlp", headers=ML_VIEWER)).status_code == 404
    # A PATCH or DELETE of none is 404 whatever its conditions (RFC 9110, 13.2.1).
    for method in ("PATCH", "DELETE"):
        for conditions in (existing_only, absent_only):
            gone = await client.request(
                method, "/v1/budgets/ml/nlp", json={"amount": "3"}, headers=conditions
            )
            assert gone.status_code == 404, gone.text
    # Both at once never proceed; If-Match is judged first (RFC 9110, 13.2.2).
    both = {**ML_ADMIN, "If-Match": "*", "If-None-Match": "*"}
    assert "If-None-Match" in precondition_failed(
        await client.put("/v1/budgets/ml", json={"amount": "7"}, headers=both)
    )
    assert "If-Match" in precondition_failed(
        await client.put("/v1/budgets/ml/nlp", json={"amount": "7"}, headers=both)
    )
    # Conditions that hold proceed.
    replaced = await client.put("/v1/budgets/ml", json={"amount": "6"}, headers=existing_only)
    assert replaced.status_code == 200, replaced.text
    changed = await client.patch("/v1/budgets/ml", json={"amount": "8"}, headers=existing_only)
    assert changed.status_code == 200 and changed.json()["amount"] == "8.000000", changed.text
    assert (await client.delete("/v1/budgets/ml", headers=existing_only)).status_code == 204
    made = await client.put("/v1/budgets/ml", json={"amount": "2"}, headers=absent_only)
    assert made.status_code == 201, made.text
    odd = await client.delete("/v1/budgets/ml", headers={**ML_ADMIN, "If-Match": "v1"})
    assert odd.status_code == 422 and "If-Match" in errors(odd), odd.text
    actions = await pool.fetch("SELECT action FROM audit_log WHERE target = 'team ml' ORDER BY id")
    assert [r["action"] for r in actions] == [
        "put budget", "put budget", "patch budget", "delete budget", "put budget"
    ]  # fmt: skip


async def test_a_budget_write_with_a_stale_etag_is_412_and_the_fresh_one_proceeds(
    pool: asyncpg.Pool, client: httpx.AsyncClient
) -> None:
    """The ``GET`` of a budget, and the answer of its ``PUT`` and ``PATCH``, carries
    ``ETag`` (of what a write sets: the spending does not change it); ``If-Match: <it>``
    proceeds while the budget is as it was read and is 412, naming ``If-Match`` and that it
    changed, once another admin's change fell between. Without a condition, as before.
    (Before, there was no ``ETag``, and a tag in ``If-Match`` was refused with 422.)"""
    for path in ("/v1/budgets/ml", "/v1/budgets/ml/nlp"):
        made = await client.put(path, json={"amount": "5"}, headers=ML_ADMIN)
        assert made.status_code == 201, made.text
        read = await client.get(path, headers=ML_VIEWER)
        tag = read.headers["ETag"]
        assert tag == made.headers["ETag"] and tag.startswith('"'), read.headers
        # Another admin changes it between this read and this write.
        other = await client.patch(
            path, json={"policy": "refuse"}, headers={**ML_ADMIN, "If-Match": tag}
        )
        assert other.status_code == 200, other.text
        assert other.headers["ETag"] not in (tag, None)
        assert (await client.get(path, headers=ML_VIEWER)).headers["ETag"] == other.headers["ETag"]
        stale = {**ML_ADMIN, "If-Match": tag}
        for response in (
            await client.put(path, json={"amount": "7"}, headers=stale),
            await client.patch(path, json={"amount": "7"}, headers=stale),
            await client.delete(path, headers=stale),
        ):
            message = precondition_failed(response)["If-Match"]
            assert "was changed since it was read" in message, message
            assert other.headers["ETag"] in message, message
        kept = (await client.get(path, headers=ML_VIEWER)).json()
        assert kept["policy"] == "refuse" and kept["amount"] == "5.000000", kept
        fresh = {**ML_ADMIN, "If-Match": other.headers["ETag"]}
        changed = await client.patch(path, json={"amount": "7"}, headers=fresh)
        assert changed.status_code == 200 and changed.json()["amount"] == "7.000000", changed.text
        replaced = await client.put(
            path, json={"amount": "8"}, headers={**ML_ADMIN, "If-Match": changed.headers["ETag"]}
        )
        assert replaced.status_code == 200, replaced.text
        # Without a condition, as before.
        assert (await client.patch(path, json={"amount": "9"}, headers=ML_ADMIN)).status_code == 200
        now = (await client.get(path, headers=ML_VIEWER)).headers["ETag"]
        assert (await client.delete(path, headers={**ML_ADMIN, "If-Match": now})).status_code == 204


async def test_budgets_are_written_by_the_team_s_admins_and_read_by_its_users(
    client: httpx.AsyncClient,
) -> None:
    body = {"amount": "100", "policy": "warn"}
    assert (await client.put("/v1/budgets/ml", json=body, headers=ML_VIEWER)).status_code == 403
    assert (await client.put("/v1/budgets/ml", json=body, headers=VISION_ADMIN)).status_code == 404
    made = await client.put("/v1/budgets/ml/nlp", json=body, headers=ML_ADMIN)
    assert made.status_code == 201, made.text
    assert made.json()["thresholds"] == [50, 80, 100]
    again = await client.put("/v1/budgets/ml/nlp", json=body, headers=OPERATOR_USER)
    assert again.status_code == 200
    # The break-glass token cannot ask the submission service whether a team exists.
    glass = await client.put("/v1/budgets/ml/nlp", json=body, headers=OPERATOR)
    assert glass.status_code == 422 and glass.json()["errors"][0]["field"] == "team"

    read = await client.get("/v1/budgets/ml/nlp", headers=ML_VIEWER)
    assert read.status_code == 200 and read.json()["project"] == "nlp"
    assert read.json()["forecast"] == "nothing spent this month"
    assert (await client.get("/v1/budgets/ml/nlp", headers=VISION_ADMIN)).status_code == 404
    assert (await client.get("/v1/budgets", headers=VISION_ADMIN)).json() == []
    listed = await client.get("/v1/budgets", params={"team": "ml"}, headers=OPERATOR)
    assert [b["project"] for b in listed.json()] == ["nlp"]

    invalid = await client.put(
        "/v1/budgets/ml",
        json={"amount": "0", "thresholds": [50, 50], "policy": "ignore", "colour": 1},
        headers=ML_ADMIN,
    )
    assert set(errors(invalid)) == {"amount", "thresholds", "policy", "colour"}
    unknown_parameter = await client.get("/v1/budgets", params={"month": "x"}, headers=ML_VIEWER)
    assert "month" in errors(unknown_parameter)

    assert (await client.delete("/v1/budgets/ml/nlp", headers=ML_VIEWER)).status_code == 403
    assert (await client.delete("/v1/budgets/ml/nlp", headers=ML_ADMIN)).status_code == 204
    assert (await client.delete("/v1/budgets/ml/nlp", headers=ML_ADMIN)).status_code == 404


async def test_an_amount_is_answered_as_it_is_kept_whatever_its_spelling(
    client: httpx.AsyncClient,
) -> None:
    """A budget of "1e3" was answered "1E+3" by its PUT and "1000.000000" by every GET; a
    price of "-0" was answered "-0", "1e2" "1E+2" (read back "0" and "100"). A budget is
    kept and answered with six places; a price as given, without exponent or sign of zero."""
    put = await client.put("/v1/budgets/ml/fmt", json={"amount": "1e3"}, headers=ML_ADMIN)
    assert put.status_code == 201, put.text
    got = await client.get("/v1/budgets/ml/fmt", headers=ML_ADMIN)
    assert put.json()["amount"] == got.json()["amount"] == "1000.000000"
    assert put.json()["remaining"] == got.json()["remaining"]
    price = {"price_per_gpu_hour": "1e2", "price_per_cpu_hour": "-0"}
    later = (datetime.now(UTC) + timedelta(days=1)).replace(microsecond=0).isoformat()
    set_ = await client.put(
        "/v1/prices/a100", json={**price, "effective_from": later}, headers=OPERATOR
    )
    assert set_.status_code == 201, set_.text
    assert set_.json()["price_per_gpu_hour"] == "100"
    assert set_.json()["price_per_cpu_hour"] == "0"
    book = (await client.get("/v1/prices", params={"flavor": "a100"}, headers=ML_VIEWER)).json()
    listed = [p for p in book if p["effective_from"] == set_.json()["effective_from"]]
    assert {p["price_per_gpu_hour"] or p["price_per_cpu_hour"] for p in listed} == {"100", "0"}


async def test_budgets_come_a_page_at_a_time(client: httpx.AsyncClient) -> None:
    # An operator's GET /v1/budgets answered every budget of every team (and priced each
    # one's month) in one request. Now a page of at most limit, the rest by the Link cursor.
    body = {"amount": "100", "policy": "warn"}
    scopes = ["/v1/budgets/ml", "/v1/budgets/ml/a", "/v1/budgets/ml/b", "/v1/budgets/vision"]
    for scope in scopes:
        made = await client.put(scope, json=body, headers=OPERATOR_USER)
        assert made.status_code == 201, made.text
    seen: list[tuple[str, str | None]] = []
    url: str | None = "/v1/budgets?limit=3"
    for _ in range(5):
        assert url is not None
        page = await client.get(url, headers=OPERATOR_USER)
        assert page.status_code == 200, page.text
        assert len(page.json()) <= 3
        seen += [(b["team"], b["project"]) for b in page.json()]
        url = page.links.get("next", {}).get("url")
        if url is None:
            break
    assert seen == [("ml", None), ("ml", "a"), ("ml", "b"), ("vision", None)]
    for bad in ({"after": "bm90IGEgY3Vyc29y"}, {"limit": 501}, {"limit": 0}):
        refused = await client.get("/v1/budgets", params=bad, headers=OPERATOR_USER)
        assert refused.status_code == 422, (bad, refused.text)
        assert next(iter(bad)) in errors(refused), refused.text


async def test_the_price_book_comes_a_page_at_a_time(client: httpx.AsyncClient) -> None:
    # Every price change adds a row to the book, and GET /v1/prices answered all of them in
    # one body. Now a page of at most limit, the rest by the Link cursor, with in_force as
    # the whole book says it.
    soon = datetime.now(UTC) + timedelta(days=1)
    for n in range(3):
        body = {
            "price_per_gpu_hour": f"{3 + n}",
            "price_per_cpu_hour": "0.2",
            "effective_from": (soon + timedelta(days=n)).isoformat(),
        }
        made = await client.put("/v1/prices/a100", json=body, headers=OPERATOR)
        assert made.status_code == 201, made.text
    whole = await client.get("/v1/prices", params={"limit": 500}, headers=ML_VIEWER)
    assert whole.status_code == 200 and "link" not in whole.headers
    book = whole.json()
    assert len(book) >= 7
    seen: list[dict[str, object]] = []
    url: str | None = "/v1/prices?limit=2"
    for _ in range(20):
        assert url is not None
        page = await client.get(url, headers=ML_VIEWER)
        assert page.status_code == 200, page.text
        assert len(page.json()) <= 2
        seen += page.json()
        url = page.links.get("next", {}).get("url")
        if url is None:
            break
    assert seen == book
    a100 = [p for p in book if p["flavor"] == "a100"]
    gpu = [p for p in a100 if p["price_per_gpu_hour"] is not None]
    assert [p["in_force"] for p in gpu] == [True, False, False, False]
    cpu = [p for p in a100 if p["price_per_cpu_hour"] is not None]
    assert [p["in_force"] for p in cpu] == [False, False, False]  # all still to come
    only = await client.get("/v1/prices", params={"flavor": "a100", "limit": 1}, headers=ML_VIEWER)
    assert only.json() == a100[:1] and "flavor=a100" in only.links["next"]["url"]
    for bad in ({"after": "bm90IGEgY3Vyc29y"}, {"limit": 501}):
        assert next(iter(bad)) in errors(
            await client.get("/v1/prices", params=bad, headers=ML_VIEWER)
        )


async def _states(pool: asyncpg.Pool, team: str) -> list[BudgetUpdated]:
    rows = await pool.fetch(
        "SELECT body FROM outbox WHERE event_id LIKE $1 ORDER BY seq", f"budget:{team}:%"
    )
    states = [parse_envelope(r["body"]).data for r in rows]
    return sorted((s for s in states if isinstance(s, BudgetUpdated)), key=lambda s: s.revision)


async def test_a_budget_that_holds_queued_jobs_says_its_rates_and_is_said_after_every_bill(
    pool: asyncpg.Pool, client: httpx.AsyncClient
) -> None:
    """The scheduler reserves each job's worst case against a budget that holds queued jobs
    once spent, at the rates billing says with its state (the highest prices from now on):
    so billing says them, says the state again when the book changes, and after every bill
    of the month (the scheduler stops reserving an allocation once it ends: its bill must
    be in ``spent`` by then). A budget that only warns reserves nothing and gets no rates."""
    put = await client.put(
        "/v1/budgets/ml", json={"amount": "1000", "policy": "refuse"}, headers=ML_ADMIN
    )
    assert put.status_code == 201, put.text
    warn = await client.put("/v1/budgets/vision", json={"amount": "1000"}, headers=OPERATOR_USER)
    assert warn.status_code == 201, warn.text
    (first,) = await _states(pool, "ml")
    assert first.rates is not None
    assert first.rates["a100"].model_dump() == {
        "gpu_hour": "2.5",
        "cpu_hour": "0",
        "memory_gib_hour": "0",
    }
    assert [s.rates for s in await _states(pool, "vision")] == [None]

    # A dearer price set for later: reserved at it from now on.
    later = (datetime.now(UTC) + timedelta(days=2)).isoformat()
    change = await client.put(
        "/v1/prices/a100",
        json={"price_per_gpu_hour": "4", "price_per_cpu_hour": "0.2", "effective_from": later},
        headers=OPERATOR,
    )
    assert change.status_code == 201, change.text
    *_, repriced = await _states(pool, "ml")
    assert repriced.revision > first.revision and repriced.rates is not None
    assert (repriced.rates["a100"].gpu_hour, repriced.rates["a100"].cpu_hour) == ("4", "0.2")
    assert len(await _states(pool, "vision")) == 1

    # A bill crossing no threshold (5.00 of 1000) still says the state, with what it spent.
    month = month_start(datetime.now(UTC))
    bill = released("r1", month + timedelta(minutes=1), timedelta(hours=1))
    await feed(pool, grant_of(bill), release_event(bill))
    *_, billed = await _states(pool, "ml")
    assert billed.revision > repriced.revision and Decimal(billed.spent) == Decimal(5)
    bill = released("v1", month + timedelta(minutes=1), timedelta(hours=1), team="vision")
    await feed(pool, grant_of(bill), release_event(bill))
    assert len(await _states(pool, "vision")) == 1


async def test_a_price_change_reads_the_book_once_for_every_budget_that_reserves(
    pool: asyncpg.Pool, client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A price change says again the state of every budget that reserves, in its
    transaction, holding all their scopes (bills wait): the rates are the same for each, so
    the book is read once, not once per budget (a thousand budgets read the whole book a
    thousand times while every bill waited)."""
    for path, headers in (
        ("/v1/budgets/ml", ML_ADMIN),
        ("/v1/budgets/ml/nlp", ML_ADMIN),
        ("/v1/budgets/vision", OPERATOR_USER),
    ):
        put = await client.put(path, json={"amount": "1000", "policy": "refuse"}, headers=headers)
        assert put.status_code in (200, 201), put.text
    reads = 0
    whole_book = catalogue.schedule

    async def counted(conn: asyncpg.Connection, flavor: str | None = None) -> Any:
        nonlocal reads
        reads += 1
        return await whole_book(conn, flavor)

    monkeypatch.setattr(catalogue, "schedule", counted)
    async with pool.acquire() as conn, conn.transaction():
        await budget_watch.reserving(conn, datetime.now(UTC))
    assert reads == 1
    *_, said = await _states(pool, "vision")
    assert said.rates is not None and said.rates["a100"].gpu_hour == "2.5"


async def _fill_book(pool: asyncpg.Pool, flavors: int) -> None:
    """Price flavors until the book has ``flavors`` of them, each with the longest name and
    the dearest prices a rate says (the largest ``budget.updated`` a book of that size
    makes)."""
    have = await pool.fetchval("SELECT count(DISTINCT flavor) FROM prices")
    dearest = Decimal("9999999999.999999")
    rows = [(f"f{i:039d}", dearest) for i in range(flavors - have)]
    await pool.executemany(
        "INSERT INTO prices (flavor, effective_from, price_per_gpu_hour, currency, set_by, "
        "recorded_at) VALUES ($1, '1970-01-01Z', $2, 'USD', 'test', now())",
        rows,
    )
    for resource in ("cpu", "memory"):
        await pool.executemany(
            "INSERT INTO resource_prices (flavor, resource, effective_from, price_per_unit_hour, "
            "currency, set_by, recorded_at) "
            f"VALUES ($1, '{resource}', '1970-01-01Z', $2, 'USD', 'test', now())",
            rows,
        )


async def test_a_book_at_its_bound_is_said_whole_and_a_flavor_past_it_is_refused(
    pool: asyncpg.Pool, client: httpx.AsyncClient
) -> None:
    """A budget that reserves says the rates of every priced flavor: a book of
    ``MAX_PRICED_FLAVORS`` flavors, the dearest and longest-named, is said whole, in an
    event that fits the bus's default ``max_payload``; the price API refuses to price one
    more flavor (422 naming ``flavor``), rather than take a price that would leave every
    budget that reserves unsaid (and its bills failing)."""
    await _fill_book(pool, MAX_PRICED_FLAVORS)
    put = await client.put(
        "/v1/budgets/ml", json={"amount": "1000", "policy": "refuse"}, headers=ML_ADMIN
    )
    assert put.status_code == 201, put.text
    (said,) = await _states(pool, "ml")
    assert said.rates is not None and len(said.rates) == MAX_PRICED_FLAVORS
    body = await pool.fetchval(
        "SELECT body FROM outbox WHERE event_id = $1", f"budget:ml::{said.revision}"
    )
    assert len(body) < DEFAULT_MAX_PAYLOAD // 2

    at = datetime.now(UTC)
    await feed(
        pool, catalogue_event(FlavorDeclared(name="b300", revision=1, declared_at=at), "b300")
    )
    refused = await client.put(
        "/v1/prices/b300", json={"price_per_gpu_hour": "9"}, headers=OPERATOR
    )
    assert "1000 flavors" in errors(refused)["flavor"]
    assert await catalogue.price_rows(pool, "b300") == []  # type: ignore[arg-type]
    # A flavor of the book is priced again as ever.
    repriced = await client.put(
        "/v1/prices/a100", json={"price_per_gpu_hour": "3"}, headers=OPERATOR
    )
    assert repriced.status_code == 201, repriced.text


async def test_billing_says_every_budget_again_at_start_with_the_next_revision(
    pool: asyncpg.Pool, client: httpx.AsyncClient
) -> None:
    """A replica's rows kept before it gained ``rates`` (submission's migration 0012, the
    scheduler's 0013) reserve nothing until billing says the budget again: billing says every
    budget's state at start, as it is, each with a revision above all said before (a replica
    keeps it) and the rates of a budget that reserves; a deleted budget is not said again."""
    for path, body, headers in (
        ("/v1/budgets/ml", {"amount": "1000", "policy": "refuse"}, ML_ADMIN),
        ("/v1/budgets/ml/nlp", {"amount": "50", "on_exhausted": "stop"}, ML_ADMIN),
        ("/v1/budgets/vision", {"amount": "1000"}, OPERATOR_USER),
        ("/v1/budgets/vision/gone", {"amount": "10"}, OPERATOR_USER),
    ):
        put = await client.put(path, json=body, headers=headers)
        assert put.status_code == 201, put.text
    gone = await client.delete("/v1/budgets/vision/gone", headers=OPERATOR_USER)
    assert gone.status_code == 204, gone.text
    before = {
        (s.team, s.project): s for s in await _states(pool, "ml") + await _states(pool, "vision")
    }
    highest = max(s.revision for s in before.values())

    await say_budgets(pool, batch=2)  # in two transactions: 2 budgets, then 1

    after = [
        s for s in await _states(pool, "ml") + await _states(pool, "vision") if s.revision > highest
    ]
    assert sorted((s.team, s.project or "") for s in after) == [
        ("ml", ""),
        ("ml", "nlp"),
        ("vision", ""),
    ]
    for state in after:
        old = before[(state.team, state.project)]
        # The same state, said again: only its revision and when spent was measured differ.
        same = {"revision", "spent_at"}
        assert state.model_dump(exclude=same) == old.model_dump(exclude=same)
        assert state.spent_at is not None
    assert {(s.project, s.rates is not None) for s in after if s.team == "ml"} == {
        (None, True),
        ("nlp", True),
    }


async def test_budgets_are_said_again_at_start_only_once_stale_rollups_are_rebuilt(
    pool: asyncpg.Pool, client: httpx.AsyncClient, database_url: str
) -> None:
    """What is spent is read from the cost rollups: a start that finds them stale (here as
    the first start after the ledger's migration finds them, none beside the ledger's
    entries) rebuilds them before it says any budget again, so a spent budget is said spent,
    not unspent with a revision every replica keeps."""
    put = await client.put(
        "/v1/budgets/ml", json={"amount": "1", "policy": "refuse"}, headers=ML_ADMIN
    )
    assert put.status_code == 201, put.text
    month = month_start(datetime.now(UTC))
    done = released("done-1", month + timedelta(minutes=1), timedelta(hours=1))  # 5.00
    await feed(pool, grant_of(done), release_event(done))
    await pool.execute("DELETE FROM cost_rollups")

    settings = Settings(
        prices={"cpu": 0.10, "a100": 2.50},
        currency="USD",
        admin_token=SecretStr("t"),
        database=DatabaseSettings(url=database_url),
    )
    await prepare(pool, settings)

    *_, said = await _states(pool, "ml")
    assert (said.exhausted, Decimal(said.spent)) == (True, Decimal(5))


async def test_a_book_priced_past_its_bound_before_is_said_so_at_start(
    pool: asyncpg.Pool, client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    """A book priced past ``MAX_PRICED_FLAVORS`` before the bound (the settings seeded it):
    no state of a budget that reserves can say its rates. Billing still starts, saying the
    other budgets again, and logs at error level what it could not say and what to do."""
    for path, body, headers in (
        ("/v1/budgets/ml", {"amount": "1000", "policy": "refuse"}, ML_ADMIN),
        ("/v1/budgets/vision", {"amount": "1000"}, OPERATOR_USER),
    ):
        put = await client.put(path, json=body, headers=headers)
        assert put.status_code == 201, put.text
    await _fill_book(pool, MAX_PRICED_FLAVORS + 1)
    (vision,) = await _states(pool, "vision")

    await say_budgets(pool, batch=1)

    assert len(await _states(pool, "ml")) == 1
    assert [s.revision > vision.revision for s in await _states(pool, "vision")] == [False, True]
    (logged,) = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert logged.startswith(
        f"budgets: 1 not said again at start: the price book has {MAX_PRICED_FLAVORS + 1} "
        f"flavors with a GPU price, more than the {MAX_PRICED_FLAVORS}"
    )


async def test_a_batch_that_cannot_say_a_budget_at_start_says_none_of_its_budgets(
    pool: asyncpg.Pool,
    client: httpx.AsyncClient,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A batch of ``say_budgets`` is one transaction: when a budget of it cannot be said
    (one that reserves, under a book past its bound: here read reserving only under its
    scope, as one changed since its page was read), the batch is rolled back, so the
    error's count of budgets not said is exact: none of them, not those before it."""
    for path, body in (
        ("/v1/budgets/ml", {"amount": "1000"}),
        ("/v1/budgets/ml/nlp", {"amount": "1000", "policy": "refuse"}),
    ):
        put = await client.put(path, json=body, headers=ML_ADMIN)
        assert put.status_code == 201, put.text
    await _fill_book(pool, MAX_PRICED_FLAVORS + 1)
    listed = budgets_repo.of_teams

    async def read_before_the_change(*args: Any, **kwargs: Any) -> list[Any]:
        return [replace(b, policy="warn") for b in await listed(*args, **kwargs)]

    monkeypatch.setattr(budgets_repo, "of_teams", read_before_the_change)
    before = await _states(pool, "ml")
    await say_budgets(pool, batch=2)

    assert await _states(pool, "ml") == before
    logged = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert [m.split(": the price book")[0] for m in logged] == [
        "budgets: 2 not said again at start"
    ]


async def test_a_book_priced_past_its_bound_refuses_a_change_with_409_naming_why(
    pool: asyncpg.Pool, client: httpx.AsyncClient
) -> None:
    """Under such a book, a change that would say a budget's rates (a budget created or
    changed to reserve, a price set while a budget reserves) is refused with 409 naming the
    field and what to do, not a 500; nothing of it is kept. A budget that reserves nothing
    is still written."""
    put = await client.put(
        "/v1/budgets/ml", json={"amount": "1000", "policy": "refuse"}, headers=ML_ADMIN
    )
    assert put.status_code == 201, put.text
    await _fill_book(pool, MAX_PRICED_FLAVORS + 1)
    too_many = f"the price book has {MAX_PRICED_FLAVORS + 1} flavors with a GPU price"

    for method, path, body, headers, field in (
        ("PUT", "/v1/budgets/ml/nlp", {"amount": "10", "on_exhausted": "stop"}, ML_ADMIN, "policy"),
        ("PATCH", "/v1/budgets/ml", {"amount": "5"}, ML_ADMIN, "policy"),
        ("PUT", "/v1/prices/a100", {"price_per_gpu_hour": "3"}, OPERATOR, "flavor"),
    ):
        refused = await client.request(method, path, json=body, headers=headers)
        assert refused.status_code == 409, refused.text
        (error,) = refused.json()["errors"]
        assert error["field"] == field and too_many in error["message"], error
    assert await budgets_repo.get(pool, "ml", "nlp") is None  # type: ignore[arg-type]
    ml = await budgets_repo.get(pool, "ml", None)  # type: ignore[arg-type]
    assert ml is not None and ml.amount == Decimal(1000)
    assert [p["price_per_gpu_hour"] for p in await catalogue.price_rows(pool, "a100")] == [  # type: ignore[arg-type]
        Decimal("2.5")
    ]
    warns = await client.put("/v1/budgets/vision", json={"amount": "10"}, headers=OPERATOR_USER)
    assert warns.status_code == 201, warns.text


async def test_a_bill_under_a_book_past_its_bound_is_kept_and_the_state_left_unsaid(
    pool: asyncpg.Pool, client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    """A bill is never lost for a state that cannot be said: under a book priced past
    ``MAX_PRICED_FLAVORS``, the bill of a team whose budget reserves commits (ledger, cost,
    thresholds crossed), its budget's state is not said, and an error says why and what
    to do; the next bill tries again."""
    put = await client.put(
        "/v1/budgets/ml", json={"amount": "1", "policy": "refuse"}, headers=ML_ADMIN
    )
    assert put.status_code == 201, put.text
    await _fill_book(pool, MAX_PRICED_FLAVORS + 1)
    month = month_start(datetime.now(UTC))
    done = released("done-1", month + timedelta(minutes=1), timedelta(hours=1))  # 5.00

    await feed(pool, grant_of(done), release_event(done))

    assert await pool.fetchval("SELECT cost FROM usage_ledger WHERE allocation_id = 'done-1'")
    assert len(await _states(pool, "ml")) == 1  # only the one its creation said
    crossed = await pool.fetch("SELECT threshold_percent FROM budget_crossings WHERE team = 'ml'")
    assert sorted(r["threshold_percent"] for r in crossed) == [50, 80, 100]
    (logged,) = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert logged.startswith(
        f"budget of ml: state not said: the price book has {MAX_PRICED_FLAVORS + 1} flavors"
    )


async def test_billing_reads_the_book_once_per_batch_when_it_says_budgets_again_at_start(
    pool: asyncpg.Pool, client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What running allocations have accrued is priced by the book: saying every budget
    again at start reads it once per batch (one transaction, one snapshot), for the rates
    and every budget's accrual alike, not once more per budget with a running allocation,
    and says the same figures as a budget read alone."""
    for path, body, headers in (
        ("/v1/budgets/ml", {"amount": "1000", "policy": "refuse"}, ML_ADMIN),
        ("/v1/budgets/ml/nlp", {"amount": "50"}, ML_ADMIN),
        ("/v1/budgets/vision", {"amount": "1000"}, OPERATOR_USER),
    ):
        put = await client.put(path, json=body, headers=headers)
        assert put.status_code == 201, put.text
    month = month_start(datetime.now(UTC))
    ml = released("run-1", month + timedelta(minutes=1), timedelta(hours=1))
    nlp = released("run-2", month + timedelta(minutes=2), timedelta(hours=1))
    vision = released("run-3", month + timedelta(minutes=3), timedelta(hours=1), team="vision")
    await feed(pool, grant_of(ml), grant_of(nlp, project="nlp"), grant_of(vision))
    reads = 0
    whole_book = catalogue.schedule

    async def counted(conn: asyncpg.Connection, flavor: str | None = None) -> Any:
        nonlocal reads
        reads += 1
        return await whole_book(conn, flavor)

    monkeypatch.setattr(catalogue, "schedule", counted)
    highest = max(s.revision for s in await _states(pool, "ml") + await _states(pool, "vision"))

    await say_budgets(pool, batch=2)  # (ml, ml/nlp), then (vision): two transactions

    assert reads == 2
    said = [s for s in await _states(pool, "ml") + await _states(pool, "vision")]
    said = [s for s in said if s.revision > highest]
    assert len(said) == 3
    monkeypatch.setattr(catalogue, "schedule", whole_book)
    async with pool.acquire() as conn:
        for state in said:
            budget = await budgets_repo.get(conn, state.team, state.project)
            assert budget is not None and state.spent_at is not None
            spent, accruing = await budgets_repo.spent_accruing(conn, budget, month, state.spent_at)
            assert Decimal(state.spent) == spent > 0
            assert state.accruing == (accruing if state.rates is not None else None)


async def test_a_state_says_when_spent_was_measured_and_which_running_allocations_it_counts(
    pool: asyncpg.Pool, client: httpx.AsyncClient
) -> None:
    """What is spent counts what the allocations still running have accrued up to its
    measure: the state says that instant (``spent_at``) and, for a budget that reserves,
    which allocations (``accruing``), so the scheduler reserves each of them only what it
    may cost after it, not its whole worst case again. An ended (billed) allocation is not
    among them; a budget that reserves nothing names none."""
    for path, body, headers in (
        ("/v1/budgets/ml", {"amount": "1000", "policy": "refuse"}, ML_ADMIN),
        ("/v1/budgets/vision", {"amount": "1000"}, OPERATOR_USER),
    ):
        put = await client.put(path, json=body, headers=headers)
        assert put.status_code == 201, put.text
    month = month_start(datetime.now(UTC))
    done = released("done-1", month + timedelta(minutes=1), timedelta(hours=1))
    running = released("run-1", month + timedelta(minutes=2), timedelta(hours=1))
    watched = released("run-2", month + timedelta(minutes=2), timedelta(hours=1), team="vision")
    await feed(pool, grant_of(done), release_event(done), grant_of(running), grant_of(watched))
    now = datetime.now(UTC)
    async with pool.acquire() as conn, conn.transaction():
        for team in ("ml", "vision"):
            budget = await budgets_repo.get(conn, team, None)
            assert budget is not None
            spent = await budget_watch.say_state(conn, budget, now)
            accrued = await budgets_repo.accrued(conn, budget, month, now)
            assert accrued > 0 and spent == (Decimal(5) if team == "ml" else 0) + accrued
    *_, ml = await _states(pool, "ml")
    assert (ml.spent_at, ml.accruing) == (now, ["run-1"])
    *_, vision = await _states(pool, "vision")
    assert (vision.spent_at, vision.accruing) == (now, None)

"""Billing through NATS and Postgres: one ledger row and one CostRecorded per allocation."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import asyncpg
import httpx
import pytest
from pydantic import SecretStr

from tests.integration.billing.conftest import Billing, feed, grant_of, release_event, until
from trainyard_platform.services.billing.api import create_app
from trainyard_platform.services.billing.config import Settings
from trainyard_platform.services.billing.handlers import BillingHandlers, NotAnnounced
from trainyard_platform.services.billing.service import seed_prices
from trainyard_platform.shared.access import service_guard
from trainyard_platform.shared.bus import REASON_HEADER, Reject
from trainyard_platform.shared.events import Envelope, Payload
from trainyard_platform.shared.events.payloads import MAX_PRICED_FLAVORS, AllocationReleased
from trainyard_platform.shared.events.trust import owner
from trainyard_platform.shared.runtime import StartupRefused

pytestmark = pytest.mark.integration

T0 = datetime(2025, 3, 1, 8, 0, tzinfo=UTC)


def released(
    allocation_id: str = "alloc-1",
    *,
    job_id: str = "job-1",
    team: str = "vision",
    user: str = "ada",
    flavor: str = "a100",
    gpus: int = 2,
    duration: timedelta = timedelta(minutes=90, microseconds=7),
) -> AllocationReleased:
    return AllocationReleased(
        allocation_id=allocation_id,
        job_id=job_id,
        node_id="node-1",
        team=team,
        user=user,
        gpu_flavor=flavor,
        gpus=gpus,
        granted_at=T0,
        released_at=T0 + duration,
        outcome="succeeded",
    )


async def test_release_is_billed_once_at_gpu_seconds_times_price(billing: Billing) -> None:
    await billing.send(released())
    row = await billing.pool.fetchrow("SELECT * FROM usage_ledger")
    gpu_seconds = Decimal("10800.000014")  # 2 GPUs x 5400.000007 s
    expected = (gpu_seconds * Decimal("2.5") / 3600).quantize(Decimal("0.000001"))
    assert row["gpu_seconds"] == gpu_seconds
    assert row["price_per_gpu_hour"] == Decimal("2.5")
    assert row["cost"] == expected == Decimal("7.500000")
    assert (row["job_id"], row["team"], row["user_name"], row["gpu_flavor"]) == (
        "job-1",
        "vision",
        "ada",
        "a100",
    )
    await until(lambda: len(billing.costs()) == 1)
    (recorded,) = billing.costs()
    assert (recorded.allocation_id, recorded.job_id, recorded.currency) == (
        "alloc-1",
        "job-1",
        "USD",
    )
    assert Decimal(str(recorded.cost)) == expected
    assert recorded.gpu_seconds == pytest.approx(10800.000014)
    envelope = next(e for e in billing.seen if e.type == "trainyard.cost.recorded.v1")
    assert envelope.subject == "job-1"


async def test_duplicate_release_is_billed_once(billing: Billing) -> None:
    first = await billing.send(released())
    # The same event past JetStream's de-duplication, then the same allocation as a new event.
    await billing.bus.publish_raw(first.nats_subject, first.to_json(), "redelivery-1", {})
    await billing.send(released())
    await billing.send(released("alloc-2", gpus=1, flavor="cpu", duration=timedelta(hours=2)))
    assert await billing.pool.fetchval("SELECT count(*) FROM usage_ledger") == 2
    await until(lambda: len(billing.costs()) == 2)
    assert sorted(c.allocation_id for c in billing.costs()) == ["alloc-1", "alloc-2"]
    assert await billing.pool.fetchval(
        "SELECT cost FROM usage_ledger WHERE allocation_id = 'alloc-2'"
    ) == Decimal("0.200000")


async def test_unknown_flavor_is_dead_lettered_with_the_reason(billing: Billing) -> None:
    unpriced = released("alloc-9", job_id="job-9", flavor="tpu")
    payload: Payload = unpriced
    bad = Envelope.wrap(payload, source=owner(payload), subject="job-9")
    await billing.announce(unpriced)
    await billing.bus.publish(bad)
    await billing.send(released("alloc-10"))  # consumption goes on behind it

    async def dead() -> list[str]:
        info = await billing.bus.jetstream.stream_info("TRAINYARD_DEADLETTER")
        reasons = []
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            if info.state.messages == 0:
                break
            msg = await billing.bus.jetstream.get_msg("TRAINYARD_DEADLETTER", seq)
            reasons.append((msg.headers or {})[REASON_HEADER])
        return reasons

    await until(lambda: dead())
    reasons = await dead()
    assert any("no price for 'tpu' in the price book (priced: a100, cpu)" in r for r in reasons)
    ids = [
        r["allocation_id"]
        for r in await billing.pool.fetch("SELECT allocation_id FROM usage_ledger")
    ]
    assert ids == ["alloc-10"]


async def test_a_release_handled_while_its_grant_commits_elsewhere_is_retried(
    pool: asyncpg.Pool,
) -> None:
    """Two replicas of billing apply consecutive batches at once: the grant's (not committed
    yet) and its release's. Before, the release found no announcement and was rejected (at
    once dead-lettered: never billed). Now it fails like any error, so the bus delivers it
    again, and then it is billed once the grant has committed."""
    release = released("alloc-r")
    async with pool.acquire() as conn, conn.transaction():  # the other replica's batch
        await BillingHandlers().dispatch(grant_of(release), conn)
        with pytest.raises(NotAnnounced, match="was never announced") as raised:
            await feed(pool, release_event(release))
        assert not isinstance(raised.value, Reject)
    await feed(pool, release_event(release))  # delivered again
    assert await pool.fetchval("SELECT cost FROM usage_ledger") == Decimal("7.500000")


async def test_settings_price_only_flavors_without_a_price(pool: asyncpg.Pool) -> None:
    # The fixture gave cpu 0.10 and a100 2.50; the settings are the book's bootstrap only:
    # a flavor priced already keeps its price (operators change it with PUT /v1/prices).
    await seed_prices(
        pool,
        Settings(prices={"cpu": 0.12, "h200": 5.5}, currency="USD", admin_token=SecretStr("t")),
    )
    rows = await pool.fetch(
        "SELECT flavor, effective_from, price_per_gpu_hour FROM prices ORDER BY flavor"
    )
    assert [(r["flavor"], r["price_per_gpu_hour"]) for r in rows] == [
        ("a100", Decimal("2.5")),
        ("cpu", Decimal("0.1")),  # kept
        ("h200", Decimal("5.5")),  # new: priced from the settings
    ]
    assert {r["effective_from"].year for r in rows} == {1970}


async def test_a_changed_currency_is_refused_at_start_naming_the_setting(
    pool: asyncpg.Pool,
) -> None:
    """TRAINYARD_BILLING_CURRENCY changed from USD to EUR on a running installation: billing
    started, and the first price set or flavor seeded in EUR made the book mix currencies,
    so every release was refused and every budget check failed after. It now refuses to
    start, in one line, and the book is left as it was."""
    before = await pool.fetch("SELECT * FROM prices ORDER BY flavor")
    with pytest.raises(StartupRefused) as refused:
        await seed_prices(
            pool,
            Settings(prices={"h200": 5.5}, currency="EUR", admin_token=SecretStr("t")),
        )
    said = str(refused.value)
    assert said.startswith("TRAINYARD_BILLING_CURRENCY is EUR, but billing holds 2 prices in USD")
    assert "set TRAINYARD_BILLING_CURRENCY=USD again" in said
    assert await pool.fetch("SELECT * FROM prices ORDER BY flavor") == before  # no h200
    await seed_prices(  # the same currency starts as before
        pool, Settings(prices={"h200": 5.5}, currency="USD", admin_token=SecretStr("t"))
    )


async def test_settings_that_take_the_book_past_its_flavors_are_refused_at_start(
    pool: asyncpg.Pool,
) -> None:
    """The book holds at most ``MAX_PRICED_FLAVORS`` flavors (each budget that reserves says
    the rates of every one in one event): settings that would price new flavors past them
    refuse the start, in one line naming the setting, and seed nothing."""
    await pool.executemany(
        "INSERT INTO prices (flavor, effective_from, price_per_gpu_hour, currency, set_by, "
        "recorded_at) VALUES ($1, '1970-01-01Z', 1, 'USD', 'test', now())",
        [(f"f{i}",) for i in range(MAX_PRICED_FLAVORS - 3)],  # with cpu and a100: 1 left
    )
    before = await pool.fetch("SELECT * FROM prices ORDER BY flavor")
    too_many = {"h200": 5.5, "b200": 6.0}
    with pytest.raises(StartupRefused) as refused:
        await seed_prices(
            pool, Settings(prices=too_many, currency="USD", admin_token=SecretStr("t"))
        )
    assert str(refused.value).startswith(
        f"TRAINYARD_BILLING_PRICES would price 2 new flavors, {MAX_PRICED_FLAVORS + 1} in all"
    )
    assert await pool.fetch("SELECT * FROM prices ORDER BY flavor") == before
    # Up to the bound, and flavors priced already, start as ever.
    await seed_prices(
        pool, Settings(prices={"h200": 5.5, "a100": 1}, currency="USD", admin_token=SecretStr("t"))
    )
    assert await pool.fetchval("SELECT count(DISTINCT flavor) FROM prices") == MAX_PRICED_FLAVORS


async def test_usage_summary_per_team_user_and_job(billing: Billing) -> None:
    await billing.send(released("a1", job_id="j1", user="ada", gpus=1, duration=timedelta(hours=1)))
    await billing.send(released("a2", job_id="j1", user="ada", gpus=1, duration=timedelta(hours=1)))
    await billing.send(released("a3", job_id="j2", user="bob", gpus=2, duration=timedelta(hours=1)))
    await billing.send(
        released("a4", job_id="j3", team="nlp", user="cy", duration=timedelta(hours=1))
    )
    app = create_app(billing.pool, service_guard(SecretStr("s3cret")), [])
    # In this event loop (the pool's), not in a test client's thread.
    transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=transport, base_url="http://billing") as client:
        assert (await client.get("/v1/usage")).status_code == 401
        response = await client.get(
            "/v1/usage", params={"team": "vision"}, headers={"Authorization": "Bearer s3cret"}
        )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["team"] == "vision"
    assert [(t["team"], Decimal(t["cost"]), t["allocations"]) for t in body["teams"]] == [
        ("vision", Decimal("10"), 3)
    ]
    assert [(u["user"], Decimal(u["gpu_seconds"]), Decimal(u["cost"])) for u in body["users"]] == [
        ("ada", Decimal(7200), Decimal("5")),
        ("bob", Decimal(7200), Decimal("5")),
    ]
    assert [(j["job_id"], j["allocations"]) for j in body["jobs"]] == [("j1", 2), ("j2", 1)]


async def test_usage_jobs_come_a_page_at_a_time_with_an_opaque_cursor(billing: Billing) -> None:
    # An operator without team used to get every job of every team in one answer.
    for n in range(5):
        team = "vision" if n % 2 else "nlp"
        await billing.send(released(f"a{n}", job_id=f"j{n}", team=team, user=f"u{n % 3}"))
    await billing.send(released("a5", job_id="j0", team="nlp", user="u0", flavor="cpu"))
    app = create_app(billing.pool, service_guard(SecretStr("s3cret")), [])
    operator = {"Authorization": "Bearer s3cret"}
    transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=transport, base_url="http://billing") as client:
        seen: list[tuple[str, str]] = []
        params: dict[str, str | int] = {"limit": 2}
        for _ in range(10):
            response = await client.get("/v1/usage", params=params, headers=operator)
            assert response.status_code == 200, response.text
            body = response.json()
            assert len(body["jobs"]) <= 2
            seen += [(j["job_id"], j["gpu_flavor"]) for j in body["jobs"]]
            if body["next"] is None:
                break
            params = {"limit": 2, "after": body["next"]}
        expected = [("j0", "cpu"), *((f"j{n}", "a100") for n in range(5))]
        assert sorted(seen) == sorted(expected)
        assert len(seen) == len(set(seen))
        whole = (await client.get("/v1/usage", headers=operator)).json()
        assert len(whole["jobs"]) == 6 and whole["next"] is None
        for bad in ({"limit": 0}, {"limit": 501}, {"after": "bm90IGEgY3Vyc29y"}, {"after": "%%"}):
            refused = await client.get("/v1/usage", params=bad, headers=operator)
            assert refused.status_code == 422, (bad, refused.text)
            assert refused.json()["errors"][0]["field"] == next(iter(bad))

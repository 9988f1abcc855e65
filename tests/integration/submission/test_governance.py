"""Submission's replicas of the flavor catalogue and of budget states (real PostgreSQL, the
real inbox and handler), and the admission they drive."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import asyncpg
import pytest

from trainyard_platform.services.submission import governance, identity
from trainyard_platform.services.submission.errors import Conflict
from trainyard_platform.services.submission.governance import admit, known_flavors
from trainyard_platform.services.submission.schemas import JobRequest, parse_job_request
from trainyard_platform.services.submission.service import event_handler
from trainyard_platform.shared.bus import Delivery
from trainyard_platform.shared.events import Envelope, Payload
from trainyard_platform.shared.events.payloads import BudgetUpdated, FlavorDeclared, FlavorRetired
from trainyard_platform.shared.events.trust import owner, routing_key_of
from trainyard_platform.shared.http_errors import RequestInvalid
from trainyard_platform.shared.identity import Role
from trainyard_platform.shared.worst_case import KILL_GRACE_SECONDS

pytestmark = pytest.mark.integration

NOW = datetime(2026, 12, 3, 12, tzinfo=UTC)
BOOTSTRAP = ["cpu", "a100"]


async def feed(pool: asyncpg.Pool, *payloads: Payload) -> None:
    """Hand the events to submission's consumer handler as one batch (inbox included)."""
    envelopes = [Envelope.wrap(p, source=owner(p), subject=routing_key_of(p)) for p in payloads]
    await event_handler(pool)([Delivery(e) for e in envelopes])


def job(project: str = "default", flavor: str = "cpu") -> JobRequest:
    body = {"name": "j", "entrypoint": "train", "gpus": 1, "gpu_flavor": flavor}
    return JobRequest.model_validate({**body, "project": project})


def state(revision: int, **changes: object) -> BudgetUpdated:
    fields: dict[str, object] = {
        "team": "ml",
        "month": "2026-12",
        "amount": "10",
        "spent": "12",
        "currency": "USD",
        "policy": "refuse",
        "exhausted": True,
        "revision": revision,
        **changes,
    }
    return BudgetUpdated.model_validate(fields)


async def test_the_catalogue_replica_keeps_the_latest_revision_of_each_flavor(
    pool: asyncpg.Pool,
) -> None:
    assert await known_flavors(pool, BOOTSTRAP) == ["a100", "cpu"]
    await feed(
        pool,
        FlavorDeclared(name="l40s", revision=5, declared_at=NOW),
        FlavorRetired(name="a100", revision=6, retired_at=NOW),
        FlavorRetired(name="l40s", revision=4, retired_at=NOW),  # older: ignored
    )
    assert await known_flavors(pool, BOOTSTRAP) == ["cpu", "l40s"]

    body = json.dumps({"name": "j", "entrypoint": "train", "gpus": 1, "gpu_flavor": "a100"})
    with pytest.raises(RequestInvalid) as refused:
        parse_job_request(body.encode(), await known_flavors(pool, BOOTSTRAP))
    (error,) = refused.value.errors
    assert error.field == "gpu_flavor" and "allowed: cpu, l40s" in error.message

    await feed(pool, FlavorDeclared(name="a100", revision=7, declared_at=NOW))
    assert await known_flavors(pool, BOOTSTRAP) == ["a100", "cpu", "l40s"]


async def test_a_spent_budget_refuses_deprioritizes_or_warns_by_its_policy(
    pool: asyncpg.Pool,
) -> None:
    assert await admit(pool, "ml", job(), NOW) == (job(), [], None)

    await feed(pool, state(1))
    with pytest.raises(Conflict, match=r"budget of team ml is spent \(12 of 10 USD"):
        await admit(pool, "ml", job(), NOW)
    assert await admit(pool, "vision", job(), NOW) == (job(), [], None)  # another team's
    # A state of an earlier month counts for nothing in this one.
    assert await admit(pool, "ml", job(), datetime(2027, 1, 1, tzinfo=UTC)) == (job(), [], None)

    await feed(pool, state(3, policy="deprioritize"), state(2, policy="refuse"))  # 2 is older
    admitted, warnings, lowered = await admit(pool, "ml", job(), NOW)
    assert admitted.priority == "low"
    assert warnings == [
        "the budget of team ml is spent (12 of 10 USD spent in 2026-12); the job runs at "
        "priority low"
    ]
    # What the job keeps (its first history entry, its job.submitted): lowered, from what.
    assert lowered == governance.Lowered(
        "normal", "the budget of team ml is spent (12 of 10 USD spent in 2026-12)"
    )
    low = job().model_copy(update={"priority": "low"})
    assert await admit(pool, "ml", low, NOW) == (low, warnings, None)  # asked low: not lowered

    await feed(pool, state(4, policy="warn"), state(5, project="nlp", policy="refuse"))
    assert (await admit(pool, "ml", job("default"), NOW))[0].priority == "normal"
    with pytest.raises(Conflict, match="budget of project nlp of ml"):
        await admit(pool, "ml", job("nlp"), NOW)

    await feed(pool, state(6, project="nlp", deleted=True), state(7, exhausted=False))
    assert await admit(pool, "ml", job("nlp"), NOW) == (job("nlp"), [], None)


async def test_the_one_query_screening_reads_what_known_flavors_and_admit_read(
    pool: asyncpg.Pool,
) -> None:
    """``POST /v1/jobs`` reads the catalogue and the budgets in one query, with the token
    (``authenticate_screened``): it must decide exactly as ``known_flavors`` and ``admit``."""
    async with pool.acquire() as conn:
        token, _ = await identity.add_user(conn, "ml", "ada", Role.MEMBER, None)
    await feed(
        pool,
        FlavorDeclared(name="l40s", revision=1, declared_at=NOW),
        FlavorRetired(name="a100", revision=2, retired_at=NOW),
        state(1, policy="warn", amount="10.50", spent="12.25"),
        state(2, project="nlp", policy="deprioritize"),
        state(3, project="cv", policy="refuse"),
        state(4, team="vision", policy="refuse"),
        state(5, team="ml", project="old", month="2026-11", policy="refuse"),
    )
    found = await identity.authenticate_screened(pool, token, BOOTSTRAP, NOW)
    assert found is not None
    caller, by_token = found
    assert caller.user == "ada" and caller.team == "ml"
    screenings = [await governance.screening(pool, BOOTSTRAP, "ml", NOW), by_token]
    assert await identity.authenticate_screened(pool, "ty_not-a-token", BOOTSTRAP) is None

    for screening in screenings:
        assert screening.flavors == await known_flavors(pool, BOOTSTRAP) == ["cpu", "l40s"]
        for project in ("default", "nlp", "old"):
            assert screening.admit(job(project)) == await admit(pool, "ml", job(project), NOW)
        with pytest.raises(Conflict, match="budget of project cv of ml") as refused:
            screening.admit(job("cv"))
        with pytest.raises(Conflict) as also_refused:
            await admit(pool, "ml", job("cv"), NOW)
        assert str(refused.value) == str(also_refused.value)
    assert screenings[0].admit(job("nlp"))[1] == [
        "the budget of team ml is spent (12.25 of 10.50 USD spent in 2026-12)",
        "the budget of project nlp of ml is spent (12 of 10 USD spent in 2026-12); the job "
        "runs at priority low",
    ]


async def test_a_job_over_the_whole_of_a_reserving_budget_is_refused_until_it_is_raised(
    pool: asyncpg.Pool,
) -> None:
    """The replica keeps ``on_exhausted`` and ``rates``: a budget that reserves refuses (422
    naming ``max_runtime_seconds``) a job it could never start, in every admission path; the
    state billing says after a raise admits the same job."""
    async with pool.acquire() as conn:
        token, _ = await identity.add_user(conn, "ml", "ada", Role.MEMBER, None)
    long_job = job(flavor="a100").model_copy(
        update={"max_runtime_seconds": 36000 - KILL_GRACE_SECONDS}
    )
    rates = {"a100": {"gpu_hour": "2.5"}}
    # Under warn with on_exhausted stop it holds queued jobs once spent, so it reserves; of
    # last month, it still does (the scheduler reserves from the whole amount).
    await feed(
        pool,
        state(
            1,
            month="2026-11",
            amount="3",
            spent="0",
            exhausted=False,
            policy="warn",
            on_exhausted="stop",
            rates=rates,
        ),
    )
    found = await identity.authenticate_screened(pool, token, BOOTSTRAP, NOW)
    assert found is not None
    screenings = [await governance.screening(pool, BOOTSTRAP, "ml", NOW), found[1]]
    for refuse in (
        lambda: admit(pool, "ml", long_job, NOW),
        *(lambda s=s: _async(s.admit, long_job) for s in screenings),
    ):
        with pytest.raises(RequestInvalid) as refused:
            await refuse()
        (error,) = refused.value.errors
        assert error.field == "max_runtime_seconds"
        assert "worst case (25.000000 USD" in error.message
        assert "whole budget of team ml (3 USD a month)" in error.message
        assert "lower max_runtime_seconds to at most 4290" in error.message
    # Within it: admitted, with no warning (nothing is spent).
    assert (await admit(pool, "ml", job(flavor="a100"), NOW))[1] == []

    await feed(
        pool,
        state(
            2,
            amount="30",
            spent="0",
            exhausted=False,
            policy="warn",
            on_exhausted="stop",
            rates=rates,
        ),
    )
    assert await admit(pool, "ml", long_job, NOW) == (long_job, [], None)
    assert (await governance.screening(pool, BOOTSTRAP, "ml", NOW)).admit(long_job)[1] == []


async def _async(call: object, *args: object) -> object:
    assert callable(call)
    return call(*args)

"""A reference to another team is checked before it is stored, on real PostgreSQL: the
registry's grants (models and datasets) and datasets an operator registers, and billing's
budgets an operator sets, name a team only the submission service knows. The services ask it
(``GET /v1/teams/{team}``, with the caller's own token, through their real guards): a team
that does not exist is a 422 naming the field, and nothing is stored; the services'
break-glass operator token has no user token to ask with and is refused the same way."""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import httpx
import pytest
from pydantic import SecretStr

from tests.integration.submission import test_data_admission as admission
from tests.integration.submission.test_data_admission import Platform, errors, model_version
from trainyard_platform.services.billing.api import create_app as billing_app
from trainyard_platform.services.billing.service import MIGRATIONS as BILLING_MIGRATIONS
from trainyard_platform.services.scheduler.api import create_app as scheduler_app
from trainyard_platform.services.scheduler.service import MIGRATIONS as SCHEDULER_MIGRATIONS
from trainyard_platform.services.submission import identity
from trainyard_platform.services.submission.config import Settings
from trainyard_platform.shared.access import service_guard
from trainyard_platform.shared.db import migrate, open_pool
from trainyard_platform.shared.identity import IdentityClient, Role

pytestmark = pytest.mark.integration

BREAK_GLASS = "billing-operator-token"
platform = admission.platform  # the fixtures: submission's and the registry's apps
stack = admission.stack


@pytest.fixture
async def billing(
    platform: Platform, settings: Settings, database_url: str
) -> AsyncIterator[httpx.AsyncClient]:
    """Billing's app behind its real guard, asking the platform's submission app."""
    database = settings.database.model_copy(update={"url": database_url})
    async with open_pool(database, "billing") as bp:
        await migrate(bp, "billing", BILLING_MIGRATIONS)
        guard = service_guard(SecretStr(BREAK_GLASS), IdentityClient("", http=platform.submission))
        transport = httpx.ASGITransport(app=billing_app(bp, guard, []))  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=transport, base_url="http://billing") as client:
            yield client


@pytest.fixture
async def scheduler(
    platform: Platform, settings: Settings, database_url: str
) -> AsyncIterator[tuple[httpx.AsyncClient, asyncpg.Pool]]:
    """The scheduler's app behind its real guard, asking the platform's submission app."""
    database = settings.database.model_copy(update={"url": database_url})
    async with open_pool(database, "scheduler") as sp:
        await migrate(sp, "scheduler", SCHEDULER_MIGRATIONS)
        guard = service_guard(SecretStr(BREAK_GLASS), IdentityClient("", http=platform.submission))
        transport = httpx.ASGITransport(app=scheduler_app(sp, guard, []))  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=transport, base_url="http://scheduler") as client:
            yield client, sp


async def count(pool: asyncpg.Pool, table: str) -> int:
    return int(await pool.fetchval(f"SELECT count(*) FROM {table}"))


async def test_submission_answers_whether_a_team_exists(platform: Platform) -> None:
    p = platform
    assert (await p.submission.get(f"/v1/teams/{p.ml}", headers=p.auth(p.vision))).json() == {
        "team": p.ml
    }
    missing = await p.submission.get("/v1/teams/no-such-team", headers=p.auth(p.vision))
    assert missing.status_code == 404
    assert (await p.submission.get(f"/v1/teams/{p.ml}")).status_code == 401


async def test_a_grant_to_a_team_that_does_not_exist_is_refused_and_nothing_is_stored(
    platform: Platform,
) -> None:
    p = platform
    await p.dataset(p.ml, "features")
    await model_version(p, p.ml, "cnn")
    for path in (f"/v1/datasets/{p.ml}/features", f"/v1/models/{p.ml}/cnn"):
        refused = errors(await p.registry.put(f"{path}/grants/no-such-team", headers=p.auth(p.ml)))
        assert refused == {"grantee_team": "no team 'no-such-team'"}
        refused = errors(
            await p.registry.put(
                f"{path}/grants/{p.vision}", headers={"Authorization": "Bearer operator-token"}
            )
        )
        assert "operator token" in refused["grantee_team"]
    assert await count(p.registry_pool, "dataset_grants") == 0
    assert await count(p.registry_pool, "model_grants") == 0
    # A team that exists is granted, and revoking needs no check (nothing is stored).
    granted = await p.registry.put(f"/v1/models/{p.ml}/cnn/grants/{p.vision}", headers=p.auth(p.ml))
    assert granted.status_code == 200 and granted.json()["changed"] is True, granted.text
    gone = await p.registry.delete(
        f"/v1/models/{p.ml}/cnn/grants/no-such-team", headers=p.auth(p.ml)
    )
    assert gone.status_code == 200 and gone.json()["changed"] is False


async def test_an_operator_names_only_teams_that_exist(
    platform: Platform, pool: asyncpg.Pool, billing: httpx.AsyncClient
) -> None:
    p = platform
    operator = {
        "Authorization": f"Bearer {await identity.bootstrap_user(pool, 'platform', 'root', Role.OPERATOR)}"
    }
    body = {"uri": "s3://data/x", "sha256": "b" * 64, "size_bytes": 10}
    refused = errors(
        await p.registry.post("/v1/datasets/no-such-team/x/versions", json=body, headers=operator)
    )
    assert refused == {"team": "no team 'no-such-team'"}
    assert await count(p.registry_pool, "datasets") == 0

    budget = {"amount": "100", "thresholds": [50, 100], "policy": "warn"}
    for path in ("/v1/budgets/no-such-team", "/v1/budgets/no-such-team/nlp"):
        assert errors(await billing.put(path, json=budget, headers=operator)) == {
            "team": "no team 'no-such-team'"
        }
    glass = {"Authorization": f"Bearer {BREAK_GLASS}"}
    assert (
        "operator token"
        in errors(await billing.put(f"/v1/budgets/{p.ml}", json=budget, headers=glass))["team"]
    )
    listed = await billing.get("/v1/budgets", headers=operator)
    assert listed.status_code == 200 and listed.json() == []

    made = await billing.put(f"/v1/budgets/{p.ml}", json=budget, headers=operator)
    assert made.status_code == 201, made.text
    own = await p.registry.post(f"/v1/datasets/{p.ml}/y/versions", json=body, headers=operator)
    assert own.status_code == 201, own.text


async def test_a_queue_is_made_only_for_a_team_that_exists(
    platform: Platform, pool: asyncpg.Pool, scheduler: tuple[httpx.AsyncClient, asyncpg.Pool]
) -> None:
    """``PUT /v1/admin/queues/{name}`` stored a queue for any team it was given: a typo
    (``"team": "visoin"``) made a queue no job would ever use, answered 201."""
    p = platform
    http, scheduler_pool = scheduler
    operator = {
        "Authorization": f"Bearer {await identity.bootstrap_user(pool, 'platform', 'root', Role.OPERATOR)}"
    }
    glass = {"Authorization": f"Bearer {BREAK_GLASS}"}
    typo = await http.put("/v1/admin/queues/typo", json={"team": "no-such-team"}, headers=operator)
    assert errors(typo) == {"team": "no team 'no-such-team'"}
    refused = errors(await http.put("/v1/admin/queues/ml", json={"team": p.ml}, headers=glass))
    assert "operator token" in refused["team"]
    assert await count(scheduler_pool, "queues") == 0
    assert await count(scheduler_pool, "audit_log") == 0

    made = await http.put("/v1/admin/queues/ml", json={"team": p.ml}, headers=operator)
    assert made.status_code == 201, made.text
    # A queue keeps its team: replacing it asks nothing, so it works with the break-glass
    # token while the submission service is down; so does a queue for a team the scheduler
    # has seen (its first job made its implicit queue).
    again = await http.put("/v1/admin/queues/ml", json={"team": p.ml, "weight": 2}, headers=glass)
    assert again.status_code == 200, again.text
    await scheduler_pool.execute(
        "INSERT INTO queues (name, team, implicit) VALUES ($1, $2, true)",
        f"default:{p.vision}",
        p.vision,
    )
    seen = await http.put("/v1/admin/queues/vision", json={"team": p.vision}, headers=glass)
    assert seen.status_code == 201, seen.text
    member = await http.put("/v1/admin/queues/x", json={"team": p.ml}, headers=p.auth(p.ml))
    assert member.status_code == 403

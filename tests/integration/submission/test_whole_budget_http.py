"""``POST /v1/jobs`` refuses a job whose worst case alone is more than the whole of its
team's budget that reserves (422 naming ``max_runtime_seconds``, nothing stored) on every
path: an audited caller's, a member's first request, a remembered member's, a dry run; a
raise billing says later admits the same request."""

from __future__ import annotations

import asyncpg
import pytest

from tests.integration.submission.conftest import SPEC
from tests.integration.submission.test_known_callers import _client, _member, _post
from trainyard_platform.services.submission import identity
from trainyard_platform.services.submission.config import Settings
from trainyard_platform.services.submission.service import NAME
from trainyard_platform.shared.db import open_pool
from trainyard_platform.shared.worst_case import KILL_GRACE_SECONDS

pytestmark = pytest.mark.integration

LONG = {**SPEC, "max_runtime_seconds": 36000 - KILL_GRACE_SECONDS}  # 10 h with the grace
"""10 hours of one ``cpu`` GPU at 2.50: 25.00 at worst."""


async def _reserving(pool: asyncpg.Pool, amount: str, revision: int) -> None:
    await pool.execute(
        """INSERT INTO budget_replica (team, project, month, amount, spent, currency, policy,
                                      on_exhausted, exhausted, deleted, revision, rates)
           VALUES ('ml', '', '2026-01', $1, '0', 'USD', 'refuse', 'finish', false, false, $2,
                   $3::jsonb)
           ON CONFLICT (team, project) DO UPDATE SET amount = EXCLUDED.amount,
               revision = EXCLUDED.revision""",
        amount,
        revision,
        {"cpu": {"gpu_hour": "2.5"}},
    )


async def test_a_job_over_the_whole_budget_is_refused_on_every_path(
    settings: Settings, pool: asyncpg.Pool
) -> None:
    await _reserving(pool, "3", 1)
    admin = await identity.bootstrap_user(pool, "ml", "alice")
    async with open_pool(settings.database, NAME) as front, await _client(settings, front) as c:
        member = await _member(c, admin)
        answers = [
            await _post(c, admin, LONG),  # audited
            await _post(c, member, LONG),  # the token's first request: the full path
            await _post(c, member, LONG),  # remembered
            await c.post(
                "/v1/jobs?dry_run=true", json=LONG, headers={"Authorization": f"Bearer {member}"}
            ),
        ]
        for answer in answers:
            assert answer.status_code == 422, answer.text
            body = answer.json()
            assert body["detail"] == (
                "this job's worst case is more than the whole budget of team ml"
            )
            (error,) = body["errors"]
            assert error["field"] == "max_runtime_seconds"
            assert "worst case (25.000000 USD" in error["message"]
            assert "lower max_runtime_seconds to at most 4290" in error["message"]
        assert await pool.fetchval("SELECT count(*) FROM jobs") == 0
        assert (await _post(c, member, {**SPEC, "max_runtime_seconds": 4290})).status_code == 201

        await _reserving(pool, "30", 2)  # billing said the budget raised
        assert (await _post(c, member, LONG)).status_code == 201

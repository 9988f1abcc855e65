"""A job a spent budget lowered at submission (policy ``deprioritize``) keeps, from its
admission, that it was lowered and from what class: its first history entry (what the job
view, ``trainyard describe`` and the dashboard show) and its ``job.submitted``
(``lowered_from``, which the scheduler reads), on every path that stores a job: an audited
caller's transaction, a member's one statement, a remembered member's statement and a
group commit's batch. A job its user asked ``low`` for is submitted as ever."""

from __future__ import annotations

import json
from collections.abc import Awaitable
from typing import Any

import asyncpg
import httpx
import pytest

from tests.integration.submission.conftest import SPEC
from tests.integration.submission.test_known_callers import (
    _admin_caller,
    _client,
    _member,
    _post,
)
from trainyard_platform.services.submission import identity
from trainyard_platform.services.submission import repository as repo
from trainyard_platform.services.submission.config import Settings
from trainyard_platform.services.submission.governance import current_month
from trainyard_platform.services.submission.service import NAME
from trainyard_platform.shared.db import open_pool

pytestmark = pytest.mark.integration

SPENT = f"the budget of team ml is spent (11 of 10 USD spent in {current_month()})"
LOWERED = f"submitted; priority lowered from normal to low: {SPENT} (policy deprioritize)"


async def _deprioritizing(pool: asyncpg.Pool) -> None:
    await pool.execute(
        """INSERT INTO budget_replica (team, project, month, amount, spent, currency, policy,
                                      exhausted, deleted, revision)
           VALUES ('ml', '', $1, '10', '11', 'USD', 'deprioritize', true, false, 1)""",
        current_month(),
    )


async def _told(pool: asyncpg.Pool, job_id: str) -> tuple[str, str | None]:
    """The job's first history entry's reason and its job.submitted's ``lowered_from``."""
    reason = await pool.fetchval(
        "SELECT reason FROM job_history WHERE job_id = $1 ORDER BY id LIMIT 1", job_id
    )
    body = await pool.fetchval(
        "SELECT body FROM outbox WHERE subject = $1", f"trainyard.job.submitted.v1.{job_id}"
    )
    data: dict[str, Any] = json.loads(body)["data"]
    return reason, data.get("lowered_from")


async def _view(client: httpx.AsyncClient, token: str, job_id: str) -> dict[str, Any]:
    got = await client.get(f"/v1/jobs/{job_id}", headers={"Authorization": f"Bearer {token}"})
    assert got.status_code == 200, got.text
    view: dict[str, Any] = got.json()
    return view


async def test_a_lowered_job_says_from_what_class_on_every_path(
    settings: Settings, pool: asyncpg.Pool
) -> None:
    # Seen: the job was told only in the answer to its submission (a header); once the
    # budget was raised nothing said why it ran at low, and the scheduler could not tell it
    # from a job asked low for.
    await _deprioritizing(pool)
    admin = await identity.bootstrap_user(pool, "ml", "alice")
    async with open_pool(settings.database, NAME) as front, await _client(settings, front) as c:
        member = await _member(c, admin)
        answers = [
            await _post(c, admin),  # audited: a transaction with its audit row
            await _post(c, member),  # the token's first request: the full path
            await _post(c, member),  # remembered: the one statement with the token check
        ]
        asked_low = await _post(c, member, {**SPEC, "priority": "low"})
        dry = await c.post(
            "/v1/jobs?dry_run=true", json=SPEC, headers={"Authorization": f"Bearer {member}"}
        )
        for answer in answers:
            assert answer.status_code == 201, answer.text
            assert "Trainyard-Budget-Warning" in answer.headers
            job = answer.json()
            assert job["spec"]["priority"] == "low"
            assert [h["reason"] for h in job["history"]] == [LOWERED]  # the 201 says it
            view = await _view(c, admin, job["id"])
            assert view["history"][0]["reason"] == LOWERED  # and so does the job view
            assert await _told(pool, job["id"]) == (LOWERED, "normal")
        assert asked_low.status_code == 201, asked_low.text
        assert await _told(pool, asked_low.json()["id"]) == ("submitted", None)
        assert dry.status_code == 200, dry.text
        assert dry.json()["history"][0]["reason"] == LOWERED


async def test_a_group_commits_batch_keeps_each_jobs_own_first_reason(
    pool: asyncpg.Pool,
) -> None:
    caller = await _admin_caller(pool)
    screening = (current_month(), [], [], "[]")
    at = await pool.fetchval("SELECT now()")
    rows = [
        (
            caller,
            screening,
            (job_id, "n", {"name": "n"}, None, at, None, reason, None),
            (f"e-{job_id}", f"trainyard.job.submitted.v1.{job_id}", b"{}", {}),
        )
        for job_id, reason in (("j1", LOWERED), ("j2", "submitted"))
    ]
    async with pool.acquire() as conn:
        assert await repo.insert_jobs_if_callers(conn, rows) == [(True, True), (True, True)]
    stored = await pool.fetch("SELECT job_id, reason FROM job_history ORDER BY job_id")
    assert [tuple(r) for r in stored] == [("j1", LOWERED), ("j2", "submitted")]


# --- a retry under an Idempotency-Key is its key's job, whatever admission says since -----------


def _keyed(
    client: httpx.AsyncClient,
    token: str,
    key: str,
    spec: dict[str, Any] | None = None,
    dry_run: bool = False,
) -> Awaitable[httpx.Response]:
    return client.post(
        "/v1/jobs?dry_run=true" if dry_run else "/v1/jobs",
        json=spec or SPEC,
        headers={"Authorization": f"Bearer {token}", "Idempotency-Key": key},
    )


async def _budget(pool: asyncpg.Pool, policy: str, exhausted: bool) -> None:
    """The team's budget as billing said it last (a revision past every earlier one)."""
    await pool.execute(
        """INSERT INTO budget_replica (team, project, month, amount, spent, currency, policy,
                                      exhausted, deleted, revision)
           VALUES ('ml', '', $1, '10', '11', 'USD', $2, $3, false, 1)
           ON CONFLICT (team, project) DO UPDATE SET policy = EXCLUDED.policy,
               exhausted = EXCLUDED.exhausted, revision = budget_replica.revision + 1""",
        current_month(),
        policy,
        exhausted,
    )


def _replayed(answer: httpx.Response, job_id: str) -> bool:
    """The answer is the job ``job_id`` (200: no job made)."""
    assert answer.status_code == 200, answer.text
    return bool(answer.json()["id"] == job_id)


def _refused_for_the_key(answer: httpx.Response) -> bool:
    return answer.status_code == 409 and "Idempotency-Key" in answer.json()["detail"]


async def test_a_retry_of_a_lowered_job_is_that_job_once_the_budget_is_raised(
    settings: Settings, pool: asyncpg.Pool
) -> None:
    # Seen: a job submitted while the team's budget was spent was lowered to low; an admin
    # raised the budget; the client's retry (the same body, the same key) was not lowered,
    # so its spec differed from the stored one and it got 409 "already used for a
    # different job spec" for the job its first request had made.
    await _budget(pool, "deprioritize", exhausted=True)
    admin = await identity.bootstrap_user(pool, "ml", "alice")
    async with open_pool(settings.database, NAME) as front, await _client(settings, front) as c:
        member = await _member(c, admin)
        first = {}
        for token in (admin, member):  # audited: a transaction; a member: one statement
            answer = await _keyed(c, token, "nightly-1")
            assert answer.status_code == 201, answer.text
            assert answer.json()["spec"]["priority"] == "low"
            first[token] = answer.json()["id"]
        await _budget(pool, "deprioritize", exhausted=False)  # raised
        for token in (admin, member):  # the member's token: its screening is stale
            dry = await _keyed(c, token, "nightly-1", dry_run=True)
            assert _replayed(dry, first[token])
            again = await _keyed(c, token, "nightly-1")
            assert _replayed(again, first[token])
            assert again.json()["spec"]["priority"] == "low"  # the job as it was stored
            assert "Trainyard-Budget-Warning" not in again.headers  # nothing was admitted
            assert again.headers["Location"] == f"/v1/jobs/{first[token]}"
        # The member's token now remembers the raised budget: the one statement, whose
        # insert finds the key's row, compares the requests too.
        again = await _keyed(c, member, "nightly-1")
        assert _replayed(again, first[member])
        for token in (admin, member):  # another body under the key is still refused
            assert _refused_for_the_key(await _keyed(c, token, "nightly-1", {**SPEC, "seed": 8}))
            other = await _keyed(c, token, "nightly-1", {**SPEC, "seed": 8}, dry_run=True)
            assert _refused_for_the_key(other)
    assert await pool.fetchval("SELECT count(*) FROM jobs") == 2


async def test_a_retry_is_its_keys_job_once_the_budget_is_spent_or_refuses(
    settings: Settings, pool: asyncpg.Pool
) -> None:
    """The reverse: a job admitted at its class, then the budget spent (lowering new jobs),
    then refusing new jobs: the retry is still the job admitted, at its class."""
    admin = await identity.bootstrap_user(pool, "ml", "alice")
    async with open_pool(settings.database, NAME) as front, await _client(settings, front) as c:
        member = await _member(c, admin)
        first = {}
        for token in (admin, member):
            answer = await _keyed(c, token, "nightly-2")
            assert answer.status_code == 201, answer.text
            assert answer.json()["spec"]["priority"] == "normal"
            first[token] = answer.json()["id"]
        for policy in ("deprioritize", "refuse"):
            await _budget(pool, policy, exhausted=True)
            for token in (admin, member):
                again = await _keyed(c, token, "nightly-2")
                assert _replayed(again, first[token])
                assert again.json()["spec"]["priority"] == "normal"
                dry = await _keyed(c, token, "nightly-2", dry_run=True)
                assert _replayed(dry, first[token])
        # The member's token now remembers the refusing budget: the refusal its screening
        # makes (before the one statement) is not the retry's answer either.
        assert _replayed(await _keyed(c, member, "nightly-2"), first[member])
        for token in (admin, member):
            refused = await _keyed(c, token, "nightly-3")  # a new job is refused
            assert refused.status_code == 409, refused.text
            assert "new jobs are refused" in refused.json()["detail"]
            assert _refused_for_the_key(await _keyed(c, token, "nightly-2", {**SPEC, "seed": 8}))
    assert await pool.fetchval("SELECT count(*) FROM jobs") == 2


async def test_a_job_stored_before_fingerprints_is_replayed_by_its_spec(
    settings: Settings, pool: asyncpg.Pool
) -> None:
    """A job stored before the request's fingerprint was kept (none) is compared with its
    retry as it always was: by the spec as stored."""
    admin = await identity.bootstrap_user(pool, "ml", "alice")
    async with open_pool(settings.database, NAME) as front, await _client(settings, front) as c:
        first = await _keyed(c, admin, "old-1")
        assert first.status_code == 201, first.text
        await pool.execute("UPDATE jobs SET request_fingerprint = NULL")
        again = await _keyed(c, admin, "old-1")
        assert _replayed(again, first.json()["id"])
        assert _refused_for_the_key(await _keyed(c, admin, "old-1", {**SPEC, "seed": 8}))


async def _retire(pool: asyncpg.Pool, flavor: str) -> None:
    await pool.execute(
        """INSERT INTO flavor_replica (name, description, revision, retired, changed_at)
           VALUES ($1, '', 1, true, now())""",
        flavor,
    )


async def test_a_retry_is_its_keys_job_once_its_flavor_is_retired(
    settings: Settings, pool: asyncpg.Pool
) -> None:
    """A flavor retired since refuses a new job naming it (422), not the retry of a job
    admitted with it; another body under the key keeps its refusal."""
    admin = await identity.bootstrap_user(pool, "ml", "alice")
    async with open_pool(settings.database, NAME) as front, await _client(settings, front) as c:
        member = await _member(c, admin)
        first = {}
        for token in (admin, member):
            answer = await _keyed(c, token, "nightly-4")
            assert answer.status_code == 201, answer.text
            first[token] = answer.json()["id"]
        await _retire(pool, SPEC["gpu_flavor"])
        for token in (admin, member):
            assert _replayed(await _keyed(c, token, "nightly-4"), first[token])
            assert _replayed(await _keyed(c, token, "nightly-4", dry_run=True), first[token])
            for key, spec in (("nightly-5", SPEC), ("nightly-4", {**SPEC, "seed": 8})):
                refused = await _keyed(c, token, key, spec)
                assert refused.status_code == 422, refused.text
                assert [e["field"] for e in refused.json()["errors"]] == ["gpu_flavor"]
    assert await pool.fetchval("SELECT count(*) FROM jobs") == 2

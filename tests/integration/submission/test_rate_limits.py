"""Rate limits per user: past the burst a caller gets 429 with Retry-After in the shared
error shape; another user, and the probes, are unaffected."""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import httpx
import pytest
from litestar import get, post, put
from pydantic import SecretStr

from tests.integration.submission.conftest import SPEC, Submission, running_submission
from trainyard_platform.services.submission import identity
from trainyard_platform.services.submission.api import AppDeps, create_app
from trainyard_platform.services.submission.config import Settings
from trainyard_platform.shared.access import only_reads, service_guard
from trainyard_platform.shared.bus import Bus
from trainyard_platform.shared.http_app import service_app
from trainyard_platform.shared.identity import IdentityClient, Role

pytestmark = pytest.mark.integration

DRY = "/v1/jobs?dry_run=true"


def tight(settings: Settings) -> Settings:
    return settings.model_copy(
        update={
            "read_rate_per_s": 0.01,
            "read_burst": 3,
            "write_rate_per_s": 0.01,
            "write_burst": 2,
        }
    )


@pytest.fixture
async def limited(settings: Settings, pool: asyncpg.Pool, bus: Bus) -> AsyncIterator[Submission]:
    async with running_submission(tight(settings), pool, bus) as running:
        yield running


async def test_past_the_burst_reads_get_429_with_retry_after(limited: Submission) -> None:
    for _ in range(3):
        assert (await limited.client.get("/v1/jobs", headers=limited.auth())).status_code == 200
    response = await limited.client.get("/v1/jobs", headers=limited.auth())
    assert response.status_code == 429, response.text
    retry = response.headers["retry-after"]
    assert retry.isdigit() and int(retry) >= 1
    body = response.json()
    assert set(body) == {"detail", "errors"}
    assert "rate limit" in body["detail"] and "read" in body["detail"], body
    assert "bursts of 3" in body["detail"], body

    other = await limited.client.get("/v1/jobs", headers=limited.auth(limited.other_team_token))
    assert other.status_code == 200, other.text


async def test_writes_have_their_own_bucket(limited: Submission) -> None:
    for _ in range(2):
        response = await limited.client.post(
            "/v1/jobs/nope/cancel", headers=limited.auth(limited.other_team_token)
        )
        assert response.status_code == 404, response.text
    response = await limited.client.post(
        "/v1/jobs/nope/cancel", headers=limited.auth(limited.other_team_token)
    )
    assert response.status_code == 429, response.text
    assert int(response.headers["retry-after"]) >= 1
    assert "write" in response.json()["detail"]
    # Reads of the same user still pass; the other user's writes too.
    listed = await limited.client.get("/v1/jobs", headers=limited.auth(limited.other_team_token))
    assert listed.status_code == 200, listed.text
    submitted = await limited.client.post("/v1/jobs/nope/cancel", headers=limited.auth())
    assert submitted.status_code == 404, submitted.text


async def test_a_bad_token_is_401_not_rate_limited(limited: Submission) -> None:
    for _ in range(5):
        response = await limited.client.get("/v1/jobs", headers=limited.auth("wrong"))
        assert response.status_code == 401


async def test_probes_are_not_limited(limited: Submission, settings: Settings) -> None:
    @get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    deps = AppDeps(pool=limited.pool, store=limited.store, health_handlers=[healthz])
    transport = httpx.ASGITransport(app=create_app(tight(settings), deps))  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=transport, base_url="http://submission") as client:
        for _ in range(20):
            assert (await client.get("/healthz")).status_code == 200
        for _ in range(3):
            assert (await client.get("/v1/jobs", headers=limited.auth())).status_code == 200
        assert (await client.get("/v1/jobs", headers=limited.auth())).status_code == 429


@get("/v1/things", sync_to_thread=False)
def read_things() -> list[str]:
    return []


@put("/v1/things", sync_to_thread=False)
def write_things() -> None:
    return None


async def test_another_service_s_writes_spend_the_user_s_writes(limited: Submission) -> None:
    """The registry, billing and the scheduler check a user token with submission on every
    request: a write there spends one of the user's writes, a read one of the reads, as
    the same request to submission would. Before, every such check spent a read, so their
    writes were limited only by the (higher) read rate."""
    identity = IdentityClient("http://submission", http=limited.client)
    app = service_app(
        "billing", [read_things, write_things], service_guard(SecretStr("op"), identity)
    )
    transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=transport, base_url="http://billing") as billing:
        for _ in range(2):
            assert (await billing.put("/v1/things", headers=limited.auth())).status_code == 200
        refused = await billing.put("/v1/things", headers=limited.auth())
        assert refused.status_code == 429, refused.text
        assert "write" in refused.json()["detail"], refused.text
        assert int(refused.headers["retry-after"]) >= 1
        # The user's reads are untouched by those writes, here and at submission.
        for _ in range(2):
            assert (await billing.get("/v1/things", headers=limited.auth())).status_code == 200
        listed = await limited.client.get("/v1/jobs", headers=limited.auth())
        assert listed.status_code == 200, listed.text
        assert (await billing.get("/v1/things", headers=limited.auth())).status_code == 429


@post("/v1/things/estimate", status_code=200, sync_to_thread=False, opt=only_reads())
def estimate_things() -> None:
    return None


async def test_a_post_that_only_reads_spends_a_read_not_a_write(limited: Submission) -> None:
    """A route declared ``only_reads()`` (billing's cost estimate: a POST that stores
    nothing) spends the user's reads, not the writes it would take from submitting: the
    CLI asks one before each submission."""
    identity = IdentityClient("http://submission", http=limited.client)
    app = service_app(
        "billing", [read_things, estimate_things], service_guard(SecretStr("op"), identity)
    )
    transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=transport, base_url="http://billing") as billing:
        for _ in range(3):  # the read burst, more than the write burst of 2
            answer = await billing.post("/v1/things/estimate", headers=limited.auth())
            assert answer.status_code == 200, answer.text
        refused = await billing.post("/v1/things/estimate", headers=limited.auth())
        assert refused.status_code == 429, refused.text
        assert "read" in refused.json()["detail"], refused.text
    # The user's writes are untouched.
    for _ in range(2):
        write = await limited.client.post("/v1/jobs/nope/cancel", headers=limited.auth())
        assert write.status_code == 404, write.text


async def test_dry_runs_spend_reads_not_the_writes_submissions_need(limited: Submission) -> None:
    """A dry run (``POST /v1/jobs?dry_run=true``) stores nothing: it spends a read, so the
    submission it checks still has the writes. Before, each spent a write: ``trainyard
    submit`` checks every spec so, which halved a user's submissions per minute, and a user
    near the limit saw the submission refused right after its dry run passed. The dry runs
    are still limited, by the reads: past their burst, 429 saying why, with Retry-After."""
    member = await identity.bootstrap_user(limited.pool, "ml", "carol", Role.MEMBER)
    # An admin's submissions are audited, a member's token is remembered after its first
    # request (the guard's two ways in): both spend the same.
    for headers in (limited.auth(), limited.auth(member)):
        for _ in range(2):  # the whole write burst
            checked = await limited.client.post(DRY, json=SPEC, headers=headers)
            assert checked.status_code == 200, checked.text
        submitted = await limited.client.post("/v1/jobs", json=SPEC, headers=headers)
        assert submitted.status_code == 201, submitted.text
        checked = await limited.client.post(DRY, json=SPEC, headers=headers)
        assert checked.status_code == 200, checked.text  # the read burst of 3
        refused = await limited.client.post(DRY, json=SPEC, headers=headers)
        assert refused.status_code == 429, refused.text
        detail = refused.json()["detail"]
        assert "read requests per second per user" in detail, detail
        assert "dry run" in detail and "bursts of 3" in detail, detail
        assert int(refused.headers["retry-after"]) >= 1
        # Refused dry runs took nothing of the writes: the last of the burst is there.
        submitted = await limited.client.post("/v1/jobs", json=SPEC, headers=headers)
        assert submitted.status_code == 201, submitted.text


async def test_a_submission_is_a_write_whatever_its_query(limited: Submission) -> None:
    """Only a request the route surely reads as a dry run spends a read: one that may
    store a job spends a write, whatever else its query says (a flag given twice: the
    route reads the last)."""
    for query in ("", "?dry_run=false"):  # the write burst of 2
        submitted = await limited.client.post(f"/v1/jobs{query}", json=SPEC, headers=limited.auth())
        assert submitted.status_code == 201, submitted.text
    refused = await limited.client.post(
        "/v1/jobs?dry_run=true&dry_run=false", json=SPEC, headers=limited.auth()
    )
    assert refused.status_code == 429, refused.text
    assert "write requests per second per user" in refused.json()["detail"], refused.text
    assert "dry run" not in refused.json()["detail"], refused.text


async def test_more_users_do_not_give_a_team_more_requests(
    settings: Settings, pool: asyncpg.Pool, bus: Bus
) -> None:
    """A team admin may create users at will, each with a bucket of its own: a team's
    requests together spend its team's bucket too (``team_rate_factor`` times a user's),
    so a hostile team cannot multiply its rate by its users. Before, 4 users of one team
    made 4 bursts of reads and writes; another team was never affected by it, nor is now."""
    limits = tight(settings).model_copy(update={"team_rate_factor": 2.0})
    async with running_submission(limits, pool, bus) as running:
        # As many users as an admin likes (created here directly: their creation is not
        # what is measured).
        tokens = [await identity.bootstrap_user(pool, "ml", name, Role.VIEWER) for name in "wxyz"]
        answers = [
            (await running.client.get("/v1/jobs", headers=running.auth(token))).status_code
            for token in tokens
            for _ in range(3)  # each user's whole read burst
        ]
        # The team's read burst is 2 x 3 = 6, whatever the number of its users.
        assert answers.count(200) == 6, answers
        assert answers.count(429) == len(answers) - 6, answers
        refused = await running.client.get("/v1/jobs", headers=running.auth(tokens[-1]))
        assert refused.status_code == 429
        assert "per team" in refused.json()["detail"], refused.text
        assert int(refused.headers["retry-after"]) >= 1
        other = await running.client.get("/v1/jobs", headers=running.auth(running.other_team_token))
        assert other.status_code == 200, other.text


async def test_a_429_names_the_token_whose_limit_is_spent(limited: Submission) -> None:
    """A 429 says, as every error answer does, what it is about (the token's limit) and
    why, besides its detail and ``Retry-After``. Before, ``errors`` was empty."""
    for _ in range(3):
        assert (await limited.client.get("/v1/jobs", headers=limited.auth())).status_code == 200
    refused = await limited.client.get("/v1/jobs", headers=limited.auth())
    assert refused.status_code == 429, refused.text
    errors = refused.json()["errors"]
    assert [e["field"] for e in errors] == ["Authorization"], errors
    assert "read requests per second per user" in errors[0]["message"], errors


@pytest.mark.parametrize("who", ["admin", "member"])
async def test_a_retry_under_its_idempotency_key_spends_a_read_not_a_write(
    limited: Submission, who: str
) -> None:
    """A client retrying a submission whose answer it lost is answered from its key's job:
    that costs a read, so its own retries never push it into 429 nor take the writes its
    new jobs need. A new job, under a new key, still spends a write, and past the write
    burst is refused (429) however many replays come between: replays carry no job past
    the write limit. An audited admin and a remembered member are stored two ways: both
    are charged alike. Before, each retry spent a write: the second new job got 429."""
    token = limited.admin_token
    if who == "member":
        token = await identity.bootstrap_user(limited.pool, "ml", "carol", Role.MEMBER)

    def under(key: str) -> dict[str, str]:
        return {**limited.auth(token), "Idempotency-Key": key}

    first = await limited.client.post("/v1/jobs", json=SPEC, headers=under("k1"))
    assert first.status_code == 201, first.text
    for _ in range(2):  # two reads of the burst of 3
        again = await limited.client.post("/v1/jobs", json=SPEC, headers=under("k1"))
        assert again.status_code == 200, again.text
        assert again.json()["id"] == first.json()["id"]
    second = await limited.client.post("/v1/jobs", json=SPEC, headers=under("k2"))
    assert second.status_code == 201, second.text  # the second write of the burst of 2
    again = await limited.client.post("/v1/jobs", json=SPEC, headers=under("k2"))
    assert again.status_code == 200, again.text  # the last read
    refused = await limited.client.post("/v1/jobs", json=SPEC, headers=under("k3"))
    assert refused.status_code == 429, refused.text
    assert "write requests per second per user" in refused.json()["detail"], refused.text
    assert int(refused.headers["retry-after"]) >= 1
    async with limited.pool.acquire() as conn:
        keys = await conn.fetch("SELECT idempotency_key FROM jobs ORDER BY submitted_at")
    assert [row["idempotency_key"] for row in keys] == ["k1", "k2"]


async def test_another_request_under_a_used_key_spends_a_write(limited: Submission) -> None:
    """Only a replay is a read: a different request under a key used before (409), like a
    new key, is charged a write, so a used key is no way around the write limit."""

    def under(key: str) -> dict[str, str]:
        return {**limited.auth(), "Idempotency-Key": key}

    first = await limited.client.post("/v1/jobs", json=SPEC, headers=under("k1"))
    assert first.status_code == 201, first.text
    other = await limited.client.post("/v1/jobs", json={**SPEC, "seed": 8}, headers=under("k1"))
    assert other.status_code == 409, other.text  # the second write of the burst of 2
    refused = await limited.client.post("/v1/jobs", json=SPEC, headers=under("k2"))
    assert refused.status_code == 429, refused.text
    assert "write requests per second per user" in refused.json()["detail"], refused.text
    other = await limited.client.post("/v1/jobs", json={**SPEC, "seed": 8}, headers=under("k1"))
    assert other.status_code == 429, other.text
    again = await limited.client.post("/v1/jobs", json=SPEC, headers=under("k1"))
    assert again.status_code == 200, again.text  # a replay: a read
    assert again.json()["id"] == first.json()["id"]


async def test_a_reproductions_retry_spends_a_read_not_a_write(limited: Submission) -> None:
    """``POST /v1/jobs/{id}/reproduce`` answers a retry under its key as ``POST /v1/jobs``
    does, and charges it alike: a read; a new reproduction still a write."""
    job = await limited.client.post("/v1/jobs", json=SPEC, headers=limited.auth())
    assert job.status_code == 201, job.text  # the first write of the burst of 2
    async with limited.pool.acquire() as conn:
        await conn.execute("UPDATE jobs SET status = 'SUCCEEDED', finished_at = now()")
    url = f"/v1/jobs/{job.json()['id']}/reproduce"
    headers = {**limited.auth(), "Idempotency-Key": "r1"}
    first = await limited.client.post(url, headers=headers)
    assert first.status_code == 201, first.text  # the second write
    for _ in range(2):
        again = await limited.client.post(url, headers=headers)
        assert again.status_code == 200, again.text
        assert again.json()["id"] == first.json()["id"]
    refused = await limited.client.post(url, headers={**limited.auth(), "Idempotency-Key": "r2"})
    assert refused.status_code == 429, refused.text
    assert "write requests per second per user" in refused.json()["detail"], refused.text


async def test_a_request_refused_for_its_role_is_charged_as_any_other(
    limited: Submission,
) -> None:
    """A 403 (a role below the route's) costs what an allowed request costs (the token's
    lookup, here and at every service's check), so it spends its kind of request like any
    other: a caller probing routes it may not use is limited. It spends only its kind: a
    view polling a forbidden read takes none of the writes (docs/security.md, "Rate
    limits", says why it is so)."""
    token = await identity.bootstrap_user(limited.pool, "ml", "carol", Role.MEMBER)
    for _ in range(3):  # the read burst
        forbidden = await limited.client.get("/v1/admin/users", headers=limited.auth(token))
        assert forbidden.status_code == 403, forbidden.text
    refused = await limited.client.get("/v1/jobs", headers=limited.auth(token))
    assert refused.status_code == 429, refused.text
    made = await limited.client.post("/v1/tokens", json={}, headers=limited.auth(token))
    assert made.status_code == 201, made.text

"""``POST /v1/tokens`` under an ``Idempotency-Key``: a retry after a lost answer (the token
was committed, its answer never arrived) answers that token, without its secret, instead of
making a second live one; a different request under the key is refused (409) naming the
header, as ``POST /v1/jobs`` does (real PostgreSQL). Before, every retry made a token."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import httpx
import pytest

from tests.integration.submission.conftest import Submission, running_submission
from tests.integration.submission.test_reproduce import said_once
from trainyard_platform.services.submission.config import Settings
from trainyard_platform.shared.bus import Bus

pytestmark = pytest.mark.integration


def _under(s: Submission, key: str) -> dict[str, str]:
    return {**s.auth(), "Idempotency-Key": key}


async def _tokens(s: Submission) -> list[dict[str, object]]:
    listed = await s.client.get("/v1/tokens", headers=s.auth())
    assert listed.status_code == 200, listed.text
    tokens: list[dict[str, object]] = listed.json()
    return tokens


async def test_a_retry_answers_the_token_its_key_made_without_its_secret(
    submission: Submission,
) -> None:
    before = await _tokens(submission)
    first = await submission.client.post(
        "/v1/tokens", json={"name": "ci"}, headers=_under(submission, "k1")
    )
    assert first.status_code == 201, first.text
    made = first.json()
    assert made["token"] and made["revoked_at"] is None

    again = await submission.client.post(
        "/v1/tokens", json={"name": "ci"}, headers=_under(submission, "k1")
    )
    assert again.status_code == 200, again.text
    replayed = again.json()
    assert replayed["token"] is None  # shown once; only its hash is stored
    assert {k: v for k, v in replayed.items() if k != "token"} == {
        k: v for k, v in made.items() if k != "token"
    }
    assert len(await _tokens(submission)) == len(before) + 1  # one token, not two

    row = await submission.pool.fetchrow(
        "SELECT idempotency_key, request_fingerprint, token_hash FROM tokens WHERE id = $1",
        made["id"],
    )
    assert row["idempotency_key"] == "k1"
    assert made["token"] not in (row["request_fingerprint"], row["token_hash"])

    # The token it made works; revoked since, a retry says so.
    me = await submission.client.get("/v1/me", headers=submission.auth(made["token"]))
    assert me.status_code == 200, me.text
    revoked = await submission.client.delete(f"/v1/tokens/{made['id']}", headers=submission.auth())
    assert revoked.status_code == 204, revoked.text
    late = await submission.client.post(
        "/v1/tokens", json={"name": "ci"}, headers=_under(submission, "k1")
    )
    assert late.status_code == 200, late.text
    assert late.json()["id"] == made["id"] and late.json()["revoked_at"] is not None


async def test_a_name_left_out_and_the_default_name_are_the_same_request(
    submission: Submission,
) -> None:
    first = await submission.client.post("/v1/tokens", json={}, headers=_under(submission, "k"))
    assert first.status_code == 201, first.text
    again = await submission.client.post(
        "/v1/tokens", json={"name": "default"}, headers=_under(submission, "k")
    )
    assert again.status_code == 200, again.text
    assert again.json()["id"] == first.json()["id"]


async def test_a_different_request_under_a_used_key_is_409_naming_it(
    submission: Submission,
) -> None:
    first = await submission.client.post(
        "/v1/tokens", json={"name": "ci"}, headers=_under(submission, "k1")
    )
    assert first.status_code == 201, first.text
    count = len(await _tokens(submission))
    for body in ({"name": "laptop"}, {"name": "ci", "expires_in_days": 7}):
        other = await submission.client.post(
            "/v1/tokens", json=body, headers=_under(submission, "k1")
        )
        assert other.status_code == 409, other.text
        errors = other.json()["errors"]
        assert [e["field"] for e in errors] == ["Idempotency-Key"], errors
        assert f"created token {first.json()['id']}" in errors[0]["message"], errors
        said_once(other.json())
    assert len(await _tokens(submission)) == count  # nothing made


async def test_keys_are_each_users_own(submission: Submission) -> None:
    """Another user's key of the same text is another key: its own token, 201."""
    mine = await submission.client.post(
        "/v1/tokens", json={"name": "ci"}, headers=_under(submission, "k1")
    )
    theirs = await submission.client.post(
        "/v1/tokens",
        json={"name": "ci"},
        headers={**submission.auth(submission.other_team_token), "Idempotency-Key": "k1"},
    )
    assert (mine.status_code, theirs.status_code) == (201, 201), (mine.text, theirs.text)
    assert mine.json()["id"] != theirs.json()["id"]


async def test_a_bad_key_is_422_naming_the_header(submission: Submission) -> None:
    refused = await submission.client.post(
        "/v1/tokens", json={}, headers=_under(submission, "x" * 201)
    )
    assert refused.status_code == 422, refused.text
    assert [e["field"] for e in refused.json()["errors"]] == ["Idempotency-Key"]


async def test_twins_sent_together_make_one_token(submission: Submission) -> None:
    """Two requests under one key at once (a client that retried before its first attempt
    was answered): one makes the token, the other answers it, whichever way they race."""
    count = len(await _tokens(submission))
    answers = await asyncio.gather(
        *(
            submission.client.post(
                "/v1/tokens", json={"name": "ci"}, headers=_under(submission, "twin")
            )
            for _ in range(4)
        )
    )
    assert sorted(a.status_code for a in answers) == [200, 200, 200, 201], [a.text for a in answers]
    assert len({a.json()["id"] for a in answers}) == 1
    assert len(await _tokens(submission)) == count + 1


@pytest.fixture
async def full(settings: Settings, pool: asyncpg.Pool, bus: Bus) -> AsyncIterator[Submission]:
    """A user may hold 2 live tokens, and spend 2 writes (then next to none)."""
    tight = settings.model_copy(
        update={
            "live_tokens_per_user": 2,
            "live_tokens_per_team": 10,
            "write_rate_per_s": 0.01,
            "write_burst": 2,
        }
    )
    async with running_submission(tight, pool, bus) as running:
        yield running


async def test_a_retry_is_answered_at_the_token_bound_and_past_the_write_limit(
    full: Submission,
) -> None:
    """A retry makes nothing: neither the live-token bound (409 for a new token) nor the
    spent writes (429 for a new one) refuse it; it spends a read, as a job's retry."""
    first = await full.client.post("/v1/tokens", json={}, headers=_under(full, "k1"))
    assert first.status_code == 201, first.text  # the second live token, the first write
    more = await full.client.post("/v1/tokens", json={}, headers=_under(full, "k2"))
    assert more.status_code == 409, more.text  # past the bound, the second write
    for _ in range(2):
        again = await full.client.post("/v1/tokens", json={}, headers=_under(full, "k1"))
        assert again.status_code == 200, again.text
        assert again.json()["id"] == first.json()["id"]
    spent: httpx.Response = await full.client.post(
        "/v1/tokens", json={}, headers=_under(full, "k3")
    )
    assert spent.status_code == 429, spent.text

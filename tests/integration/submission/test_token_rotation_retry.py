"""``POST /v1/tokens/rotate`` under an ``Idempotency-Key``: the retry of a rotation whose
answer was lost presents the token that rotation revoked, with the same key and request,
and is given the token it made with a new secret, the lost one dead (real PostgreSQL).
Before, the retry was 401 (the token it presents was revoked by the first request): the
client held no working secret at all. Nothing else gets a revoked token in: another key,
another route, another request, the window passed, a token revoked otherwise."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import httpx
import pytest

from tests.integration.submission.conftest import Submission
from trainyard_platform.services.submission.identity import ROTATION_REPLAY_WINDOW

pytestmark = pytest.mark.integration


async def _fresh_token(s: Submission, name: str = "laptop") -> str:
    made = await s.client.post("/v1/tokens", json={"name": name}, headers=s.auth())
    assert made.status_code == 201, made.text
    token: str = made.json()["token"]
    return token


async def _rotate(
    s: Submission, token: str, key: str | None, body: dict[str, Any] | None = None
) -> httpx.Response:
    headers = s.auth(token) | ({} if key is None else {"Idempotency-Key": key})
    return await s.client.post("/v1/tokens/rotate", json=body or {}, headers=headers)


async def _works(s: Submission, token: str) -> bool:
    me = await s.client.get("/v1/me", headers=s.auth(token))
    assert me.status_code in (200, 401), me.text
    return me.status_code == 200


async def test_a_retry_gets_the_new_token_with_a_new_secret_the_lost_one_dead(
    submission: Submission,
) -> None:
    old = await _fresh_token(submission)
    first = await _rotate(submission, old, "r1", {"expires_in_days": 7})
    assert first.status_code == 201, first.text
    lost = first.json()  # the answer a client never got

    again = await _rotate(submission, old, "r1", {"expires_in_days": 7})
    assert again.status_code == 200, again.text
    retried = again.json()
    assert retried["id"] == lost["id"] and retried["name"] == "laptop"
    assert retried["expires_at"] == lost["expires_at"] and retried["revoked_at"] is None
    assert retried["token"] and retried["token"] != lost["token"]

    assert await _works(submission, retried["token"])
    assert not await _works(submission, lost["token"])  # never two secrets of one token
    assert not await _works(submission, old)  # the old token is dead for everything else
    row = await submission.pool.fetchrow(
        "SELECT replaces, idempotency_key FROM tokens WHERE id = $1", lost["id"]
    )
    assert row["idempotency_key"] == "r1" and row["replaces"] is not None
    actions = await submission.pool.fetch(
        "SELECT action FROM audit_log WHERE detail->>'token_id' = $1 ORDER BY id",
        str(lost["id"]),
    )
    assert [a["action"] for a in actions] == ["rotate token", "reissue token"]

    # A second retry (its answer lost too) does the same: the previous secret dies.
    third = await _rotate(submission, old, "r1", {"expires_in_days": 7})
    assert third.status_code == 200, third.text
    assert await _works(submission, third.json()["token"])
    assert not await _works(submission, retried["token"])


async def test_a_name_left_out_is_the_rotated_tokens_name(submission: Submission) -> None:
    old = await _fresh_token(submission, "ci")
    assert (await _rotate(submission, old, "r1")).status_code == 201
    again = await _rotate(submission, old, "r1", {"name": "ci"})
    assert again.status_code == 200, again.text


async def test_only_that_rotations_retry_lets_the_revoked_token_in(
    submission: Submission,
) -> None:
    old = await _fresh_token(submission)
    assert (await _rotate(submission, old, "r1")).status_code == 201

    # Another key, no key, a key no rotation used: the revoked token's 401.
    for key in ("r2", None, "x" * 201):
        refused = await _rotate(submission, old, key)
        assert refused.status_code == 401, (key, refused.text)
    # The key on any other route: 401.
    listed = await submission.client.get(
        "/v1/tokens", headers=submission.auth(old) | {"Idempotency-Key": "r1"}
    )
    assert listed.status_code == 401, listed.text
    made = await submission.client.post(
        "/v1/tokens", json={}, headers=submission.auth(old) | {"Idempotency-Key": "r1"}
    )
    assert made.status_code == 401, made.text
    # Another request under the key: 409 naming it, nothing changed.
    other = await _rotate(submission, old, "r1", {"expires_in_days": 3})
    assert other.status_code == 409, other.text
    assert [e["field"] for e in other.json()["errors"]] == ["Idempotency-Key"]


async def test_a_token_revoked_otherwise_is_not_let_in(submission: Submission) -> None:
    """Revoked by DELETE (not by a rotation), presented with a key another rotation used."""
    mine = await _fresh_token(submission)
    assert (await _rotate(submission, mine, "r1")).status_code == 201
    other = await _fresh_token(submission, "other")
    listed = await submission.client.get("/v1/tokens", headers=submission.auth())
    other_id = next(t["id"] for t in listed.json() if t["name"] == "other")
    gone = await submission.client.delete(f"/v1/tokens/{other_id}", headers=submission.auth())
    assert gone.status_code == 204, gone.text
    assert (await _rotate(submission, other, "r1")).status_code == 401


async def test_after_the_window_the_retry_is_refused(submission: Submission) -> None:
    old = await _fresh_token(submission)
    first = await _rotate(submission, old, "r1")
    assert first.status_code == 201, first.text
    await submission.pool.execute(
        "UPDATE tokens SET created_at = created_at - $2::interval WHERE id = $1",
        first.json()["id"],
        ROTATION_REPLAY_WINDOW + timedelta(seconds=1),
    )
    assert (await _rotate(submission, old, "r1")).status_code == 401
    assert await _works(submission, first.json()["token"])  # the new token is untouched


async def test_a_new_token_revoked_since_is_answered_without_a_secret(
    submission: Submission,
) -> None:
    old = await _fresh_token(submission)
    first = await _rotate(submission, old, "r1")
    assert first.status_code == 201, first.text
    new_id = first.json()["id"]
    gone = await submission.client.delete(f"/v1/tokens/{new_id}", headers=submission.auth())
    assert gone.status_code == 204, gone.text
    again = await _rotate(submission, old, "r1")
    assert again.status_code == 200, again.text
    assert again.json()["token"] is None and again.json()["revoked_at"] is not None


async def test_a_key_used_for_a_creation_is_409_and_the_token_stays(
    submission: Submission,
) -> None:
    made = await submission.client.post(
        "/v1/tokens", json={}, headers=submission.auth() | {"Idempotency-Key": "k"}
    )
    assert made.status_code == 201, made.text
    old = await _fresh_token(submission)
    refused = await _rotate(submission, old, "k")
    assert refused.status_code == 409, refused.text
    assert [e["field"] for e in refused.json()["errors"]] == ["Idempotency-Key"]
    assert await _works(submission, old)  # nothing revoked

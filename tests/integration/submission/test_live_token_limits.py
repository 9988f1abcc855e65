"""Live tokens per user and per team (``live_tokens_per_user``/``_per_team``): one past
either bound is a 409 naming it; expired and revoked tokens do not count; an issue at the
bound waits for one under way in its team (another replica's) and counts it (real
PostgreSQL)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import asyncpg
import httpx
import pytest

from tests.integration.submission.conftest import Submission, running_submission
from trainyard_platform.services.submission import identity
from trainyard_platform.services.submission import identity_repository as identity_repo
from trainyard_platform.services.submission.config import Settings
from trainyard_platform.services.submission.errors import Conflict
from trainyard_platform.services.submission.identity_schemas import TokenRequest
from trainyard_platform.shared.bus import Bus

pytestmark = pytest.mark.integration

PER_USER, PER_TEAM = 3, 5


def bounded(settings: Settings) -> Settings:
    return settings.model_copy(
        update={"live_tokens_per_user": PER_USER, "live_tokens_per_team": PER_TEAM}
    )


@pytest.fixture
async def limited(settings: Settings, pool: asyncpg.Pool, bus: Bus) -> AsyncIterator[Submission]:
    async with running_submission(bounded(settings), pool, bus) as running:
        yield running


async def _make(s: Submission, token: str | None = None, name: str = "t") -> httpx.Response:
    return await s.client.post("/v1/tokens", json={"name": name}, headers=s.auth(token))


def _refusal(response: httpx.Response) -> tuple[str, str, str]:
    assert response.status_code == 409, response.text
    body = response.json()
    assert len(body["errors"]) == 1, body
    return body["detail"], body["errors"][0]["field"], body["errors"][0]["message"]


async def _ids(s: Submission, token: str | None = None) -> tuple[int, int]:
    """(user id, team id) of the token's user."""
    me = (await s.client.get("/v1/me", headers=s.auth(token))).json()
    row = await s.pool.fetchrow(
        "SELECT k.user_id, u.team_id FROM tokens k JOIN users u ON u.id = k.user_id "
        "WHERE k.id = $1",
        me["token_id"],
    )
    return int(row["user_id"]), int(row["team_id"])


async def test_a_user_past_its_bound_gets_409_and_expired_or_revoked_tokens_do_not_count(
    limited: Submission,
) -> None:
    user_id, _ = await _ids(limited)
    async with limited.pool.acquire() as conn:  # expired yesterday: not live
        past = datetime.now(UTC) - timedelta(days=1)
        await identity_repo.insert_token(conn, "e" * 64, user_id, "old", past, user_id)
    made = [await _make(limited, name=f"t{n}") for n in range(PER_USER - 1)]  # 1 held already
    assert [m.status_code for m in made] == [201] * (PER_USER - 1), [m.text for m in made]

    detail, field, message = _refusal(await _make(limited, name="more"))
    assert field == "Authorization"
    assert message == f"user ml/alice has {PER_USER} live tokens, the most a user may have is 3"
    assert detail.startswith(f"Authorization: {message}; ") and "DELETE /v1/tokens/{id}" in detail

    rotated = await limited.client.post("/v1/tokens/rotate", json={}, headers=limited.auth())
    assert rotated.status_code == 201, rotated.text  # one for one, at the bound
    fresh = rotated.json()["token"]
    gone = await limited.client.delete(
        f"/v1/tokens/{made[0].json()['id']}", headers=limited.auth(fresh)
    )
    assert gone.status_code == 204, gone.text
    assert (await _make(limited, fresh, "again")).status_code == 201  # the revoked one freed


async def test_rotation_works_for_a_user_and_team_already_past_their_bounds(
    limited: Submission,
) -> None:
    """A user or team may hold more than the bounds (tokens issued before them, or a bound
    lowered since), and keeps them valid. Rotating one leaves the count as it was, so it is
    never refused: it is what a user does with a token it fears leaked, and refused it the
    token stayed live (revoking it instead can leave the user with none to ask with)."""
    user_id, _ = await _ids(limited)
    async with limited.pool.acquire() as conn:  # alice and her team hold PER_TEAM + 1
        for n in range(PER_TEAM):
            await identity_repo.insert_token(conn, f"{n:064x}", user_id, f"old{n}", None, user_id)
    held = "SELECT count(*) FROM tokens WHERE user_id = $1 AND revoked_at IS NULL"
    before = await limited.pool.fetchval(held, user_id)
    assert before == PER_TEAM + 1

    rotated = await limited.client.post("/v1/tokens/rotate", json={}, headers=limited.auth())
    assert rotated.status_code == 201, rotated.text
    gone = await limited.client.get("/v1/me", headers=limited.auth())
    assert gone.status_code == 401, gone.text  # the presented token is revoked
    fresh = rotated.json()["token"]
    assert (await limited.client.get("/v1/me", headers=limited.auth(fresh))).status_code == 200
    assert await limited.pool.fetchval(held, user_id) == before  # one for one
    assert _refusal(await _make(limited, fresh, "more"))[1] == "Authorization"  # no more


async def test_a_team_past_its_bound_refuses_tokens_and_new_users_of_that_team_only(
    limited: Submission,
) -> None:
    admin = limited.auth()
    firsts = {}
    for name in ("u1", "u2"):  # each with its first token: the team holds 3
        made = await limited.client.post(
            "/v1/admin/users", json={"name": name, "role": "member"}, headers=admin
        )
        assert made.status_code == 201, made.text
        firsts[name] = made.json()["token"]
    for n in range(2):  # the team holds 5
        assert (await _make(limited, firsts["u1"], f"u1-{n}")).status_code == 201

    full = "team ml has 5 live tokens, the most a team's users may have together is 5"
    detail, field, message = _refusal(await _make(limited, name="mine"))
    assert (field, message) == ("Authorization", full)
    assert detail.startswith(f"Authorization: {full}; ")
    refused = await limited.client.post(
        "/v1/admin/users", json={"name": "u3", "role": "member"}, headers=admin
    )
    assert _refusal(refused)[1:] == ("team", full)
    missing = await limited.client.get("/v1/admin/users/u3", headers=admin)
    assert missing.status_code == 404, missing.text  # nothing stored
    other = await _make(limited, limited.other_team_token, "vision")
    assert other.status_code == 201, other.text  # another team is not held back

    disabled = await limited.client.delete("/v1/admin/users/u2", headers=admin)
    assert disabled.status_code == 204, disabled.text  # its token revoked: room for one
    assert (await _make(limited, name="mine")).status_code == 201
    assert (await _make(limited, name="more")).status_code == 409


async def test_an_issue_waits_for_one_under_way_in_its_team_and_counts_it(
    limited: Submission,
) -> None:
    # Without the team's lock both counted 4 of 5 and both stored a token: 6 live tokens.
    caller = await identity.authenticate(limited.pool, limited.admin_token)
    assert caller is not None
    async with limited.pool.acquire() as conn:  # the team holds 4: room for one
        made = await limited.client.post(
            "/v1/admin/users", json={"name": "u1", "role": "member"}, headers=limited.auth()
        )
        assert made.status_code == 201, made.text
        assert (await _make(limited, made.json()["token"], "x")).status_code == 201
        assert (await _make(limited, made.json()["token"], "y")).status_code == 201
        under_way = conn.transaction()
        await under_way.start()  # another replica's issue, counted and stored, not committed
        counted = await identity_repo.live_tokens(conn, caller.team_id, caller.user_id, _now())
        assert counted == (1, 4)
        await identity_repo.insert_token(conn, "a" * 64, caller.user_id, "first", None, None)

        second = asyncio.create_task(
            identity.create_token(
                limited.pool, caller, TokenRequest(name="second"), 1, bounded_limits()
            )
        )
        await _done_or_waiting_on_a_lock(second, limited.pool)
        await under_way.commit()
    with pytest.raises(Conflict, match="team ml has 5 live tokens"):
        await second


def _now() -> datetime:
    return datetime.now(UTC)


def bounded_limits() -> identity.LiveTokens:
    return identity.LiveTokens(PER_USER, PER_TEAM)


async def _done_or_waiting_on_a_lock(task: asyncio.Task[object], pool: asyncpg.Pool) -> None:
    """Until ``task`` ended or a connection of ``pool``'s database waits for a lock (no
    timing: whichever comes first, the test then decides)."""
    while not task.done():
        waiting = await pool.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND datname = current_database()"
        )
        if waiting:
            return
        await asyncio.sleep(0.01)

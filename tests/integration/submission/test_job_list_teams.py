"""``GET /v1/jobs`` of another team (``team``) and of every team (``all_teams=true``), for
operators: each job names its team, the keyset pages go through every team's jobs once,
the filters still narrow; anyone else naming another team gets 404, as from the other
routes taking ``team``, and asking for every team 403. A page of every team's walks each
team's index in list order, at most a page of each, as a team's page walks its own."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from tests.integration.submission.conftest import SPEC, Submission
from trainyard_platform.services.submission import identity
from trainyard_platform.services.submission import repository as repo
from trainyard_platform.shared.identity import Role

pytestmark = pytest.mark.integration

T0 = datetime(2026, 1, 1, tzinfo=UTC)
TEAMS = ("ml", "vision", "platform")


async def _operator(submission: Submission) -> str:
    """A token of ``root``, an operator of team ``platform``."""
    return await identity.bootstrap_user(submission.pool, "platform", "root", Role.OPERATOR)


async def _store(submission: Submission, per_team: int) -> list[tuple[str, str, str]]:
    """``per_team`` jobs of each of ``TEAMS``' first user (``platform``'s: made by
    ``_operator`` first) written straight to the table, the
    teams' jobs interleaved in time and every third instant shared by all three teams (the
    list then orders them by id, across teams); every fourth of a team is PENDING and
    labelled ``hot=yes``, the others QUEUED. Returns ``(id, team, status)`` in list order
    (newest first)."""
    rows = []
    async with submission.pool.acquire() as conn:
        for t, team in enumerate(TEAMS):
            team_id, user_id = await conn.fetchrow(
                "SELECT t.id, min(u.id) FROM teams t JOIN users u ON u.team_id = t.id "
                "WHERE t.name = $1 GROUP BY t.id",
                team,
            )
            for i in range(per_team):
                at = T0 + timedelta(minutes=i * 3 + (0 if i % 3 == 0 else t))
                status = "PENDING" if i % 4 == 0 else "QUEUED"
                spec = {**SPEC, "labels": {"hot": "yes"}} if i % 4 == 0 else SPEC
                rows.append(
                    (str(uuid.uuid4()), team_id, user_id, f"job-{i}", spec, status, at, team)
                )
        await conn.executemany(
            "INSERT INTO jobs (id, team_id, user_id, name, spec, status, submitted_at, "
            "updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $7)",
            [r[:7] for r in rows],
        )
    ordered = sorted(rows, key=lambda r: (r[6], r[0]), reverse=True)
    return [(r[0], r[7], r[5]) for r in ordered]


async def _walk(
    submission: Submission, token: str, params: dict[str, Any]
) -> tuple[list[dict[str, Any]], list[int]]:
    """Every job listed from ``params`` on, following ``rel="next"``; and the page sizes."""
    jobs: list[dict[str, Any]] = []
    sizes: list[int] = []
    response = await submission.client.get(
        "/v1/jobs", params=params, headers=submission.auth(token)
    )
    while True:
        assert response.status_code == 200, response.text
        jobs.extend(response.json())
        sizes.append(len(response.json()))
        link = response.links.get("next")
        if link is None:
            return jobs, sizes
        assert len(sizes) < 100, "the links never end"
        response = await submission.client.get(link["url"], headers=submission.auth(token))


async def test_an_operator_lists_another_teams_jobs_each_naming_its_team(
    submission: Submission,
) -> None:
    root = await _operator(submission)
    stored = await _store(submission, per_team=5)
    jobs, _ = await _walk(submission, root, {"team": "vision"})
    assert [j["id"] for j in jobs] == [job for job, team, _ in stored if team == "vision"]
    assert {j["team"] for j in jobs} == {"vision"}
    # Without team, still the operator's own team's, as before.
    own, _ = await _walk(submission, root, {})
    assert [j["id"] for j in own] == [job for job, team, _ in stored if team == "platform"]


async def test_an_operators_pages_of_every_team_list_each_job_once_newest_first(
    submission: Submission,
) -> None:
    root = await _operator(submission)
    stored = await _store(submission, per_team=20)
    jobs, sizes = await _walk(submission, root, {"all_teams": "true", "limit": 7})
    assert sizes == [7] * 8 + [4]
    assert [(j["id"], j["team"]) for j in jobs] == [(job, team) for job, team, _ in stored]
    first = await submission.client.get(
        "/v1/jobs", params={"all_teams": "true", "limit": 7}, headers=submission.auth(root)
    )
    query = httpx.URL(first.links["next"]["url"]).params
    assert query["all_teams"] == "true" and query["limit"] == "7" and "team" not in query


async def test_filters_combine_with_every_team_and_with_another_team(
    submission: Submission,
) -> None:
    root = await _operator(submission)
    stored = await _store(submission, per_team=12)
    hot = [(job, team) for job, team, status in stored if status == "PENDING"]
    params = {"all_teams": "true", "status": "PENDING", "label": "hot=yes", "limit": 2}
    jobs, _ = await _walk(submission, root, params)
    assert [(j["id"], j["team"]) for j in jobs] == hot
    first = await submission.client.get("/v1/jobs", params=params, headers=submission.auth(root))
    query = httpx.URL(first.links["next"]["url"]).params
    assert (query["all_teams"], query["status"], query["label"]) == ("true", "PENDING", "hot=yes")
    # A user's name is a team's: alice is ml's first user, bob vision's.
    alice, _ = await _walk(submission, root, {"all_teams": "true", "user": "alice"})
    assert {j["team"] for j in alice} == {"ml"} and len(alice) == 12
    theirs, _ = await _walk(submission, root, {"team": "vision", "status": "PENDING", "limit": 1})
    assert [j["id"] for j in theirs] == [job for job, team in hot if team == "vision"]
    assert await _walk(submission, root, {"team": "vision", "user": "alice"}) == ([], [0])


async def test_a_member_naming_another_team_is_answered_as_for_a_team_that_does_not_exist(
    submission: Submission,
) -> None:
    root = await _operator(submission)
    await _store(submission, per_team=2)
    member = submission.admin_token  # an admin of ml: no operator
    other = await submission.client.get(
        "/v1/jobs", params={"team": "vision"}, headers=submission.auth(member)
    )
    missing = await submission.client.get(
        "/v1/jobs", params={"team": "nosuchteam"}, headers=submission.auth(member)
    )
    users = await submission.client.get(
        "/v1/admin/users", params={"team": "vision"}, headers=submission.auth(member)
    )
    assert other.status_code == missing.status_code == users.status_code == 404
    assert other.json()["detail"] == users.json()["detail"] == "no team 'vision'"
    # Naming its own team is its own list.
    own = await submission.client.get(
        "/v1/jobs", params={"team": "ml"}, headers=submission.auth(member)
    )
    assert own.status_code == 200 and {j["team"] for j in own.json()} == {"ml"}
    # Every team's is for operators: a 403 saying so, nothing listed.
    every = await submission.client.get(
        "/v1/jobs", params={"all_teams": "true"}, headers=submission.auth(member)
    )
    assert every.status_code == 403, every.text
    assert "operator" in every.json()["detail"]
    # An operator naming a team that does not exist: 404 too.
    none = await submission.client.get(
        "/v1/jobs", params={"team": "nosuchteam"}, headers=submission.auth(root)
    )
    assert none.status_code == 404 and none.json()["detail"] == "no team 'nosuchteam'"


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"team": "vision", "all_teams": "true"}, "all_teams"),
        ({"all_teams": "maybe"}, "all_teams"),
        ({"team": "not a name!"}, "team"),
    ],
)
async def test_a_bad_team_or_all_teams_is_a_422_naming_it(
    submission: Submission, params: dict[str, str], field: str
) -> None:
    root = await _operator(submission)
    response = await submission.client.get("/v1/jobs", params=params, headers=submission.auth(root))
    assert response.status_code == 422, response.text
    assert [e["field"] for e in response.json()["errors"]] == [field]


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    """Every node of an ``EXPLAIN (FORMAT JSON)`` plan."""
    return [plan, *(node for child in plan.get("Plans", []) for node in _nodes(child))]


@pytest.mark.parametrize(
    ("status", "index"), [(None, "jobs_team_newest"), ("PENDING", "jobs_team_status_newest")]
)
async def test_a_page_of_every_team_walks_each_teams_index_in_list_order(
    submission: Submission, status: str | None, index: str
) -> None:
    """20,000 jobs of 10 teams: a page of every team's (first or half-way down, with a
    status or not) walks each team's index in list order, at most a page of each, and
    reads no other job; one team's page still walks that team's index alone, however old
    its jobs are (no index of every team's jobs tempts the planner away from it)."""
    teams = [f"team{n}" for n in range(10)]
    for team in teams:
        await identity.bootstrap_user(submission.pool, team, "owner")
    async with submission.pool.acquire() as conn:
        await conn.execute(
            "INSERT INTO jobs (id, team_id, user_id, name, spec, status, submitted_at, "
            "updated_at) "
            "SELECT gen_random_uuid()::text, u.team_id, u.id, 'job-' || i, $1::jsonb, "
            "CASE WHEN i % 50 < 10 THEN 'PENDING' ELSE 'QUEUED' END, "
            # team0's jobs are the oldest of all: a list of newest jobs finds none of them
            # before the other teams' 18,000.
            "$2::timestamptz + (CASE WHEN i % 10 = 0 THEN i / 100 ELSE 1000 + i END) "
            "* interval '1 s', $2::timestamptz "
            "FROM generate_series(1, 20000) i "
            "JOIN users u ON u.name = 'owner' "
            "JOIN teams t ON t.id = u.team_id AND t.name = 'team' || (i % 10)",
            SPEC,
            T0,
        )
        await conn.execute("ANALYZE jobs")
        middle = await conn.fetchrow(
            "SELECT submitted_at, id FROM jobs ORDER BY submitted_at DESC, id DESC "
            "OFFSET 10000 LIMIT 1"
        )
        team0 = await conn.fetchval("SELECT id FROM teams WHERE name = 'team0'")
        for team_id, after in (
            (None, None),
            (None, (middle["submitted_at"], middle["id"])),
            (team0, None),
        ):
            sql, params = repo.jobs_for_team_query(team_id, status, after, 51)
            plan = json.loads(
                await conn.fetchval(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}", *params)
            )[0]["Plan"]
            scans = [n for n in _nodes(plan) if n.get("Relation Name") == "jobs"]
            walks = [n for n in scans if n.get("Index Name") != "jobs_pkey"]
            assert [n.get("Index Name") for n in walks] == [index], plan
            (walk,) = walks
            read = walk["Actual Rows"] * walk["Actual Loops"] + walk.get(
                "Rows Removed by Filter", 0
            )
            assert read <= 51 * (10 if team_id is None else 1), plan
            # The page's own rows are read again by id (their summaries), and nothing else.
            assert all(n.get("Index Name") == "jobs_pkey" for n in scans if n is not walk), plan


async def test_every_teams_jobs_of_a_user_look_the_user_up_in_each_team_alone(
    submission: Submission,
) -> None:
    """``user`` with ``all_teams``: each team's walk joins that team's user of that name,
    one row per team, not every team's user of that name (teams x users: 9 s for 1,000
    teams of 20 jobs each, where the page takes 27 ms this way)."""
    teams = 60
    async with submission.pool.acquire() as conn:
        await conn.execute(
            "INSERT INTO teams (name) SELECT 'crowd' || n FROM generate_series(1, $1::int) n",
            teams,
        )
        await conn.execute(
            "INSERT INTO users (team_id, name, role) "
            "SELECT id, 'owner', 'member' FROM teams WHERE name LIKE 'crowd%'"
        )
        await conn.execute(
            "INSERT INTO jobs (id, team_id, user_id, name, spec, status, submitted_at, "
            "updated_at) "
            "SELECT gen_random_uuid()::text, u.team_id, u.id, 'job-' || i, $1::jsonb, "
            "'QUEUED', $2::timestamptz + (u.id * 4 + i) * interval '1 s', $2::timestamptz "
            "FROM users u CROSS JOIN generate_series(1, 4) i WHERE u.name = 'owner'",
            SPEC,
            T0,
        )
        await conn.execute("ANALYZE")
        sql, params = repo.jobs_for_team_query(None, None, None, 51, {"user": "owner"})
        plan = json.loads(await conn.fetchval(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}", *params))[0][
            "Plan"
        ]
        rows = await conn.fetch(sql, *params)
        everyone = await conn.fetchval("SELECT count(*) FROM users")
    assert len(rows) == 51 and {r["user_name"] for r in rows} == {"owner"}, rows
    # The rows of users that joined: a user per team in the walks (not each team's
    # ``owner`` for every team), and at most every user once for the page's summaries.
    joined = sum(
        n["Actual Rows"] * n["Actual Loops"]
        for n in _nodes(plan)
        if n.get("Relation Name") == "users"
    )
    assert joined <= 2 * everyone, plan

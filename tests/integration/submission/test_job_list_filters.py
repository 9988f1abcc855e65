"""``GET /v1/jobs`` narrowed by ``id_prefix``, ``user``, ``project`` and ``experiment`` (the
CLI's short ids and ``ls`` filters); each summary says its project, experiment and reason."""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.submission.conftest import SPEC, Submission

pytestmark = pytest.mark.integration


async def _list(submission: Submission, token: str | None = None, **query: Any) -> list[Any]:
    response = await submission.client.get("/v1/jobs", params=query, headers=submission.auth(token))
    assert response.status_code == 200, response.text
    body: list[Any] = response.json()
    return body


async def test_filters_narrow_the_list_and_pages_keep_them(submission: Submission) -> None:
    plain = await submission.submit()
    tracked = [
        await submission.submit(
            {**SPEC, "project": "vision", "experiment": "sweep", "labels": {"lr": str(i)}}
        )
        for i in range(3)
    ]
    everything = await _list(submission)
    assert {j["id"] for j in everything} == {plain["id"], *(t["id"] for t in tracked)}
    assert [j["project"] for j in everything if j["id"] == plain["id"]] == ["default"]

    swept = await _list(submission, project="vision", experiment="sweep")
    assert {j["id"] for j in swept} == {t["id"] for t in tracked}
    assert all((j["project"], j["experiment"]) == ("vision", "sweep") for j in swept)
    assert await _list(submission, project="default") == [
        j for j in everything if j["id"] == plain["id"]
    ]
    assert await _list(submission, experiment="nope") == []
    (one,) = await _list(submission, label="lr=1")
    assert one["id"] == tracked[1]["id"]
    assert await _list(submission, label="lr=9") == []
    assert await _list(submission, label="lr=") == []
    assert len(await _list(submission, user="alice")) == 4
    assert await _list(submission, user="bob") == []

    response = await submission.client.get(
        "/v1/jobs", params={"project": "vision", "limit": 2}, headers=submission.auth()
    )
    assert "project=vision" in response.links["next"]["url"]


async def test_an_id_prefix_finds_the_teams_jobs_only(submission: Submission) -> None:
    job = await submission.submit()
    for length in (1, 8, 36):
        found = await _list(submission, id_prefix=job["id"][:length])
        assert job["id"] in [j["id"] for j in found]
        assert all(j["id"].startswith(job["id"][:length]) for j in found)
    other = await _list(submission, submission.other_team_token, id_prefix=job["id"][:8])
    assert other == []  # another team's job is never found


@pytest.mark.parametrize("prefix", ["", "XYZ", "a%", "abc_", "g", "0" * 37])
async def test_an_id_prefix_is_hex_and_dashes(submission: Submission, prefix: str) -> None:
    response = await submission.client.get(
        "/v1/jobs", params={"id_prefix": prefix}, headers=submission.auth()
    )
    assert response.status_code == 422, response.text
    assert [e["field"] for e in response.json()["errors"]] == ["id_prefix"]


async def test_a_label_filter_is_key_equals_value(submission: Submission) -> None:
    for bad in ("nolabel", "=v", "k=a\nb"):
        response = await submission.client.get(
            "/v1/jobs", params={"label": bad}, headers=submission.auth()
        )
        assert response.status_code == 422, (bad, response.text)
        assert [e["field"] for e in response.json()["errors"]] == ["label"]


async def test_a_summary_says_why_a_job_waits(submission: Submission) -> None:
    job = await submission.submit()
    async with submission.pool.acquire() as conn:
        await conn.execute(
            "UPDATE jobs SET status = 'PENDING', pending_reason = 'waiting for 1 GPU' "
            "WHERE id = $1",
            job["id"],
        )
    (summary,) = await _list(submission, id_prefix=job["id"])
    assert summary["reason"] == "waiting for 1 GPU"

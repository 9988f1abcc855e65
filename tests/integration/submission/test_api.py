"""The HTTP API against real PostgreSQL and NATS: auth, validation, tenancy, submission."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from typing import Any

import asyncpg
import pytest

from tests.integration.submission.conftest import SPEC, Submission, eventually
from trainyard_platform.services.submission import identity
from trainyard_platform.services.submission import identity_repository as identity_repo
from trainyard_platform.services.submission.config import Settings
from trainyard_platform.shared.events import nats_subject, parse_envelope
from trainyard_platform.shared.events.payloads import JobCancelRequested, JobSubmitted
from trainyard_platform.shared.identity import Role

pytestmark = pytest.mark.integration


async def _counts(pool: asyncpg.Pool) -> tuple[int, int, int]:
    async with pool.acquire() as conn:
        jobs = await conn.fetchval("SELECT count(*) FROM jobs")
        history = await conn.fetchval("SELECT count(*) FROM job_history")
        outbox = await conn.fetchval("SELECT count(*) FROM outbox")
    return jobs, history, outbox


async def _published(submission: Submission, subject: str) -> list[bytes]:
    """Every message on ``subject`` in the event stream, read with a JetStream consumer."""
    sub = await submission.bus.jetstream.pull_subscribe(subject, stream="TRAINYARD")
    found: list[bytes] = []
    try:
        while True:
            try:
                batch = await sub.fetch(10, timeout=0.5)
            except TimeoutError:
                return found
            for msg in batch:
                found.append(msg.data)
                await msg.ack()
    finally:
        await sub.unsubscribe()


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer ty_not-a-real-token"}, {"Authorization": "Basic abc"}],
)
async def test_every_v1_route_needs_a_valid_token(
    submission: Submission, headers: dict[str, str]
) -> None:
    for method, path in [
        ("GET", "/v1/jobs"),
        ("GET", "/v1/jobs/x"),
        ("POST", "/v1/jobs"),
        ("POST", "/v1/jobs/x/cancel"),
        ("POST", "/v1/admin/users"),
    ]:
        response = await submission.client.request(method, path, json=SPEC, headers=headers)
        assert response.status_code == 401, (method, path)
        assert response.json()["detail"]
        assert response.headers["WWW-Authenticate"] == "Bearer"
    assert await _counts(submission.pool) == (0, 0, 0)


async def test_unknown_paths_are_json_404s(submission: Submission) -> None:
    response = await submission.client.get("/nowhere")
    assert response.status_code == 404
    assert response.json()["detail"]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"gpus": None}, "gpus"),  # missing
        ({"gpus": "four"}, "gpus"),  # wrong type
        ({"gpus": -1}, "gpus"),  # negative
        ({"gpu_flavor": "tpu"}, "gpu_flavor"),  # unknown flavor
        ({"colour": "blue"}, "colour"),  # unknown field
        ({"entrypoint": "../etc/passwd"}, "entrypoint"),
        ({"name": ""}, "name"),
        ({"hyperparameters": {"lr": [0.1]}}, "hyperparameters.lr"),
        ({"args": ["ok", 3]}, "args[1]"),
    ],
)
async def test_invalid_job_is_422_naming_the_field_and_nothing_is_stored(
    submission: Submission, change: dict[str, Any], field: str
) -> None:
    spec = {**SPEC, **change}
    spec = {k: v for k, v in spec.items() if v is not None}
    response = await submission.client.post("/v1/jobs", json=spec, headers=submission.auth())
    assert response.status_code == 422, response.text
    body = response.json()
    assert body["detail"]
    assert field in [e["field"] for e in body["errors"]], body
    assert all(e["message"] for e in body["errors"])
    assert await _counts(submission.pool) == (0, 0, 0)


async def test_an_unknown_field_is_named_with_the_close_known_one(submission: Submission) -> None:
    body = {**SPEC, "hyperparameter": {"lr": 0.1}, "apiVersion": "trainyard.dev/v1"}
    response = await submission.client.post("/v1/jobs", json=body, headers=submission.auth())
    assert response.status_code == 422, response.text
    assert response.json()["errors"] == [
        {
            "field": "hyperparameter",
            "message": "unknown field 'hyperparameter': did you mean 'hyperparameters'?",
        }
    ]
    assert await _counts(submission.pool) == (0, 0, 0)


async def test_unknown_flavor_error_lists_the_allowed_flavors(submission: Submission) -> None:
    response = await submission.client.post(
        "/v1/jobs", json={**SPEC, "gpu_flavor": "tpu"}, headers=submission.auth()
    )
    (error,) = response.json()["errors"]
    assert error["field"] == "gpu_flavor"
    for flavor in ("cpu", "t4", "a100", "h100", "h200"):
        assert flavor in error["message"]


async def test_body_that_is_not_a_json_object_is_422(submission: Submission) -> None:
    for content in (b"not json", b"[1, 2]"):
        response = await submission.client.post(
            "/v1/jobs",
            content=content,
            headers={**submission.auth(), "Content-Type": "application/json"},
        )
        assert response.status_code == 422
        assert response.json()["errors"][0]["field"] == "body"


async def test_bad_query_parameter_is_422_in_the_same_shape(submission: Submission) -> None:
    response = await submission.client.get("/v1/jobs?limit=lots", headers=submission.auth())
    assert response.status_code == 422
    assert response.json()["errors"][0]["field"] == "limit"
    response = await submission.client.get("/v1/jobs?status=DONE", headers=submission.auth())
    assert response.status_code == 422
    assert response.json()["errors"][0]["field"] == "status"


async def test_good_job_is_stored_and_announced_exactly_once(submission: Submission) -> None:
    response = await submission.client.post("/v1/jobs", json=SPEC, headers=submission.auth())
    assert response.status_code == 201, response.text
    view = response.json()
    assert response.headers["Location"] == f"/v1/jobs/{view['id']}"
    assert view["status"] == "QUEUED"
    assert (view["team"], view["user"]) == ("ml", "alice")
    assert view["spec"]["hyperparameters"] == SPEC["hyperparameters"]
    assert view["spec"]["max_runtime_seconds"] == 3600  # defaults filled in
    assert [h["status"] for h in view["history"]] == ["QUEUED"]

    async def relayed() -> bool:
        async with submission.pool.acquire() as conn:
            return bool(
                await conn.fetchval("SELECT bool_and(published_at IS NOT NULL) FROM outbox")
            )

    await eventually(relayed)
    (raw,) = await _published(submission, nats_subject(JobSubmitted))
    envelope = parse_envelope(raw)
    assert isinstance(envelope.data, JobSubmitted)
    assert envelope.subject == view["id"]
    assert envelope.data.job_id == view["id"]
    assert envelope.data.spec.user == "alice"
    assert envelope.data.spec.team == "ml"
    assert envelope.data.spec.seed == 7
    assert envelope.data.spec.hyperparameters == SPEC["hyperparameters"]
    assert envelope.source == "trainyard/submission"


async def test_the_view_a_submission_answers_is_the_one_reading_it_back_gives(
    submission: Submission,
) -> None:
    """The 201's view is built from what was written, not read back: it must not differ."""
    created = await submission.client.post("/v1/jobs", json=SPEC, headers=submission.auth())
    assert created.status_code == 201, created.text
    read = await submission.client.get(created.headers["Location"], headers=submission.auth())
    assert read.json() == created.json()


async def test_other_team_cannot_see_or_cancel_the_job(submission: Submission) -> None:
    job = await submission.submit()
    other = submission.auth(submission.other_team_token)
    assert (await submission.client.get(f"/v1/jobs/{job['id']}", headers=other)).status_code == 404
    cancel = await submission.client.post(f"/v1/jobs/{job['id']}/cancel", headers=other)
    assert cancel.status_code == 404
    listed = await submission.client.get("/v1/jobs", headers=other)
    assert listed.json() == []
    mine = await submission.client.get("/v1/jobs", headers=submission.auth())
    assert [j["id"] for j in mine.json()] == [job["id"]]


async def test_submitting_for_another_team_is_forbidden(submission: Submission) -> None:
    response = await submission.client.post(
        "/v1/jobs", json={**SPEC, "team": "vision"}, headers=submission.auth()
    )
    assert response.status_code == 403
    assert await _counts(submission.pool) == (0, 0, 0)
    ok = await submission.client.post(
        "/v1/jobs", json={**SPEC, "team": "ml"}, headers=submission.auth()
    )
    assert ok.status_code == 201


async def test_list_is_newest_first_and_filters_by_status(submission: Submission) -> None:
    first = await submission.submit({**SPEC, "name": "first"})
    second = await submission.submit({**SPEC, "name": "second"})
    listed = (await submission.client.get("/v1/jobs", headers=submission.auth())).json()
    assert [j["id"] for j in listed] == [second["id"], first["id"]]
    assert listed[0]["gpu_flavor"] == "cpu"
    one = await submission.client.get("/v1/jobs?limit=1", headers=submission.auth())
    assert [j["id"] for j in one.json()] == [second["id"]]
    none = await submission.client.get("/v1/jobs?status=RUNNING", headers=submission.auth())
    assert none.json() == []


async def test_idempotency_key_returns_the_same_job(submission: Submission) -> None:
    headers = {**submission.auth(), "Idempotency-Key": "nightly-2024-06-01"}
    first = await submission.client.post("/v1/jobs", json=SPEC, headers=headers)
    again = await submission.client.post("/v1/jobs", json=SPEC, headers=headers)
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json()["id"] == again.json()["id"]
    assert await _counts(submission.pool) == (1, 1, 1)
    different = await submission.client.post("/v1/jobs", json={**SPEC, "seed": 8}, headers=headers)
    assert different.status_code == 409
    # The same key from another user is another job.
    other = {
        **submission.auth(submission.other_team_token),
        "Idempotency-Key": "nightly-2024-06-01",
    }
    assert (await submission.client.post("/v1/jobs", json=SPEC, headers=other)).status_code == 201


DEFAULTS_SPELLED_OUT: dict[str, Any] = {
    "apiVersion": "trainyard.dev/v1",
    "kind": "Job",
    "team": "ml",
    "requirements": [],
    "cpus_per_gpu": 0,
    "memory_gib_per_gpu": 0,
    "max_runtime_seconds": 3600,
    "max_restarts": 3,
    "priority": "normal",
    "project": "default",
    "labels": {},
    "register_model": False,
    "datasets": [],
    "dataset": None,
}


async def test_a_retry_that_spells_out_the_defaults_is_the_same_request(
    submission: Submission,
) -> None:
    """A client library that fills in the defaults on its retry sends the same request: 200
    with the job its key made, for an audited caller and a remembered member alike (the
    two ways a submission is stored), and a dry run says so too. Before, it was 409."""
    member = await identity.bootstrap_user(submission.pool, "ml", "carol", Role.MEMBER)
    for token in (submission.admin_token, member):
        headers = {**submission.auth(token), "Idempotency-Key": "defaults-1"}
        first = await submission.client.post("/v1/jobs", json=SPEC, headers=headers)
        assert first.status_code == 201, first.text
        spelled = {**SPEC, **DEFAULTS_SPELLED_OUT}
        for query in ("?dry_run=true", ""):
            again = await submission.client.post(f"/v1/jobs{query}", json=spelled, headers=headers)
            assert again.status_code == 200, again.text
            assert again.json()["id"] == first.json()["id"]
        changed = await submission.client.post(
            "/v1/jobs", json={**spelled, "max_restarts": 4}, headers=headers
        )
        assert changed.status_code == 409, changed.text


async def test_a_job_fingerprinted_in_the_earlier_form_still_replays_its_same_body(
    submission: Submission,
) -> None:
    """A job stored before defaults were part of the fingerprint kept the sha256 of the
    fields its body set: a retry of that body is still its replay, another body is not."""
    headers = {**submission.auth(), "Idempotency-Key": "earlier-form"}
    first = await submission.client.post("/v1/jobs", json=SPEC, headers=headers)
    assert first.status_code == 201, first.text
    earlier = hashlib.sha256(
        json.dumps(SPEC, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()
    async with submission.pool.acquire() as conn:
        await conn.execute("UPDATE jobs SET request_fingerprint = $1", earlier)
    again = await submission.client.post("/v1/jobs", json=SPEC, headers=headers)
    assert again.status_code == 200, again.text
    assert again.json()["id"] == first.json()["id"]
    other = await submission.client.post("/v1/jobs", json={**SPEC, "seed": 8}, headers=headers)
    assert other.status_code == 409, other.text


async def test_a_key_reused_for_another_request_names_the_header_and_its_job(
    submission: Submission,
) -> None:
    """The 409 of a key used before for a different request says, as every error answer
    does, which field and why: the ``Idempotency-Key`` header, used for another request,
    and the job it made. Before, ``errors`` was empty."""
    headers = {**submission.auth(), "Idempotency-Key": "nightly-2024-06-02"}
    first = await submission.client.post("/v1/jobs", json=SPEC, headers=headers)
    assert first.status_code == 201, first.text
    for query in ("", "?dry_run=true"):
        different = await submission.client.post(
            f"/v1/jobs{query}", json={**SPEC, "seed": 8}, headers=headers
        )
        assert different.status_code == 409, different.text
        errors = different.json()["errors"]
        assert [e["field"] for e in errors] == ["Idempotency-Key"], errors
        assert "different request" in errors[0]["message"], errors
        assert first.json()["id"] in errors[0]["message"], errors


async def test_every_conflict_names_its_field(submission: Submission) -> None:
    """A 409 of any kind names the field it is about (a path parameter, a body field, the
    token), never an empty ``errors``."""
    job = await submission.submit()
    async with submission.pool.acquire() as conn:
        await conn.execute(
            "UPDATE jobs SET status = 'SUCCEEDED', finished_at = now() WHERE id = $1", job["id"]
        )
    ended = await submission.client.post(f"/v1/jobs/{job['id']}/cancel", headers=submission.auth())
    taken = await submission.client.post(
        "/v1/admin/users", json={"name": "alice"}, headers=submission.auth()
    )
    me = await submission.client.get("/v1/me", headers=submission.auth())
    yourself = await submission.client.delete(
        f"/v1/admin/users/{me.json()['user']}", headers=submission.auth()
    )
    for answer, field in ((ended, "job_id"), (taken, "name"), (yourself, "name")):
        assert answer.status_code == 409, answer.text
        errors = answer.json()["errors"]
        assert [e["field"] for e in errors] == [field], answer.text
        assert all(e["message"] for e in errors), answer.text


async def test_cancel_announces_once_and_refuses_ended_jobs(submission: Submission) -> None:
    job = await submission.submit()
    url = f"/v1/jobs/{job['id']}/cancel"
    first = await submission.client.post(url, headers=submission.auth())
    assert first.status_code == 202
    assert first.json()["cancel_requested"] is True
    assert (await submission.client.post(url, headers=submission.auth())).status_code == 202
    async with submission.pool.acquire() as conn:
        subjects = await conn.fetch("SELECT subject FROM outbox ORDER BY seq")
    assert [r["subject"] for r in subjects] == [
        f"{JobSubmitted.TYPE}.{job['id']}",
        f"{JobCancelRequested.TYPE}.{job['id']}",
    ]
    async with submission.pool.acquire() as conn:
        await conn.execute(
            "UPDATE jobs SET status = 'SUCCEEDED', finished_at = now() WHERE id = $1", job["id"]
        )
    ended = await submission.client.post(url, headers=submission.auth())
    assert ended.status_code == 409
    assert "SUCCEEDED" in ended.json()["detail"]


async def test_admin_creates_members_who_cannot_create_users(submission: Submission) -> None:
    created = await submission.client.post(
        "/v1/admin/users", json={"name": "carol"}, headers=submission.auth()
    )
    assert created.status_code == 201, created.text
    body = created.json()
    assert (body["user"], body["team"], body["role"]) == ("carol", "ml", "member")
    carol = submission.auth(body["token"])
    job = await submission.client.post("/v1/jobs", json=SPEC, headers=carol)
    assert job.json()["user"] == "carol"
    refused = await submission.client.post("/v1/admin/users", json={"name": "dave"}, headers=carol)
    assert refused.status_code == 403
    again = await submission.client.post(
        "/v1/admin/users", json={"name": "carol"}, headers=submission.auth()
    )
    assert again.status_code == 409
    elsewhere = await submission.client.post(
        "/v1/admin/users", json={"name": "eve", "team": "vision"}, headers=submission.auth()
    )
    assert elsewhere.status_code == 403
    invalid = await submission.client.post(
        "/v1/admin/users", json={"name": "x y", "role": "root"}, headers=submission.auth()
    )
    assert invalid.status_code == 422
    assert {e["field"] for e in invalid.json()["errors"]} == {"name", "role"}


async def test_an_admin_changes_a_users_role_from_its_next_request_on(
    submission: Submission,
) -> None:
    """The role a token carries is read on every request: no token is reissued, and the
    change is audited with the old and the new role."""
    admin = submission.auth()
    created = await submission.client.post("/v1/admin/users", json={"name": "carol"}, headers=admin)
    carol = submission.auth(created.json()["token"])
    assert (await submission.client.post("/v1/jobs", json=SPEC, headers=carol)).status_code == 201

    def change(name: str, role: object, headers: dict[str, str] = admin) -> Any:
        return submission.client.patch(
            f"/v1/admin/users/{name}", json={"role": role}, headers=headers
        )

    demoted = await change("carol", "viewer")
    assert demoted.status_code == 200, demoted.text
    assert (demoted.json()["name"], demoted.json()["role"]) == ("carol", "viewer")
    assert (await submission.client.post("/v1/jobs", json=SPEC, headers=carol)).status_code == 403
    assert (await submission.client.get("/v1/jobs", headers=carol)).status_code == 200
    assert (await change("carol", "member")).status_code == 200
    assert (await submission.client.post("/v1/jobs", json=SPEC, headers=carol)).status_code == 201

    assert (await change("alice", "viewer")).status_code == 409  # not one's own role
    assert (await change("carol", "operator")).status_code == 403  # operators make operators
    assert (await change("carol", "admin", carol)).status_code == 403  # members manage nobody
    assert (await change("nobody", "viewer")).status_code == 404
    invalid = await change("carol", "root")
    assert invalid.status_code == 422
    assert [e["field"] for e in invalid.json()["errors"]] == ["role"]

    async with submission.pool.acquire() as conn:
        rows = await conn.fetch(
            "SELECT target, detail FROM audit_log WHERE action = 'change role' ORDER BY id"
        )
    assert [(r["target"], r["detail"]) for r in rows] == [
        ("ml/carol", {"from": "member", "to": "viewer"}),
        ("ml/carol", {"from": "viewer", "to": "member"}),
    ]


async def test_a_user_change_with_a_stale_etag_is_412_and_the_fresh_one_proceeds(
    submission: Submission,
) -> None:
    """``GET /v1/admin/users/{name}`` answers the user with its ``ETag`` (its role and
    whether it is disabled); a role change or a disabling with ``If-Match: <it>`` goes
    ahead while the user is as it was read and is 412, naming ``If-Match`` and that it
    changed, once another admin changed it since: an admin who read carol as a viewer
    and disables her for it does not disable her once another admin made her an admin.
    Without a condition, as before. (Before, there was no such ``GET`` nor tag.)"""
    admin = submission.auth()
    made = await submission.client.post("/v1/admin/users", json={"name": "carol"}, headers=admin)
    assert made.status_code == 201, made.text
    read = await submission.client.get("/v1/admin/users/carol", headers=admin)
    assert read.status_code == 200, read.text
    assert (read.json()["name"], read.json()["role"]) == ("carol", "member")
    tag = read.headers["ETag"]
    assert (await submission.client.get("/v1/admin/users/nobody", headers=admin)).status_code == 404
    other = await submission.client.patch(
        "/v1/admin/users/carol", json={"role": "admin"}, headers={**admin, "If-Match": tag}
    )
    assert other.status_code == 200, other.text
    assert other.headers["ETag"] not in (tag, None)
    stale = {**admin, "If-Match": tag}
    for response in (
        await submission.client.patch(
            "/v1/admin/users/carol", json={"role": "viewer"}, headers=stale
        ),
        await submission.client.delete("/v1/admin/users/carol", headers=stale),
    ):
        assert response.status_code == 412, response.text
        (error,) = response.json()["errors"]
        assert error["field"] == "If-Match"
        assert "user carol was changed since it was read" in error["message"]
    now = await submission.client.get("/v1/admin/users/carol", headers=admin)
    assert (now.json()["role"], now.json()["disabled_at"]) == ("admin", None)
    assert now.headers["ETag"] == other.headers["ETag"]
    gone = await submission.client.delete(
        "/v1/admin/users/carol", headers={**admin, "If-Match": now.headers["ETag"]}
    )
    assert gone.status_code == 204, gone.text
    # Without a condition, as before.
    made = await submission.client.post("/v1/admin/users", json={"name": "dave"}, headers=admin)
    plain = await submission.client.patch(
        "/v1/admin/users/dave", json={"role": "viewer"}, headers=admin
    )
    assert plain.status_code == 200, plain.text


async def test_tokens_are_stored_hashed(submission: Submission) -> None:
    async with submission.pool.acquire() as conn:
        stored = [r["token_hash"] for r in await conn.fetch("SELECT token_hash FROM tokens")]
    assert len(stored) == 2
    assert submission.admin_token not in stored
    assert all(len(h) == 64 for h in stored)


async def test_the_job_spec_schema_is_served_to_anyone(submission: Submission) -> None:
    from trainyard.spec import schema_text

    response = await submission.client.get("/v1/schemas/job.v1.json")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/schema+json")
    assert response.text == schema_text()


async def test_users_and_tokens_come_a_page_at_a_time(submission: Submission) -> None:
    # GET /v1/admin/users and GET /v1/tokens answered every row in one body, however many
    # users a team has or tokens a user made. Now a page of at most limit, the rest by the
    # Link cursor (as GET /v1/jobs).
    admin = submission.auth()
    for name in ("u1", "u2", "u3", "u4"):
        made = await submission.client.post("/v1/admin/users", json={"name": name}, headers=admin)
        assert made.status_code == 201, made.text
    for n in range(4):
        made = await submission.client.post("/v1/tokens", json={"name": f"t{n}"}, headers=admin)
        assert made.status_code == 201, made.text

    async def every(url: str) -> list[Any]:
        rows: list[Any] = []
        following: str | None = url
        for _ in range(10):
            assert following is not None
            page = await submission.client.get(following, headers=admin)
            assert page.status_code == 200, page.text
            assert len(page.json()) <= 2
            rows += page.json()
            following = page.links.get("next", {}).get("url")
            if following is None:
                return rows
        raise AssertionError("the cursor never ended")

    users = await every("/v1/admin/users?limit=2")
    assert {"u1", "u2", "u3", "u4"} <= {u["name"] for u in users}
    assert [u["name"] for u in users] == sorted(u["name"] for u in users)
    tokens = await every("/v1/tokens?limit=2")
    assert {"t0", "t1", "t2", "t3"} <= {t["name"] for t in tokens}
    assert len({t["id"] for t in tokens}) == len(tokens)
    for path, bad in (
        ("/v1/admin/users", {"after": "bm90IGEgY3Vyc29y"}),
        ("/v1/tokens", {"after": "Mg"}),
        ("/v1/tokens", {"limit": 501}),
    ):
        refused = await submission.client.get(path, params=bad, headers=admin)
        assert refused.status_code == 422, (bad, refused.text)
        assert refused.json()["errors"][0]["field"] == next(iter(bad)), refused.text


async def test_a_user_holds_at_most_max_live_tokens(
    submission: Submission, settings: Settings
) -> None:
    # POST /v1/tokens issued a token whatever the user held already: a loop made any number
    # of live tokens, each valid on every service. Now one past live_tokens_per_user (100
    # by default) is a 409 saying so; revoking one makes room, and rotating (one for one)
    # still works.
    most = settings.live_tokens_per_user
    admin = submission.auth()
    me = (await submission.client.get("/v1/me", headers=admin)).json()
    user_id, team_id = await submission.pool.fetchrow(
        "SELECT k.user_id, u.team_id FROM tokens k JOIN users u ON u.id = k.user_id "
        "WHERE k.id = $1",
        me["token_id"],
    )
    async with submission.pool.acquire() as conn:
        held, _ = await identity_repo.live_tokens(conn, team_id, user_id, datetime.now(UTC))
        for n in range(most - held - 1):  # as if made one by one
            await identity_repo.insert_token(conn, f"{n:064x}", user_id, f"t{n}", None, user_id)
    last = await submission.client.post("/v1/tokens", json={"name": "last"}, headers=admin)
    assert last.status_code == 201, last.text
    refused = await submission.client.post("/v1/tokens", json={"name": "more"}, headers=admin)
    assert refused.status_code == 409, refused.text
    assert f"the most a user may have is {most}" in refused.json()["detail"]
    rotated = await submission.client.post("/v1/tokens/rotate", json={}, headers=admin)
    assert rotated.status_code == 201, rotated.text
    fresh = submission.auth(rotated.json()["token"])
    gone = await submission.client.delete(f"/v1/tokens/{last.json()['id']}", headers=fresh)
    assert gone.status_code in (200, 204), gone.text
    again = await submission.client.post("/v1/tokens", json={"name": "more"}, headers=fresh)
    assert again.status_code == 201, again.text

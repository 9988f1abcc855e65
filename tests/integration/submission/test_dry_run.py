"""``POST /v1/jobs?dry_run=true`` checks a job as a submission does and stores nothing: the
same refusal (status and body) for what a submission refuses, 200 with the job as it would
be for what it accepts, and no job, history row, event or audit entry either way. A sweep
checks every trial with it before it submits the first (``trainyard sweep``): it stopped at
a trial whose value the server refused, with the trials before it already running."""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest

from tests.integration.submission.conftest import SPEC, Submission
from trainyard_platform.services.submission.governance import current_month
from trainyard_platform.services.submission.service import event_handler
from trainyard_platform.shared.bus import Delivery
from trainyard_platform.shared.events import Envelope
from trainyard_platform.shared.events.payloads import BudgetUpdated
from trainyard_platform.shared.events.trust import owner, routing_key_of

pytestmark = pytest.mark.integration

DRY = "/v1/jobs?dry_run=true"


async def _counts(pool: asyncpg.Pool) -> tuple[int, int, int, int]:
    """Jobs, history rows, outbox rows, audit entries."""
    async with pool.acquire() as conn:
        return (
            await conn.fetchval("SELECT count(*) FROM jobs"),
            await conn.fetchval("SELECT count(*) FROM job_history"),
            await conn.fetchval("SELECT count(*) FROM outbox"),
            await conn.fetchval("SELECT count(*) FROM audit_log WHERE action = 'submit job'"),
        )


async def _member(submission: Submission) -> dict[str, str]:
    """A member's headers: a member's writes are not audited, so the token is remembered
    after its first request and its submissions take the one-statement path."""
    made = await submission.client.post(
        "/v1/admin/users", json={"name": "carol", "role": "member"}, headers=submission.auth()
    )
    assert made.status_code == 201, made.text
    return {"Authorization": f"Bearer {made.json()['token']}"}


def _post(submission: Submission, path: str, spec: dict[str, Any], headers: dict[str, str]) -> Any:
    return submission.client.post(path, json=spec, headers=headers)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"hyperparameters": {"lr": 0.1, "note": "a\x01b"}}, "hyperparameters.note"),
        ({"gpus": 65}, "gpus"),
        ({"gpu_flavor": "tpu"}, "gpu_flavor"),
        ({"code": {"kind": "bundle", "sha256": "ab" * 32, "size_bytes": 10}}, "code.sha256"),
        ({"seed": -1}, "seed"),
    ],
    ids=["control-character", "over-a-bound", "unknown-flavor", "no-such-bundle", "seed"],
)
@pytest.mark.parametrize("who", ["admin", "member"])
async def test_a_dry_run_refuses_what_a_submission_refuses_with_the_same_422(
    submission: Submission, change: dict[str, Any], field: str, who: str
) -> None:
    headers = submission.auth() if who == "admin" else await _member(submission)
    if who == "member":  # remembered from here on: the one-statement path is the one taken
        assert (await _post(submission, "/v1/jobs", SPEC, headers)).status_code == 201
    before = await _counts(submission.pool)
    spec = {**SPEC, **change}
    dry = await _post(submission, DRY, spec, headers)
    real = await _post(submission, "/v1/jobs", spec, headers)
    assert (dry.status_code, dry.json()) == (real.status_code, real.json()), dry.text
    assert dry.status_code == 422 and field in [e["field"] for e in dry.json()["errors"]]
    assert await _counts(submission.pool) == before


@pytest.mark.parametrize("who", ["admin", "member"])
async def test_a_dry_run_answers_the_job_as_it_would_be_and_stores_nothing(
    submission: Submission, who: str
) -> None:
    headers = submission.auth() if who == "admin" else await _member(submission)
    if who == "member":
        assert (await _post(submission, "/v1/jobs", SPEC, headers)).status_code == 201
    before = await _counts(submission.pool)
    dry = await _post(submission, DRY, SPEC, headers)
    assert dry.status_code == 200, dry.text
    assert "Location" not in dry.headers
    view = dry.json()
    assert (view["status"], view["spec"]["hyperparameters"]) == ("QUEUED", SPEC["hyperparameters"])
    assert view["spec"]["max_runtime_seconds"] == 3600  # defaults filled in, as a 201's
    assert await _counts(submission.pool) == before
    missing = await submission.client.get(f"/v1/jobs/{view['id']}", headers=headers)
    assert missing.status_code == 404  # its id names no job
    real = await _post(submission, "/v1/jobs", SPEC, headers)
    assert real.status_code == 201
    assert {**real.json(), **_apart} == {**view, **_apart}


_apart = {"id": "", "submitted_at": "", "updated_at": "", "history": [], "trace_id": None}
"""What a dry run's view and the submission's differ in: the id and the times."""


async def test_a_dry_run_with_a_used_idempotency_key_answers_as_the_replay_would(
    submission: Submission,
) -> None:
    headers = {**submission.auth(), "Idempotency-Key": "sweep-abc-1"}
    first = await _post(submission, "/v1/jobs", SPEC, headers)
    assert first.status_code == 201
    before = await _counts(submission.pool)
    same = await _post(submission, DRY, SPEC, headers)
    assert (same.status_code, same.json()["id"]) == (200, first.json()["id"])
    other = await _post(submission, DRY, {**SPEC, "seed": 8}, headers)
    real = await _post(submission, "/v1/jobs", {**SPEC, "seed": 8}, headers)
    assert (
        (other.status_code, other.json()) == (real.status_code, real.json()) == (409, other.json())
    )
    assert await _counts(submission.pool) == before


async def test_a_dry_run_meets_the_budget_a_submission_meets(submission: Submission) -> None:
    """Admission at submission time (a spent budget whose policy refuses) is checked too."""
    spent = BudgetUpdated.model_validate(
        {
            "team": "ml",
            "month": current_month(),
            "amount": "10",
            "spent": "12",
            "currency": "USD",
            "policy": "refuse",
            "exhausted": True,
            "revision": 1,
        }
    )
    envelope = Envelope.wrap(spent, source=owner(spent), subject=routing_key_of(spent))
    await event_handler(submission.pool)([Delivery(envelope)])
    dry = await _post(submission, DRY, SPEC, submission.auth())
    real = await _post(submission, "/v1/jobs", SPEC, submission.auth())
    assert (dry.status_code, dry.json()) == (real.status_code, real.json()) == (409, dry.json())
    assert await _counts(submission.pool) == (0, 0, 0, 0)


async def test_dry_run_is_a_typed_query_parameter(submission: Submission) -> None:
    bad = await _post(submission, "/v1/jobs?dry_run=perhaps", SPEC, submission.auth())
    assert bad.status_code == 422 and bad.json()["errors"][0]["field"] == "dry_run", bad.text
    assert await _counts(submission.pool) == (0, 0, 0, 0)
    schema = (await submission.client.get("/schema/openapi.json", headers=submission.auth())).json()
    (param,) = [
        p for p in schema["paths"]["/v1/jobs"]["post"]["parameters"] if p["name"] == "dry_run"
    ]
    assert (param["in"], param["schema"]["type"], param["required"]) == ("query", "boolean", False)
    assert "stores nothing" in param["description"] or "store nothing" in param["description"]

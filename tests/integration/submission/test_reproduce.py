"""``POST /v1/jobs/{id}/reproduce`` against real PostgreSQL and NATS: only an ended job of
the caller's team, the same resolved spec linked to the original, deliberate changes only as
asked, bad input refused naming the field, and the new job announced like any other."""

from __future__ import annotations

import pytest

from tests.integration.submission.conftest import Submission
from tests.unit.submission import factories as ev
from trainyard_platform.services.submission.governance import current_month

pytestmark = pytest.mark.integration


async def ended_job(submission: Submission) -> str:
    job: str = (await submission.submit())["id"]
    await submission.publish(ev.granted(job))
    await submission.publish(ev.started(job))
    await submission.publish(ev.succeeded(job, accuracy=0.9))
    await submission.wait_for(job, lambda v: v["status"] == "SUCCEEDED")
    return job


async def test_a_job_that_has_not_ended_cannot_be_reproduced(submission: Submission) -> None:
    job = (await submission.submit())["id"]
    answer = await submission.client.post(f"/v1/jobs/{job}/reproduce", headers=submission.auth())
    assert answer.status_code == 409, answer.text
    assert "has not ended" in answer.json()["detail"]
    said_once(answer.json())


def said_once(refusal: dict[str, object]) -> None:
    """The field's message is said within the detail, word for word: the CLI prints such a
    reason once (``TrainyardError.__str__``). Before, ``rerun --reproduce`` said the job had
    not ended twice, in two wordings."""
    errors = refusal["errors"]
    assert isinstance(errors, list) and len(errors) == 1, refusal
    assert errors[0]["message"] in str(refusal["detail"]), refusal


async def test_the_reproduction_is_the_same_job_linked_to_the_original(
    submission: Submission,
) -> None:
    job = await ended_job(submission)
    original = await submission.job(job)
    answer = await submission.client.post(f"/v1/jobs/{job}/reproduce", headers=submission.auth())
    assert answer.status_code == 201, answer.text
    view = answer.json()
    assert view["id"] != job and answer.headers["location"] == f"/v1/jobs/{view['id']}"
    spec = view["spec"]
    assert spec["reproduces"] == job and spec["register_model"] is False
    same = ("entrypoint", "args", "hyperparameters", "seed", "gpus", "gpu_flavor", "name")
    assert {k: spec[k] for k in same} == {k: original["spec"][k] for k in same}
    reread = await submission.job(view["id"])
    assert reread["spec"]["reproduces"] == job


async def test_deliberate_changes_are_applied_and_bad_ones_named(submission: Submission) -> None:
    job = await ended_job(submission)
    changed = await submission.client.post(
        f"/v1/jobs/{job}/reproduce",
        json={"seed": 8, "hyperparameters": {"lr": 0.02}},
        headers=submission.auth(),
    )
    assert changed.status_code == 201, changed.text
    spec = changed.json()["spec"]
    assert spec["seed"] == 8 and spec["hyperparameters"]["lr"] == 0.02
    assert spec["hyperparameters"]["batch_size"] == 64  # the original's, kept
    for body, field in (({"name": "x"}, "name"), ({"seed": -1}, "seed")):
        refused = await submission.client.post(
            f"/v1/jobs/{job}/reproduce", json=body, headers=submission.auth()
        )
        assert refused.status_code == 422, refused.text
        assert [e["field"] for e in refused.json()["errors"]] == [field]
    wrong_type = await submission.client.post(
        f"/v1/jobs/{job}/reproduce",
        content=b"seed=8",
        headers={**submission.auth(), "Content-Type": "text/plain"},
    )
    assert wrong_type.status_code == 415


async def test_another_teams_job_is_not_found(submission: Submission) -> None:
    job = await ended_job(submission)
    other = submission.auth(submission.other_team_token)
    answer = await submission.client.post(f"/v1/jobs/{job}/reproduce", headers=other)
    assert answer.status_code == 404, answer.text
    missing = await submission.client.post(
        "/v1/jobs/no-such-job/reproduce", headers=submission.auth()
    )
    assert missing.status_code == 404


async def test_a_retried_reproduction_is_the_job_its_key_made_whatever_admission_says(
    submission: Submission,
) -> None:
    """A retry under the same ``Idempotency-Key`` is answered with the reproduction its key
    made, even once a spent budget would lower (or refuse) a new one, or its flavor is
    retired; another reproduction under that key is refused naming the key."""
    job = await ended_job(submission)
    headers = {**submission.auth(), "Idempotency-Key": "repro-1"}
    url = f"/v1/jobs/{job}/reproduce"
    first = await submission.client.post(url, json={"seed": 8}, headers=headers)
    assert first.status_code == 201, first.text
    assert first.json()["spec"]["priority"] == "normal"
    for policy in ("deprioritize", "refuse"):
        await submission.pool.execute(
            """INSERT INTO budget_replica (team, project, month, amount, spent, currency,
                                          policy, exhausted, deleted, revision)
               VALUES ('ml', '', $1, '10', '11', 'USD', $2, true, false, 1)
               ON CONFLICT (team, project) DO UPDATE SET policy = EXCLUDED.policy""",
            current_month(),
            policy,
        )
        again = await submission.client.post(url, json={"seed": 8}, headers=headers)
        assert again.status_code == 200, again.text
        assert again.json()["id"] == first.json()["id"]
        assert again.json()["spec"]["priority"] == "normal"
    other = await submission.client.post(url, json={"seed": 9}, headers=headers)
    assert other.status_code == 409, other.text
    assert "Idempotency-Key" in other.json()["detail"]
    said_once(other.json())
    await submission.pool.execute(  # its flavor retired since: still the job its key made
        """INSERT INTO flavor_replica (name, description, revision, retired, changed_at)
           VALUES ('cpu', '', 1, true, now())"""
    )
    again = await submission.client.post(url, json={"seed": 8}, headers=headers)
    assert again.status_code == 200, again.text
    assert again.json()["id"] == first.json()["id"]

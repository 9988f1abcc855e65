"""A job whose priority class a spent budget lowered (policy ``deprioritize``) keeps, from
its admission, that it was lowered and from what class: its first history entry and its
``job.submitted`` say so (``governance.Lowered``), so the job view, ``trainyard describe``
and the dashboard show why it runs at ``low`` after the budget is raised or the month ends,
and the scheduler can tell it from a job whose user asked for ``low``."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from trainyard_platform.services.submission.commands import Prepared
from trainyard_platform.services.submission.governance import (
    DEPRIORITIZED_CLASS,
    Lowered,
    Screening,
    lowered_reason,
)
from trainyard_platform.services.submission.schemas import JobRequest
from trainyard_platform.shared.events.payloads import JobSpec, JobSubmitted

SPENT = "the budget of team ml is spent (12 of 10 USD spent in 2026-12)"


def budget(policy: str, project: str = "") -> dict[str, Any]:
    return {
        "project": project,
        "month": "2026-12",
        "amount": "10",
        "spent": "12",
        "currency": "USD",
        "policy": policy,
    }


def job(priority: str = "normal", project: str = "default") -> JobRequest:
    body = {"name": "j", "entrypoint": "train", "gpus": 1, "gpu_flavor": "cpu"}
    return JobRequest.model_validate({**body, "priority": priority, "project": project})


def test_a_budget_that_deprioritizes_says_from_what_class_it_lowered_the_job() -> None:
    admitted, warnings, lowered = Screening("ml", [], [budget("deprioritize")]).admit(job("high"))
    assert admitted.priority == DEPRIORITIZED_CLASS
    assert lowered == Lowered("high", SPENT)
    assert warnings == [f"{SPENT}; the job runs at priority low"]
    assert lowered_reason(lowered) == (
        f"submitted; priority lowered from high to low: {SPENT} (policy deprioritize)"
    )


def test_a_job_asked_low_for_or_not_lowered_is_submitted_as_ever() -> None:
    screening = Screening("ml", [], [budget("deprioritize")])
    assert screening.admit(job("low"))[2] is None  # its user asked for low
    assert Screening("ml", [], [budget("warn")]).admit(job())[2] is None
    assert Screening("ml", [], []).admit(job())[2] is None
    assert lowered_reason(None) == "submitted"


def test_the_first_budget_that_lowers_is_named_and_the_class_asked_for_kept() -> None:
    both = [budget("deprioritize"), budget("deprioritize", project="nlp")]
    _, warnings, lowered = Screening("ml", [], both).admit(job("high", project="nlp"))
    assert lowered == Lowered("high", SPENT)  # the team's, not "low" from the project's
    assert len(warnings) == 2


def test_its_job_submitted_carries_the_class_asked_for() -> None:
    fields = {"name": "j", "gpus": 1, "gpu_flavor": "cpu", "user": "u", "team": "ml"}
    spec = JobSpec(**fields, priority="low", seed=1, max_runtime_seconds=60)
    at = datetime(2026, 12, 3, tzinfo=UTC)
    lowered = Prepared("j1", spec, {}, at, Lowered("normal", SPENT))
    assert lowered.event.lowered_from == "normal"
    assert lowered.reason == lowered_reason(Lowered("normal", SPENT))
    plain = Prepared("j1", spec, {}, at)
    assert plain.event.lowered_from is None and plain.reason == "submitted"
    # Optional within v1: an event from before the field reads as not lowered.
    old = {"job_id": "j1", "spec": spec.model_dump(mode="json"), "submitted_at": at.isoformat()}
    assert JobSubmitted.model_validate(old).lowered_from is None

"""An API's refusal whose detail and field error say the same reason is said once, by every
command (``TrainyardError.__str__``, which every refusal is printed by): a field error
whose message the detail holds is left out, and one that holds the detail and says more
takes its place. Only ``cancel`` did so (its own code): ``model register`` said the
registry's reason twice, ``admin cohorts rm`` the scheduler's."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from trainyard import cli
from trainyard.cli_base import Exit
from trainyard.client import TrainyardError

from .conftest import routed_api

JOB = "aaaaaaaa-0000-4000-8000-000000000001"

GONE = (
    f"job {JOB!r}: its checkpoint step-10 is no longer stored; register another of its "
    "committed checkpoints"
)
"""The registry's 409 to a version of a checkpoint gone meanwhile (``model_api``'s
``Conflicting`` with no message of its own: its field error's message is the detail)."""

IN_USE = "cohort research is in use by queues ml-prod"
"""The scheduler's 409 to removing what is used (``admin._refuse_if_used``): its field
error is the detail and ``: nothing changed``."""


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    monkeypatch.delenv("TRAINYARD_CONTEXT", raising=False)
    monkeypatch.setenv("TRAINYARD_TOKEN", "ty_a")
    urls = {
        "TRAINYARD_URL": "http://api.test",
        "TRAINYARD_REGISTRY_URL": "http://registry.test",
        "TRAINYARD_SCHEDULER_URL": "http://scheduler.test",
    }
    return routed_api(tmp_path, monkeypatch, urls)


def test_model_register_says_the_registry_s_reason_once(
    state: dict[str, object], capsys: pytest.CaptureFixture[str]
) -> None:
    def route(request: httpx.Request) -> httpx.Response:
        if request.url.host == "api.test":  # which job JOB names
            return httpx.Response(200, json=[{"id": JOB, "name": "j"}])
        errors = [{"field": "job_id", "message": GONE}]
        return httpx.Response(409, json={"detail": GONE, "errors": errors})

    state["route"] = route
    assert cli.main(["model", "register", "ml/m", "--job", JOB]) == Exit.ERROR
    # Named by the API that refused, as every other command's refusal of another service.
    assert capsys.readouterr().err == f"trainyard: error: registry: 409 {GONE}\n"


def test_admin_cohorts_rm_says_the_scheduler_s_reason_once_with_what_it_adds(
    state: dict[str, object], capsys: pytest.CaptureFixture[str]
) -> None:
    errors = [{"field": "name", "message": f"{IN_USE}: nothing changed"}]
    state["route"] = lambda r: httpx.Response(409, json={"detail": IN_USE, "errors": errors})
    assert cli.main(["admin", "cohorts", "rm", "research"]) == Exit.ERROR
    assert capsys.readouterr().err == (
        f"trainyard: error: scheduler: 409 {IN_USE}: nothing changed\n"
    )


@pytest.mark.parametrize(
    ("errors", "said"),
    [
        ([{"field": "name", "message": "taken"}], "409 name taken"),
        ([{"field": "name", "message": "name taken"}], "409 name taken"),
        (
            [{"field": "name", "message": "name taken: nothing changed"}],
            "409 name taken: nothing changed",
        ),
        (
            [{"field": "name", "message": "name taken"}, {"field": "team", "message": "full"}],
            "409 name taken (team: full)",
        ),
        (
            [
                {"field": "a", "message": "name taken, twice"},
                {"field": "b", "message": "name taken!"},
            ],
            "409 name taken, twice (b: name taken!)",
        ),
    ],
    ids=["contained", "same", "holds-it", "another-kept", "replaced-once"],
)
def test_a_field_error_that_restates_the_detail_is_said_once(
    errors: list[dict[str, str]], said: str
) -> None:
    assert str(TrainyardError(409, "name taken", errors)) == said


def test_a_field_error_without_a_message_is_kept() -> None:
    """No message is no restatement, even of a detail that has a question mark in it."""
    assert str(TrainyardError(409, "is it taken?", [{"field": "name"}])) == (
        "409 is it taken? (name: ?)"
    )


@pytest.mark.parametrize(
    "argv",
    [["model", "ls"], ["model", "show", "ml/m"], ["model", "register", "ml/m", "--job", JOB]],
)
def test_a_refusal_no_command_caught_names_the_api_that_refused(
    argv: list[str], state: dict[str, object], capsys: pytest.CaptureFixture[str]
) -> None:
    """Each command named another service's refusal itself (``asked``); those that let one
    pass (the model commands) said it bare, as if the submission API had refused. Now the
    client of each service labels its refusals, and what no command caught says so too."""

    def route(request: httpx.Request) -> httpx.Response:
        if request.url.host == "api.test":
            return httpx.Response(200, json=[{"id": JOB, "name": "j"}])
        return httpx.Response(403, json={"detail": "not yours", "errors": []})

    state["route"] = route
    assert cli.main(argv) != Exit.OK
    assert capsys.readouterr().err == "trainyard: error: registry: 403 not yours\n"

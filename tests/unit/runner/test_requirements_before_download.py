"""A grant whose requirements the runner would refuse to install fails as ``user_error``
before anything is made or fetched for it: no sandbox, no code download, no checkpoint.

Before, the runner made the sandbox and downloaded the job's code (a bundle of up to 100 MiB,
or a git clone), then refused the requirement while building the environment."""

from __future__ import annotations

from typing import Any, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainyard_platform.services.runner import launch
from trainyard_platform.services.runner.config import Settings
from trainyard_platform.services.runner.sandbox import JobUser, failure_kind
from trainyard_platform.shared.requirements import REQUIREMENT, requirement_problem
from trainyard_platform.shared.storage import ObjectStore

from .test_launch import GRANT


class Untouchable:
    """Any use of it fails the test: nothing may be fetched or made."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"used before the requirements were checked: .{name}")


@pytest.mark.parametrize(
    ("requirements", "said"),
    [
        (["tabulate==0.9.0", "-e ."], "spec.requirements[1]: requirement '-e .': must be a "),
        (["./dist/x.whl"], "spec.requirements[0]: requirement './dist/x.whl': must be a PEP 508"),
        (["pkg @ file:///etc/x.whl"], "spec.requirements[0]: requirement 'pkg @ file:///etc/"),
        (["pkg @ https://h/pkg.tar.gz"], "spec.requirements[0]: requirement 'pkg @ https://h/"),
    ],
)
def test_a_refused_requirement_fails_the_job_before_anything_is_fetched(
    requirements: list[str], said: str
) -> None:
    spec = GRANT.spec.model_copy(update={"requirements": requirements})
    grant = GRANT.model_copy(update={"spec": spec})
    nothing: Any = Untouchable()
    with pytest.raises(launch.RequirementsUnmet) as refused:
        launch.fetch(
            grant,
            cast(Settings, nothing),
            cast(ObjectStore, nothing),
            cast(JobUser, nothing),
            cgroups=nothing,
        )
    assert str(refused.value).startswith(said)
    assert "refused before the job's code was downloaded" in str(refused.value)
    assert failure_kind(refused.value) == "user_error"


def test_acceptable_requirements_pass_the_check() -> None:
    launch.check_requirements(["tabulate==0.9.0", "torch>=2.3; python_version>='3.11'"])
    launch.check_requirements([])


@settings(max_examples=400, derandomize=True, database=None, deadline=None)
@given(st.from_regex(REQUIREMENT, fullmatch=True) | st.text(max_size=40))
def test_the_api_refuses_at_submission_whatever_the_runner_would(requirement: str) -> None:
    # The submission API refuses a requirement by ``requirement_problem``: one it accepts
    # must never fail the job at the runner's check, so that a bad requirement is always
    # said at submission, when the grant came through the API.
    if requirement_problem(requirement) is None:
        launch.check_requirements([requirement])

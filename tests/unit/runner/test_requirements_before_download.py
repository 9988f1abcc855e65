"""A grant whose requirements the runner would refuse to install fails as ``user_error``
before anything is made or fetched for it: no sandbox, no code download, no checkpoint.

Before, the runner made the sandbox and downloaded the job's code (a bundle of up to 100 MiB,
or a git clone), then refused the requirement while building the environment."""

from __future__ import annotations

import socket
from typing import Any, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import SecretStr

from trainyard_platform.services.runner import launch
from trainyard_platform.services.runner.config import Settings
from trainyard_platform.services.runner.git_remote import PUBLIC_ONLY, PrivateAllowed, Resolver
from trainyard_platform.services.runner.sandbox import (
    JobUser,
    PlatformError,
    failure_kind,
)
from trainyard_platform.shared.requirements import (
    REQUIREMENT,
    requirement_problem,
    wheel_address_problem,
)
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
            Settings(admin_token=SecretStr("t")),
            cast(ObjectStore, nothing),
            cast(JobUser, nothing),
            cgroups=nothing,
        )
    assert str(refused.value).startswith(said)
    assert "refused before the job's code was downloaded" in str(refused.value)
    assert failure_kind(refused.value) == "user_error"


def test_acceptable_requirements_pass_the_check() -> None:
    launch.check_requirements(
        ["tabulate==0.9.0", "torch>=2.3; python_version>='3.11'"], PUBLIC_ONLY, _unasked
    )
    launch.check_requirements([], PUBLIC_ONLY, _unasked)


def _unasked(host: str, port: int) -> list[str]:
    raise AssertionError(f"{host} was looked up")


def answers(*addresses: str) -> Resolver:
    return lambda host, port: list(addresses)


# The runner fetches a wheel URL in the host's network: a tenant could make the node ask
# its own services (the cloud's metadata, the object store, anything on loopback), and the
# installer's error text came back in the job's failure reason.
@pytest.mark.parametrize(
    ("requirement", "resolver", "said"),
    [
        (
            "x @ https://169.254.169.254/x-1.0-py3-none-any.whl",
            _unasked,
            "names the address 169.254.169.254, a link-local address;",
        ),
        (
            "x @ https://10.0.0.5:9000/x-1.0-py3-none-any.whl",
            _unasked,
            "names the address 10.0.0.5, a private address;",
        ),
        (
            "x @ https://127.1/x-1.0-py3-none-any.whl",
            _unasked,
            "names the host 127.1, which is 127.0.0.1, a loopback address;",
        ),
        (
            "x @ https://[::ffff:127.0.0.1]/x-1.0-py3-none-any.whl",
            _unasked,
            "names the host ::ffff:127.0.0.1, which is ::ffff:7f00:1, a loopback address (as 127.0.0.1);",
        ),
        (
            "x @ https://wheels.corp.example/x-1.0-py3-none-any.whl ; python_version>'3'",
            answers("10.1.2.3"),
            "names the host wheels.corp.example, which resolves to a private address;",
        ),
        (
            "x @ https://localhost:8222/x-1.0-py3-none-any.whl",
            answers("140.82.112.3", "::1"),
            "names the host localhost, which resolves to a loopback address;",
        ),
    ],
)
def test_a_wheel_url_on_an_address_that_is_not_public_fails_the_job(
    requirement: str, resolver: Resolver, said: str
) -> None:
    with pytest.raises(launch.RequirementsUnmet) as refused:
        launch.check_requirements(["tabulate==0.9.0", requirement], PUBLIC_ONLY, resolver)
    reason = str(refused.value)
    assert reason.startswith(f"spec.requirements[1]: requirement {requirement!r}: a URL "), reason
    assert said in reason, reason
    assert reason.endswith(
        " this node fetches wheels only from public addresses unless its operator allows the "
        "network (TRAINYARD_RUNNER_FETCH_ALLOW_PRIVATE) (refused before the job's code was "
        "downloaded)"
    ), reason
    assert failure_kind(refused.value) == "user_error"


def test_a_wheel_url_on_a_public_address_or_one_the_operator_allows_passes() -> None:
    public = "x @ https://files.example/x-1.0-py3-none-any.whl"
    launch.check_requirements([public], PUBLIC_ONLY, answers("140.82.112.3", "2606:4700::1"))
    allowed = PrivateAllowed.parse(["10.0.0.0/8", "wheels.corp.example"])
    launch.check_requirements(
        [
            "x @ https://10.0.0.5:9000/x-1.0-py3-none-any.whl",
            "y @ https://files.example/y-1.0-py3-none-any.whl",
            "z @ https://wheels.corp.example/z-1.0-py3-none-any.whl",
        ],
        allowed,
        lambda host, port: {"files.example": ["10.9.9.9"], "wheels.corp.example": ["::1"]}[host],
    )


@pytest.mark.parametrize(
    ("requirement", "said"),
    [
        ("x @ https://h.example:0/x-1.0-py3-none-any.whl", "port 0"),
        ("x @ https://h.\u212aey.example/x-1.0-py3-none-any.whl", "beyond ASCII"),
        ("x @ https://h.example:99999/x-1.0-py3-none-any.whl", "installers read as such"),
    ],
)
def test_a_wheel_url_the_judgement_would_read_otherwise_is_refused(
    requirement: str, said: str
) -> None:
    with pytest.raises(launch.RequirementsUnmet, match=said) as refused:
        launch.check_requirements([requirement], PUBLIC_ONLY, _unasked)
    assert str(refused.value).startswith("spec.requirements[0]: ")


def test_a_wheel_host_that_does_not_resolve_is_the_platforms() -> None:
    def unresolved(host: str, port: int) -> list[str]:
        raise launch.HostUnresolved("Name or service not known")

    with pytest.raises(PlatformError) as failed:
        launch.check_requirements(
            ["x @ https://nowhere.example/x-1.0-py3-none-any.whl"], PUBLIC_ONLY, unresolved
        )
    assert str(failed.value).startswith("spec.requirements[0]: resolving the host of ")
    assert failure_kind(failed.value) == "platform_error"


def test_a_wheel_host_that_does_not_exist_is_the_jobs_input() -> None:
    """Before: the platform's, retried: a mistyped wheel host burnt the platform's retries."""

    def no_such_name(host: str, port: int) -> list[str]:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    with pytest.raises(launch.RequirementsUnmet) as refused:
        launch.check_requirements(
            ["x @ https://nowhere.example/x-1.0-py3-none-any.whl"], PUBLIC_ONLY, no_such_name
        )
    assert str(refused.value) == (
        "spec.requirements[0]: requirement 'x @ https://nowhere.example/x-1.0-py3-none-any.whl': "
        "the host nowhere.example does not exist in DNS (no such name, or no address for it): "
        "check its spelling (refused before the job's code was downloaded)"
    )
    assert failure_kind(refused.value) == "user_error"


def test_a_wheel_host_the_resolver_fails_to_look_up_is_the_platforms() -> None:
    def again(host: str, port: int) -> list[str]:
        raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")

    with pytest.raises(PlatformError) as failed:
        launch.check_requirements(
            ["x @ https://nowhere.example/x-1.0-py3-none-any.whl"], PUBLIC_ONLY, again
        )
    assert failure_kind(failed.value) == "platform_error"
    assert str(failed.value).startswith("spec.requirements[0]: resolving the host of ")
    assert "could not be looked up from this node just now" in str(failed.value)


@settings(max_examples=400, derandomize=True, database=None, deadline=None)
@given(st.from_regex(REQUIREMENT, fullmatch=True) | st.text(max_size=40))
def test_the_api_refuses_at_submission_whatever_the_runner_would(requirement: str) -> None:
    # The submission API refuses a requirement by ``requirement_problem``: one it accepts
    # must never fail the job at the runner's check, so that a bad requirement is always
    # said at submission, when the grant came through the API.
    # A host name is the runner's to judge (what it resolves to is its network's answer):
    # here every name resolves to a public address.
    if requirement_problem(requirement) is None and wheel_address_problem(requirement) is None:
        launch.check_requirements([requirement], PUBLIC_ONLY, answers("140.82.112.3"))

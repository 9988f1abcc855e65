"""A requirement that names something on the node (a ``file:`` URL, however spelled, a
local path, an installer option) is refused by the runner too, as the job's own error
naming the requirement, not only by the submission API: a grant reaches the runner from an
old job, a reproduction, or a producer other than the API.

Before: the runner's check only asked that a URL end in ``.whl``, so ``pkg @
file:///x.whl``, ``git+file:``, ``file:`` without ``@``, ``dist/x.whl`` and ``x.whl`` (which
the installers take for a path in their working folder), and ``pkg --index-url ...`` went
to the installer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import pytest

from tests.unit.runner.test_launch import GRANT
from trainyard_platform.services.runner import launch
from trainyard_platform.services.runner.environments import EnvironmentCache, normalize_requirement
from trainyard_platform.services.runner.sandbox import PlatformError, failure_kind
from trainyard_platform.services.submission.config import DEFAULT_FLAVORS
from trainyard_platform.services.submission.schemas import parse_job_request
from trainyard_platform.shared.http_errors import RequestInvalid
from trainyard_platform.shared.requirements import requirement_problem

WHEEL = "pkg-1.0-py3-none-any.whl"
LOCAL = [
    f"pkg @ file:///srv/{WHEEL}",
    f"pkg @ FILE:///srv/{WHEEL}",
    f"pkg@file:{WHEEL}",
    f"pkg @ File://localhost/srv/{WHEEL}",
    f"file:///srv/{WHEEL}",
    f"FILE:{WHEEL}",
    f"pkg @ git+file:///srv/repo/{WHEEL}",
    f"git+file:///srv/repo/{WHEEL}",
    f"./{WHEEL}",
    f"/srv/{WHEEL}",
    f"~/{WHEEL}",
    f"dist/{WHEEL}",
    f"dist\\{WHEEL}",
    WHEEL,
    "pkg-1.0.tar.gz",
    "pkg-1.0.zip",
    ".",
    "--find-links /srv/wheels",
    "--find-links=/srv/wheels",
    "-f /srv/wheels",
    "--index-url http://evil/simple",
    "--extra-index-url http://evil/simple",
    "-e .",
    "-r requirements.txt",
    "-c constraints.txt",
    "torch --index-url http://evil/simple",
    "torch -f /srv/wheels",
]


@pytest.mark.parametrize("requirement", LOCAL)
def test_the_runner_refuses_a_local_requirement_as_the_jobs_error(
    tmp_path: Path, requirement: str
) -> None:
    # A base interpreter that does not exist: had the requirement gone on to a build, the
    # job would fail as the node's (platform_error), not as its own.
    cache = EnvironmentCache(tmp_path / "envs", str(tmp_path / "no-python"))
    grant = GRANT.model_copy(
        update={"spec": GRANT.spec.model_copy(update={"requirements": ["numpy", requirement]})}
    )
    with pytest.raises(PlatformError) as raised:
        launch.prepare(grant, cast(Any, None), cast(Any, None), cast(Any, None), cache, {})
    assert failure_kind(raised.value) == "user_error"
    reason = str(raised.value)
    assert reason.startswith("spec.requirements: ")
    assert repr(requirement) in reason, reason
    assert not (tmp_path / "envs").exists(), "nothing is built for a refused requirement"


@pytest.mark.parametrize("requirement", LOCAL)
def test_submission_and_the_runner_refuse_the_same(requirement: str) -> None:
    problem = requirement_problem(requirement)
    assert problem
    body = {"name": "n", "entrypoint": "train", "gpus": 1, "gpu_flavor": "h200"}
    body["requirements"] = ["numpy", requirement]
    with pytest.raises(RequestInvalid) as raised:
        parse_job_request(json.dumps(body).encode(), DEFAULT_FLAVORS)
    assert {e.field: e.message for e in raised.value.errors} == {"requirements[1]": problem}


@pytest.mark.parametrize(
    "requirement",
    [
        "torch",
        "numpy>=1.26,<3",
        "transformers[torch,sentencepiece]~=4.44",
        "discord.py",
        'tomli>=2; python_version < "3.11"',
        f"pkg @ https://example.org/{WHEEL}#sha256=abc",
        f"pkg @ https://example.org/files/file:{WHEEL}",
    ],
)
def test_packages_and_wheel_urls_are_still_accepted(requirement: str) -> None:
    assert requirement_problem(requirement) is None


def test_the_runners_reason_never_quotes_a_wheel_urls_credentials(tmp_path: Path) -> None:
    cache = EnvironmentCache(tmp_path / "envs", str(tmp_path / "no-python"))
    secret = f"pkg @ https://alice:s3cret@pypi.example.com/{WHEEL}"
    grant = GRANT.model_copy(
        update={"spec": GRANT.spec.model_copy(update={"requirements": [secret]})}
    )
    with pytest.raises(PlatformError) as raised:
        launch.prepare(grant, cast(Any, None), cast(Any, None), cast(Any, None), cache, {})
    assert failure_kind(raised.value) == "user_error"
    reason = str(raised.value)
    assert "s3cret" not in reason and "alice" not in reason
    assert f"'pkg @ https://***@pypi.example.com/{WHEEL}'" in reason
    assert "must not carry credentials" in reason


def test_a_marker_after_a_wheel_url_without_a_space_is_part_of_the_url() -> None:
    """PEP 508 (and the installers) end a URL at " ;" only: ``x.whl;marker`` is one URL, not
    a wheel's, and the runner refuses it (by the check it shares with the API); with the
    space, the marker is kept apart."""
    with pytest.raises(ValueError, match="a URL must name a wheel"):
        normalize_requirement(f"pkg @ https://example.org/{WHEEL};extra=='gpu'")
    assert (
        normalize_requirement(f"pkg @ https://example.org/{WHEEL} ; extra=='gpu'")
        == f"pkg @ https://example.org/{WHEEL} ; extra=='gpu'"
    )


def test_the_api_reads_a_wheel_url_before_a_marker_as_the_runner_does() -> None:
    # The API's check (``requirement_problem``) once stopped the URL at any ";", so it took
    # ``x.whl;extra=='gpu'`` for a wheel and a marker, a job the runner then refused.
    assert requirement_problem(f"pkg @ https://example.org/{WHEEL};extra=='gpu'") is not None
    assert requirement_problem(f"pkg @ https://example.org/{WHEEL} ; extra=='gpu'") is None

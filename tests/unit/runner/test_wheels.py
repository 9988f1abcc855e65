"""What the runner makes of a job's wheel URL before and after asking its server: the file
name it saves it as, the address it may connect to, and whose fault each answer is."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest

from trainyard_platform.services.runner.environments import RequirementsError
from trainyard_platform.services.runner.git_remote import PUBLIC_ONLY, HostUnresolved
from trainyard_platform.services.runner.launch import requirements_field
from trainyard_platform.services.runner.wheels import (
    WheelRefused,
    WheelUnreachable,
    fetch_wheel,
    judge_status,
    wheel_file_name,
)


@pytest.mark.parametrize(
    ("url", "name"),
    [
        ("https://h/a/pkg-1.0-py3-none-any.whl", "pkg-1.0-py3-none-any.whl"),
        ("https://h/torch-2.1.0%2Bcpu-cp311-cp311-linux_x86_64.whl?x=1#sha256=ab",
         "torch-2.1.0+cpu-cp311-cp311-linux_x86_64.whl"),
        ("https://h/My_Pkg-2.0-1-py2.py3-none-any.whl", "My_Pkg-2.0-1-py2.py3-none-any.whl"),
    ],
)  # fmt: skip
def test_a_wheels_file_name_is_the_urls_last_segment(url: str, name: str) -> None:
    assert wheel_file_name(url) == name


@pytest.mark.parametrize(
    "url",
    [
        "https://h/x.whl",  # no version or tags
        "https://h/pkg-1.0.whl",
        "https://h/pkg-1.0-py3-none-any.whl/",  # the last segment is empty
        "https://h/a%2F..%2F..%2Fpkg-1.0-py3-none-any.whl",  # a path once decoded
        "https://h/..%2Fpkg-1.0-py3-none-any.whl",
        "https://h/.pkg-1.0-py3-none-any.whl",
        "https://h/pkg%20x-1.0-py3-none-any.whl",
        "https://h/pkg-not!a!version-py3-none-any.whl",
    ],
)
def test_a_name_that_is_no_wheels_is_refused(url: str) -> None:
    with pytest.raises(WheelRefused):
        wheel_file_name(url)


def test_an_address_that_is_not_public_is_refused_before_any_connection(tmp_path: Path) -> None:
    def metadata(host: str, port: int) -> list[str]:
        return ["169.254.169.254"]

    with pytest.raises(WheelRefused, match="link-local address; this node fetches wheels"):
        fetch_wheel(
            "https://wheels.example/x-1.0-py3-none-any.whl", tmp_path, PUBLIC_ONLY,
            resolver=metadata, timeout=0.001,
        )  # fmt: skip
    assert list(tmp_path.iterdir()) == []


def test_a_host_that_does_not_resolve_is_the_platforms(tmp_path: Path) -> None:
    def failing(host: str, port: int) -> list[str]:
        raise HostUnresolved("Temporary failure in name resolution")

    with pytest.raises(WheelUnreachable, match=r"resolving wheels\.example"):
        fetch_wheel(
            "https://wheels.example/x-1.0-py3-none-any.whl", tmp_path, PUBLIC_ONLY,
            resolver=failing,
        )  # fmt: skip


@pytest.mark.parametrize(
    ("code", "verdict"),
    [("EAI_NONAME", WheelRefused), ("EAI_NODATA", WheelRefused), ("EAI_AGAIN", WheelUnreachable)],
)
def test_a_host_that_does_not_exist_is_the_jobs_a_failing_resolver_the_platforms(
    tmp_path: Path, code: str, verdict: type[Exception]
) -> None:
    # As a repository's host is blamed (``git_remote.lookup``): the answer "no such name"
    # is the same on every node, a resolver failing is this node's.
    if not hasattr(socket, code):
        pytest.skip(f"this platform's resolver has no {code}")

    def resolver(host: str, port: int) -> list[str]:
        raise socket.gaierror(getattr(socket, code), "no answer")

    with pytest.raises(verdict, match=r"resolving wheels\.example"):
        fetch_wheel(
            "https://wheels.example/x-1.0-py3-none-any.whl", tmp_path, PUBLIC_ONLY,
            resolver=resolver,
        )  # fmt: skip
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "url",
    [
        "https://127.0.0.1./x-1.0-py3-none-any.whl",
        "https://wh%65els.example/x-1.0-py3-none-any.whl",
        "https://a@b@wheels.example/x-1.0-py3-none-any.whl",
        "https://wheels.example:0/x-1.0-py3-none-any.whl",
    ],
)
def test_a_url_the_api_would_refuse_is_refused_before_any_lookup(tmp_path: Path, url: str) -> None:
    # One reader of a URL's host (``shared.url_hosts``) for the API, the judgement and the
    # download, so no form passes one and is read otherwise by another.
    def resolver(host: str, port: int) -> list[str]:
        raise AssertionError(f"looked up {host}")

    with pytest.raises(WheelRefused, match="a URL "):
        fetch_wheel(url, tmp_path, PUBLIC_ONLY, resolver=resolver)


@dataclass
class Answered:
    status: int
    reason: str = "Reason"
    headers: dict[str, str] = field(default_factory=dict)

    def getheader(self, name: str) -> str | None:
        return self.headers.get(name)


@pytest.mark.parametrize(
    ("status", "verdict"),
    [
        (200, None),
        (301, WheelRefused), (302, WheelRefused), (307, WheelRefused), (308, WheelRefused),
        (304, WheelRefused),
        (401, WheelRefused), (403, WheelRefused), (404, WheelRefused), (410, WheelRefused),
        (408, WheelUnreachable), (429, WheelUnreachable),
        (500, WheelUnreachable), (502, WheelUnreachable), (503, WheelUnreachable),
        (204, WheelUnreachable),
    ],
)  # fmt: skip
def test_whose_fault_each_answer_is(status: int, verdict: type[Exception] | None) -> None:
    answer = cast(Any, Answered(status, headers={"Location": "http://169.254.169.254/"}))
    if verdict is None:
        judge_status(answer)
        return
    with pytest.raises(verdict) as caught:
        judge_status(answer)
    if 300 <= status < 400:
        assert "redirects are not followed" in str(caught.value)
        assert "169.254.169.254" in str(caught.value)


def test_a_failed_download_names_its_requirements_field() -> None:
    requirements = ["tabulate", "X @ https://h/x-1.0-py3-none-any.whl"]
    named = RequirementsError("...", "x @ https://h/x-1.0-py3-none-any.whl")
    assert requirements_field(requirements, named) == "spec.requirements[1]"
    assert requirements_field(requirements, RequirementsError("...")) == "spec.requirements"
    assert requirements_field(requirements, ValueError("...")) == "spec.requirements"

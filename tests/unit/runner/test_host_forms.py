"""Every form of host a tenant writes in a repository or wheel URL is read once, the same
way by the submission API and the runner (``shared.url_hosts``), as git, curl and the
installers connect to it; a form programs read differently is refused by both, saying why.

Before: ``https://127.0.0.1./x`` passed the API (no address to it) and failed on the runner
as a host that did not resolve, the platform's failure, retried: a tenant could make the
platform burn its retries. The API and the runner each took a URL apart with code of their
own."""

from __future__ import annotations

import re

import pytest
from pydantic import ValidationError

from trainyard_platform.services.runner import launch
from trainyard_platform.services.runner.git_remote import (
    PUBLIC_ONLY,
    RemoteRefused,
    Resolver,
    fetch_plan,
    parse_remote,
)
from trainyard_platform.services.runner.sandbox import failure_kind
from trainyard_platform.services.submission.schemas import GitCode
from trainyard_platform.shared.requirements import requirement_problem, wheel_address_problem
from trainyard_platform.shared.url_hosts import GIT_SCHEMES, WHEEL_SCHEMES, read_url

COMMIT = "0" * 40
AMBIGUOUS = "which ends in a number: some programs read it as an IPv4 address"

# host as written -> what it is read as: an address, "name", or ("refused", words said).
HOST_FORMS: dict[str, str | tuple[str, str]] = {
    "example.com": "name",
    "Example.COM": "name",  # read in lower case: DNS is not case-sensitive
    "example.com.": "name",  # the same name, written absolute
    "xn--bcher-kva.example": "name",  # an internationalized name in its ASCII form
    "8.8.8.8": "8.8.8.8",
    "0x8.0x8.0x8.0x8": "8.8.8.8",  # hex parts: inet_aton, curl and WHATWG agree
    "0x08080808": "8.8.8.8",
    "134744072": "8.8.8.8",  # one number
    "010.8.8.8": "8.8.8.8",  # octal
    "8.526344": "8.8.8.8",  # short form
    "8.8.8.8.": ("refused", AMBIGUOUS),  # an address to WHATWG, a name to the resolver
    "127.0.0.1.": ("refused", AMBIGUOUS),
    "0x7f.1.": ("refused", AMBIGUOUS),
    "08.8.8.8": ("refused", AMBIGUOUS),  # no octal: an error to WHATWG, a name to curl
    "1.2.3.4.5": ("refused", AMBIGUOUS),
    "example.123": ("refused", AMBIGUOUS),
    "example.0x": ("refused", AMBIGUOUS),
    "b\u00fccher.example": ("refused", "an internationalized host name is written in its xn--"),
    "\u212aey.example": ("refused", "a character beyond ASCII"),  # urlsplit lowers it to k
    "%38.8.8.8": ("refused", "a percent-escape in its host"),  # curl decodes, the resolver not
    "ex%41mple.com": ("refused", "a percent-escape in its host"),
    "a" * 64 + ".example": ("refused", "labels of at most 63 characters"),
    "h_x.example": ("refused", "names no host this node fetches from"),
    "example.com\\@8.8.8.8": ("refused", "a backslash before its path"),  # WHATWG: '/'
    "a@b@8.8.8.8": ("refused", "more than one '@'"),  # curl takes the first, urlsplit the last
}
IPV6_FORMS: dict[str, str | tuple[str, str]] = {
    "[2606:4700::1111]": "2606:4700::1111",
    "[2606:4700:0:0:0:0:0:1111]": "2606:4700::1111",
    "[2606:4700::1111%25eth0]": ("refused", "an IPv6 address with a zone"),
    "[fe80::1%eth0]": ("refused", "an IPv6 address with a zone"),
    "[v1.x]": ("refused", "which is no IPv6 address"),
}


def answers(*addresses: str) -> Resolver:
    return lambda host, port: list(addresses)


def _api_repository(repository: str) -> str | None:
    """The submission API's refusal of ``repository``, None when it takes it."""
    try:
        GitCode.model_validate({"kind": "git", "repository": repository, "commit": COMMIT})
    except ValidationError as exc:
        return str(exc.errors()[0]["msg"])
    return None


def _api_wheel(requirement: str) -> str | None:
    return requirement_problem(requirement) or wheel_address_problem(requirement)


def _runner_wheel(requirement: str) -> str | None:
    try:
        launch.check_requirements([requirement], PUBLIC_ONLY, answers("140.82.112.3"))
    except launch.RequirementsUnmet as exc:
        assert failure_kind(exc) == "user_error"
        return str(exc)
    return None


@pytest.mark.parametrize(("host", "read_as"), {**HOST_FORMS, **IPV6_FORMS}.items())
def test_every_form_of_host_is_read_once_the_same_way(
    host: str, read_as: str | tuple[str, str]
) -> None:
    git = f"git://{host}/x.git"
    https = f"https://{host}/x.git"
    wheel = f"x @ https://{host}/x-1.0-py3-none-any.whl"
    if isinstance(read_as, tuple):
        said = read_as[1]
        for url, schemes in ((https, GIT_SCHEMES), (git, GIT_SCHEMES), (wheel[4:], WHEEL_SCHEMES)):
            with pytest.raises(ValueError, match=re.escape(said)):
                read_url(url, schemes, "unreadable")
        for repository in (https, git):
            with pytest.raises(RemoteRefused, match=re.escape(said)):
                fetch_plan(repository, PUBLIC_ONLY, answers("140.82.112.3"))
        runner_wheel, api_wheel = _runner_wheel(wheel), _api_wheel(wheel)
        assert runner_wheel is not None and api_wheel is not None
        if requirement_problem(wheel) is None:  # else refused by a requirement's own rules
            assert said in runner_wheel, runner_wheel
            assert said in api_wheel, api_wheel
        assert _api_repository(https) is not None  # by its own pattern, or saying the same
        return
    # Taken by both: read as the same address, and git connects to that one.
    read = read_url(https, GIT_SCHEMES, "unreadable")
    assert str(read.address) == read_as if read_as != "name" else read.address is None
    assert parse_remote(https).host == read.host == host.strip("[]").lower()
    plan = fetch_plan(git, PUBLIC_ONLY, answers("140.82.112.3"))
    pinned = "140.82.112.3" if read_as == "name" else read_as
    shown = f"[{pinned}]" if ":" in pinned else pinned
    assert plan.url == f"git://{shown}:9418/x.git"
    assert _runner_wheel(wheel) is None
    assert _api_wheel(wheel) is None
    if host in HOST_FORMS:  # the API takes no IPv6 repository at all (its own rule)
        assert _api_repository(https) is None
        assert _api_repository(git) is None


@pytest.mark.parametrize("host", ["127.1", "0x7f.1", "2130706433", "0177.0.0.1", "127.0.0.1"])
def test_a_loopback_address_in_any_form_is_refused_by_both_naming_where_it_leads(
    host: str,
) -> None:
    for repository in (f"https://{host}/x.git", f"git://{host}/x.git"):
        refused = _api_repository(repository)
        assert refused is not None, repository
        assert "127.0.0.1" in refused and "a loopback address" in refused, refused
        with pytest.raises(RemoteRefused, match=r"127\.0\.0\.1, a loopback address"):
            fetch_plan(repository, PUBLIC_ONLY, answers("140.82.112.3"))
    wheel = f"x @ https://{host}/x-1.0-py3-none-any.whl"
    api_wheel, runner_wheel = _api_wheel(wheel), _runner_wheel(wheel)
    assert api_wheel is not None and "loopback" in api_wheel
    assert runner_wheel is not None and "loopback" in runner_wheel


def test_the_trailing_dot_address_is_the_jobs_input_at_the_api_naming_the_reason() -> None:
    """The case seen: taken by the API, then retried as the platform's on the runner."""
    refused = _api_repository("https://127.0.0.1./repo")
    assert refused is not None
    assert "names the host '127.0.0.1.', which ends in a number" in refused
    assert "write an address as four decimal numbers (192.0.2.1) without a final dot" in refused


@pytest.mark.parametrize(
    ("repository", "said"),
    [
        ("git://example.com/x@[.evil.example]:4222/y.git", "holds '@[' after its host"),
        ("git://example.com/@[::1]/y.git", "holds '@[' after its host"),
        ("git://example.com?.evil.example/y.git", "has no '/' after its host"),
        ("git://example.com#.evil.example/y.git", "has no '/' after its host"),
        ("git://example.com", "has no '/' after its host"),  # git: "no path specified"
        # git refuses it ("url contains a newline"): it failed on every node as the
        # platform's, retried.
        ("https://example.com/x.git%0a", "holds '%0a', an escaped newline"),
        ("https://example.com/x.git?%0A", "holds '%0a', an escaped newline"),
    ],
)
def test_a_repository_git_reads_otherwise_or_refuses_is_refused_by_both(
    repository: str, said: str
) -> None:
    """git takes a git:// URL's host apart itself: up to the first '/', and from an '@['
    wherever it stands; it refuses an escaped newline. The runner hands git the URL with the address judged for its host,
    and git read ``140.82.112.3:9418/x@.evil.example``, port 4222, from the first: a name the
    tenant's DNS answers, at the port of NATS. The API took it."""
    refused = _api_repository(repository)
    assert refused is not None
    if "://example.com/" in repository:  # no '/' after the host: by the API's pattern
        assert said in refused, refused
    with pytest.raises(RemoteRefused, match=re.escape(said)):
        fetch_plan(repository, PUBLIC_ONLY, answers("140.82.112.3"))


def test_an_https_url_holding_what_git_reads_in_git_urls_is_read_as_curl_reads_it() -> None:
    """curl reads an https URL's host as ``urlsplit`` does: '@[' in its path is nothing."""
    repository = "https://example.com/x@[.evil.example]:4222/y.git"
    assert _api_repository(repository) is None
    plan = fetch_plan(repository, PUBLIC_ONLY, answers("140.82.112.3"))
    assert plan.url == repository
    assert "http.curloptResolve=example.com:443:140.82.112.3" in plan.options

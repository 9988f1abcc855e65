"""Where a job's git repository may be fetched from: judged before git runs, git pinned to
what was judged (``services.runner.git_remote``).

Before: the runner handed any repository to git, in the host's network, so a tenant's URL
made the node ask its own services (``169.254.169.254``, NATS on ``127.0.0.1:4222``, the
object store, a name resolving to ``10.x``), and git's error text carried their answer back
in the job's failure reason."""

from __future__ import annotations

import ipaddress
import socket
import subprocess

import pytest
from pydantic import SecretStr, ValidationError

from trainyard_platform.services.runner import git_remote
from trainyard_platform.services.runner.config import Settings
from trainyard_platform.services.runner.git_remote import (
    HostNotFound,
    HostUnresolved,
    PrivateAllowed,
    RemoteRefused,
    Resolver,
    allow_entry,
    fetch_plan,
    git_version,
    installed_git,
    unpinned_git,
)
from trainyard_platform.shared.public_addresses import address_problem
from trainyard_platform.shared.settings import invalid_settings

NOT_PUBLIC = {
    "127.0.0.1": "a loopback address",
    "127.255.0.9": "a loopback address",
    "10.0.0.5": "a private address",
    "172.16.3.4": "a private address",
    "192.168.1.1": "a private address",
    "169.254.169.254": "a link-local address",
    "100.64.0.1": "a shared (CGNAT) address",
    "0.0.0.0": "the unspecified address",
    "0.1.2.3": "a reserved address, not globally routable",
    "224.0.0.251": "a multicast address",
    "240.0.0.1": "a reserved address, not globally routable",
    "255.255.255.255": "a reserved address, not globally routable",
    "192.0.2.1": "a reserved address, not globally routable",
    "198.18.0.1": "a reserved address, not globally routable",
    "::1": "a loopback address",
    "::": "the unspecified address",
    "fe80::1": "a link-local address",
    "fd12:3456::1": "a unique-local address",
    "fc00::1": "a unique-local address",
    "fec0::1": "a site-local address",
    "::ffff:0:10.0.0.5": "a reserved address, not globally routable",
    "ff02::1": "a multicast address",
    "ff0e::1": "a multicast address",
    "2001:db8::1": "a reserved address, not globally routable",
    "::a00:5": "a reserved address, not globally routable",
    "::ffff:10.0.0.5": "a private address (as 10.0.0.5)",
    "::ffff:127.0.0.1": "a loopback address (as 127.0.0.1)",
    "::ffff:169.254.169.254": "a link-local address (as 169.254.169.254)",
    "64:ff9b::a9fe:a9fe": "a link-local address (as 169.254.169.254)",
    "2002:7f00:1::1": "a loopback address (as 127.0.0.1)",
    "2002:a00:5::1": "a private address (as 10.0.0.5)",
}
PUBLIC = ["8.8.8.8", "140.82.112.3", "2606:4700::1111", "::ffff:8.8.8.8", "64:ff9b::808:808"]


@pytest.mark.parametrize(("address", "problem"), NOT_PUBLIC.items())
def test_every_address_that_is_not_public_is_named_for_what_it_is(
    address: str, problem: str
) -> None:
    assert address_problem(ipaddress.ip_address(address)) == problem


@pytest.mark.parametrize("address", PUBLIC)
def test_a_public_address_has_no_problem(address: str) -> None:
    assert address_problem(ipaddress.ip_address(address)) is None


def answers(*addresses: str) -> Resolver:
    return lambda host, port: list(addresses)


NONE = PrivateAllowed()


@pytest.mark.parametrize(
    "repository",
    [
        "https://127.0.0.1:9000/x.git",
        "https://169.254.169.254/latest/meta-data",
        "git://127.0.0.1:4222/",
        "git://10.1.2.3/x.git",
        "https://192.168.0.7/team/x.git",
        "git://[::1]/x.git",
        "https://[::ffff:127.0.0.1]/x.git",
        "https://2130706433/x.git",  # 127.0.0.1 to the resolver and to curl
        "https://0x7f.1/x.git",
        "https://127.1/x.git",
    ],
)
def test_a_literal_address_that_is_not_public_is_refused_without_a_lookup(
    repository: str,
) -> None:
    def resolver(host: str, port: int) -> list[str]:
        raise AssertionError("an address is not looked up")

    with pytest.raises(RemoteRefused, match="this node fetches code only from public"):
        fetch_plan(repository, NONE, resolver)


def test_a_name_that_resolves_to_a_private_address_is_refused_saying_so() -> None:
    with pytest.raises(RemoteRefused) as refused:
        fetch_plan("https://git.corp.example/x.git", NONE, answers("10.0.0.5"))
    assert str(refused.value) == (
        "names the host git.corp.example, which resolves to a private address; "
        "this node fetches code only from public addresses unless its operator allows the "
        "network (TRAINYARD_RUNNER_FETCH_ALLOW_PRIVATE)"
    )


def test_one_address_that_is_not_public_among_public_ones_is_enough_to_refuse() -> None:
    with pytest.raises(RemoteRefused, match=r"resolves to a loopback"):
        fetch_plan("https://h.example/x.git", NONE, answers("140.82.112.3", "::1"))


def test_what_the_operator_allows_is_fetched_from_all_the_same() -> None:
    networks = PrivateAllowed.parse(["10.0.0.0/8", "fd00::/8"])
    plan = fetch_plan("https://git.corp.example/x.git", networks, answers("10.0.0.5"))
    assert "http.curloptResolve=git.corp.example:443:10.0.0.5" in plan.options
    fetch_plan("git://[fd00::5]/x.git", networks)
    with pytest.raises(RemoteRefused, match=r"resolves to a loopback address;") as refused:
        fetch_plan("https://git.corp.example/x.git", networks, answers("127.0.0.1"))
    assert "127.0.0.1" not in str(refused.value)  # the node's DNS answer is not the tenant's
    by_name = PrivateAllowed.parse(["Git.Corp.Example."])
    fetch_plan("git://git.corp.example/x.git", by_name, answers("10.0.0.5"))
    with pytest.raises(RemoteRefused):  # exactly that name, not one below it
        fetch_plan("git://a.git.corp.example/x.git", by_name, answers("10.0.0.5"))


def test_git_is_held_to_the_transports_and_to_the_address_judged() -> None:
    """The check and git's own connection must not resolve apart (DNS rebinding): each
    transport connects to the address judged."""
    https = fetch_plan("https://h.example:8443/x.git", NONE, answers("140.82.112.3", "8.8.8.8"))
    assert https.url == "https://h.example:8443/x.git"
    assert https.options == [
        "protocol.allow=never",
        "protocol.https.allow=always",
        "protocol.git.allow=always",
        "http.followRedirects=false",
        "http.curloptResolve=h.example:8443:140.82.112.3",
        "http.curloptResolve=h.example.:8443:140.82.112.3",
    ]
    v6 = fetch_plan("https://h.example/x.git", NONE, answers("2606:4700::1111"))
    assert "http.curloptResolve=h.example:443:[2606:4700::1111]" in v6.options
    git = fetch_plan("git://h.example/team/x.git", NONE, answers("140.82.112.3"))
    assert git.url == "git://140.82.112.3:9418/team/x.git"
    # An address written out too: git takes a git:// host apart itself, and looked up
    # ``user@8.8.8.8`` of ``git://user@8.8.8.8/`` as a name of its own.
    by_address = fetch_plan("git://localhost@8.8.8.8/x.git", NONE)
    assert by_address.url == "git://8.8.8.8:9418/x.git"
    v6_address = fetch_plan("git://localhost:22@[2606:4700::1111]/x.git", NONE)
    assert v6_address.url == "git://[2606:4700::1111]:9418/x.git"
    for plan in (git, by_address):
        assert plan.options[0] == "protocol.allow=never"
        assert "http.followRedirects=false" in plan.options


@pytest.mark.parametrize(
    "repository",
    [
        "/srv/git/x.git",
        "x.git",
        "file:///srv/git/x.git",
        "file:/srv/git/x.git",
        "http://h.example/x.git",
        "ftp://h.example/x.git",
        "ext::sh -c touch% /tmp/x",
        "fd::3",
        "h.example:x.git",  # scp form without a user: the API takes it only with one
        "https://h%2eexample/x.git",
        "https://h_example/x.git",
        "https://[not-v6]/x.git",
        "https:///x.git",
        "git://[2606:4700::1111%25$(id)]/x.git",  # a zone takes any text
        "https://[2606:4700::1111%eth0]/x.git",
    ],
)
def test_a_repository_not_by_https_or_git_is_refused(repository: str) -> None:
    with pytest.raises(RemoteRefused):
        fetch_plan(repository, PrivateAllowed.parse(["0.0.0.0/0", "::/0"]), answers("8.8.8.8"))


@pytest.mark.parametrize(
    ("repository", "said"),
    [
        # urlsplit reads these without their tab or blank; git is given them as written.
        ("https://127.0.0.1\t@h.example/x.git", "whitespace, a control character"),
        ("git://h.exam\nple/x.git", "whitespace, a control character"),
        # urlsplit lowers the Kelvin sign to an ASCII k: judged as key.example.
        ("https://\u212aey.example/x.git", "a character beyond ASCII"),
        # Judged (and pinned) as port 443, while curl looked the name up again for port 0.
        ("https://h.example:0/x.git", "the port 0, which is no port"),
        ("https://h.example:000/x.git", "the port 0, which is no port"),
    ],
)
def test_a_repository_git_would_refuse_or_read_otherwise_is_refused_before_it_runs(
    repository: str, said: str
) -> None:
    """What urlsplit reads otherwise than git and curl would have been judged, and pinned,
    as another URL."""
    with pytest.raises(RemoteRefused, match=said):
        fetch_plan(repository, NONE, answers("8.8.8.8"))


@pytest.mark.parametrize(
    "repository",
    [
        "ssh://git@github.com/acme/train.git",
        "ssh://git@h.example:2222/x.git",
        "git+ssh://git@h.example/x.git",
        "ssh+git://git@h.example/x.git",
        "git@github.com:acme/train.git",
        "git@[2606:4700::1111]:x.git",
        # What ssh would read as an option is refused as ssh all the same.
        "ssh://-oProxyCommand@h.example/x.git",
        "-oProxyCommand@h.example:x.git",
        "git@h.example:-x.git",
    ],
)
def test_a_repository_by_ssh_is_refused_saying_why_before_a_lookup(repository: str) -> None:
    """git fetches as the job's uid, which has no keys (never the host's: one team could
    name another's private repository): an ssh fetch could never succeed, and failed on the
    node as the platform's, retried. Refused as the job's input, saying what to do."""

    def resolver(host: str, port: int) -> list[str]:
        raise AssertionError("an ssh host is not looked up")

    with pytest.raises(RemoteRefused) as refused:
        fetch_plan(repository, PrivateAllowed.parse(["0.0.0.0/0", "::/0"]), resolver)
    assert str(refused.value) == (
        "is an ssh repository, which is not supported: a job fetches its code without keys, "
        "so only a public repository by https:// or git:// can be fetched; for a private "
        "repository submit a code bundle"
    )


def test_a_host_that_does_not_resolve_says_so() -> None:
    def resolver(host: str, port: int) -> list[str]:
        raise HostUnresolved("[Errno -2] Name or service not known")

    with pytest.raises(HostUnresolved):
        fetch_plan("https://gti.example.invalid/x.git", NONE, resolver)
    with pytest.raises(HostUnresolved):
        fetch_plan("https://gti.example.invalid/x.git", NONE)  # the real resolver


def failing(error: BaseException) -> Resolver:
    def resolver(host: str, port: int) -> list[str]:
        raise error

    return resolver


@pytest.mark.parametrize(
    ("resolver", "not_found"),
    [
        # The resolver's answer about the name itself: the same from every node.
        (failing(socket.gaierror(socket.EAI_NONAME, "Name or service not known")), True),
        (failing(socket.gaierror(socket.EAI_NODATA, "No address associated")), True),
        (failing(socket.gaierror(socket.EAI_ADDRFAMILY, "Address family for hostname")), True),
        (answers(), True),  # an answer without an address
        (failing(UnicodeError("label too long")), True),
        # The resolver failing: this node's DNS, just now.
        (failing(socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")), False),
        (failing(socket.gaierror(socket.EAI_FAIL, "Non-recoverable failure")), False),
        (failing(socket.gaierror(socket.EAI_SYSTEM, "System error")), False),
    ],
)
def test_a_host_that_does_not_exist_is_told_from_a_resolver_that_fails(
    resolver: Resolver, not_found: bool
) -> None:
    """Before: every lookup failure was ``HostUnresolved``, the platform's, retried: a
    mistyped host burnt the platform's retries and was charged to it."""
    for repository in ("https://gti.example/x.git", "git://gti.example/x.git"):
        with pytest.raises(HostUnresolved) as raised:
            fetch_plan(repository, NONE, resolver)
        assert isinstance(raised.value, HostNotFound) is not_found
        said = str(raised.value)
        assert "gti.example" in said
        assert "Errno" not in said and "System error" not in said  # nothing internal
        if not_found:
            assert said.startswith("the host gti.example ")
        else:
            assert (
                said
                == (
                    "the host gti.example could not be looked up from this node just now (its DNS "
                    "failed or did not answer in time)"
                )
                or said == "resolver unreachable"
            )


@pytest.mark.parametrize(
    ("said", "version", "refused"),
    [
        ("git version 2.39.5\n", (2, 39, 5), False),
        ("git version 2.37.0", (2, 37, 0), False),
        ("git version 2.37.1 (Apple Git-137.1)", (2, 37, 1), False),
        ("git version 2.43.0.windows.1", (2, 43, 0), False),
        ("git version 3.0", (3, 0, 0), False),
        ("git version 2.36.6", (2, 36, 6), True),
        ("git version 1.8.3.1", (1, 8, 3), True),
        ("", None, True),
    ],
)
def test_git_older_than_2_37_is_refused_since_it_ignores_the_pin(
    said: str, version: tuple[int, ...] | None, refused: bool
) -> None:
    """An older git drops ``http.curloptResolve`` without a word: curl would look the host
    up again, and fetch from what a second answer says."""
    assert git_version(said) == version
    problem = unpinned_git(version)
    assert (problem is not None) is refused
    if version is not None and refused:
        assert problem == (
            f"this node's git is {'.'.join(map(str, version))}, older than 2.37, which ignores "
            "http.curloptResolve and so would fetch without being held to the address judged: "
            "this node fetches no git code until its operator installs git 2.37 or later"
        )


def test_git_keeps_the_host_name_for_a_daemon_that_serves_several() -> None:
    """git:// connects to the address judged (named in the URL), but its ``host=`` names the
    host written, for a virtual-hosting daemon; https needs nothing (curl sends the name)."""
    plan = fetch_plan("git://Git.Example:9418/x.git", NONE, answers("140.82.112.3"))
    assert plan.url == "git://140.82.112.3:9418/x.git"
    assert plan.env == {"GIT_OVERRIDE_VIRTUAL_HOST": "Git.Example:9418"}
    assert fetch_plan("git://user@git.example/x.git", NONE, answers("8.8.8.8")).env == {
        "GIT_OVERRIDE_VIRTUAL_HOST": "git.example"
    }
    assert fetch_plan("https://git.example/x.git", NONE, answers("8.8.8.8")).env == {}


@pytest.mark.parametrize(
    "entry", ["10.0.0.0/33", "10.0.0.1/8", "git corp", "http://git.corp", "x_y", "fd00::/200"]
)
def test_an_entry_of_the_setting_that_is_neither_network_nor_host_is_refused_at_start(
    entry: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ValueError):
        allow_entry(entry)
    monkeypatch.setenv("TRAINYARD_RUNNER_FETCH_ALLOW_PRIVATE", f'["127.0.0.0/8", "{entry}"]')
    with pytest.raises(ValidationError) as refused:
        Settings(admin_token=SecretStr("t"))
    [line] = invalid_settings(Settings, refused.value)
    assert line.startswith("TRAINYARD_RUNNER_FETCH_ALLOW_PRIVATE"), line


def test_the_setting_is_empty_by_default_and_parsed_when_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert Settings(admin_token=SecretStr("t")).fetch_private_allowed == PrivateAllowed()
    monkeypatch.setenv("TRAINYARD_RUNNER_FETCH_ALLOW_PRIVATE", '["10.1.0.0/16", "git.corp"]')
    allowed = Settings(admin_token=SecretStr("t")).fetch_private_allowed
    assert allowed.networks == (ipaddress.ip_network("10.1.0.0/16"),)
    assert allowed.hosts == frozenset({"git.corp"})


def test_git_that_could_not_be_run_once_is_asked_again_and_a_version_said_is_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before: a git that could not be run at the runner's start (being upgraded, a process
    limit reached) was remembered as none until the runner restarted, and every git job on
    the node failed as the node's fault, counted towards its cordon."""
    said: list[object] = [OSError("git: text file busy"), b"", b"git version 2.39.5\n"]
    asked: list[list[str]] = []

    def run(command: list[str], **_: object) -> subprocess.CompletedProcess[bytes]:
        asked.append(command)
        answer = said.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        assert isinstance(answer, bytes)
        return subprocess.CompletedProcess(command, 0, answer, b"")

    monkeypatch.setattr(git_remote, "_LEARNT", [])
    monkeypatch.setattr(subprocess, "run", run)
    assert installed_git() is None  # could not be run
    assert installed_git() is None  # said no version
    assert installed_git() == (2, 39, 5)
    assert installed_git() == (2, 39, 5)  # kept: git is not asked again
    assert asked == [["git", "--version"]] * 3

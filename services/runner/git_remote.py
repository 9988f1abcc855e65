"""Where a job's git repository may be fetched from, judged before git runs, and how git is
held to it.

git fetches a job's ``code`` in the host's network, before the job's own network namespace
exists (``netns``), so a repository URL is a request the node makes for the tenant: without
this, ``https://169.254.169.254/``, ``git://127.0.0.1:4222/`` (NATS), a name resolving to a
private address, or a public server redirecting to one would reach the node's internal
services, and git's error text (in the job's failure reason) would carry back what they
answered. So, before git runs (``fetch_plan``):

* Only the transports the submission API takes: ``https://`` and ``git://``. ssh
  (``ssh://`` and the scp form ``user@host:path``) is refused, saying why: git runs as the
  job's uid, which has no keys (never the host's: one team could name another's private
  repository), so an ssh fetch could never succeed. A path, ``file://``, ``http://`` and
  git's remote helpers (``ext::<command>``, ``fd::``) are refused too, and git is held to
  the same list by ``-c protocol.allow=never`` with ``protocol.<name>.allow=always`` for
  those two, on its command line, where no repository's config can change it. The host is
  read as the submission API reads it (``shared.url_hosts``): what git, curl and this
  judgement could read differently is refused (whitespace, a character beyond ASCII, a
  percent-escape, a host ending in a number that is no address such as ``127.0.0.1.``, port
  0, an IPv6 zone; in a git:// URL, '@[' after its host and a host not followed by '/',
  from which git reads a host of its own; ``%0a``, which git refuses).
* The host is resolved once, here; every address it resolves to must be globally routable
  (``shared.public_addresses``: not loopback, private, link-local, shared CGNAT, unique-local,
  site-local, multicast, unspecified, documentation or otherwise reserved, nor an IPv6 form
  carrying such an IPv4 address: mapped, NAT64, 6to4), unless the operator allows it
  (``Settings.fetch_allow_private``: networks and host names, for a company's own git server).
* git then connects to the first address it was judged by, never to a second lookup's
  answer (DNS rebinding): https through ``http.curloptResolve`` (git 2.37 or later: an
  older git ignores it, so a runner with one fetches no git code, ``unpinned_git``), git://
  by naming the address itself in the URL, even when the URL names an address, whose host
  git takes apart itself; its ``host=`` still names the host written
  (``GIT_OVERRIDE_VIRTUAL_HOST``), for a daemon that serves several. https follows no redirect
  (``http.followRedirects=false``): a redirect's target is never judged, so a repository
  that moved is named where it now is.

The same judgement of a host (``judged_addresses``) and the same setting hold for a job's
wheel URLs, which the runner downloads in the host's network too
(``launch.check_requirements`` before the job's code, ``wheels.fetch_wheel`` when it
downloads one, connected to the address judged and following no redirect).

A refusal is the job's own input (the same on any node): ``JobInputError`` naming
``spec.code.repository`` and why. So is a host that does not exist (``HostNotFound``: the
resolver answers there is no such name or no address for it); one the resolver fails to
look up just now (``HostUnresolved``) is retried as the platform's, as when git says so
(``git_faults``).
"""

from __future__ import annotations

import ipaddress
import re
import socket
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final
from urllib.parse import urlsplit

from trainyard_platform.shared.public_addresses import (
    IPAddress,
    address_problem,
    literal_address,
)
from trainyard_platform.shared.url_hosts import GIT_SCHEMES, HOST_NAME, read_git_url

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

TRANSPORTS = tuple(GIT_SCHEMES)
"""The URL schemes a job's repository may use (git's protocol names too)."""

SSH_SCHEMES = ("ssh", "git+ssh", "ssh+git")
"""The URL schemes git fetches by ssh."""
_SCP = re.compile(r"[^/:@]*@[^/@]+:")
"""The start of git's scp-like ssh form ``user@host:path`` (``user@[v6]:path`` too)."""


SETTING = "TRAINYARD_RUNNER_FETCH_ALLOW_PRIVATE"


class RemoteRefused(ValueError):
    """The repository may not be fetched from this node; the message says why (without the
    field's name)."""


class HostUnresolved(OSError):
    """The host could not be looked up from this node just now: its resolver failed, timed
    out or could not be reached (``EAI_AGAIN`` and the like). The platform's, retried; the
    message names the host and says so, nothing of the node's resolver."""


class HostNotFound(HostUnresolved):
    """The host does not exist: the resolver answered that there is no such name
    (NXDOMAIN: ``EAI_NONAME``), no address for it (``EAI_NODATA``, ``EAI_ADDRFAMILY``, or an
    empty answer), or it is no name DNS can hold. The job's own input (``user_error``, not
    retried): every node's resolver answers the same."""


NO_SUCH_HOST: Final = frozenset(
    getattr(socket, name)
    for name in ("EAI_NONAME", "EAI_NODATA", "EAI_ADDRFAMILY")
    if hasattr(socket, name)
)
"""The ``getaddrinfo`` errors that answer the name itself (``HostNotFound``); any other
(``EAI_AGAIN``, ``EAI_FAIL``, ``EAI_SYSTEM``, ...) is a resolver failing (``HostUnresolved``)."""


@dataclass(frozen=True)
class Remote:
    """A repository URL, taken apart."""

    transport: str
    """``https`` or ``git``."""
    host: str
    """As written, in lower case, without brackets (``shared.url_hosts.UrlHost.host``)."""
    port: int


@dataclass(frozen=True)
class FetchPlan:
    """How git fetches one repository: the URL it is given and ``-c`` options that go
    before its command."""

    url: str
    options: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    """What git's environment holds besides (``GIT_OVERRIDE_VIRTUAL_HOST`` for git://)."""


@dataclass(frozen=True)
class PrivateAllowed:
    """What the operator lets jobs fetch from although it is not public
    (``Settings.fetch_allow_private``)."""

    networks: tuple[IPNetwork, ...] = ()
    hosts: frozenset[str] = frozenset()
    """Lower case, without a final dot."""

    @classmethod
    def parse(cls, entries: Sequence[str]) -> PrivateAllowed:
        """From the setting's entries (each checked by ``allow_entry``)."""
        networks: list[IPNetwork] = []
        hosts: set[str] = set()
        for entry in entries:
            parsed = allow_entry(entry)
            if isinstance(parsed, str):
                hosts.add(parsed)
            else:
                networks.append(parsed)
        return cls(tuple(networks), frozenset(hosts))

    def allows_host(self, host: str) -> bool:
        return host.lower().rstrip(".") in self.hosts

    def allows_address(self, address: IPAddress) -> bool:
        return any(address in network for network in self.networks)


PUBLIC_ONLY = PrivateAllowed()
"""Nothing allowed beyond public addresses: the default."""


def allow_entry(entry: str) -> IPNetwork | str:
    """One entry of ``fetch_allow_private``: a network (``10.1.0.0/16``, ``fd00::/8``, an
    address alone) or a host name (returned lower case, without a final dot); else
    ``ValueError`` saying what it may be."""
    text = entry.strip()
    try:
        return ipaddress.ip_network(text, strict=True)
    except ValueError as exc:
        if "/" in text or ":" in text or re.fullmatch(r"[0-9.]+", text):
            raise ValueError(f"{entry!r} is not a network: {exc}") from None
    if not HOST_NAME.fullmatch(text):
        raise ValueError(
            f"{entry!r} is neither a network (10.1.0.0/16, fd00::/8, an address) nor a host "
            "name (git.internal.example)"
        )
    return text.lower().rstrip(".")


def parse_remote(repository: str) -> Remote:
    """``repository`` as a remote of one of ``TRANSPORTS``, its host read as the submission
    API reads it (``shared.url_hosts.read_git_url``), else ``RemoteRefused``."""
    if repository.partition("://")[0] in SSH_SCHEMES or _SCP.match(repository):
        raise RemoteRefused(_NO_SSH)
    # git takes a scheme as written (``HTTPS://`` names a remote helper of its own).
    if repository.partition("://")[0] not in TRANSPORTS or "://" not in repository:
        raise RemoteRefused(_ONLY)  # a path, file:, or a remote helper (``ext::``)
    try:
        url = read_git_url(repository)
    except ValueError as exc:
        raise RemoteRefused(str(exc)) from None
    return Remote(url.scheme, url.host, url.port)


_ONLY = (
    "is not an https:// or git:// URL: this node fetches code by those alone (never a "
    "path, file://, http://, ssh or a git remote helper such as ext::)"
)
_NO_SSH = (
    "is an ssh repository, which is not supported: a job fetches its code without keys, so "
    "only a public repository by https:// or git:// can be fetched; for a private "
    "repository submit a code bundle"
)


Resolver = Callable[[str, int], list[str]]


def resolve(host: str, port: int) -> list[str]:
    """The addresses ``host`` resolves to for a TCP connection, in the resolver's order
    (``socket.gaierror`` when it does not: ``lookup`` tells whose failure it is)."""
    answers = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(answer[4][0]) for answer in answers]


def lookup(host: str, port: int, resolver: Resolver | None = None) -> list[str]:
    """The addresses ``resolver`` (``resolve`` by default) answers for ``host``;
    ``HostNotFound`` when it answers that the host does not exist or has no address,
    ``HostUnresolved`` when it fails otherwise (its own failure: retried)."""
    try:
        answers = (resolver or resolve)(host, port)
    except socket.gaierror as exc:
        if exc.errno in NO_SUCH_HOST:
            raise HostNotFound(
                f"the host {host} does not exist in DNS (no such name, or no address for "
                "it): check its spelling"
            ) from None
        raise HostUnresolved(
            f"the host {host} could not be looked up from this node just now (its DNS "
            "failed or did not answer in time)"
        ) from None
    except UnicodeError:  # the idna codec's refusal: a label empty or too long
        raise HostNotFound(f"the host {host} is no name DNS can hold") from None
    if not answers:
        raise HostNotFound(f"the host {host} has no address in DNS: check its spelling")
    return answers


def fetch_plan(
    repository: str, allowed: PrivateAllowed, resolver: Resolver | None = None
) -> FetchPlan:
    """How git fetches ``repository`` from this node: refused (``RemoteRefused``) unless it
    is of one of ``TRANSPORTS`` and every address its host resolves to is public or
    ``allowed``; else the URL and options that hold git to the transports and
    to the first address judged (``HostNotFound`` or ``HostUnresolved`` when the host does
    not resolve: ``lookup``)."""
    remote = parse_remote(repository)
    addresses, literal = judged_addresses(remote.host, remote.port, allowed, "code", resolver)
    return _pinned(repository, remote, addresses[0], literal)


def judged_addresses(
    host: str, port: int, allowed: PrivateAllowed, what: str, resolver: Resolver | None = None
) -> tuple[list[IPAddress], bool]:
    """The addresses ``host`` is (written as an address: looked nothing up) or resolves to
    for ``port``, and whether it was written as one: ``RemoteRefused`` unless every one is
    public or ``allowed`` (the reason says this node fetches ``what`` only from public
    addresses), ``HostNotFound`` or ``HostUnresolved`` when it does not resolve (``lookup``). The one judgement of what a
    job makes this node fetch: its git code here, its wheel URLs
    (``launch.check_requirements``)."""
    literal = literal_address(host)
    if literal is not None:
        addresses = [literal]
    else:
        addresses = [_address(text) for text in lookup(host, port, resolver)]
    if not allowed.allows_host(host):
        for address in addresses:
            problem = address_problem(address)
            if problem is not None and not allowed.allows_address(address):
                if literal is None:
                    # The node's own DNS answered: the tenant learns the kind of address,
                    # never the address (it would map the node's internal names for them).
                    problem = problem.partition(" (as ")[0]
                    named = f"the host {host}, which resolves to"
                elif str(address) == host:
                    named = f"the address {address},"
                else:
                    named = f"the host {host}, which is {address},"
                raise RemoteRefused(
                    f"names {named} {problem}; this node fetches {what} only "
                    f"from public addresses unless its operator allows the network "
                    f"({SETTING})"
                )
    return addresses, literal is not None


def _address(text: str) -> IPAddress:
    return ipaddress.ip_address(text.partition("%")[0])  # a scoped fe80::1%eth0 too


def _pinned(repository: str, remote: Remote, address: IPAddress, literal: bool) -> FetchPlan:
    options = ["protocol.allow=never"] + [f"protocol.{name}.allow=always" for name in TRANSPORTS]
    options.append("http.followRedirects=false")
    shown = f"[{address}]" if address.version == 6 else str(address)
    if remote.transport == "https":
        if literal:  # curl reads an address as the resolver does, and looks nothing up
            return FetchPlan(repository, options)
        name = remote.host.rstrip(".")
        for host in (name, name + "."):  # curl may key its cache with the final dot or without
            options.append(f"http.curloptResolve={host}:{remote.port}:{shown}")
        return FetchPlan(repository, options)
    # git:// is pinned for an address written out too: git takes its host apart itself,
    # and looks up ``user@8.8.8.8`` of ``git://user@8.8.8.8/`` as a name of its own.
    # git:// sends ``host=`` from the URL it is given, the address here: the name written
    # (and port, if written) goes instead, as a virtual-hosting daemon expects.
    url = urlsplit(repository)
    netloc = f"{shown}:{remote.port}"
    virtual = {"GIT_OVERRIDE_VIRTUAL_HOST": url.netloc.rpartition("@")[2]}
    return FetchPlan(url._replace(netloc=netloc).geturl(), options, virtual)


GIT_PATH: Final = "/usr/local/bin:/usr/bin:/bin"
"""The ``PATH`` git runs with, for a job's fetch and for ``installed_git`` alike."""

PINNING_GIT: Final = (2, 37)
"""The first git that hands ``http.curloptResolve`` to curl: an older one ignores the option
without a word, and curl looks the host up again (DNS rebinding)."""


def git_version(said: str) -> tuple[int, ...] | None:
    """The version ``git --version`` ``said`` (``git version 2.39.2``, ``git version 2.37.1
    (Apple Git-137.1)``), None when it said none."""
    found = re.search(r"git version (\d+)\.(\d+)(?:\.(\d+))?", said)
    return None if found is None else tuple(int(part or 0) for part in found.groups())


_LEARNT: list[tuple[int, ...]] = []
"""This node's git version once git said one (``installed_git``)."""


def installed_git() -> tuple[int, ...] | None:
    """The version of this node's git, learnt once git says one (at the runner's start, or
    its first fetch after); None while git cannot be run or says no version, and asked again
    at the next fetch: a failure at the start (git being upgraded, a process limit reached)
    would otherwise keep every git job from this node until the runner restarts, each a
    ``NodeFault`` counted towards its cordon."""
    if not _LEARNT:
        try:
            result = subprocess.run(
                ["git", "--version"],
                capture_output=True,
                timeout=60,
                check=False,
                env={"PATH": GIT_PATH},
            )
        except (OSError, subprocess.SubprocessError):
            return None
        version = git_version(result.stdout.decode(errors="replace"))
        if version is None:
            return None
        _LEARNT.append(version)
    return _LEARNT[0]


def unpinned_git(version: tuple[int, ...] | None) -> str | None:
    """Why git of ``version`` (``installed_git``) may fetch no job's code, None when it may:
    older than ``PINNING_GIT`` it ignores the pin to the address judged, and would fetch
    from whatever a second lookup answers. The operator's to fix, never the job's."""
    if version is None:
        return "git could not be run on this node or did not say its version"
    if version < PINNING_GIT:
        shown = ".".join(str(part) for part in version)
        return (
            f"this node's git is {shown}, older than 2.37, which ignores http.curloptResolve "
            "and so would fetch without being held to the address judged: this node fetches "
            "no git code until its operator installs git 2.37 or later"
        )
    return None

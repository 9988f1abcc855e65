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
  those two, on its command line, where no repository's config can change it. So is what
  git would read otherwise than this judgement: whitespace, a control character or one
  beyond ASCII (which ``urlsplit`` drops or lowers to ASCII), port 0, an IPv6 zone.
* The host is resolved once, here; every address it resolves to must be globally routable
  (``shared.public_addresses``: not loopback, private, link-local, shared CGNAT, unique-local,
  site-local, multicast, unspecified, documentation or otherwise reserved, nor an IPv6 form
  carrying such an IPv4 address: mapped, NAT64, 6to4), unless the operator allows it
  (``Settings.fetch_allow_private``: networks and host names, for a company's own git server).
* git then connects to the first address it was judged by, never to a second lookup's
  answer (DNS rebinding): https through ``http.curloptResolve``, git:// by naming the address
  itself in the URL (its ``host=`` then names the address), even when the URL names an
  address, whose host git takes apart itself. https follows no redirect
  (``http.followRedirects=false``): a redirect's target is never judged, so a repository
  that moved is named where it now is.

The same judgement of a host (``judged_addresses``) and the same setting hold for a job's
wheel URLs, which the runner downloads in the host's network too
(``launch.check_requirements`` before the job's code, ``wheels.fetch_wheel`` when it
downloads one, connected to the address judged and following no redirect).

A refusal is the job's own input (the same on any node): ``JobInputError`` naming
``spec.code.repository`` and why. A host that does not resolve is retried as the platform's,
as when git says so (``git_faults``).
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from urllib.parse import SplitResult, urlsplit

from trainyard_platform.shared.public_addresses import (
    NOT_PRINTABLE_ASCII,
    IPAddress,
    address_problem,
    literal_address,
)

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

TRANSPORTS = ("https", "git")
"""The URL schemes a job's repository may use (git's protocol names too)."""
DEFAULT_PORTS = {"https": 443, "git": 9418}

_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
HOST_NAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})*\.?")
"""A DNS host name (letters, digits, ``-`` and dots; a final dot allowed): anything else in a
host (``%``-escapes, ``@``, spaces) is refused rather than left for git's parser and the
resolver's to read differently."""

SSH_SCHEMES = ("ssh", "git+ssh", "ssh+git")
"""The URL schemes git fetches by ssh."""
_SCP = re.compile(r"[^/:@]*@[^/@]+:")
"""The start of git's scp-like ssh form ``user@host:path`` (``user@[v6]:path`` too)."""


SETTING = "TRAINYARD_RUNNER_FETCH_ALLOW_PRIVATE"


class RemoteRefused(ValueError):
    """The repository may not be fetched from this node; the message says why (without the
    field's name)."""


class HostUnresolved(OSError):
    """The repository's host did not resolve from this node (mistyped, or the node's DNS
    failing: the platform's to retry)."""


@dataclass(frozen=True)
class Remote:
    """A repository URL, taken apart."""

    transport: str
    """``https`` or ``git``."""
    host: str
    """As written, without brackets."""
    port: int


@dataclass(frozen=True)
class FetchPlan:
    """How git fetches one repository: the URL it is given and ``-c`` options that go
    before its command."""

    url: str
    options: list[str] = field(default_factory=list)


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
    """``repository`` as a remote of one of ``TRANSPORTS``, else ``RemoteRefused``."""
    if repository.partition("://")[0] in SSH_SCHEMES or _SCP.match(repository):
        raise RemoteRefused(_NO_SSH)
    if "://" in repository:
        if repository.partition("://")[0] not in TRANSPORTS:
            raise RemoteRefused(_ONLY)
        _printable_ascii(repository)
        try:
            url: SplitResult = urlsplit(repository)
            port = url.port
        except ValueError as exc:
            raise RemoteRefused(f"is not a URL git may fetch ({exc})") from None
        if url.scheme not in TRANSPORTS:
            raise RemoteRefused(_ONLY)
        host = url.hostname or ""
        bracketed = url.netloc.rpartition("@")[2].startswith("[")
        if not _host_ok(host, bracketed):
            raise RemoteRefused(f"names no host this node fetches from ({host!r})")
        if port == 0:
            # curl would connect to port 0 of a lookup of its own, not to the address pinned
            # for the port judged (the default's).
            raise RemoteRefused("names the port 0, which is no port: 1 to 65535")
        return Remote(url.scheme, host, port or DEFAULT_PORTS[url.scheme])
    raise RemoteRefused(_ONLY)  # a path, file:, or a remote helper (``ext::``)


def _printable_ascii(repository: str) -> None:
    # urlsplit drops tabs and line breaks and lowers the Kelvin sign of ``\u212aey.example``
    # to an ASCII k: what it read would not be what git is given.
    if NOT_PRINTABLE_ASCII.search(repository):
        raise RemoteRefused("holds whitespace, a control character or a character beyond ASCII")


_ONLY = (
    "is not an https:// or git:// URL: this node fetches code by those alone (never a "
    "path, file://, http://, ssh or a git remote helper such as ext::)"
)
_NO_SSH = (
    "is an ssh repository, which is not supported: a job fetches its code without keys, so "
    "only a public repository by https:// or git:// can be fetched; for a private "
    "repository submit a code bundle"
)


def _host_ok(host: str, bracketed: bool) -> bool:
    if bracketed:
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return False
        # No zone (``fe80::1%eth0``): it names one of this node's interfaces, and takes any
        # text.
        return isinstance(address, ipaddress.IPv6Address) and address.scope_id is None
    return bool(HOST_NAME.fullmatch(host))


Resolver = Callable[[str, int], list[str]]


def resolve(host: str, port: int) -> list[str]:
    """The addresses ``host`` resolves to for a TCP connection, in the resolver's order;
    ``HostUnresolved`` when it does not."""
    try:
        answers = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise HostUnresolved(str(exc)) from None
    return [str(answer[4][0]) for answer in answers]


def fetch_plan(
    repository: str, allowed: PrivateAllowed, resolver: Resolver | None = None
) -> FetchPlan:
    """How git fetches ``repository`` from this node: refused (``RemoteRefused``) unless it
    is of one of ``TRANSPORTS`` and every address its host resolves to is public or
    ``allowed``; else the URL and options that hold git to the transports and
    to the first address judged (``HostUnresolved`` when the host does not resolve)."""
    remote = parse_remote(repository)
    addresses, literal = judged_addresses(remote.host, remote.port, allowed, "code", resolver)
    return _pinned(repository, remote, addresses[0], literal)


def judged_addresses(
    host: str, port: int, allowed: PrivateAllowed, what: str, resolver: Resolver | None = None
) -> tuple[list[IPAddress], bool]:
    """The addresses ``host`` is (written as an address: looked nothing up) or resolves to
    for ``port``, and whether it was written as one: ``RemoteRefused`` unless every one is
    public or ``allowed`` (the reason says this node fetches ``what`` only from public
    addresses), ``HostUnresolved`` when it does not resolve. The one judgement of what a
    job makes this node fetch: its git code here, its wheel URLs
    (``launch.check_requirements``)."""
    literal = literal_address(host)
    if literal is not None:
        addresses = [literal]
    else:
        answers = (resolver or resolve)(host, port)
        addresses = [_address(text) for text in answers]
        if not addresses:
            raise HostUnresolved(f"{host} resolved to no address")
    if not allowed.allows_host(host):
        for address in addresses:
            problem = address_problem(address)
            if problem is not None and not allowed.allows_address(address):
                if literal is None:
                    named = f"the host {host}, which resolves to {address},"
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
    url = urlsplit(repository)
    netloc = f"{shown}:{remote.port}"
    return FetchPlan(url._replace(netloc=netloc).geturl(), options)

"""The host a job's URL names, read once: the same way by the submission API and the runner,
and the way git, curl and the installers connect to it.

A job names hosts a node fetches from in two places: its git repository
(``spec.code.repository``, ``https://`` or ``git://``) and the wheel URLs of its requirements
(``spec.requirements[i]``, ``https://``). ``read_url`` takes either apart, each caller giving
its own schemes (``shared.requirements.wheel_host`` and the runner's wheel download; a
repository through ``read_git_url``, by ``services.runner.git_remote.parse_remote`` and the
submission API alike, which adds git's own rules), and reads its host as one of:

* a host name: ASCII letters, digits and ``-`` in labels of at most 63 characters, at most
  253 in all, one final dot allowed (the same name, written absolute); read in lower case
  (``urlsplit`` lowers it; DNS is not case-sensitive);
* an IPv4 address: four decimal numbers, or an older form that ``inet_aton`` (and so the
  resolver, curl and git) and the WHATWG URL readers (uv) all take for the same address
  (``127.1``, ``0x7f.1``, ``0177.0.0.1``, ``2130706433``): ``UrlHost.address``;
* an IPv6 address in brackets, without a zone: ``UrlHost.address`` too.

Anything programs read differently is refused, saying why, never guessed at (``ValueError``,
the message a predicate of the URL: "holds ...", "names ..."):

* a host whose last label is a number (``WHATWG``'s "ends in a number") that is no address
  to ``inet_aton``: ``127.0.0.1.`` is 127.0.0.1 to a WHATWG reader but a name to curl and the
  resolver (which then fail to find it, or find what a DNS server says), ``1.2.3.4.5`` and
  ``08.1`` an error to one and a name to the other;
* a percent-escape in the host (``%31%32%37.0.0.1``): curl and WHATWG readers decode it, the
  resolver does not;
* a character beyond ASCII, whitespace or a control character anywhere (``urlsplit`` drops
  tabs and lowers the Kelvin sign to an ASCII k; IDNA 2003 and 2008 map some characters
  differently): an internationalized name is written in its ``xn--`` form;
* a backslash or more than one ``@`` before the path (WHATWG readers take ``\\`` for ``/``,
  curl takes the first ``@`` where ``urlsplit`` takes the last: each would name another
  host);
* an IPv6 zone (``[fe80::1%eth0]``: one of the node's own interfaces, and any text), a
  bracketed host that is no IPv6 address, port 0.

``read_git_url`` refuses besides what git itself reads otherwise or refuses:

* in a ``git://`` URL, an authority ended by ``?``, ``#`` or the URL's end rather than
  ``/`` (git fetches nothing without a path), or ``@[`` after the authority: git takes a git:// URL's host apart itself (``connect.c``), not as
  ``urlsplit`` or curl do: up to the first ``/``, and, when ``@[`` stands anywhere in the
  URL, its path included, from the bracket after it (``git://h/x@[.a.example]:4222/y`` is
  the host ``h/x@.a.example``, port 4222, to git). The runner hands git the URL with its
  authority replaced by the address judged (``git_remote.fetch_plan``): git would look up a
  name of its own instead, which ends in a domain the tenant's DNS answers, at a port of
  its choosing;
* ``%0a`` (an escaped newline) anywhere: git refuses such an https URL ("url contains a
  newline") on every node, which the runner could tell only from git's words, after the
  job was granted.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlsplit

from trainyard_platform.shared.public_addresses import (
    NOT_PRINTABLE_ASCII,
    IPAddress,
    literal_address,
)

GIT_SCHEMES: Final = {"https": 443, "git": 9418}
"""The schemes a job's repository may use (git's protocol names too), with their ports."""
WHEEL_SCHEMES: Final = {"https": 443}
"""The schemes a job's wheel URL may use, with their ports."""

_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
HOST_NAME: Final = re.compile(rf"{_LABEL}(?:\.{_LABEL})*\.?")
"""A DNS host name (letters, digits, ``-`` and dots; a final dot allowed)."""
_NUMBER = re.compile(r"[0-9]+|0[xX][0-9A-Fa-f]*")
"""A label WHATWG's URL readers take for a part of an IPv4 address."""

NOT_ASCII: Final = (
    "holds whitespace, a control character or a character beyond ASCII (an "
    "internationalized host name is written in its xn-- form)"
)


@dataclass(frozen=True)
class UrlHost:
    """Where a URL leads, as ``read_url`` read it."""

    scheme: str
    """Lower case, one of the caller's."""
    host: str
    """As written, lower case, without brackets."""
    port: int
    """As written, else the scheme's."""
    address: IPAddress | None
    """The address ``host`` is written as, None for a host name."""


def read_url(url: str, schemes: Mapping[str, int], unreadable: str) -> UrlHost:
    """``url`` (``scheme://authority/...``, the scheme one of ``schemes``, whose values are
    their ports) taken apart, its host read as the module says; else ``ValueError`` saying
    why (``unreadable``, such as "is not a URL git may fetch", for what ``urlsplit`` cannot
    read, followed by its words)."""
    if NOT_PRINTABLE_ASCII.search(url):
        raise ValueError(NOT_ASCII)
    scheme, _, rest = url.partition("://")
    if scheme.lower() not in schemes:
        raise ValueError(f"is not a URL of {' or '.join(s + '://' for s in schemes)}")
    authority = re.split(r"[/?#]", rest, maxsplit=1)[0]
    if "\\" in authority:
        raise ValueError(
            "holds a backslash before its path, which some programs read as '/' and others "
            "as part of the host"
        )
    if authority.count("@") > 1:
        raise ValueError(
            "holds more than one '@' before its path: programs read different hosts in it"
        )
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"{unreadable} ({exc})") from None
    if port == 0:
        # curl would connect to port 0 of a lookup of its own, not to the address pinned
        # for the port judged (the default's).
        raise ValueError("names the port 0, which is no port: 1 to 65535")
    host = parts.hostname or ""
    if not host:
        raise ValueError("names no host")
    bracketed = authority.rpartition("@")[2].startswith("[")
    address = read_host(host, bracketed=bracketed)
    return UrlHost(scheme.lower(), host, port or schemes[scheme.lower()], address)


def read_git_url(url: str) -> UrlHost:
    """``read_url`` of a job's repository (``GIT_SCHEMES``), and what git reads otherwise or
    refuses refused too (module docstring)."""
    located = read_url(url, GIT_SCHEMES, "is not a URL git may fetch")
    if "%0a" in url.lower():
        raise ValueError("holds '%0a', an escaped newline, which git refuses in a URL")
    if located.scheme == "git":
        rest = url.partition("://")[2]
        after = rest[len(re.split(r"[/?#]", rest, maxsplit=1)[0]) :]  # what follows the host
        if "@[" in after:  # the runner hands git this after the address judged
            raise ValueError(
                "holds '@[' after its host, from which git reads a git:// URL's host wherever "
                "it stands, its path included: git would connect to another host than the one "
                "judged"
            )
        if not after.startswith("/"):
            raise ValueError(
                "has no '/' after its host: git reads a git:// URL's host up to the first "
                "'/' ('?' and '#' included), and fetches nothing without a path after it"
            )
    return located


def read_host(host: str, *, bracketed: bool) -> IPAddress | None:
    """The address ``host`` (as ``urlsplit`` reads it: without brackets, ``bracketed`` when
    it had them, a percent-escape or zone kept) is written as, None for a host name;
    ``ValueError`` for what programs would read differently."""
    if "%" in host:
        if bracketed:
            raise ValueError(
                "names an IPv6 address with a zone ('%...'), which names one of the node's "
                "own interfaces"
            )
        raise ValueError(
            "holds a percent-escape in its host, which some programs decode and others not: "
            "write the host as it is"
        )
    if bracketed:
        try:
            socket.inet_pton(socket.AF_INET6, host)  # as curl and git read it too
            return ipaddress.IPv6Address(host)
        except (ValueError, OSError):
            raise ValueError(f"names {host!r} in brackets, which is no IPv6 address") from None
    name = host[:-1] if host.endswith(".") else host
    if _NUMBER.fullmatch(name.rpartition(".")[2]):
        # Ends in a number: an IPv4 address to WHATWG readers, which must be the address
        # inet_aton (the resolver, curl, git) reads too.
        written = None if host.endswith(".") else literal_address(host)
        if written is None or written.version != 4:
            raise ValueError(
                f"names the host {host!r}, which ends in a number: some programs read it as "
                "an IPv4 address and others as a host name; write an address as four decimal "
                "numbers (192.0.2.1) without a final dot"
            )
        return written
    if (
        not HOST_NAME.fullmatch(host)
        or len(name) > 253
        or any(len(label) > 63 for label in name.split("."))
    ):
        raise ValueError(
            f"names no host this node fetches from ({host!r}): a host name is letters, "
            "digits and '-' in dot-separated labels of at most 63 characters"
        )
    return None

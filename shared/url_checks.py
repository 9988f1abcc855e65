"""Whether a URL setting can name a server at all, checked when the settings are read.

A URL that cannot be parsed, or names no usable host or port, is a mistake in the
settings, not an outage: refused at start with the setting's name (exit status 2, like
every bad setting), instead of being waited for like a DNS failure for ever or failing
inside the start-up with a traceback. A well-formed URL of a server that cannot be reached
is not checked here: that is an outage, waited out as before.

Contract: ``nats_url_problem`` and ``http_url_problem`` answer None for a usable URL, else
the reason, which never holds the URL's credentials (only its scheme, host and port are
ever quoted). ``redact_password`` hides the password of a URL that is echoed.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Final
from urllib.parse import SplitResult, urlsplit

NATS_SCHEMES: Final = ("nats", "tls", "ws", "wss")
HTTP_SCHEMES: Final = ("http", "https")
_HOST_NAME = re.compile(
    r"(?=.{1,253}$)[A-Za-z0-9_]([A-Za-z0-9_-]{0,62})(\.[A-Za-z0-9_-]{1,63})*\.?"
)
"""A DNS name (letters, digits, ``-``; ``_`` too, as container names have)."""
_USERINFO = re.compile(r"(?<=://)([^/@:\s]*):[^/@\s]*@")


def nats_url_problem(url: str) -> str | None:
    """Why the NATS client could not use ``url`` (one server), or None. Without a scheme
    it is ``nats://`` (as the client reads it: ``host:port``, or ``host`` on 4222)."""
    text = url.strip()
    if not text:
        return "is empty (expected nats://host:port)"
    parts = urlsplit(text if "://" in text else f"nats://{text}")
    if parts.scheme not in NATS_SCHEMES:
        schemes = ", ".join(NATS_SCHEMES)
        return f"scheme {parts.scheme!r} is not one of {schemes} (expected nats://host:port)"
    return _address_problem(parts, "nats://host:port")


def http_url_problem(url: str) -> str | None:
    """Why ``url`` is no ``http(s)://host[:port][/path]`` an HTTP client could ask, or
    None."""
    text = url.strip()
    parts = urlsplit(text)
    if parts.scheme not in HTTP_SCHEMES or not text.startswith(f"{parts.scheme}://"):
        return "must start with http:// or https:// (expected http://host:port)"
    return _address_problem(parts, "http://host:port")


def _address_problem(parts: SplitResult, expected: str) -> str | None:
    if any(c.isspace() for c in parts.geturl()):
        return f"must not contain spaces (expected {expected})"
    try:
        parts.port  # noqa: B018  # urllib checks the port when it is read
    except ValueError:
        return f"the port is not a number from 0 to 65535 (expected {expected})"
    host = parts.hostname
    if not host:
        return f"names no host (expected {expected})"
    if not _HOST_NAME.fullmatch(host) and not _is_ip(host):
        return f"{host!r} is not a host name or an IP address (expected {expected})"
    return None


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def redact_password(value: str) -> str:
    """``value`` with the password of each ``scheme://user:password@`` in it replaced by
    ``***``."""
    return _USERINFO.sub(r"\1:***@", value)

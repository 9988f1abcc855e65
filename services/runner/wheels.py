"""A job's wheel URLs, downloaded by the runner itself before the installer runs.

A requirement ``name @ https://host/path/name-1.0-py3-none-any.whl`` is a request the node
makes for the tenant, in the host's network. Left to the installer (uv, pip), it would
resolve the host again (DNS rebinding: the address judged is not the one asked) and follow
any redirect, so a public server could send it to ``http://169.254.169.254/`` or the node's
object store, NATS or PostgreSQL. So the runner fetches each wheel URL itself
(``fetch_wheel``) and gives the installer the local file, which it installs without
touching the network for it:

* The URL is https (the only scheme ``shared.requirements`` lets a requirement name).
* Its host is resolved once and judged by ``git_remote.judged_addresses``, the judgement of
  a job's git code, with the same setting (``Settings.fetch_allow_private``); the connection
  goes to the first address judged, never to a second lookup's answer.
* TLS with the host name as SNI and the server's certificate checked against it (the
  system's certificates, or ``SSL_CERT_FILE`` / ``SSL_CERT_DIR``); ``Host`` names the host.
  No proxy: the node connects to the address judged, or to nothing.
* No redirect is followed: a 3xx refuses the requirement, saying so (name the wheel where
  it now is).
* At most ``MAX_WHEEL_BYTES`` (the bound of an unpacked code bundle), announced or read;
  every socket operation within ``timeout`` seconds, the whole download within
  ``deadline``.
* The file keeps the wheel's file name, the URL's last path segment (``%``-escapes
  decoded), which must be a valid wheel file name (``wheel_file_name``); a ``#sha256=``
  fragment, when the URL has one, must match what was downloaded.

Whose fault a failure is: ``WheelRefused`` (the requirement's, the same on any node: the
URL is one ``shared.url_hosts`` refuses, the address is refused, the host does not exist
(``git_remote.HostNotFound``), a redirect, a 4xx answer other than 408 and 429, a body over
the bound, a file name that is no wheel's, a digest that does not match) and
``WheelUnreachable`` (the platform's, as an unreachable package index is: the resolver
fails to look the host up, the connection fails, is reset or runs out of time, TLS fails, a 5xx, 408 or
429 answer, a body cut short).
"""

from __future__ import annotations

import errno
import hashlib
import http.client
import re
import socket
import ssl
import time
from pathlib import Path
from typing import Final
from urllib.parse import unquote, urlsplit

from packaging.utils import InvalidWheelFilename, parse_wheel_filename

from trainyard_platform.services.runner.git_remote import (
    HostNotFound,
    HostUnresolved,
    PrivateAllowed,
    RemoteRefused,
    Resolver,
    judged_addresses,
)
from trainyard_platform.shared.public_addresses import IPAddress
from trainyard_platform.shared.url_hosts import WHEEL_SCHEMES, read_url

MAX_WHEEL_BYTES: Final = 4 * 1024**3
"""The largest wheel a job's requirement may name by URL: the bound of a job's unpacked
code bundle (``bundle_archive.MAX_UNPACKED_BYTES``)."""
TIMEOUT_S: Final = 60.0
"""Seconds each connect, send and read of a download may take."""
_CHUNK = 1024 * 1024
_FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+!-]*\.whl")
_SHOWN = 300
"""Characters of a redirect's ``Location`` a refusal quotes."""
_TEMPORARY = frozenset({408, 429})
"""4xx answers that say "try again later": the platform's, as a 5xx."""


class WheelRefused(ValueError):
    """The wheel URL is not one this node downloads, or what it served is no wheel it
    installs: the requirement's fault. The message says why, without the field's name."""


class WheelUnreachable(OSError):
    """The wheel could not be downloaded for a reason of the network or the server, not of
    the requirement (the platform's, retried). The message says what failed."""


def wheel_file_name(url: str) -> str:
    """The wheel's file name: the last path segment of ``url``, ``%``-escapes decoded, when
    it is a valid wheel file name (``name-version[-build]-python-abi-platform.whl``, of
    letters, digits and ``._+!-`` alone); else ``WheelRefused`` saying why."""
    segment = unquote(urlsplit(url).path.rsplit("/", 1)[-1])
    if not _FILE_NAME.fullmatch(segment):
        raise WheelRefused(
            f"the URL's last path segment {segment!r} is not a wheel's file name "
            "(letters, digits and ._+!- ending in .whl: name-1.0-py3-none-any.whl)"
        )
    try:
        parse_wheel_filename(segment)
    except InvalidWheelFilename as exc:
        raise WheelRefused(f"{segment!r} is not a valid wheel file name: {exc}") from None
    return segment


def fetch_wheel(
    url: str,
    folder: Path,
    allowed: PrivateAllowed,
    *,
    max_bytes: int = MAX_WHEEL_BYTES,
    timeout: float = TIMEOUT_S,
    deadline: float = 1800.0,
    resolver: Resolver | None = None,
) -> tuple[Path, str]:
    """Download the wheel at ``url`` (https, ``shared.requirements`` passed it) into
    ``folder`` (one of its own: the file is created, never replaced) as the module docstring
    says; the file's path and its sha256 (hex). ``WheelRefused`` or ``WheelUnreachable``
    when it cannot (see the module docstring); an ``OSError`` of a full disk as it is."""
    try:
        # The host read as the API and the runner's judgement read it (one reader).
        located = read_url(url, WHEEL_SCHEMES, "is not one the installers read as such")
    except ValueError as exc:
        raise WheelRefused(f"a URL {exc}") from None
    parts = urlsplit(url)
    name = wheel_file_name(url)
    host, port = located.host, located.port
    try:
        addresses, _ = judged_addresses(host, port, allowed, "wheels", resolver)
    except RemoteRefused as exc:
        raise WheelRefused(f"a URL {exc}") from None
    except HostNotFound as exc:  # the tenant's: no such host (``git_remote.lookup``)
        raise WheelRefused(f"resolving {host}: {exc}") from None
    except HostUnresolved as exc:
        raise WheelUnreachable(f"resolving {host}: {exc}") from None
    path = folder / name
    started = time.monotonic()
    connection = _PinnedHTTPS(host.rstrip("."), port, addresses[0], timeout)
    try:
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        connection.request("GET", target, headers={"Accept-Encoding": "identity"})
        answer = connection.getresponse()
        judge_status(answer)
        announced = answer.getheader("Content-Length")
        if announced is not None and announced.isdigit() and int(announced) > max_bytes:
            raise WheelRefused(_too_large(max_bytes))
        digest = hashlib.sha256()
        size = 0
        with open(path, "xb") as out:
            while chunk := answer.read(_CHUNK):
                size += len(chunk)
                if size > max_bytes:
                    raise WheelRefused(_too_large(max_bytes))
                if time.monotonic() - started > deadline:
                    raise WheelUnreachable(f"the download took over {deadline:.0f} s")
                digest.update(chunk)
                out.write(chunk)
    except (WheelRefused, WheelUnreachable):
        path.unlink(missing_ok=True)
        raise
    except (OSError, http.client.HTTPException) as exc:  # timeouts, resets, TLS, bad HTTP
        path.unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise  # the node's disk: the cache makes room and builds again (``out_of_space``)
        raise WheelUnreachable(f"downloading from {host}: {_said(exc)}") from None
    finally:
        connection.close()
    _check_digest(parts.fragment, digest.hexdigest(), path)
    return path, digest.hexdigest()


class _PinnedHTTPS(http.client.HTTPSConnection):
    """An https connection to ``host`` that connects to ``address`` alone: SNI, the
    certificate's check and ``Host`` are the host name's (an address's when the URL names
    one), and no proxy is used. ``http.client`` follows no redirect."""

    def __init__(self, host: str, port: int, address: IPAddress, timeout: float) -> None:
        self._tls = ssl.create_default_context()
        super().__init__(host, port, timeout=timeout, context=self._tls)
        self._address = address

    def connect(self) -> None:
        raw = socket.create_connection((str(self._address), self.port), self.timeout)
        try:
            self.sock = self._tls.wrap_socket(raw, server_hostname=self.host)
        except BaseException:
            raw.close()
            raise


def judge_status(answer: http.client.HTTPResponse) -> None:
    """Nothing for a 200; else the verdict on the answer (see the module docstring):
    ``WheelRefused`` for a redirect (naming where to) or a 4xx but 408 and 429,
    ``WheelUnreachable`` for the rest."""
    status = answer.status
    if status == 200:
        return
    if 300 <= status < 400:
        where = (answer.getheader("Location") or "nowhere")[:_SHOWN]
        raise WheelRefused(
            f"the server answered {status} {answer.reason}, a redirect (to {where!r}), and "
            "redirects are not followed: name the wheel's URL where it is"
        )
    if 400 <= status < 500 and status not in _TEMPORARY:
        raise WheelRefused(f"the server answered {status} {answer.reason}")
    raise WheelUnreachable(f"the server answered {status} {answer.reason}")


def _check_digest(fragment: str, got: str, path: Path) -> None:
    """A ``sha256=<hex>`` fragment names the wheel's digest: one that does not match
    refuses it."""
    for item in fragment.split("&"):
        algorithm, _, expected = item.partition("=")
        if algorithm.lower() == "sha256" and expected.lower() != got:
            path.unlink(missing_ok=True)
            raise WheelRefused(
                f"what the URL served has the sha256 {got}, not the {expected} its #sha256= says"
            )


def _too_large(max_bytes: int) -> str:
    return f"the wheel is larger than {max_bytes} bytes, the most this node downloads"


def _said(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__

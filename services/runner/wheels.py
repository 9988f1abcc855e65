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
* At most ``max_bytes``, announced or read (``MAX_WHEEL_BYTES``, the bound of an unpacked
  code bundle, for all the wheels of an environment together: ``environments``); every
  socket operation within ``timeout`` seconds, the whole download (connecting, TLS, the
  answer's headers and body) within ``deadline``: each read waits only for what is left of
  it, so a server sending a byte now and then cannot hold the build.
* The file keeps the wheel's file name, the URL's last path segment (``%``-escapes
  decoded), which must be a valid wheel file name of at most ``MAX_NAME`` characters
  (``wheel_file_name``); a ``#sha256=`` fragment, when the URL has one, must match what
  was downloaded.
* The installer fetches what a wheel it installs names in its ``Requires-Dist`` by URL
  (``dep @ http://169.254.169.254/...``, ``git+https://...``) itself, unjudged, uv and pip
  alike, from a wheel given as a file too. So a downloaded wheel whose metadata names a
  dependency by anything but its name, versions and marker is refused
  (``refuse_direct_references``): its dependencies come from the index, by name.

Whose fault a failure is: ``WheelRefused`` (the requirement's, the same on any node: the
URL is one ``shared.url_hosts`` refuses, the address is refused, the host does not exist
(``git_remote.HostNotFound``), a redirect, a 4xx answer other than 408 and 429, a body over
the bound (``WheelTooLarge``), a file name that is no wheel's, a digest that does not match,
a dependency named by URL) and ``WheelUnreachable`` (the platform's, as an unreachable
package index is: the resolver fails to look the host up, the connection fails, is reset or
runs out of time, TLS fails, a 5xx, 408 or 429 answer, a body cut short).
"""

from __future__ import annotations

import errno
import hashlib
import http.client
import io
import re
import socket
import ssl
import struct
import time
import zipfile
import zlib
from pathlib import Path
from typing import Any, Final
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
MAX_NAME: Final = 200
"""Characters a wheel's file name may have: a file system takes 255 at most, and the
runner's own error for a longer one would name its folders."""
_SHOWN = 300
"""Characters of a redirect's ``Location`` a refusal quotes."""
_METADATA = re.compile(r"/?(?:\./)?[^/]*\.dist-info/METADATA", re.IGNORECASE)
_MAX_METADATA = 16 * 1024 * 1024
_MAX_DIRECTORY = 16 * 1024 * 1024
"""Bytes of a wheel's zip central directory read: some 300,000 entries (a large wheel of
CUDA kernels has tens of thousands)."""
_DIRECTORY_SIZE, _DIRECTORY_OFFSET = 5, 6
"""Where the central directory's size and offset are in what ``zipfile._EndRecData``
returns."""
_REQUIRES_DIST = re.compile(
    # At a line's start as any parser splits lines (``str.splitlines``, Python's email
    # parser's, or ``\n`` alone); the value running on over folded lines.
    r"(?:^|(?<=[\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]))"
    r"requires-dist[ \t]*:(?P<value>(?:[^\n]|\n(?=[ \t]))*)",
    re.IGNORECASE,
)
_PLAIN_REQUIREMENT = re.compile(r"[A-Za-z0-9 \t\r\n._\-\[\],;<>=!~()'\"*+]*")
"""What a ``Requires-Dist`` of a name, extras, versions and marker is written with: no
``@``, ``:``, ``/``, ``%``, ``?`` (a URL, a path, an encoded word)."""
_TEMPORARY = frozenset({408, 429})
"""4xx answers that say "try again later": the platform's, as a 5xx."""


class WheelRefused(ValueError):
    """The wheel URL is not one this node downloads, or what it served is no wheel it
    installs: the requirement's fault. The message says why, without the field's name."""


class WheelTooLarge(WheelRefused):
    """The wheel is larger than the bytes it may take."""


class WheelUnreachable(OSError):
    """The wheel could not be downloaded for a reason of the network or the server, not of
    the requirement (the platform's, retried). The message says what failed."""


def wheel_file_name(url: str) -> str:
    """The wheel's file name: the last path segment of ``url``, ``%``-escapes decoded, when
    it is a valid wheel file name (``name-version[-build]-python-abi-platform.whl``, of
    letters, digits and ``._+!-`` alone); else ``WheelRefused`` saying why."""
    segment = unquote(urlsplit(url).path.rsplit("/", 1)[-1])
    if len(segment) > MAX_NAME:
        raise WheelRefused(
            f"the URL's last path segment, the wheel's file name, has {len(segment)} "
            f"characters, over the {MAX_NAME} a file name may have here"
        )
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
    connection = _PinnedHTTPS(host.rstrip("."), port, addresses[0], _Deadline(timeout, deadline))
    answer: http.client.HTTPResponse | None = None
    try:
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        connection.request("GET", target, headers={"Accept-Encoding": "identity"})
        answer = connection.getresponse()
        judge_status(answer)
        if answer.length is not None and answer.length > max_bytes:  # Content-Length, read
            raise WheelTooLarge(_too_large(max_bytes))
        digest = hashlib.sha256()
        size = 0
        with open(path, "xb") as out:
            while chunk := answer.read(_CHUNK):
                size += len(chunk)
                if size > max_bytes:
                    raise WheelTooLarge(_too_large(max_bytes))
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
        if answer is not None:
            answer.close()
        connection.close()
        connection.release()
    _check_digest(parts.fragment, digest.hexdigest(), path)
    return path, digest.hexdigest()


def refuse_direct_references(wheel: Path) -> None:
    """Nothing when every ``Requires-Dist`` of the wheel at ``wheel`` names a dependency by
    its name, extras, versions and marker alone; else ``WheelRefused``: one naming a URL or
    a path (``dep @ https://...``), which the installer would fetch itself, unjudged.

    Read so that no reading of the installers' sees a field this one does not: every
    ``*.dist-info/METADATA`` of the archive (there is to be one), each line that starts with
    ``Requires-Dist:`` (any case; a line as any of the installers' parsers splits them,
    header or body), its value running on to a ``\n`` followed by no space or tab; and a value may hold only the characters of a plain requirement, so
    no URL, path, ``@`` or RFC 2047 encoded word (``=?utf-8?q?...?=``, which uv decodes).
    An archive with two entries of one name, or no METADATA, is refused too, and one whose
    central directory is not where its end record says (which zip readers find
    differently) or is over ``_MAX_DIRECTORY`` bytes, before it is read (reading it takes
    memory of the runner's in proportion)."""
    try:
        offset = _directory_offset(wheel)
        with zipfile.ZipFile(wheel) as archive:
            if archive.start_dir != offset:
                # ``zipfile`` takes the directory to end where the end record starts and
                # shifts every offset by the difference (data put before the archive);
                # another reader goes by the offsets written, and may read another one.
                raise WheelRefused(
                    "the wheel's zip directory is not where the archive says it is (data "
                    "before the archive, or a second directory)"
                )
            entries = archive.infolist()
            names = [e.filename for e in entries]
            if len(set(names)) != len(names):
                raise WheelRefused("the wheel (a zip archive) holds two entries of one name")
            metadata = [e for e in entries if _METADATA.fullmatch(e.filename.replace("\\", "/"))]
            if not metadata:
                raise WheelRefused("the wheel holds no .dist-info/METADATA")
            for entry in metadata:
                if entry.file_size > _MAX_METADATA:
                    raise WheelRefused(
                        f"the wheel's {entry.filename} is over {_MAX_METADATA} bytes"
                    )
                with archive.open(entry) as file:
                    data = file.read(_MAX_METADATA + 1)
                if len(data) > _MAX_METADATA:  # the size an entry announces may lie
                    raise WheelRefused(
                        f"the wheel's {entry.filename} is over {_MAX_METADATA} bytes"
                    )
                text = data.decode("utf-8", "replace")
                for field in _REQUIRES_DIST.finditer(text):
                    if not _PLAIN_REQUIREMENT.fullmatch(field["value"]):
                        raise WheelRefused(
                            f"the wheel's {entry.filename} has a Requires-Dist that is not a "
                            "package's name, extras, versions and marker alone (a direct "
                            "reference, dep @ URL, which the installer would fetch itself): a "
                            "wheel names its dependencies by name, and a URL is a requirement "
                            "of its own"
                        )
    except (
        zipfile.BadZipFile,
        zipfile.LargeZipFile,
        zlib.error,
        EOFError,
        NotImplementedError,
        RuntimeError,
        ValueError,
        struct.error,
    ) as exc:  # corrupt (a name that is no UTF-8...), compressed or encrypted as none reads
        raise WheelRefused(f"the wheel is not a zip archive that can be read: {exc}") from None


def _directory_offset(wheel: Path) -> int | None:
    """Where the zip archive at ``wheel`` says its central directory starts (None: no end
    record, which ``zipfile`` then says). ``WheelRefused`` when that directory is over
    ``_MAX_DIRECTORY`` bytes: ``zipfile`` reads all of it, and makes an object of each
    entry, so a 4 GiB wheel of nothing else would take the runner's memory. Read as
    ``zipfile.ZipFile`` reads it (its own function), so no archive is judged on one record
    and then opened with another."""
    with open(wheel, "rb") as file:
        end = zipfile._EndRecData(file)  # type: ignore[attr-defined]
    if end is None:
        return None
    if end[_DIRECTORY_SIZE] > _MAX_DIRECTORY:
        raise WheelRefused(
            f"the wheel's zip directory takes {end[_DIRECTORY_SIZE]} bytes, over the "
            f"{_MAX_DIRECTORY} this node reads"
        )
    return int(end[_DIRECTORY_OFFSET])


class _Deadline:
    """Each socket operation's time: ``timeout`` seconds, or what is left of ``deadline``
    seconds from now when that is less; ``TimeoutError`` once the deadline has passed."""

    def __init__(self, timeout: float, deadline: float) -> None:
        self.timeout = timeout
        self.deadline = deadline
        self._end = time.monotonic() + deadline

    def left(self) -> float:
        left = self._end - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"the download took over the {self.deadline:.0f} s it may take")
        return min(self.timeout, left)

    def check(self, exc: TimeoutError) -> TimeoutError:
        """``exc`` (a socket's timeout), or the deadline's when that is what ran out."""
        return (
            TimeoutError(f"the download took over the {self.deadline:.0f} s it may take")
            if (time.monotonic() >= self._end)
            else exc
        )


class _BoundedSocket:
    """A connected socket as ``http.client`` uses it (``sendall``, ``makefile("rb")``,
    ``close``), each send and receive given what ``deadline`` leaves of its time: a
    buffered read of a megabyte is many receives, each of which a socket's own timeout
    would bound alone. Closed once it and the readers it made are (``http.client`` closes
    the connection and reads on from the answer's reader, as a socket's ``makefile``
    allows)."""

    def __init__(self, sock: socket.socket, deadline: _Deadline) -> None:
        self.sock = sock
        self.deadline = deadline
        self._readers = 0
        self._closed = False

    def sendall(self, data: bytes) -> None:
        self.sock.settimeout(self.deadline.left())
        try:
            self.sock.sendall(data)
        except TimeoutError as exc:
            raise self.deadline.check(exc) from None

    def makefile(self, mode: str) -> io.BufferedReader:
        self._readers += 1
        return io.BufferedReader(_BoundedReader(self))

    def close(self) -> None:
        self._closed = True
        self.reader_closed(0)

    def reader_closed(self, count: int = 1) -> None:
        self._readers -= count
        if self._closed and self._readers <= 0:
            self.sock.close()


class _BoundedReader(io.RawIOBase):
    def __init__(self, owner: _BoundedSocket) -> None:
        self._owner = owner

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        self._owner.sock.settimeout(self._owner.deadline.left())
        try:
            return self._owner.sock.recv_into(buffer)
        except TimeoutError as exc:
            raise self._owner.deadline.check(exc) from None

    def close(self) -> None:
        if not self.closed:
            self._owner.reader_closed()
        super().close()


class _PinnedHTTPS(http.client.HTTPSConnection):
    """An https connection to ``host`` that connects to ``address`` alone: SNI, the
    certificate's check and ``Host`` are the host name's (an address's when the URL names
    one), and no proxy is used; every socket operation within ``deadline``'s time.
    ``http.client`` follows no redirect."""

    def __init__(self, host: str, port: int, address: IPAddress, deadline: _Deadline) -> None:
        self._tls = ssl.create_default_context()
        super().__init__(host, port, timeout=deadline.timeout, context=self._tls)
        self._address = address
        self._deadline = deadline
        self._bounded: _BoundedSocket | None = None

    def connect(self) -> None:
        try:
            raw = socket.create_connection((str(self._address), self.port), self._deadline.left())
        except TimeoutError as exc:
            raise self._deadline.check(exc) from None
        try:
            raw.settimeout(self._deadline.left())  # the handshake, all of it
            tls = self._tls.wrap_socket(raw, server_hostname=self.host)
        except TimeoutError as exc:
            raw.close()
            raise self._deadline.check(exc) from None
        except BaseException:
            raw.close()
            raise
        self.sock = self._bounded = _BoundedSocket(tls, self._deadline)

    def release(self) -> None:
        """Close the socket, whatever reader of it is left open (an answer whose headers
        failed to arrive is not closed by ``http.client``)."""
        if self._bounded is not None:
            self._bounded.sock.close()


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

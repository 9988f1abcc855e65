"""What a job's ``requirements`` may hold: the one check the submission API (on what a user
sends) and the runner (on every grant, before anything is installed) both apply.

The runner hands each requirement to an installer (uv, pip) that runs as the runner, in the
runner's own folders. So nothing may name the node's files or change how the installer
works: no ``file:`` URL however spelled (``pkg @ FILE:///x``, ``file:x`` without a name,
``git+file:``), no local path (``./x.whl``, ``/abs/x.whl``, ``dist/x.whl``, ``~/x``), no
archive file name the installers take for a path in their working folder (``x.whl``,
``x.tar.gz``), no installer option (``-f``, ``--find-links``, ``--index-url``, ``-e``, ``-r``,
``-c``, or one after a requirement). Only a conservative subset of PEP 508 passes, a URL
only to a wheel over https, without credentials.

Contract: ``requirement_problem`` answers None for a requirement that may be installed,
else the reason (which never quotes the requirement's credentials). A grant reaches the
runner from old jobs and other producers than the API, so the runner does not trust that
the API checked: it asks again, and a requirement refused here fails the job as its own
error.

A wheel URL is also a request the node makes for the tenant: the runner downloads it in
the host's network (``services.runner.wheels``) and gives the installer the file.
``wheel_host`` reads the host and port it names as a repository's are read
(``shared.url_hosts``: refusing what the runner's judgement would read otherwise than its
download), ``wheel_address_problem`` refuses a host written as an address that is not
public (``shared.public_addresses``), which the submission API applies; a host name is left
to the runner, which resolves and judges it before installing
(``services.runner.launch.check_requirements``).
"""

from __future__ import annotations

import re
from typing import Final

from trainyard_platform.shared.public_addresses import address_problem, literal_address
from trainyard_platform.shared.url_hosts import WHEEL_SCHEMES, read_url

_REQ_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
_REQ_EXTRAS = rf"\[ *{_REQ_NAME}(?: *, *{_REQ_NAME})* *\]"
_REQ_VERSION = r"(?:===|==|!=|<=|>=|~=|<|>) *[A-Za-z0-9*][A-Za-z0-9.*+!_-]*"
_REQ_VERSIONS = rf"{_REQ_VERSION}(?: *, *{_REQ_VERSION})*"
_REQ_URL = r"(?:https|git\+https|git\+ssh)://[^\s;\x00-\x1f\x7f\"'\\]+"
WHEEL_URL: Final = re.compile(r"https://[^?#]+\.whl(?:[?#]\S*)?", re.IGNORECASE)
"""The only URL a requirement may name: a wheel. Runners install wheels only (building a
source distribution or a git checkout runs its code, as the runner)."""
_MARKER_VAR = (
    r"(?:python_version|python_full_version|os_name|sys_platform|platform_release"
    r"|platform_system|platform_version|platform_machine|platform_python_implementation"
    r"|implementation_name|implementation_version|extra)"
)
_MARKER_OP = r"(?:===|==|!=|<=|>=|~=|<|>|not +in|in)"
_MARKER_STR = r"(?:'[A-Za-z0-9_.*+!<>=~-]*'|\"[A-Za-z0-9_.*+!<>=~-]*\")"
_MARKER_ATOM = (
    rf"\(* *(?:{_MARKER_VAR} *{_MARKER_OP} *{_MARKER_STR}"
    rf"|{_MARKER_STR} *{_MARKER_OP} *{_MARKER_VAR}) *\)*"
)
_MARKER = rf"{_MARKER_ATOM}(?: +(?:and|or) +{_MARKER_ATOM})*"
REQUIREMENT: Final = re.compile(
    rf"{_REQ_NAME} *(?:{_REQ_EXTRAS})? *"
    rf"(?:{_REQ_VERSIONS}|\( *{_REQ_VERSIONS} *\)|@ *{_REQ_URL})? *"
    rf"(?:; *{_MARKER})? *"
)
"""A conservative subset of PEP 508: ``name[extras] <versions> ; <marker>`` or
``name @ https://...`` (which must also be a ``WHEEL_URL``). Spaces are the only whitespace,
marker strings hold no spaces, and nothing can start with ``-``: a requirement never turns
into a pip option (``--index-url``, ``-e``, ``--hash``), not even when written to a
requirements file, where pip splits a line at spaces."""

FILE_SUFFIXES: Final = (".txt", ".in", ".toml", ".cfg", ".lock")
"""A requirement whose name ends so is a requirements or project file a person meant to
list the contents of (``requirements.txt``), not a package."""
ARCHIVE_SUFFIXES: Final = (
    ".whl", ".zip", ".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz", ".tar.xz", ".txz",
    ".tlz", ".tar.lz", ".tar.lzma",
)  # fmt: skip
"""A requirement whose name ends so is an archive file to the installers (pip's and uv's
archive extensions): they install it from that path in their working folder, never a
package of that name from the index."""

_FILE_URL = re.compile(r"(?:^|[\s@+])file:", re.IGNORECASE)
"""A ``file:`` URL: after ``@`` (``pkg @ file:///x``), a ``+`` (``git+file:``), or on its own
(``file:///x.whl``, which the installers take as a URL too)."""

CREDENTIALS_IN_URL: Final = (
    "must not carry credentials (a user name, token or password before '@' in the host "
    "part): a job's spec is readable by its whole team and travels in the platform's "
    "events; give the URL without them"
)
WHEEL_CREDENTIALS: Final = (
    f"{CREDENTIALS_IN_URL} (packages of a private index come through the index the "
    "operator sets for the runners)"
)
LOCAL_PATH: Final = (
    "must be a PEP 508 requirement naming a package, not a local file or folder: the "
    "node's files are not a job's to install (a wheel of your own: "
    "name @ https://.../name-1.0-py3-none-any.whl)"
)


def has_userinfo(url: str) -> bool:
    """Whether ``url`` (``scheme://...``) names a user, token or password before its host:
    ``https://TOKEN@host/...``, ``https://user:password@host/...``."""
    authority = url.partition("://")[2].split("/", 1)[0].split("?", 1)[0].split("#", 1)[0]
    return "@" in authority


def without_credentials(requirement: str) -> str:
    """``requirement`` with the credentials of its URL (if any) written ``***``: to quote
    it in a reason."""
    return re.sub(r"(://)[^/@\s]*@", r"\1***@", requirement)


def requirement_problem(value: str) -> str | None:
    """Why ``value`` may not be one of a job's requirements, or None when it may."""
    if value.lstrip().startswith("-"):
        return "must be a requirement such as 'torch>=2.3', not a pip option"
    if any(c in value for c in "\r\n\x00"):
        return "must be one line (no newline or NUL)"
    if _FILE_URL.search(value):
        return "must not install from a file: URL"
    if not value.strip():
        return "must not be blank"
    head = value.split("@", 1)[0].split(";", 1)[0]
    if not re.search(r"\s-", value) and (
        "/" in head or "\\" in head or head.strip().startswith((".", "~"))
    ):
        return LOCAL_PATH
    if re.search(r"\s-", value) or not REQUIREMENT.fullmatch(value):
        return (
            "must be a PEP 508 requirement: name[extras], optional versions "
            "(torch>=2.3,<3), optional marker (; python_version>='3.11'), or "
            "name @ https://.../name-1.0-py3-none-any.whl"
        )
    name = re.match(r"[A-Za-z0-9._-]+", value.strip())
    if name is not None and name.group().lower().endswith(FILE_SUFFIXES):
        # A valid project name, but what a person means is the file's contents.
        return (
            f"{name.group()!r} is a file name, not a package: list the packages themselves, "
            "one item each (the lines of a requirements file)"
        )
    if name is not None and name.group().lower().endswith(ARCHIVE_SUFFIXES):
        return (
            f"{name.group()!r} is a file name, not a package (the installer would look for "
            "that file on the node): a wheel comes from a URL, "
            "name @ https://.../name-1.0-py3-none-any.whl"
        )
    url = wheel_url(value)
    # (An ssh URL keeps its login name, git@host: no credential.)
    if url is not None and url.startswith("https:") and has_userinfo(url):
        return WHEEL_CREDENTIALS
    if url is not None and not WHEEL_URL.fullmatch(url):
        return (
            "a URL must name a wheel (https://.../name-1.0-py3-none-any.whl): source "
            "distributions and git URLs are not installed, since building one runs its code"
        )
    return None


def wheel_url(value: str) -> str | None:
    """The URL the requirement ``value`` names (after ``@``), None when it names none. As
    PEP 508 and the installers read it, the URL runs to the first whitespace: a marker
    after it needs a space before its ``;`` (``x.whl;extra=='y'`` is one URL, no wheel's),
    so the API refuses what the runner would refuse."""
    url = re.search(r"@ *(\S+)", value)
    return None if url is None else url.group(1)


def wheel_host(value: str) -> tuple[str, int] | None:
    """The host (without brackets) and port of the wheel URL the requirement ``value`` (one
    ``requirement_problem`` passed) names, None when it names none; ``ValueError`` saying
    why for one no node fetches from: its host read as a repository's is
    (``shared.url_hosts.read_url``), and refused where programs would read it differently
    (whitespace, a character beyond ASCII, a percent-escape, a host ending in a number that
    is no address such as ``127.0.0.1.``, port 0, no host)."""
    url = wheel_url(value)
    if url is None:
        return None
    try:
        located = read_url(url, WHEEL_SCHEMES, "is not one the installers read as such")
    except ValueError as exc:
        raise ValueError(f"a URL {exc}") from None
    return located.host, located.port


def wheel_address_problem(value: str) -> str | None:
    """Why the wheel URL of the requirement ``value`` (one ``requirement_problem`` passed) is
    no URL a node fetches from, judged without asking DNS (``wheel_host``, and a host written
    as an address must be a public one), None when it may be (or names no URL)."""
    try:
        located = wheel_host(value)
    except ValueError as exc:
        return str(exc)
    if located is None:
        return None
    host = located[0]
    address = literal_address(host)
    problem = None if address is None else address_problem(address)
    if problem is None:
        return None
    shown = "" if str(address) == host else f" ({address})"
    return (
        f"a URL names the address {host}{shown}, {problem}: the runners fetch wheels only "
        "from public addresses (a wheel host of your company's own network: name it by its "
        "host name, which the runners' operator may allow)"
    )

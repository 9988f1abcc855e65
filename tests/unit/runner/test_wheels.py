"""What the runner makes of a job's wheel URL before and after asking its server: the file
name it saves it as, the address it may connect to, and whose fault each answer is."""

from __future__ import annotations

import socket
import warnings
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest

from trainyard_platform.services.runner import environments, wheels
from trainyard_platform.services.runner.environments import RequirementsError
from trainyard_platform.services.runner.git_remote import PUBLIC_ONLY, HostUnresolved
from trainyard_platform.services.runner.launch import requirements_field
from trainyard_platform.services.runner.wheels import (
    WheelRefused,
    WheelUnreachable,
    fetch_wheel,
    judge_status,
    refuse_direct_references,
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
        # Longer than a file system takes: the runner's own error would name its folders.
        f"https://h/{'a' * 250}-1.0-py3-none-any.whl",
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
        "https://wheels.example:99999/x-1.0-py3-none-any.whl",
        "https://wheels.example:abc/x-1.0-py3-none-any.whl",
        "https://[::1/x-1.0-py3-none-any.whl",
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


def _archive(folder: Path, entries: list[tuple[str, bytes]]) -> Path:
    wheel = folder / "pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Duplicate name": wanted, where it is
        for name, data in entries:
            archive.writestr(name, data)
    return wheel


def _metadata(requires: str) -> bytes:
    return f"Metadata-Version: 2.1\nName: pkg\nVersion: 1.0\n{requires}\nBody\n".encode(
        errors="surrogateescape"
    )


@pytest.mark.parametrize(
    "requires",
    [
        "",
        "Requires-Dist: six",
        "Requires-Dist: six (>=1.16,<2)",
        "Requires-Dist: Six[a,b] >=1.16, !=1.17.*; python_version >= '3.8' and extra == 'x'",
        'Requires-Dist: tabulate ; sys_platform == "linux" or platform_machine == "x86_64"',
        "Requires-Dist: six\r\nRequires-Dist: tabulate\r\n",
        "Author-email: someone@example.com\nProject-URL: home, https://example.com",
        # Not at a line's start: no field of any parser.
        "Description: how the requires-dist: field names https://example.com/x.whl",
    ],
)
def test_a_wheel_whose_dependencies_are_named_plainly_is_taken(
    tmp_path: Path, requires: str
) -> None:
    wheel = _archive(tmp_path, [("pkg-1.0.dist-info/METADATA", _metadata(requires))])
    refuse_direct_references(wheel)


@pytest.mark.parametrize(
    "requires",
    [
        "Requires-Dist: dep @ https://169.254.169.254/dep-1.0-py3-none-any.whl",
        "Requires-Dist: dep@http://127.0.0.1:5432/",
        "requires-dist: dep @ git+https://10.0.0.1/x.git",
        "REQUIRES-DIST : dep @ file:///etc/passwd",
        # Folded: a line that starts with a space goes on with the one before.
        "Requires-Dist: dep\n @ https://169.254.169.254/x.whl",
        "Requires-Dist: dep\r\n\t@ https://169.254.169.254/x.whl",
        # A line break as one installer's parser splits lines and another does not.
        "Requires-Dist: dep\r@ https://169.254.169.254/x.whl",
        "Summary: x\x0cRequires-Dist: dep @ https://169.254.169.254/x.whl",
        "Summary: x\u2028Requires-Dist: dep @ https://169.254.169.254/x.whl",
        # An RFC 2047 encoded word, which uv's mail parser decodes ("dep @ https://...").
        "Requires-Dist: =?utf-8?q?dep_=40_https=3A//169.254.169.254/x.whl?=",
        "Requires-Dist: =?utf-8?b?ZGVwIEAgaHR0cHM6Ly8xNjkuMjU0LjE2OS4yNTQveC53aGw=?=",
        # Not UTF-8 where a value is.
        "Requires-Dist: dep \udcff",
    ],
)
def test_a_wheel_naming_a_dependency_by_url_is_refused(tmp_path: Path, requires: str) -> None:
    """uv and pip fetch a dependency's URL themselves, from a wheel installed from a file
    too, where the runner judges nothing: a wheel naming one, however its metadata is
    written, is refused before the installer sees it."""
    wheel = _archive(tmp_path, [("pkg-1.0.dist-info/METADATA", _metadata(requires))])
    with pytest.raises(WheelRefused, match="direct reference"):
        refuse_direct_references(wheel)


@pytest.mark.parametrize(
    "entries",
    [
        # Every dist-info's METADATA is read, whichever an installer takes.
        [("pkg-1.0.dist-info/METADATA", _metadata("")),
         ("other-1.0.dist-info/METADATA", _metadata("Requires-Dist: d @ https://h/d.whl"))],
        [("pkg-1.0.dist-info/METADATA", _metadata("")),
         ("./pkg-1.0.dist-info/metadata", _metadata("Requires-Dist: d @ https://h/d.whl"))],
        [("pkg-1.0.dist-info\\METADATA", _metadata("Requires-Dist: d @ https://h/d.whl"))],
    ],
)  # fmt: skip
def test_every_metadata_of_the_wheel_is_read(
    tmp_path: Path, entries: list[tuple[str, bytes]]
) -> None:
    with pytest.raises(WheelRefused, match="direct reference"):
        refuse_direct_references(_archive(tmp_path, entries))


def test_an_archive_an_installer_may_read_otherwise_is_refused(tmp_path: Path) -> None:
    """Two entries of one name (which one is read is the zip reader's choice), no
    METADATA, no zip at all."""
    twice = [
        ("pkg-1.0.dist-info/METADATA", _metadata("Requires-Dist: d @ https://h/d.whl")),
        ("pkg-1.0.dist-info/METADATA", _metadata("")),
    ]
    with pytest.raises(WheelRefused, match="two entries of one name"):
        refuse_direct_references(_archive(tmp_path, twice))
    with pytest.raises(WheelRefused, match=r"no \.dist-info/METADATA"):
        refuse_direct_references(_archive(tmp_path, [("pkg/__init__.py", b"")]))
    # Data before the archive: zipfile shifts every offset by it and reads the directory
    # before the end record; a reader going by the offsets written may read another.
    plain = _archive(tmp_path, [("pkg-1.0.dist-info/METADATA", _metadata(""))]).read_bytes()
    (tmp_path / "shifted.whl").write_bytes(b"\0" * 64 + plain)
    with pytest.raises(WheelRefused, match="not where the archive says"):
        refuse_direct_references(tmp_path / "shifted.whl")
    # A name flagged UTF-8 that is not: zipfile raised UnicodeDecodeError, no WheelRefused.
    named = _archive(tmp_path, [("pkg/\u00e9.py", b""), ("pkg-1.0.dist-info/METADATA", b"")])
    (tmp_path / "badname.whl").write_bytes(named.read_bytes().replace(b"\xc3\xa9", b"\xc3\x28"))
    with pytest.raises(WheelRefused, match="not a zip archive that can be read"):
        refuse_direct_references(tmp_path / "badname.whl")
    (tmp_path / "not.whl").write_bytes(b"not a zip")
    with pytest.raises(WheelRefused, match="not a zip archive"):
        refuse_direct_references(tmp_path / "not.whl")


def test_a_wheel_whose_zip_directory_is_large_is_refused_before_it_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``zipfile`` reads all the central directory and makes an object of each entry: a
    4 GiB wheel of nothing else would take the runner's memory, so its size is read first
    (the bound made small here: a real one would take a 16 MiB archive)."""
    entries = [(f"pkg/{'m' * 60}{i}.py", b"") for i in range(40)]
    entries.append(("pkg-1.0.dist-info/METADATA", _metadata("")))
    wheel = _archive(tmp_path, entries)
    refuse_direct_references(wheel)
    monkeypatch.setattr(wheels, "_MAX_DIRECTORY", 2000)
    with pytest.raises(WheelRefused, match=r"zip directory takes \d+ bytes, over the 2000"):
        refuse_direct_references(wheel)


def test_the_wheel_urls_of_an_environment_share_one_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each download had the whole ``timeout``: a hundred slow wheel URLs held the build a
    hundred times over. Now the next one gets what the ones before left, and none starts
    once it is spent."""
    clock = [1000.0]
    given: list[float] = []

    def fetch(url: str, folder: Path, *args: Any, deadline: float, **kwargs: Any) -> Any:
        given.append(deadline)
        clock[0] += 400  # this download took 400 s
        path = folder / wheel_file_name(url)
        path.write_bytes(b"wheel")
        return path, "digest"

    monkeypatch.setattr(environments, "fetch_wheel", fetch)
    monkeypatch.setattr(environments, "refuse_direct_references", lambda path: None)
    monkeypatch.setattr(environments.time, "monotonic", lambda: clock[0])
    cache = environments.EnvironmentCache(tmp_path / "envs", "python3", timeout=1000)
    requirements = [f"p{i} @ https://h/p{i}-1.0-py3-none-any.whl" for i in range(4)]
    with pytest.raises(environments.InstallError, match="took over the 1000 s") as caught:
        cache._download_wheels(tmp_path / "wheels", requirements)
    assert given == [1000, 600, 200]
    assert caught.value.requirement == requirements[3]

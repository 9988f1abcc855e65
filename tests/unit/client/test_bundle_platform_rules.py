"""``trainyard submit`` refuses, before it uploads anything, to pack code the platform would
refuse (``trainyard.bundle_archive``, the rule the submission service and the runner check
bundles with): the error names the file and the rule, and how to leave it out.

Before, the CLI packed and uploaded such a directory and the service answered 422 (or the
runner failed the job) after the upload."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import trainyard.bundle
import trainyard.bundle_archive
from trainyard.bundle import BundleError, pack
from trainyard.bundle_archive import MAX_BUNDLE_DEPTH, BundleRefused
from trainyard.cli_jobs import upload_code


def _leftovers(out: Path) -> list[Path]:
    return list(out.iterdir())


@pytest.fixture
def out(tmp_path: Path) -> Path:
    folder = tmp_path / "out"
    folder.mkdir()
    return folder


def test_a_path_deeper_than_the_platform_unpacks_is_named(tmp_path: Path, out: Path) -> None:
    code = tmp_path / "code"
    deep = code.joinpath(*(["d"] * MAX_BUNDLE_DEPTH))
    deep.mkdir(parents=True)
    (deep / "x.txt").write_text("x")
    (code / "train.py").write_text("print(1)")
    with pytest.raises(BundleError) as refused:
        pack(code, out_dir=out)
    said = str(refused.value)
    assert f"the code in {code} cannot be uploaded: " in said
    assert f"is {MAX_BUNDLE_DEPTH + 1} levels deep: at most {MAX_BUNDLE_DEPTH}" in said
    assert "'d/d/d/d" in said and "x.txt'" in said  # the file, its middle left out
    assert ".trainyardignore" in said and "--no-code" in said
    assert _leftovers(out) == []


def test_a_name_longer_than_file_systems_hold_is_named(
    tmp_path: Path, out: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Linux's own file systems cannot hold a name over 255 bytes, others (255 UTF-16
    # characters) can: the rule's limit is lowered to meet it here.
    monkeypatch.setattr(trainyard.bundle_archive, "NAME_MAX", 12)
    code = tmp_path / "code"
    (code / "data").mkdir(parents=True)
    (code / "data" / "résumé-final.txt").write_text("x")
    with pytest.raises(BundleError) as refused:
        pack(code, out_dir=out)
    assert "'data/résumé-final.txt' has a folder or file name of 18 bytes" in str(refused.value)
    assert "at most 12 bytes" in str(refused.value)


def test_too_many_files_or_bytes_are_refused_before_packing(
    tmp_path: Path, out: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code = tmp_path / "code"
    code.mkdir()
    for name, size in (("a.bin", 300), ("b.bin", 200), ("c.py", 10)):
        (code / name).write_bytes(b"x" * size)
    monkeypatch.setattr(trainyard.bundle, "MAX_BUNDLE_MEMBERS", 2)
    with pytest.raises(BundleError, match="it has 3 files and folders to pack, more than 2"):
        pack(code, out_dir=out)
    monkeypatch.setattr(trainyard.bundle, "MAX_BUNDLE_MEMBERS", 10)
    monkeypatch.setattr(trainyard.bundle, "MAX_UNPACKED_BYTES", 400)
    with pytest.raises(BundleError) as refused:
        pack(code, out_dir=out)
    assert "its files add up to 510 B, more than a bundle may unpack to (400 B)" in str(
        refused.value
    )
    assert "largest files: a.bin (300 B), b.bin (200 B), c.py (10 B)" in str(refused.value)
    assert _leftovers(out) == []


def test_the_packed_archive_is_checked_whole_as_the_service_checks_it(
    tmp_path: Path, out: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checked: list[bytes] = []

    def check_bundle(archive: Any) -> None:
        checked.append(archive.read(2))
        raise BundleRefused("'x' is in it twice")

    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("print(1)")
    monkeypatch.setattr(trainyard.bundle, "check_bundle", check_bundle)
    with pytest.raises(BundleError, match="cannot be uploaded: 'x' is in it twice"):
        pack(code, out_dir=out)
    assert checked == [b"\x1f\x8b"]  # the gzip it wrote
    assert _leftovers(out) == []


def test_nothing_is_uploaded_when_the_code_breaks_a_rule(tmp_path: Path) -> None:
    class Client:
        uploads: list[str] = []

        def upload_bundle(self, path: Path, sha256: str) -> bool:
            self.uploads.append(sha256)
            return True

    code = tmp_path / "code"
    code.joinpath(*(["d"] * (MAX_BUNDLE_DEPTH + 1))).mkdir(parents=True)
    client = Client()
    with pytest.raises(BundleError):
        upload_code(client, code, max_bytes=10**6)  # type: ignore[arg-type]
    assert client.uploads == []

"""Code bundles: what goes in, determinism, links, and the size limit."""

from __future__ import annotations

import gzip
import os
import tarfile
import time
from pathlib import Path

import pytest

from trainyard.bundle import (
    Bundle,
    BundleError,
    BundleTooLarge,
    format_size,
    list_files,
    pack,
)


def _tree(root: Path, files: dict[str, str | bytes]) -> Path:
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    return root


def _members(bundle: Bundle) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(bundle.path, "r:gz") as tar:
        return {m.name: m for m in tar.getmembers()}


@pytest.fixture
def out(tmp_path: Path) -> Path:
    folder = tmp_path / "out"
    folder.mkdir()
    return folder


def test_ignore_rules_root_nested_negation_and_trainyardignore(tmp_path: Path) -> None:
    root = _tree(
        tmp_path / "w",
        {
            "train.py": "print('hi')\n",
            "pkg/model.py": "",
            "pkg/.gitignore": "*.ckpt\n!keep.ckpt\n/local.txt\n",
            "pkg/a.ckpt": "x",
            "pkg/keep.ckpt": "x",
            "pkg/local.txt": "x",
            "pkg/sub/local.txt": "kept: /local.txt is anchored to pkg/",
            ".gitignore": "*.log\nbuild/\ndata/\n!data/keep.csv\n",
            "run.log": "x",
            "build/out.bin": "x",
            "src/build/x.py": "x",  # build/ matches at any depth
            "data/big.csv": "x",
            "data/keep.csv": "x",  # git cannot re-include inside an excluded folder
            ".trainyardignore": "notebooks/\n!run.log\n",
            "notebooks/scratch.ipynb": "{}",
            ".git/HEAD": "ref",
            ".venv/bin/python": "x",
            "pkg/__pycache__/model.cpython-311.pyc": b"\0",
            ".trainyard/objects/x": "x",
            "nested/.git/config": "x",
        },
    )
    assert list_files(root) == [
        ".gitignore",
        ".trainyardignore",
        "nested/",  # its .git/ is left out
        "pkg/",
        "pkg/.gitignore",
        "pkg/keep.ckpt",
        "pkg/model.py",
        "pkg/sub/",
        "pkg/sub/local.txt",
        "run.log",  # re-included by .trainyardignore, which overrides .gitignore
        "src/",
        "train.py",
    ]


def test_same_contents_give_the_same_bytes(tmp_path: Path, out: Path) -> None:
    files = {"a.py": "x = 1\n", "pkg/b.py": "y = 2\n", "run.sh": "#!/bin/sh\n"}
    first = _tree(tmp_path / "one", files)
    second = _tree(tmp_path / "two", dict(reversed(files.items())))
    (first / "run.sh").chmod(0o750)
    (second / "run.sh").chmod(0o700)  # any execute bit: 0755
    (first / "a.py").chmod(0o600)
    os.utime(second / "a.py", (1, 1))
    a = pack(first, out_dir=out)
    time.sleep(0.01)
    b = pack(second, out_dir=out)
    assert a.path != b.path
    assert a.sha256 == b.sha256 and a.size_bytes == b.size_bytes
    assert a.path.read_bytes() == b.path.read_bytes()
    assert a.size_bytes == a.path.stat().st_size
    (first / "a.py").write_text("x = 2\n")
    assert pack(first, out_dir=out).sha256 != a.sha256


def test_entries_are_normalised(tmp_path: Path, out: Path) -> None:
    root = _tree(tmp_path / "w", {"z.py": "", "a/b.py": "b", "run.sh": "#!/bin/sh\n"})
    (root / "run.sh").chmod(0o744)
    bundle = pack(root, out_dir=out)
    members = _members(bundle)
    assert list(members) == ["a", "a/b.py", "run.sh", "z.py"]
    for member in members.values():
        assert (member.mtime, member.uid, member.gid, member.uname, member.gname) == (
            0,
            0,
            0,
            "",
            "",
        )
    assert members["a"].isdir() and members["a"].mode == 0o755
    assert members["run.sh"].mode == 0o755
    assert members["z.py"].mode == 0o644
    with gzip.open(bundle.path) as gz:
        gz.read()
    header = bundle.path.read_bytes()[:10]
    assert header[4:8] == b"\0\0\0\0"  # gzip mtime 0
    assert not header[3] & 0x08  # no file name in the gzip header
    with tarfile.open(bundle.path, "r:gz") as tar:
        extracted = tar.extractfile("a/b.py")
        assert extracted is not None and extracted.read() == b"b"


def test_symlinks_inside_are_kept_outside_ones_are_skipped(tmp_path: Path, out: Path) -> None:
    secret = _tree(tmp_path, {"secret.txt": "password"}) / "secret.txt"
    root = _tree(
        tmp_path / "w", {"conf/base.yaml": "a: 1", "ignored.log": "x", ".gitignore": "*.log"}
    )
    (root / "conf" / "current.yaml").symlink_to("base.yaml")
    (root / "abs.yaml").symlink_to(root / "conf" / "base.yaml")  # absolute but inside
    (root / "confdir").symlink_to("conf")
    (root / "leak").symlink_to(secret)
    (root / "up").symlink_to("..")
    (root / "dangling").symlink_to("nowhere")
    (root / "to-ignored").symlink_to("ignored.log")
    warnings: list[str] = []
    bundle = pack(root, out_dir=out, warn=warnings.append)
    members = _members(bundle)
    assert members["conf/current.yaml"].issym()
    assert members["conf/current.yaml"].linkname == "base.yaml"
    assert members["abs.yaml"].linkname == "conf/base.yaml"
    assert members["confdir"].linkname == "conf"
    for skipped in ("leak", "up", "dangling", "to-ignored"):
        assert skipped not in members
        assert any(w.startswith(f"skipping symlink {skipped}:") for w in warnings), warnings
    assert any("outside" in w for w in warnings if w.startswith("skipping symlink leak"))
    with tarfile.open(bundle.path, "r:gz") as tar:
        tar.extractall(tmp_path / "x", filter="data")  # a strict extractor accepts it
    assert (tmp_path / "x" / "confdir" / "base.yaml").read_text() == "a: 1"


def test_size_limit_names_the_largest_files(tmp_path: Path, out: Path) -> None:
    root = _tree(
        tmp_path / "w",
        {
            "train.py": "print(1)\n",
            "data/weights.bin": os.urandom(300_000),
            "data/small.bin": os.urandom(100_000),
        },
    )
    with pytest.raises(BundleTooLarge) as caught:
        pack(root, max_bytes=200_000, out_dir=out)
    message = str(caught.value)
    assert "larger than 195.3 KiB" in message
    assert message.index("data/weights.bin (293.0 KiB)") < message.index("data/small.bin")
    assert ".trainyardignore" in message and "TRAINYARD_BUNDLE_MAX_BYTES" in message
    assert list(out.iterdir()) == []  # nothing left behind
    (root / ".trainyardignore").write_text("data/\n")
    assert pack(root, max_bytes=200_000, out_dir=out).size_bytes < 1000


def test_not_a_directory(tmp_path: Path) -> None:
    with pytest.raises(BundleError, match="is not a directory"):
        pack(tmp_path / "missing")


def test_empty_directory_packs(tmp_path: Path, out: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    bundle = pack(empty, out_dir=out)
    assert _members(bundle) == {}


def test_format_size() -> None:
    assert format_size(512) == "512 B"
    assert format_size(1_258_291) == "1.2 MiB"

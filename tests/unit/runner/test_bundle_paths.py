"""A bundle whose paths the node's file system cannot hold (a name over 255 bytes, a path
over 4095, folders nested thousands deep, a name that is also a folder's) fails the job as
its own error, naming the entry and why, like every other bundle the rule refuses; only the
node's own disk failing (full, read-only, I/O errors) is the node's.

Before: such a bundle failed as ``platform_error`` ("could not be unpacked on this node:
[Errno 36] File name too long: '<the node's path>'"), retried on other nodes where it
failed the same way, and a file nested 1,500 folders deep raised a ``RecursionError``
out of the unpacking, which nobody classified."""

from __future__ import annotations

import errno
import os
import tarfile
from pathlib import Path
from typing import Any

import pytest

from tests.unit.runner.test_sandbox import store_bundle
from trainyard_platform.services.runner.sandbox import (
    JobInputError,
    PlatformError,
    counts_against_node,
    failure_kind,
    fetch_bundle,
)
from trainyard_platform.shared.storage import LocalStore

LONG_NAME = "x" * 300 + ".py"
LONG_PATH = "/".join(["d" * 200] * 25) + "/train.py"
DEEP = "a/" * 1500 + "train.py"
NEAR_THE_LIMIT = "/".join(["d" * 200] * 20) + "/" + "t" * 60 + ".py"
"""4083 bytes: a path the upload's rule allows, past 4095 with the node's folder before it."""


@pytest.mark.parametrize(
    ("files", "says"),
    [
        ({LONG_NAME: b""}, "255 bytes"),
        ({f"pkg/{LONG_NAME}": b""}, "255 bytes"),
        ({LONG_PATH: b""}, "4095 bytes"),
        ({DEEP: b""}, "levels deep"),
        ({NEAR_THE_LIMIT: b""}, "File name too long (a name or path longer than this node's"),
        ({"data": b"x", "data/train.py": b""}, "inside file 'data'"),
    ],
    ids=["long-name", "long-name-in-folder", "long-path", "deep", "near-limit", "inside-a-file"],
)
def test_a_bundle_the_file_system_cannot_hold_is_the_jobs_own_error(
    tmp_path: Path, files: dict[str, bytes], says: str
) -> None:
    store = LocalStore(tmp_path / "store")
    bundle = store_bundle(store, "a", {"train.py": b"", **files})
    with pytest.raises(PlatformError) as raised:
        fetch_bundle(store, "a", bundle, tmp_path / "code")
    assert failure_kind(raised.value) == "user_error"
    assert not counts_against_node(raised.value)
    reason = str(raised.value)
    assert reason.startswith(f"spec.code.sha256: code bundle {bundle.sha256[:12]} cannot be ")
    assert says in reason, reason
    assert str(tmp_path) not in reason, "the node's own folders are not the job's to read"
    assert len(reason) < 1000, "a name thousands of bytes long is shortened"


@pytest.mark.parametrize(
    ("code", "kind", "counts", "says"),
    [
        # What the bundle's names are: the same on every node of the file system's kind.
        (errno.ENAMETOOLONG, "user_error", False, "longer than this node's file system"),
        (errno.EILSEQ, "user_error", False, "a name this node's file system refuses"),
        (errno.EINVAL, "user_error", False, "a name this node's file system refuses"),
        (errno.EMLINK, "user_error", False, "too many entries in one folder"),
        (errno.ENOTDIR, "user_error", False, "both a file and a folder"),
        (errno.EEXIST, "user_error", False, "both a file and a folder"),
        # The node's disk.
        (errno.ENOSPC, "platform_error", True, "No space left"),
        (errno.EIO, "platform_error", True, "Input/output error"),
        (errno.EROFS, "platform_error", True, "Read-only"),
        (errno.EDQUOT, "platform_error", True, "quota"),
        # Neither surely: the platform's, but not the node's.
        (errno.EACCES, "platform_error", False, "Permission denied"),
    ],
)
def test_an_error_unpacking_is_the_bundles_only_when_its_names_cause_it(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    code: int,
    kind: str,
    counts: bool,
    says: str,
) -> None:
    store = LocalStore(tmp_path / "store")
    bundle = store_bundle(store, "a", {"train.py": b""})
    dest = tmp_path / "code"

    def extractall(self: tarfile.TarFile, *args: Any, **kwargs: Any) -> None:
        raise OSError(code, os.strerror(code), str(dest / "pkg/m.py"))

    monkeypatch.setattr(tarfile.TarFile, "extractall", extractall)
    with pytest.raises(PlatformError) as raised:
        fetch_bundle(store, "a", bundle, dest)
    assert failure_kind(raised.value) == kind
    assert counts_against_node(raised.value) is counts
    reason = str(raised.value)
    assert says in reason, reason
    if kind == "user_error":
        assert isinstance(raised.value, JobInputError)
        assert "'pkg/m.py'" in reason and str(dest) not in reason, reason

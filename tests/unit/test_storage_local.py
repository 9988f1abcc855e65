"""``LocalStore`` specifics and URI handling; the shared contract is in tests/contract."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from trainyard_platform.shared.settings import StorageSettings
from trainyard_platform.shared.storage import (
    LocalStore,
    open_store,
    split_uri,
    validate_key,
    validate_prefix,
)
from trainyard_platform.shared.storage.base import TEMP_PREFIX, ObjectTooLarge, bounded


def test_absolute_file_uri_roots_the_store_there(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path}/objects")
    assert isinstance(store, LocalStore)
    store.put_bytes("a/b.txt", b"hi")
    assert (tmp_path / "objects" / "a" / "b.txt").read_bytes() == b"hi"
    assert store.root_uri == (tmp_path / "objects").as_uri()
    assert store.uri_for("a/b.txt") == (tmp_path / "objects" / "a" / "b.txt").as_uri()


def test_relative_file_uri_is_resolved_once_at_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    store = open_store("file://./.trainyard/objects")
    monkeypatch.chdir("/")  # a later chdir must not move the store
    store.put_bytes("k", b"v")
    assert (tmp_path / ".trainyard" / "objects" / "k").read_bytes() == b"v"
    assert store.uri_for("k") == f"file://{tmp_path}/.trainyard/objects/k"


def test_default_settings_uri_opens_a_local_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TRAINYARD_STORAGE_URI", raising=False)
    store = open_store(StorageSettings().uri)
    assert isinstance(store, LocalStore)
    assert store.root == tmp_path / ".trainyard" / "objects"


def test_localhost_and_percent_encoded_file_uris(tmp_path: Path) -> None:
    store = open_store(f"file://localhost{tmp_path}/with%20space")
    store.put_bytes("x", b"1")
    assert (tmp_path / "with space" / "x").read_bytes() == b"1"
    assert "with%20space" in store.uri_for("x")


def test_opening_creates_nothing_until_the_first_write(tmp_path: Path) -> None:
    root = tmp_path / "not" / "yet"
    store = open_store(root.as_uri())
    assert not root.exists()
    assert store.list() == []
    assert not store.exists("k")
    store.put_bytes("k", b"v")
    assert root.is_dir()


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("gs://bucket/x", "unsupported object-store scheme 'gs'"),
        ("http://host/x", "unsupported object-store scheme 'http'"),
        ("/just/a/path", "not an object-store URI"),
        ("file://remotehost/x", "remote hosts are not supported"),
        ("s3:///prefix-without-bucket", "names no bucket"),
    ],
)
def test_bad_uris_are_refused(uri: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        open_store(uri)


def test_failed_write_keeps_the_old_object_and_leaves_no_temp_file(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "root")
    store.put_bytes("obj", b"old")
    # A directory as the source fails mid-write, after the temp file exists.
    with pytest.raises(IsADirectoryError):
        store.put_file("obj", tmp_path)
    assert store.get_bytes("obj") == b"old"
    assert os.listdir(tmp_path / "root") == ["obj"]


def test_writes_are_renamed_into_place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    replaced: list[tuple[str, str]] = []
    real_replace = os.replace

    def spy(src: str, dst: str) -> None:
        replaced.append((os.path.basename(src), os.path.basename(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    store = LocalStore(tmp_path)
    store.put_bytes("dir/file.bin", b"x")
    [(src, dst)] = replaced
    assert src.startswith(TEMP_PREFIX) and dst == "file.bin"


def test_in_progress_writes_are_not_listed(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    store.put_bytes("step-00000001/checkpoint.pt", b"done")
    # What a writer killed mid-upload leaves behind.
    (tmp_path / "step-00000001" / f"{TEMP_PREFIX}manifest.json.abc123").write_bytes(b"{")
    (tmp_path / f"{TEMP_PREFIX}dir").mkdir()
    (tmp_path / f"{TEMP_PREFIX}dir" / "inner").write_bytes(b"x")
    assert store.list() == ["step-00000001/checkpoint.pt"]


def test_a_file_cannot_also_be_a_folder(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    store.put_bytes("a", b"file")
    with pytest.raises(OSError):
        store.put_bytes("a/b", b"under a file")
    assert store.get_bytes("a") == b"file"


def test_traversal_keys_cannot_reach_outside_the_root(tmp_path: Path) -> None:
    outside = tmp_path / "secret.txt"
    outside.write_bytes(b"secret")
    store = LocalStore(tmp_path / "root")
    for key in ("../secret.txt", "a/../../secret.txt", str(outside)):
        with pytest.raises(ValueError):
            store.get_bytes(key)


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        (
            "s3://bucket/jobs/j1/step-00000001/checkpoint.pt",
            ("s3://bucket/jobs/j1/step-00000001", "checkpoint.pt"),
        ),
        ("s3://bucket/top.bin", ("s3://bucket", "top.bin")),
        ("file:///data/my%20run/model.pt", ("file:///data/my%20run", "model.pt")),
        ("file:///data/with%20space.pt", ("file:///data", "with space.pt")),
        ("file:///root.pt", ("file:///", "root.pt")),
        ("file://./rel/x.pt", ("file://./rel", "x.pt")),
    ],
)
def test_split_uri(uri: str, expected: tuple[str, str]) -> None:
    assert split_uri(uri) == expected


@pytest.mark.parametrize("uri", ["s3://bucket", "s3://bucket/", "file:///dir/", "ftp://x/y"])
def test_split_uri_refuses_uris_without_an_object(uri: str) -> None:
    with pytest.raises(ValueError):
        split_uri(uri)


def test_split_uri_of_a_local_object_opens_it(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "a b")
    store.put_bytes("c d/e f.bin", b"data")
    folder, name = split_uri(store.uri_for("c d/e f.bin"))
    assert open_store(folder).get_bytes(name) == b"data"


@pytest.mark.parametrize(
    "key", ["a", "a/b/c.pt", ".hidden", "a.b/..c", "step-00000001/manifest.json", "x y/ü"]
)
def test_valid_keys(key: str) -> None:
    assert validate_key(key) == key


def test_prefixes_may_be_empty_or_end_in_a_slash() -> None:
    assert validate_prefix("") == ""
    assert validate_prefix("step-00000001/") == "step-00000001/"
    with pytest.raises(ValueError, match="empty segment"):
        validate_prefix("a//")


def test_a_bounded_read_asks_for_no_chunk_past_its_bound() -> None:
    """Where the size is not known before the read (a file that grows, a server that sends
    more than it said), the bytes are counted as they come: once past the bound, no further
    chunk is asked for, however many the source would give."""
    asked = 0

    def endless() -> Iterator[bytes]:
        nonlocal asked
        while True:
            asked += 1
            yield b"x" * 1000

    taken = []
    with pytest.raises(ObjectTooLarge) as refused:
        for chunk in bounded(endless(), "k", 2500, "file:///store/k"):
            taken.append(chunk)
    assert (asked, len(taken)) == (3, 2)
    assert refused.value.size_bytes is None
    assert str(refused.value) == (
        "object 'k' (file:///store/k) is more than 2500 bytes, over the 2500 bytes allowed: "
        "not read past them"
    )
    assert b"".join(bounded(iter([b"ab", b"c"]), "k", 3)) == b"abc"
    assert b"".join(bounded(iter([b"ab", b"c"]), "k", None)) == b"abc"


def test_a_file_larger_than_its_bound_is_refused_by_its_size(tmp_path: Path) -> None:
    """A file's size is known before it is read: over the bound, the refusal says it."""
    store = LocalStore(tmp_path)
    store.put_bytes("big", b"y" * 5000)
    with pytest.raises(ObjectTooLarge) as refused:
        store.get_file("big", tmp_path / "out", max_bytes=4999)
    assert refused.value.size_bytes == 5000
    assert "is 5000 bytes, over the 4999 bytes allowed" in str(refused.value)
    assert not (tmp_path / "out").exists()

"""The ``ObjectStore`` contract (see ``shared.storage.base``), run against every backend."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.contract.conftest import Backend
from trainyard_platform.shared.storage import (
    ObjectNotFound,
    ObjectStore,
    ObjectTooLarge,
    split_uri,
)

BAD_KEYS = [
    ("", "empty"),
    ("/etc/passwd", "relative"),
    ("a/../../etc/passwd", "'..'"),
    ("..", "'..'"),
    ("./a", "'.'"),
    ("a\\..\\b", "backslash"),
    ("a\x00b", "NUL"),
    ("a//b", "empty segment"),
    ("a/", "empty segment"),
    (".trainyard-tmp-x", "reserved"),
]


def test_put_and_get_bytes_round_trip_and_overwrite(store: ObjectStore) -> None:
    store.put_bytes("a/b/c.bin", b"first")
    assert store.get_bytes("a/b/c.bin") == b"first"
    store.put_bytes("a/b/c.bin", b"second, longer than the first")
    assert store.get_bytes("a/b/c.bin") == b"second, longer than the first"


def test_empty_object_is_an_object(store: ObjectStore) -> None:
    store.put_bytes("empty", b"")
    assert store.exists("empty")
    assert store.get_bytes("empty") == b""
    assert store.list() == ["empty"]


def test_put_file_and_get_file_round_trip(store: ObjectStore, tmp_path: Path) -> None:
    # Larger than minio's 5 MiB multipart threshold would be slow on moto; 3 MiB still
    # spans several read chunks on both backends.
    payload = os.urandom(3 * 1024 * 1024 + 17)
    source = tmp_path / "source.bin"
    source.write_bytes(payload)
    store.put_file("blobs/big.bin", source)

    destination = tmp_path / "new" / "folders" / "big.bin"
    store.get_file("blobs/big.bin", destination)
    assert destination.read_bytes() == payload

    # An existing destination is replaced, not appended to.
    destination.write_bytes(b"x" * (len(payload) + 100))
    store.get_file("blobs/big.bin", destination)
    assert destination.read_bytes() == payload
    assert sorted(p.name for p in destination.parent.iterdir()) == ["big.bin"]


def test_a_read_with_a_bound_stops_at_it(store: ObjectStore, tmp_path: Path) -> None:
    """A reader that knows how large an object should be (a manifest, a spec) downloaded
    one larger whole before its own check refused it: a node's disk filled with an object
    that was never going to be used. ``max_bytes`` bounds the read: a larger object raises
    ``ObjectTooLarge`` naming the key and the bound (and its size where the backend said
    it), and leaves no file; one within it is read as ever."""
    payload = os.urandom(2 * 1024 * 1024 + 17)  # several read chunks
    store.put_bytes("blobs/big.bin", payload)
    destination = tmp_path / "out" / "big.bin"
    for bound in (len(payload) - 1, 1024, 0):
        with pytest.raises(ObjectTooLarge) as refused:
            store.get_file("blobs/big.bin", destination, max_bytes=bound)
        assert (refused.value.key, refused.value.max_bytes) == ("blobs/big.bin", bound)
        assert refused.value.size_bytes in (None, len(payload))
        assert f"over the {bound} bytes allowed" in str(refused.value)
        assert not destination.exists()
        with pytest.raises(ObjectTooLarge):
            store.get_bytes("blobs/big.bin", max_bytes=bound)
    assert not destination.parent.exists() or list(destination.parent.iterdir()) == []

    store.get_file("blobs/big.bin", destination, max_bytes=len(payload))
    assert destination.read_bytes() == payload
    assert store.get_bytes("blobs/big.bin", max_bytes=len(payload)) == payload
    store.put_bytes("empty", b"")
    assert store.get_bytes("empty", max_bytes=0) == b""
    with pytest.raises(ObjectNotFound):
        store.get_bytes("nope", max_bytes=10)


def test_missing_object_raises_object_not_found(store: ObjectStore, tmp_path: Path) -> None:
    with pytest.raises(ObjectNotFound) as caught:
        store.get_bytes("nope/missing.txt")
    assert isinstance(caught.value, KeyError)
    assert isinstance(caught.value, LookupError)
    assert caught.value.key == "nope/missing.txt"
    assert "nope/missing.txt" in str(caught.value)

    destination = tmp_path / "out" / "missing.txt"
    with pytest.raises(ObjectNotFound, match=r"missing\.txt"):
        store.get_file("nope/missing.txt", destination)
    assert not destination.exists()
    assert not store.exists("nope/missing.txt")


def test_size_is_the_stored_objects_or_none(store: ObjectStore) -> None:
    """A reader that checks a size it was told (a spec's bundle) against the stored object
    learns it in one look, without reading the object."""
    store.put_bytes("blobs/three.bin", b"abc")
    store.put_bytes("blobs/empty.bin", b"")
    assert store.size("blobs/three.bin") == 3
    assert store.size("blobs/empty.bin") == 0
    assert store.size("blobs/missing.bin") is None
    assert store.size("blobs/three.bin/below") is None  # a path through an object
    store.put_bytes("blobs/three.bin", b"longer now")
    assert store.size("blobs/three.bin") == len(b"longer now")


def test_a_folder_is_not_an_object(store: ObjectStore) -> None:
    store.put_bytes("folder/inner.txt", b"x")
    assert not store.exists("folder")
    assert store.size("folder") is None
    with pytest.raises(ObjectNotFound):
        store.get_bytes("folder")


def test_list_is_sorted_relative_and_filtered_by_string_prefix(store: ObjectStore) -> None:
    assert store.list() == []
    keys = [
        "step-00000010/manifest.json",
        "step-00000002/checkpoint.pt",
        "step-00000010/checkpoint.pt",
        "stepping.txt",
        "logs/run.log",
        "z",
    ]
    for key in keys:
        store.put_bytes(key, key.encode())

    assert store.list() == sorted(keys)
    assert store.list("step-") == [
        "step-00000002/checkpoint.pt",
        "step-00000010/checkpoint.pt",
        "step-00000010/manifest.json",
    ]
    assert store.list("step") == sorted(k for k in keys if k.startswith("step"))
    assert store.list("step-00000010/") == [
        "step-00000010/checkpoint.pt",
        "step-00000010/manifest.json",
    ]
    assert store.list("step-00000010/man") == ["step-00000010/manifest.json"]
    assert store.list("nothing/here") == []


def test_unicode_keys(store: ObjectStore) -> None:
    store.put_bytes("données/ü ß.txt", b"unicode")
    assert store.get_bytes("données/ü ß.txt") == b"unicode"
    assert store.list("données/") == ["données/ü ß.txt"]


def test_stores_see_only_their_own_root(backend: Backend) -> None:
    store, sibling = backend.open("root"), backend.open("root-sibling")
    store.put_bytes("k", b"mine")
    sibling.put_bytes("k", b"theirs")
    nested = backend.open("root/sub")
    nested.put_bytes("deep", b"nested")

    assert store.list() == ["k", "sub/deep"]
    assert sibling.list() == ["k"]
    assert store.get_bytes("k") == b"mine"
    # A store rooted deeper sees the same objects under shorter keys.
    assert store.get_bytes("sub/deep") == b"nested"


def test_uri_for_round_trips_through_split_uri(backend: Backend, store: ObjectStore) -> None:
    store.put_bytes("step-00000001/check point.pt", b"payload")
    uri = store.uri_for("step-00000001/check point.pt")
    assert uri.startswith(f"{backend.kind if backend.kind == 's3' else 'file'}://")
    assert uri.startswith(store.root_uri + "/")

    folder, name = split_uri(uri)
    assert name == "check point.pt"
    assert backend.open_uri(folder).get_bytes(name) == b"payload"
    # Opening the store's own root URI again reaches the same objects.
    assert backend.open_uri(store.root_uri).get_bytes("step-00000001/check point.pt") == (
        b"payload"
    )


@pytest.mark.parametrize(("key", "reason"), BAD_KEYS)
def test_invalid_keys_are_refused_everywhere(
    store: ObjectStore, tmp_path: Path, key: str, reason: str
) -> None:
    source = tmp_path / "f"
    source.write_bytes(b"x")
    calls: list[Callable[[], object]] = [
        lambda: store.put_bytes(key, b"x"),
        lambda: store.put_file(key, source),
        lambda: store.get_bytes(key),
        lambda: store.get_file(key, tmp_path / "out"),
        lambda: store.exists(key),
        lambda: store.uri_for(key),
    ]
    for call in calls:
        with pytest.raises(ValueError, match=reason) as caught:
            call()
        assert repr(key) in str(caught.value)
    assert store.list() == []


@pytest.mark.parametrize("prefix", ["/abs", "a/../b", "..", "a\\b", "a\x00"])
def test_invalid_list_prefixes_are_refused(store: ObjectStore, prefix: str) -> None:
    with pytest.raises(ValueError, match="invalid object key prefix"):
        store.list(prefix)


def test_readers_never_see_a_torn_object(store: ObjectStore) -> None:
    """Overwrites are atomic: every read returns one whole version, never a mix."""
    versions = [bytes([i]) * (512 * 1024) for i in range(2)]
    store.put_bytes("hot", versions[0])
    stop = threading.Event()
    errors: list[BaseException] = []

    def writer() -> None:
        try:
            for i in range(20):
                store.put_bytes("hot", versions[i % 2])
        except BaseException as exc:  # surfaced by the assertion below
            errors.append(exc)
        finally:
            stop.set()

    thread = threading.Thread(target=writer)
    thread.start()
    reads = 0
    while not stop.is_set() or reads == 0:
        assert store.get_bytes("hot") in versions
        reads += 1
    thread.join()
    assert errors == []

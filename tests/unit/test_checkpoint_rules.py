"""The SDK's checkpoint commit and verified read, rule by rule (found by mutation testing,
``bench/mutation.py``): step 0, digests of objects larger than one read, why a checkpoint is
refused (each reason named), and an object that is not plain tensors and containers is
never unpickled, whatever its manifest says."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
import torch

from trainyard.sdk.checkpoints import (
    MAX_MANIFEST_BYTES,
    CheckpointManifest,
    CheckpointWriter,
    CorruptCheckpoint,
    file_digest,
    load_verified,
    manifest_key,
    object_key,
    step_folder,
)
from trainyard_platform.shared.storage import LocalStore, validate_key


class Opaque:
    """Not something ``torch.load(weights_only=True)`` may build."""

    def __init__(self) -> None:
        self.payload = "would run code on unpickling in a hostile checkpoint"


def test_step_zero_is_a_step_and_negative_ones_are_refused() -> None:
    assert step_folder(0) == "step-00000000"
    assert object_key(0) == "step-00000000/checkpoint.pt"
    with pytest.raises(ValueError, match="must be >= 0, got -1"):
        step_folder(-1)


def test_the_digest_covers_every_read_of_a_large_object(tmp_path: Path) -> None:
    path = tmp_path / "big"
    data = bytes(range(256)) * (3 * 4096 + 7)  # about 3 MiB: several reads
    path.write_bytes(data)
    assert file_digest(path) == (hashlib.sha256(data).hexdigest(), len(data))


def test_a_state_that_is_not_a_dict_is_named_in_the_error(tmp_path: Path) -> None:
    writer = CheckpointWriter(LocalStore(tmp_path), job_id="j", attempt=1)
    try:
        with pytest.raises(TypeError, match="checkpoint state must be a dict, not list"):
            writer.save(1, [1, 2])  # type: ignore[arg-type]
    finally:
        writer.close()


def test_the_manifest_is_written_with_an_aware_time(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    writer = CheckpointWriter(store, job_id="j", attempt=3)
    writer.save(4, {"x": torch.ones(2)})
    writer.close()
    manifest = CheckpointManifest.model_validate_json(store.get_bytes(manifest_key(4)))
    assert manifest.created_at.tzinfo is not None
    assert abs((datetime.now(UTC) - manifest.created_at).total_seconds()) < 60
    assert (manifest.job_id, manifest.attempt, manifest.step) == ("j", 3, 4)


def _commit(store: LocalStore, step: int, obj: object) -> None:
    """An object and a manifest that matches it, as the writer would leave them."""
    path = store.root / "tmp.pt"
    torch.save(obj, path)
    sha256, size = file_digest(path)
    store.put_file(object_key(step), path)
    manifest = CheckpointManifest(
        step=step,
        object=object_key(step),
        size_bytes=size,
        sha256=sha256,
        created_at=datetime.now(UTC),
        job_id="j",
        attempt=1,
    )
    store.put_bytes(manifest_key(step), manifest.model_dump_json().encode())
    path.unlink()


def test_an_object_that_is_not_plain_data_is_never_unpickled(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    _commit(store, 1, {"model": Opaque()})
    with pytest.raises(CorruptCheckpoint, match=r"^torch.load failed: "):
        load_verified(store, 1)


def test_each_reason_to_refuse_a_checkpoint_is_named(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    _commit(store, 1, [1, 2, 3])
    with pytest.raises(CorruptCheckpoint, match=r"^object holds a list, not a dict$"):
        load_verified(store, 1)

    with pytest.raises(CorruptCheckpoint, match=r"^manifest vanished: "):
        load_verified(store, 2)

    store.put_bytes(manifest_key(3), b"{not json")
    with pytest.raises(CorruptCheckpoint, match=r"^unreadable manifest: "):
        load_verified(store, 3)

    _commit(store, 4, {"step": 4})
    data = json.loads(store.get_bytes(manifest_key(4)))
    store.put_bytes(manifest_key(5), json.dumps({**data, "step": 4}).encode())
    with pytest.raises(CorruptCheckpoint, match=r"^manifest is for step 4$"):
        load_verified(store, 5)

    store.put_bytes(manifest_key(6), json.dumps({**data, "step": 6, "object": "../x"}).encode())
    with pytest.raises(ValueError) as invalid:
        validate_key("../x")
    with pytest.raises(CorruptCheckpoint) as refused_key:
        load_verified(store, 6)
    assert str(refused_key.value) == str(invalid.value)

    store.put_bytes(
        manifest_key(7), json.dumps({**data, "step": 7, "object": object_key(7)}).encode()
    )
    with pytest.raises(CorruptCheckpoint, match=r"^object missing: "):
        load_verified(store, 7)

    sha = data["sha256"]
    store.put_bytes(object_key(8), b"not the object")
    store.put_bytes(
        manifest_key(8), json.dumps({**data, "step": 8, "object": object_key(8)}).encode()
    )
    with pytest.raises(CorruptCheckpoint) as refused:
        load_verified(store, 8)
    actual = hashlib.sha256(b"not the object").hexdigest()
    assert str(refused.value) == (
        f"object '{object_key(8)}' has 14 bytes with sha256 {actual[:12]}..., manifest says "
        f"{data['size_bytes']} bytes with sha256 {sha[:12]}..."
    )


def test_no_more_of_a_checkpoint_is_read_than_its_manifest_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An object larger than its manifest says was downloaded whole before the digest
    refused it; the read now stops past the manifest's size (a manifest's past
    ``MAX_MANIFEST_BYTES``), and the refusal names both sizes."""
    store = LocalStore(tmp_path)
    _commit(store, 1, {"step": 1})
    size = json.loads(store.get_bytes(manifest_key(1)))["size_bytes"]
    store.put_bytes(object_key(1), b"z" * (size + 5000))
    bounds: list[int | None] = []
    read_file, read_bytes = store.get_file, store.get_bytes

    def get_file(key: str, path: Path, *, max_bytes: int | None = None) -> None:
        bounds.append(max_bytes)
        read_file(key, path, max_bytes=max_bytes)

    def get_bytes(key: str, *, max_bytes: int | None = None) -> bytes:
        bounds.append(max_bytes)
        return read_bytes(key, max_bytes=max_bytes)

    monkeypatch.setattr(store, "get_file", get_file)
    monkeypatch.setattr(store, "get_bytes", get_bytes)
    with pytest.raises(CorruptCheckpoint) as refused:
        load_verified(store, 1)
    assert str(refused.value) == (
        f"object '{object_key(1)}' is {size + 5000} bytes, manifest says {size} bytes"
    )
    assert bounds == [MAX_MANIFEST_BYTES, size]

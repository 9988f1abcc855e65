"""Which checkpoint a job resumes from: the newest whose manifest names an existing object."""

from __future__ import annotations

import json
from pathlib import Path

from services.runner.checkpoints import latest_complete_checkpoint
from shared.storage import LocalStore


def put(store: LocalStore, step: int, *, manifest: object | None, obj: bool = True) -> None:
    folder = f"step-{step:08d}"
    if obj:
        store.put_bytes(f"{folder}/checkpoint.pt", b"weights")
    if manifest is not None:
        store.put_bytes(f"{folder}/manifest.json", json.dumps(manifest).encode())


def test_no_checkpoints_means_a_fresh_start(tmp_path: Path) -> None:
    assert latest_complete_checkpoint(LocalStore(tmp_path)) is None


def test_the_newest_complete_checkpoint_wins(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    put(store, 5, manifest={"object": "step-00000005/checkpoint.pt"})
    put(store, 100, manifest={"object": "step-00000100/checkpoint.pt"})
    put(store, 20, manifest={"object": "step-00000020/checkpoint.pt"})
    assert latest_complete_checkpoint(store) == store.uri_for("step-00000100/checkpoint.pt")


def test_incomplete_and_broken_checkpoints_are_skipped(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    put(store, 1, manifest={"object": "step-00000001/checkpoint.pt"})
    put(store, 2, manifest=None)  # upload never finished: no manifest
    put(store, 3, manifest={"object": "step-00000003/checkpoint.pt"}, obj=False)
    put(store, 4, manifest={"object": "../../etc/passwd"})
    put(store, 5, manifest=["not", "a", "manifest"])
    store.put_bytes("step-00000006/manifest.json", b"{not json")
    assert latest_complete_checkpoint(store) == store.uri_for("step-00000001/checkpoint.pt")

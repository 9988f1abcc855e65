"""An upload given up (``checkpoints.Upload.cancel``: the job's end reported its checkpoint
lost) leaves nothing of it in the store, however far its thread had gone, and one whose
manifest's upload had begun is no longer given up (``checkpoints``, "given up")."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.runner.test_checkpoints import stage
from trainyard_platform.services.runner.checkpoints import (
    Upload,
    UploadCancelled,
    commit_staged,
)
from trainyard_platform.shared.storage import LocalStore


class GivenUpDuringPut(LocalStore):
    """A store whose object upload outlives the end's wait: the give-up comes while the
    object is going up, and the upload then ends as a slow one would."""

    def __init__(self, root: Path, upload: Upload) -> None:
        super().__init__(root)
        self.upload = upload

    def put_file(self, key: str, path: Path) -> None:
        assert self.upload.cancel(), "given up before the manifest's upload began"
        super().put_file(key, path)


def test_an_upload_given_up_while_its_object_goes_up_leaves_nothing_in_the_store(
    tmp_path: Path,
) -> None:
    staging, upload = tmp_path / "staging", Upload()
    store = GivenUpDuringPut(tmp_path / "store", upload)
    stage(staging, 7, b"weights of step 7")
    with pytest.raises(UploadCancelled, match="step 7"):
        commit_staged(staging, 7, store, attempt=1, upload=upload, scratch=tmp_path / "scratch")
    # Before: the manifest followed the object once its upload ended, the give-up unseen.
    assert store.list("step-") == []
    assert list((tmp_path / "scratch").iterdir()) == [], "the private copy is gone too"


def test_an_upload_given_up_before_it_began_uploads_nothing(tmp_path: Path) -> None:
    staging, store, upload = tmp_path / "staging", LocalStore(tmp_path / "store"), Upload()
    stage(staging, 7)
    assert upload.cancel()
    with pytest.raises(UploadCancelled):
        commit_staged(staging, 7, store, attempt=1, upload=upload)
    assert store.list("step-") == []


class GivenUpDuringManifest(LocalStore):
    """A store where the give-up comes once the manifest's upload began."""

    def __init__(self, root: Path, upload: Upload) -> None:
        super().__init__(root)
        self.upload = upload
        self.cancelled: bool | None = None

    def put_bytes(self, key: str, data: bytes) -> None:
        self.cancelled = self.upload.cancel()
        super().put_bytes(key, data)


def test_a_give_up_after_the_manifest_went_out_is_refused_and_the_checkpoint_stands(
    tmp_path: Path,
) -> None:
    staging, upload = tmp_path / "staging", Upload()
    store = GivenUpDuringManifest(tmp_path / "store", upload)
    stage(staging, 7)
    ref = commit_staged(staging, 7, store, attempt=1, upload=upload)
    assert store.cancelled is False, "too late: its giver waits for the upload and reports it"
    assert store.exists("step-00000007-a0001/manifest.json")
    assert ref.uri == store.uri_for("step-00000007-a0001/checkpoint.pt")

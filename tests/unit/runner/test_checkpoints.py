"""Checkpoints between a job's staging folder and the store: verified, confined, retained."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest

from trainyard_platform.services.runner.checkpoints import (
    ResumeRefused,
    ResumeTooLarge,
    StagedCheckpointInvalid,
    apply_retention,
    commit_staged,
    complete_folders,
    mark_succeeded,
    prune_earlier_attempts,
    resumed_mark,
    stage_resume,
    succeeded_mark,
)
from trainyard_platform.shared.events.payloads import CheckpointRef
from trainyard_platform.shared.storage import LocalStore


def stage(staging: Path, step: int, data: bytes = b"weights", **overrides: object) -> None:
    """What the SDK writes: the object, then its manifest (object named from the root)."""
    folder = staging / f"step-{step:08d}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "checkpoint.pt").write_bytes(data)
    manifest = {
        "step": step,
        "object": f"step-{step:08d}/checkpoint.pt",
        "size_bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "created_at": datetime.now(UTC).isoformat(),
        "job_id": "job-1",
        "attempt": 1,
    } | overrides
    (folder / "manifest.json").write_text(json.dumps(manifest))


def test_a_staged_checkpoint_is_uploaded_with_its_manifest_last(tmp_path: Path) -> None:
    staging, store = tmp_path / "staging", LocalStore(tmp_path / "store")
    stage(staging, 10, b"abc")
    ref = commit_staged(staging, 10, store, attempt=2)
    assert ref.step == 10 and ref.size_bytes == 3
    assert ref.uri == store.uri_for("step-00000010-a0002/checkpoint.pt")
    manifest = json.loads(store.get_bytes("step-00000010-a0002/manifest.json"))
    assert manifest["object"] == "step-00000010-a0002/checkpoint.pt"
    assert manifest["sha256"] == hashlib.sha256(b"abc").hexdigest()
    assert not (staging / "step-00000010").exists(), "the staged copy is removed"


def test_attempts_never_write_the_same_keys(tmp_path: Path) -> None:
    staging, store = tmp_path / "staging", LocalStore(tmp_path / "store")
    stage(staging, 10, b"first")
    commit_staged(staging, 10, store, attempt=1)
    stage(staging, 10, b"second")
    commit_staged(staging, 10, store, attempt=2)
    assert [f for _, _, f in complete_folders(store)] == [
        "step-00000010-a0001",
        "step-00000010-a0002",
    ]
    assert store.get_bytes("step-00000010-a0001/checkpoint.pt") == b"first"


def test_an_object_that_does_not_match_its_manifest_is_refused(tmp_path: Path) -> None:
    staging, store = tmp_path / "staging", LocalStore(tmp_path / "store")
    stage(staging, 3, b"abc", sha256="0" * 64)
    with pytest.raises(StagedCheckpointInvalid, match="does not match"):
        commit_staged(staging, 3, store, attempt=1)
    assert store.list() == []


def test_a_link_to_a_file_outside_the_staging_folder_is_refused(tmp_path: Path) -> None:
    secret = tmp_path / "runner-secret"
    secret.write_bytes(b"s3 keys")
    staging, store = tmp_path / "staging", LocalStore(tmp_path / "store")
    stage(staging, 1, b"s3 keys")
    target = staging / "step-00000001" / "checkpoint.pt"
    target.unlink()
    os.symlink(secret, target)
    with pytest.raises(StagedCheckpointInvalid):
        commit_staged(staging, 1, store, attempt=1)
    assert store.list() == []


@pytest.mark.parametrize("which", ["checkpoint.pt", "manifest.json"])
def test_a_hard_link_to_a_file_outside_the_staging_folder_is_refused(
    tmp_path: Path, which: str
) -> None:
    """A hard link resolves inside the folder, yet is another file's: where the kernel lets
    a user link files of others (fs.protected_hardlinks=0), a job could have the runner
    upload a file it cannot read into its own prefix, and read it back on resume."""
    staging, store = tmp_path / "staging", LocalStore(tmp_path / "store")
    stage(staging, 1, b"s3 keys")
    staged = staging / "step-00000001" / which
    secret = tmp_path / "runner-secret"
    secret.write_bytes(staged.read_bytes())
    staged.unlink()
    os.link(secret, staged)
    with pytest.raises(StagedCheckpointInvalid, match="hard link"):
        commit_staged(staging, 1, store, attempt=1)
    assert store.list() == []


@pytest.mark.parametrize(
    "object_key", ["../../runner-secret", "step-00000002/checkpoint.pt", "other/checkpoint.pt"]
)
def test_a_manifest_naming_another_object_is_refused(tmp_path: Path, object_key: str) -> None:
    staging, store = tmp_path / "staging", LocalStore(tmp_path / "store")
    stage(staging, 1, object=object_key)
    with pytest.raises(StagedCheckpointInvalid):
        commit_staged(staging, 1, store, attempt=1)


def forge(store: LocalStore, step: int, data: bytes, attempt: int = 9) -> None:
    """What a hostile node writes under a job's prefix: an object and a manifest that
    matches it, in the runner's own layout, at a newer step."""
    folder = f"step-{step:08d}-a{attempt:04d}"
    store.put_bytes(f"{folder}/checkpoint.pt", data)
    manifest = {
        "step": step,
        "object": f"{folder}/checkpoint.pt",
        "size_bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "created_at": datetime.now(UTC).isoformat(),
        "job_id": "job-1",
        "attempt": attempt,
    }
    store.put_bytes(f"{folder}/manifest.json", json.dumps(manifest).encode())


def test_resume_stages_exactly_the_checkpoint_it_is_given_not_the_newest_in_the_store(
    tmp_path: Path,
) -> None:
    """The newest folder whose object matched its manifest was restored: any node can write
    any key, so a forged newer folder under the job's prefix, with a manifest written to
    match, was the checkpoint the job loaded (pickle: code run in the job's sandbox). Now
    the one the grant names is restored, verified against its own size and sha256."""
    staging, store = tmp_path / "staging", LocalStore(tmp_path / "store")
    stage(staging, 5, b"five")
    committed = commit_staged(staging, 5, store, attempt=1)
    forge(store, 900, b"cos\nsystem\n(S'touch pwned'\ntR.")
    resume = tmp_path / "resume"
    ref = stage_resume(store, committed, resume, job_id="job-1")
    assert ref == committed
    assert (resume / "step-00000005" / "checkpoint.pt").read_bytes() == b"five"
    local = json.loads((resume / "step-00000005" / "manifest.json").read_text())
    assert local["object"] == "step-00000005/checkpoint.pt"
    assert (local["step"], local["size_bytes"], local["sha256"]) == (
        5,
        4,
        hashlib.sha256(b"five").hexdigest(),
    )
    assert (local["job_id"], local["attempt"]) == ("job-1", 1)
    assert [p.name for p in resume.iterdir()] == ["step-00000005"]


def test_no_checkpoint_given_means_a_fresh_start_whatever_the_store_holds(
    tmp_path: Path,
) -> None:
    staging, store = tmp_path / "staging", LocalStore(tmp_path / "store")
    stage(staging, 5)
    commit_staged(staging, 5, store, attempt=1)
    forge(store, 900, b"forged")
    resume = tmp_path / "resume"
    assert stage_resume(store, None, resume) is None
    assert not resume.exists() or list(resume.rglob("*")) == []


def test_a_checkpoint_overwritten_since_its_commit_is_refused_not_replaced(
    tmp_path: Path,
) -> None:
    """Its object overwritten with other bytes, its manifest too (both as the writer likes):
    the store's manifest proves nothing, the committed sha256 does. It is refused, naming
    both digests, nothing of it is left staged, and no other checkpoint (an older one that
    verifies) is taken in its place."""
    staging, store = tmp_path / "staging", LocalStore(tmp_path / "store")
    stage(staging, 5, b"five")
    commit_staged(staging, 5, store, attempt=1)
    stage(staging, 9, b"nine")
    committed = commit_staged(staging, 9, store, attempt=1)
    forge(store, 9, b"evil", attempt=1)  # same size, its manifest rewritten to match
    resume = tmp_path / "resume"
    with pytest.raises(ResumeRefused) as refused:
        stage_resume(store, committed, resume)
    said = str(refused.value)
    assert "step 9" in said and committed.sha256 in said
    assert hashlib.sha256(b"evil").hexdigest() in said
    assert not resume.exists() or list(resume.rglob("*.pt")) == []


def test_a_checkpoint_deleted_since_its_commit_is_refused(tmp_path: Path) -> None:
    staging, store = tmp_path / "staging", LocalStore(tmp_path / "store")
    stage(staging, 5, b"five")
    committed = commit_staged(staging, 5, store, attempt=1)
    store.delete("step-00000005-a0001/checkpoint.pt")
    with pytest.raises(ResumeRefused, match="missing"):
        stage_resume(store, committed, tmp_path / "resume")


@pytest.mark.parametrize(
    "uri_of",
    [
        lambda root: root.parent.parent / "other-job" / "checkpoints" / "x" / "checkpoint.pt",
        lambda root: root / "step-00000005-a0001" / "manifest.json",
        lambda root: root / "step-00000005-a0001" / ".." / ".." / "secret",
        lambda root: root / "elsewhere.pt",
        lambda root: root / "step-00000006-a0001" / "checkpoint.pt",  # another step's
    ],
)
def test_a_checkpoint_that_is_not_one_of_the_jobs_own_commits_is_refused_unread(
    tmp_path: Path, uri_of: Callable[[Path], Path]
) -> None:
    """The reference names another job's object, a manifest, a path out of the prefix or a
    key that no commit writes: refused before the store is read."""
    root = tmp_path / "store" / "jobs" / "job-1" / "checkpoints"
    store = LocalStore(root)
    stage(tmp_path / "staging", 5, b"five")
    committed = commit_staged(tmp_path / "staging", 5, store, attempt=1)
    other = committed.model_copy(update={"uri": uri_of(root).as_uri()})
    with pytest.raises(ResumeRefused, match="not a checkpoint of this job"):
        stage_resume(store, other, tmp_path / "resume")
    assert not (tmp_path / "resume").exists()


def test_a_checkpoint_the_store_cannot_serve_now_raises_as_it_is(
    tmp_path: Path,
) -> None:
    """A store folder on a mount that times out raised an OSError (TimeoutError): it is
    raised as it is (the grant comes again), never taken for a refused checkpoint."""
    staging = tmp_path / "staging"

    class NotAnswering(LocalStore):
        def get_file(self, key: str, path: Path, *, max_bytes: int | None = None) -> None:
            if key.startswith("step-00000009"):
                raise TimeoutError(110, "Connection timed out")
            super().get_file(key, path, max_bytes=max_bytes)

    store = NotAnswering(tmp_path / "store")
    stage(staging, 9)
    committed = commit_staged(staging, 9, store, attempt=1)
    with pytest.raises(TimeoutError):
        stage_resume(store, committed, tmp_path / "resume")


def test_resume_reads_the_older_layout(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    data = b"old"
    store.put_bytes("step-00000001/checkpoint.pt", data)
    ref = CheckpointRef(
        uri=store.uri_for("step-00000001/checkpoint.pt"),
        manifest_uri=store.uri_for("step-00000001/manifest.json"),
        step=1,
        size_bytes=3,
        sha256=hashlib.sha256(data).hexdigest(),
    )
    assert stage_resume(store, ref, tmp_path / "resume") == ref
    local = json.loads((tmp_path / "resume" / "step-00000001" / "manifest.json").read_text())
    assert local["attempt"] == 0


def test_retention_keeps_the_newest_and_protected_ones(tmp_path: Path) -> None:
    staging, store = tmp_path / "staging", LocalStore(tmp_path / "store")
    committed = []
    for step in range(1, 7):
        stage(staging, step, f"s{step}".encode())
        committed.append(commit_staged(staging, step, store, attempt=1))
    protected = {store.uri_for("step-00000001-a0001/checkpoint.pt")}
    assert apply_retention(store, 2, committed, protected, attempt=1) == 3
    assert [s for s, _, _ in complete_folders(store)] == [1, 5, 6]
    assert store.list("step-00000002") == []


def stage_sparse(staging: Path, step: int, apparent: int, tail: bytes) -> bytes:
    """A sparse object: a hole of ``apparent - len(tail)`` bytes, then ``tail``; returns
    the bytes it reads as (what its manifest describes)."""
    folder = staging / f"step-{step:08d}"
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "checkpoint.pt").open("wb") as handle:
        handle.seek(apparent - len(tail))
        handle.write(tail)
    digest = hashlib.sha256()
    digest.update(bytes(apparent - len(tail)))
    digest.update(tail)
    manifest = {
        "step": step,
        "object": f"step-{step:08d}/checkpoint.pt",
        "size_bytes": apparent,
        "sha256": digest.hexdigest(),
    }
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return tail


def test_a_sparse_checkpoint_counts_its_holes_against_the_cap(tmp_path: Path) -> None:
    # 64 MiB to read, hash and upload, though the disk holds a few bytes of it.
    staging, store = tmp_path / "staging", LocalStore(tmp_path / "store")
    stage_sparse(staging, 1, 64 * 1024**2, b"end")
    with pytest.raises(StagedCheckpointInvalid, match=r"67108864 bytes \(its apparent size"):
        commit_staged(staging, 1, store, attempt=1, max_bytes=1024**2)
    assert store.list() == []


def test_an_object_of_another_size_than_its_manifest_says_is_refused_unread(
    tmp_path: Path,
) -> None:
    staging, store = tmp_path / "staging", LocalStore(tmp_path / "store")
    stage(staging, 2, b"abc", size_bytes=2)
    with pytest.raises(StagedCheckpointInvalid, match="is 3 bytes, its manifest says 2"):
        commit_staged(staging, 2, store, attempt=1)
    assert store.list() == []


def test_a_sparse_checkpoint_within_the_cap_is_copied_with_its_holes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    staging, store = tmp_path / "staging", LocalStore(tmp_path / "store")
    apparent = 256 * 1024**2
    stage_sparse(staging, 3, apparent, b"weights")
    copies: list[os.stat_result] = []
    real_put = store.put_file

    def put_file(key: str, path: Path) -> None:
        copies.append(path.stat())  # the runner's private copy, before it is uploaded
        real_put(key, path)

    monkeypatch.setattr(store, "put_file", put_file)
    ref = commit_staged(staging, 3, store, attempt=1)
    assert ref.size_bytes == apparent
    [copy] = copies
    assert copy.st_size == apparent
    assert copy.st_blocks * 512 < 1024**2, "the private copy was written dense"


def test_a_checkpoint_larger_than_the_allowance_is_refused_before_its_download(
    tmp_path: Path,
) -> None:
    """Its committed size is known: a checkpoint over ``max_bytes`` (the job's disk
    allowance) raised nothing and was downloaded whole, filling the node's disk. It is
    refused now, naming the step and both sizes, and nothing is downloaded; an older one
    that fits is not taken instead (the job would lose its newer steps unsaid)."""
    staging, store = tmp_path / "staging", LocalStore(tmp_path / "store")
    stage(staging, 5, b"x" * 10)
    commit_staged(staging, 5, store, attempt=1)
    stage(staging, 9, b"x" * 4096)
    committed = commit_staged(staging, 9, store, attempt=1)
    resume = tmp_path / "resume"
    with pytest.raises(ResumeTooLarge) as refused:
        stage_resume(store, committed, resume, max_bytes=4095)
    assert (refused.value.step, refused.value.size_bytes, refused.value.max_bytes) == (
        9,
        4096,
        4095,
    )
    assert not resume.exists() or list(resume.rglob("*.pt")) == []
    ref = stage_resume(store, committed, resume, max_bytes=4096)  # one that fits is staged
    assert ref is not None and ref.step == 9


def test_no_more_of_a_checkpoint_is_read_than_its_job_committed(tmp_path: Path) -> None:
    """An object grown since its commit (3 MiB, committed as 4096 bytes, under an allowance
    of 1 MiB) is refused after at most the committed size is read, and no manifest of the
    store is read at all."""
    reads: list[tuple[str, int | None]] = []

    class Recording(LocalStore):
        def get_file(self, key: str, path: Path, *, max_bytes: int | None = None) -> None:
            reads.append((key, max_bytes))
            super().get_file(key, path, max_bytes=max_bytes)

        def get_bytes(self, key: str, *, max_bytes: int | None = None) -> bytes:
            reads.append((key, max_bytes))
            return super().get_bytes(key, max_bytes=max_bytes)

    staging, store = tmp_path / "staging", Recording(tmp_path / "store")
    stage(staging, 9, b"x" * 4096)
    committed = commit_staged(staging, 9, store, attempt=1)
    store.put_bytes("step-00000009-a0001/checkpoint.pt", b"x" * (3 * 1024 * 1024))
    reads.clear()
    resume = tmp_path / "resume"
    with pytest.raises(ResumeRefused, match="not the 4096 bytes the job committed"):
        stage_resume(store, committed, resume, max_bytes=1024 * 1024)
    assert reads == [("step-00000009-a0001/checkpoint.pt", 4096)]
    assert not (resume / "step-00000009").exists()


def test_retention_chooses_among_the_jobs_own_checkpoints_never_forged_folders(
    tmp_path: Path,
) -> None:
    """Retention listed the store and kept its newest folders: a hostile node that wrote
    complete folders of later steps under the job's prefix pushed the job's real
    checkpoints out (all but the protected ones deleted). It chooses only among the
    checkpoints the job's attempts committed (the resume ref, the ones this attempt saved)
    and deletes nothing else."""
    staging, store = tmp_path / "staging", LocalStore(tmp_path / "store")
    stage(staging, 1, b"resumed")
    resumed = commit_staged(staging, 1, store, attempt=1)
    saved = []
    for step in (2, 3, 4):
        stage(staging, step, f"s{step}".encode())
        saved.append(commit_staged(staging, step, store, attempt=2))
    for step in range(100, 106):  # forged: complete folders, newer steps
        stage(staging, step, b"forged")
        commit_staged(staging, step, store, attempt=9)
    protected = {resumed.uri, saved[-1].uri}
    assert apply_retention(store, 2, [resumed, *saved], protected, attempt=2) == 1
    steps = [s for s, _, _ in complete_folders(store)]
    assert steps == [1, 3, 4, *range(100, 106)]
    assert store.list("step-00000002") == []


def _commit(store: LocalStore, staging: Path, step: int, attempt: int) -> CheckpointRef:
    stage(staging, step, f"weights {step} of attempt {attempt}".encode())
    return commit_staged(staging, step, store, attempt=attempt)


def _folders(store: LocalStore) -> list[str]:
    return sorted({key.split("/")[0] for key in store.list("step-")})


def test_an_attempt_prunes_the_checkpoints_earlier_attempts_left(tmp_path: Path) -> None:
    """Retention ran only at an attempt's end and only over that attempt's own checkpoints:
    what attempts 1 and 2 left (attempt 1 died without pruning; attempt 2 pruned only its
    own) stayed in the store for good, one set per restart. Attempt 3, resuming from step
    9, keeps that one and the job's ``keep - 1`` newest older ones, and deletes the rest of
    its predecessors' (an object left without a manifest too), but for attempt 1's newest
    complete one: attempt 1 may be lost and still running (below)."""
    staging, store = tmp_path / "staging", LocalStore(tmp_path / "store")
    for step in (1, 2, 3, 4):
        _commit(store, staging, step, attempt=1)
    store.put_bytes("step-00000005-a0001/checkpoint.pt", b"torn: its node died mid-upload")
    for step in (6, 7, 8):
        _commit(store, staging, step, attempt=2)
    resumed = _commit(store, staging, 9, attempt=2)

    assert prune_earlier_attempts(store, 3, resumed, keep=3) == 5
    assert _folders(store) == [
        "step-00000004-a0001",
        "step-00000007-a0002",
        "step-00000008-a0002",
        "step-00000009-a0002",
    ]
    assert store.list("step-00000009-a0002/") == [
        "step-00000009-a0002/checkpoint.pt",
        "step-00000009-a0002/manifest.json",
    ]
    assert prune_earlier_attempts(store, 3, resumed, keep=3) == 0, "a second prune finds none"


def test_the_prune_never_touches_newer_steps_this_or_later_attempts(tmp_path: Path) -> None:
    """During a failover the attempt that was lost may still run: its checkpoints past the
    one the new attempt resumes from (and so the one its late success would name) stay,
    as do the new attempt's own, a later attempt's, and another folder of the resumed
    step. ``keep=1`` keeps only the resumed checkpoint of what is older."""
    staging, store = tmp_path / "staging", LocalStore(tmp_path / "store")
    _commit(store, staging, 3, attempt=1)
    resumed = _commit(store, staging, 5, attempt=1)
    _commit(store, staging, 5, attempt=2)  # the same step, reached by another attempt
    _commit(store, staging, 6, attempt=1)  # the lost attempt, still running
    _commit(store, staging, 2, attempt=3)  # this attempt's own
    _commit(store, staging, 1, attempt=4)  # a later attempt's
    store.put_bytes("step-00000004-a0001/nested/key", b"not a checkpoint's layout")

    assert prune_earlier_attempts(store, 3, resumed, keep=1) == 1
    assert _folders(store) == [
        "step-00000001-a0004",
        "step-00000002-a0003",
        "step-00000004-a0001",
        "step-00000005-a0001",
        "step-00000005-a0002",
        "step-00000006-a0001",
    ]


def test_the_prune_reads_the_older_layout_and_tolerates_vanished_objects(
    tmp_path: Path,
) -> None:
    """Folders of the older layout (``step-<n>/``) are of attempt 0 (whose newest stays, as
    every earlier attempt's); an object deleted meanwhile (by the registry's collector,
    another attempt's prune) is no error."""
    staging, store = tmp_path / "staging", LocalStore(tmp_path / "store")
    for step in (1, 2):
        _commit(store, staging, step, attempt=1)
        for key in store.list(f"step-{step:08d}-a0001/"):
            store.put_bytes(key.replace("-a0001", ""), store.get_bytes(key))
            store.delete(key)
    resumed = _commit(store, staging, 3, attempt=1)
    listed = store.list

    def list_then_lose(prefix: str = "") -> list[str]:
        keys = listed(prefix)
        if prefix == "step-":
            store.delete("step-00000001/checkpoint.pt")
        return keys

    store.list = list_then_lose  # type: ignore[method-assign]
    assert prune_earlier_attempts(store, 2, resumed, keep=1) == 1
    assert _folders(store) == ["step-00000002", "step-00000003-a0001"]


def test_the_prune_keeps_the_last_checkpoint_of_a_lost_attempt_still_running(
    tmp_path: Path,
) -> None:
    """Attempt 1 was lost after saving step 2 and runs on without saving more; attempts 2
    and 3 got to step 6 meanwhile. Attempt 4's prune (keep 2) kept only the newest older
    folder, step 5, and deleted step 2: attempt 1's late success, which the scheduler keeps,
    then marked a folder without its checkpoint and registered nothing. Each earlier
    attempt's newest complete folder stays (attempt 2's too: it may be lost as well)."""
    staging, store = tmp_path / "staging", LocalStore(tmp_path / "store")
    _commit(store, staging, 1, attempt=1)
    last = _commit(store, staging, 2, attempt=1)  # what attempt 1's success registers
    _commit(store, staging, 3, attempt=2)
    _commit(store, staging, 4, attempt=2)
    _commit(store, staging, 5, attempt=3)
    resumed = _commit(store, staging, 6, attempt=3)

    assert prune_earlier_attempts(store, 4, resumed, keep=2) == 2
    assert _folders(store) == [
        "step-00000002-a0001",
        "step-00000004-a0002",
        "step-00000005-a0003",
        "step-00000006-a0003",
    ]
    assert store.list("step-00000002-a0001/") == [
        "step-00000002-a0001/checkpoint.pt",
        "step-00000002-a0001/manifest.json",
    ]
    assert last.uri.endswith("step-00000002-a0001/checkpoint.pt")


def test_the_prune_deletes_nothing_for_a_resume_outside_the_prefix(tmp_path: Path) -> None:
    staging, store = tmp_path / "staging", LocalStore(tmp_path / "store")
    _commit(store, staging, 1, attempt=1)
    other = LocalStore(tmp_path / "other")
    elsewhere = _commit(other, staging, 9, attempt=1)
    assert prune_earlier_attempts(store, 2, elsewhere, keep=1) == 0
    assert _folders(store) == ["step-00000001-a0001"]
    with pytest.raises(ValueError, match="keep must be at least 1"):
        prune_earlier_attempts(store, 2, elsewhere, keep=0)


def test_a_lost_attempt_never_deletes_the_checkpoint_a_later_one_resumed_from(
    tmp_path: Path,
) -> None:
    """Attempt 1 was lost after reporting step 2; attempt 2 resumed from it. Attempt 1 ran
    on and saved three more, and its end's retention (keep 2) deleted step 2, the job's
    only checkpoint the platform knew: attempt 2, preempted before saving, was followed by
    an attempt refused for a missing checkpoint. The resuming attempt marks the folder,
    and an earlier attempt's retention keeps a folder a later attempt marked."""
    staging, store = tmp_path / "staging", LocalStore(tmp_path / "store")
    saved = [_commit(store, staging, step, attempt=1) for step in (1, 2, 3, 4, 5)]
    reported = saved[1]
    assert stage_resume(store, reported, tmp_path / "resume", attempt=2) == reported
    assert store.exists(f"step-00000002-a0001/{resumed_mark(2)}")

    assert apply_retention(store, 2, saved, {saved[-1].uri}, attempt=1) == 2
    assert _folders(store) == ["step-00000002-a0001", "step-00000004-a0001", "step-00000005-a0001"]
    # Its own mark, or an earlier attempt's, protects nothing from an attempt's retention.
    left = [saved[1], saved[3], saved[4]]
    assert apply_retention(store, 1, left, {saved[-1].uri}, attempt=2) == 2
    assert _folders(store) == ["step-00000005-a0001"]


def test_a_refused_resume_leaves_no_mark(tmp_path: Path) -> None:
    staging, store = tmp_path / "staging", LocalStore(tmp_path / "store")
    ref = _commit(store, staging, 7, attempt=1)
    store.put_bytes("step-00000007-a0001/checkpoint.pt", b"other bytes")
    with pytest.raises(ResumeRefused):
        stage_resume(store, ref, tmp_path / "resume", attempt=2)
    assert store.list("step-00000007-a0001/") == [
        "step-00000007-a0001/checkpoint.pt",
        "step-00000007-a0001/manifest.json",
    ]
    store.delete("step-00000007-a0001/checkpoint.pt")
    with pytest.raises(ResumeRefused, match="missing"):
        stage_resume(store, ref, tmp_path / "resume", attempt=2)
    assert store.list("step-00000007-a0001/") == ["step-00000007-a0001/manifest.json"]


def test_no_retention_deletes_the_artifact_an_attempt_succeeded_with(tmp_path: Path) -> None:
    """Attempt 1 was declared lost but ran on and succeeded with step 4 while attempts 2
    and 3 ran; its success, reported when its node is heard again, is kept and its model
    registered from step 4. Attempt 3, resuming from attempt 2's step 9, deleted step 4
    with the rest of attempt 1's: the registration found no checkpoint. A success's
    artifact is marked, and no retention deletes a folder so marked."""
    staging, store = tmp_path / "staging", LocalStore(tmp_path / "store")
    saved = [_commit(store, staging, step, attempt=1) for step in (1, 2, 3, 4)]
    assert mark_succeeded(store, saved[-1], 1)
    resumed = _commit(store, staging, 9, attempt=2)

    assert prune_earlier_attempts(store, 3, resumed, keep=1) == 3
    assert _folders(store) == ["step-00000004-a0001", "step-00000009-a0002"]
    assert store.exists(f"step-00000004-a0001/{succeeded_mark(1)}")
    # Nor does an attempt's end, its own or another's.
    for attempt in (1, 2):
        assert apply_retention(store, 1, [saved[-1], resumed], {resumed.uri}, attempt=attempt) == 0
    assert _folders(store) == ["step-00000004-a0001", "step-00000009-a0002"]
    other = CheckpointRef(
        uri="file:///elsewhere/step-00000004-a0001/checkpoint.pt",
        manifest_uri="file:///elsewhere/step-00000004-a0001/manifest.json",
        step=4,
        size_bytes=1,
        sha256="0" * 64,
    )
    assert not mark_succeeded(store, other, 1), "a ref outside the store marks nothing"

"""The end of a job that stops waiting for its final checkpoint's upload
(``checkpoint_upload_wait_s``) reports what the store holds: a checkpoint whose manifest
was already going up when the wait ran out is waited for and reported saved, never lost
while the store keeps it (``JobRun._give_up_upload``, ``checkpoints.Upload``)."""

from __future__ import annotations

import asyncio
import hashlib
import threading
from pathlib import Path
from typing import Any

from tests.unit.runner.test_checkpoints import stage
from trainyard_platform.services.runner.domain import JobIdentity
from trainyard_platform.services.runner.sandbox import JobUser, Sandbox
from trainyard_platform.services.runner.supervisor import JobRun
from trainyard_platform.shared.control import CheckpointMessage, CheckpointRef
from trainyard_platform.shared.storage import LocalStore


class _Events:
    parent = None

    def __init__(self) -> None:
        self.emitted: list[Any] = []

    def emit(self, envelope: Any) -> None:
        self.emitted.append(envelope)


class SlowManifest(LocalStore):
    """A store whose manifest upload goes on until ``release`` is set."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.manifest_going = threading.Event()
        self.release = threading.Event()

    def put_bytes(self, key: str, data: bytes) -> None:
        if key.endswith("/manifest.json"):
            self.manifest_going.set()
            assert self.release.wait(60)
        super().put_bytes(key, data)


def test_a_manifest_going_up_when_the_wait_runs_out_is_waited_for_and_reported_saved(
    tmp_path: Path,
) -> None:
    store = SlowManifest(tmp_path / "store")
    box = Sandbox(tmp_path / "sandbox", JobUser(None, None))
    stage(box.checkpoints, 3, b"weights")
    events = _Events()
    run = JobRun(
        JobIdentity("job-1", "alloc-1", "node-1", 1, 1),
        events=events,  # type: ignore[arg-type]
        ledger=None,  # type: ignore[arg-type]
        store=None,  # type: ignore[arg-type]
        checkpoint_store=store,
        sandbox=box,
        log_path=tmp_path / "jobs" / "job-1" / "alloc-1.log",
        trace_headers={},
        progress_interval_s=60.0,
        log_tail_lines=10,
        checkpoint_upload_wait_s=0.01,
    )

    async def main() -> None:
        run._on_checkpoint(
            CheckpointMessage(
                checkpoint=CheckpointRef(
                    uri="file:///staging/step-00000003/checkpoint.pt",
                    manifest_uri="file:///staging/step-00000003/manifest.json",
                    step=3,
                    size_bytes=7,
                    sha256=hashlib.sha256(b"weights").hexdigest(),
                )
            )
        )
        assert await asyncio.to_thread(store.manifest_going.wait, 60)
        closing = asyncio.create_task(run._close_control())
        async with asyncio.timeout(60):  # the wait ran out and gave the upload up, too late
            while run._upload is not None:
                await asyncio.sleep(0.01)
        store.release.set()
        await closing

    asyncio.run(main())
    # Before: reported lost, while the manifest landed after the verdict all the same.
    assert run._lost_checkpoint is None
    assert run._last_checkpoint is not None and run._last_checkpoint.step == 3
    assert store.exists("step-00000003-a0001/manifest.json")
    assert len(events.emitted) == 1, "checkpoint.saved, once"


class SlowSecondObject(LocalStore):
    """A store whose second object upload waits until ``release`` is set."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.objects = 0
        self.second_going = threading.Event()
        self.release = threading.Event()

    def put_file(self, key: str, path: Path) -> None:
        self.objects += 1
        if self.objects == 2:
            self.second_going.set()
            assert self.release.wait(60)
        super().put_file(key, path)


def _staged(step: int, data: bytes) -> CheckpointMessage:
    return CheckpointMessage(
        checkpoint=CheckpointRef(
            uri=f"file:///staging/step-{step:08d}/checkpoint.pt",
            manifest_uri=f"file:///staging/step-{step:08d}/manifest.json",
            step=step,
            size_bytes=len(data),
            sha256=hashlib.sha256(data).hexdigest(),
        )
    )


def test_a_step_staged_again_never_replaces_nor_deletes_the_checkpoint_saved(
    tmp_path: Path,
) -> None:
    """A job that saves the same step twice (a periodic save, then its last one) made the
    runner upload it again to the same keys (step and attempt): the object its first report
    names was overwritten, and deleted when that second upload was given up at the end, so
    the job's retry could not resume from the checkpoint reported saved."""
    store = SlowSecondObject(tmp_path / "store")
    box = Sandbox(tmp_path / "sandbox", JobUser(None, None))
    events = _Events()
    run = JobRun(
        JobIdentity("job-1", "alloc-1", "node-1", 1, 1),
        events=events,  # type: ignore[arg-type]
        ledger=None,  # type: ignore[arg-type]
        store=None,  # type: ignore[arg-type]
        checkpoint_store=store,
        sandbox=box,
        log_path=tmp_path / "jobs" / "job-1" / "alloc-1.log",
        trace_headers={},
        progress_interval_s=60.0,
        log_tail_lines=10,
        checkpoint_upload_wait_s=0.01,
    )

    async def main() -> None:
        stage(box.checkpoints, 3, b"weights")
        run._on_checkpoint(_staged(3, b"weights"))
        async with asyncio.timeout(60):
            while run._last_checkpoint is None:
                await asyncio.sleep(0.01)
        stage(box.checkpoints, 3, b"weights, later")
        run._on_checkpoint(_staged(3, b"weights, later"))
        async with asyncio.timeout(60):  # uploading again, or refused
            while not store.second_going.is_set() and run._refused_checkpoint is None:
                await asyncio.sleep(0.01)
        pending = run._upload
        await run._close_control()  # the wait runs out: an upload under way is given up
        store.release.set()
        if pending is not None:
            await asyncio.wait([pending[1]], timeout=60)

    asyncio.run(main())
    assert store.get_bytes("step-00000003-a0001/checkpoint.pt") == b"weights"
    assert run._last_checkpoint is not None and run._last_checkpoint.step == 3
    assert run._lost_checkpoint is None
    assert len(events.emitted) == 1, "checkpoint.saved, once"

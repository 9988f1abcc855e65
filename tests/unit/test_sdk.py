"""The in-job SDK: configuration, metrics, checkpoints (written and verified), stopping."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import signal
import socket
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from trainyard import sdk
from trainyard.sdk.checkpoints import CheckpointManifest, file_digest, snapshot
from trainyard_platform.shared.control import (
    PREEMPTED_EXIT_CODE,
    CheckpointMessage,
    JobRuntimeEnv,
    MetricsMessage,
    parse_control_line,
)
from trainyard_platform.shared.storage import LocalStore, ObjectStore, open_store, split_uri


class RecordingStore(LocalStore):
    """A LocalStore that records puts, can hold uploads at a gate, and can fail them."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.puts: list[str] = []
        self.gate = threading.Event()
        self.gate.set()
        self.fail_with: Exception | None = None

    def put_file(self, key: str, path: Path) -> None:
        assert self.gate.wait(10), "test never opened the gate"
        if self.fail_with is not None:
            raise self.fail_with
        self.puts.append(key)
        super().put_file(key, path)

    def put_bytes(self, key: str, data: bytes) -> None:
        self.puts.append(key)
        super().put_bytes(key, data)


def make_context(store: ObjectStore, **kwargs: Any) -> sdk.JobContext:
    return sdk.JobContext(runtime=None, hyperparameters={}, seed=0, store=store, **kwargs)


def model_and_optimizer() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    loss = model(torch.randn(5, 4)).sum()
    loss.backward()
    optimizer.step()  # gives the optimizer per-parameter state worth saving
    return model, optimizer


@pytest.fixture
def outside_platform(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No TRAINYARD_* variables, and a throwaway working folder."""
    for name in list(os.environ):
        if name.startswith("TRAINYARD_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def platform_env(monkeypatch: pytest.MonkeyPatch, runtime: JobRuntimeEnv) -> None:
    for name, value in runtime.to_env().items():
        monkeypatch.setenv(name, value)


# --- configuration -----------------------------------------------------------------------


def test_init_outside_the_platform_uses_local_fallbacks(outside_platform: Path) -> None:
    with sdk.init({"lr": 0.1, "seed": 7}, name="my job") as ctx:
        assert ctx.runtime is None
        assert ctx.job_id == "local" and ctx.attempt == 0
        assert ctx.seed == 7
        assert ctx.hyperparameters == {"lr": 0.1}  # the seed is not a hyperparameter
        expected = outside_platform / ".trainyard" / "local-checkpoints" / "my_job"
        assert ctx.checkpoint_uri == expected.as_uri()


def test_init_defaults_the_seed_to_zero(outside_platform: Path) -> None:
    with sdk.init() as ctx:
        assert ctx.seed == 0 and ctx.hyperparameters == {}


def test_platform_values_override_defaults(
    outside_platform: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime = JobRuntimeEnv(
        job_id="job-9",
        allocation_id="alloc-9",
        attempt=3,
        seed=99,
        hyperparameters={"lr": 0.5, "extra": "x"},
        checkpoint_uri=(outside_platform / "ckpt").as_uri(),
        dataset="sklearn:digits",
    )
    platform_env(monkeypatch, runtime)
    with sdk.init({"lr": 0.1, "epochs": 3, "seed": 7}) as ctx:
        assert ctx.runtime == runtime
        assert ctx.hyperparameters == {"lr": 0.5, "epochs": 3, "extra": "x"}
        assert ctx.seed == 99 and ctx.job_id == "job-9" and ctx.attempt == 3
        assert ctx.dataset == "sklearn:digits"
        assert ctx.checkpoint_uri == (outside_platform / "ckpt").as_uri()


def test_hyperparameters_are_a_copy(outside_platform: Path) -> None:
    with sdk.init({"lr": 0.1}) as ctx:
        ctx.hyperparameters["lr"] = 99.0
        assert ctx.hyperparameters["lr"] == 0.1


def test_seed_everything_makes_all_generators_repeat(outside_platform: Path) -> None:
    def draw(ctx: sdk.JobContext) -> tuple[float, float, list[float]]:
        ctx.seed_everything()
        return random.random(), float(np.random.rand()), torch.rand(3).tolist()

    with sdk.init({"seed": 5}) as a, sdk.init({"seed": 5}) as b, sdk.init({"seed": 6}) as c:
        first = draw(a)
        assert draw(b) == first
        assert draw(c) != first


# --- metrics ----------------------------------------------------------------------------


def test_metrics_are_printed_outside_the_platform(
    outside_platform: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with sdk.init() as ctx:
        ctx.report_metrics(3, loss=0.5, accuracy=torch.tensor(0.75))
    assert "step 3: loss=0.5 accuracy=0.75" in capsys.readouterr().out


def test_non_numeric_metrics_are_refused(outside_platform: Path) -> None:
    with sdk.init() as ctx, pytest.raises(TypeError, match="metric 'name'"):
        ctx.report_metrics(1, name="0.5")  # type: ignore[arg-type]


def test_control_messages_arrive_on_a_real_socket(
    outside_platform: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = str(outside_platform / "control.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)
    runtime = JobRuntimeEnv(
        job_id="job-1",
        allocation_id="alloc-1",
        attempt=1,
        seed=1,
        checkpoint_uri=(outside_platform / "ckpt").as_uri(),
        control_socket=path,
    )
    platform_env(monkeypatch, runtime)
    ctx = sdk.init()
    connection, _ = server.accept()
    ctx.report_metrics(1, loss=2.0)
    ctx.save_checkpoint(1, {"w": torch.ones(2)})
    ctx.report_metrics(2, loss=1.0)
    ctx.close()  # shuts the connection down: the reader below sees end-of-file

    with connection, connection.makefile("rb") as reader:
        messages = [parse_control_line(line) for line in reader]
    server.close()
    metrics = [m for m in messages if isinstance(m, MetricsMessage)]
    checkpoints = [m for m in messages if isinstance(m, CheckpointMessage)]
    assert [(m.step, m.metrics) for m in metrics] == [(1, {"loss": 2.0}), (2, {"loss": 1.0})]
    [saved] = checkpoints
    ref = saved.checkpoint
    assert ref.step == 1
    folder, name = split_uri(ref.uri)
    data = open_store(folder).get_bytes(name)
    assert name == "checkpoint.pt"
    assert (hashlib.sha256(data).hexdigest(), len(data)) == (ref.sha256, ref.size_bytes)
    manifest_folder, manifest_name = split_uri(ref.manifest_uri)
    manifest = json.loads(open_store(manifest_folder).get_bytes(manifest_name))
    assert manifest["sha256"] == ref.sha256 and manifest["job_id"] == "job-1"


def test_a_vanished_runner_does_not_stop_training(
    outside_platform: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    runtime = JobRuntimeEnv(
        job_id="j",
        allocation_id="a",
        attempt=1,
        seed=1,
        checkpoint_uri=(outside_platform / "ckpt").as_uri(),
        control_socket=str(outside_platform / "no-runner.sock"),  # nobody listens
    )
    platform_env(monkeypatch, runtime)
    with caplog.at_level(logging.WARNING, "trainyard.sdk"), sdk.init() as ctx:
        ctx.report_metrics(1, loss=1.0)
        ctx.report_metrics(2, loss=1.0)
    assert sum("control socket" in r.message for r in caplog.records) == 1


# --- checkpoints ------------------------------------------------------------------------


def test_save_and_restore_round_trip(tmp_path: Path) -> None:
    model, optimizer = model_and_optimizer()
    with make_context(LocalStore(tmp_path)) as ctx:
        assert ctx.restore_latest() is None
        ctx.save_checkpoint(5, {"model": model.state_dict(), "step": 5})
        ctx.save_checkpoint(
            12, {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": 12}
        )
        ref = ctx.wait_for_checkpoints()
        assert ref is not None and ref.step == 12

        restored = ctx.restore_latest()
    assert restored is not None
    step, state = restored
    assert step == 12 and state["step"] == 12

    fresh, fresh_optimizer = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2)), None
    fresh.load_state_dict(state["model"])
    for name, tensor in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[name], tensor)
    fresh_optimizer = torch.optim.Adam(fresh.parameters(), lr=0.1)
    fresh_optimizer.load_state_dict(state["optimizer"])
    assert fresh_optimizer.state_dict()["state"][0]["exp_avg"].equal(
        optimizer.state_dict()["state"][0]["exp_avg"]
    )
    assert LocalStore(tmp_path).list() == [
        "step-00000005/checkpoint.pt",
        "step-00000005/manifest.json",
        "step-00000012/checkpoint.pt",
        "step-00000012/manifest.json",
    ]


def test_manifest_describes_the_object(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    runtime = JobRuntimeEnv(
        job_id="job-7", allocation_id="a", attempt=2, seed=0, checkpoint_uri=store.root_uri
    )
    with sdk.JobContext(runtime=runtime, hyperparameters={}, seed=0, store=store) as ctx:
        ctx.save_checkpoint(3, {"x": torch.arange(10)})
    manifest = CheckpointManifest.model_validate_json(
        store.get_bytes("step-00000003/manifest.json")
    )
    raw = json.loads(store.get_bytes("step-00000003/manifest.json"))
    assert set(raw) == {"step", "object", "size_bytes", "sha256", "created_at", "job_id", "attempt"}
    assert manifest.step == 3 and manifest.object == "step-00000003/checkpoint.pt"
    assert (manifest.job_id, manifest.attempt) == ("job-7", 2)
    assert (manifest.sha256, manifest.size_bytes) == file_digest(
        tmp_path / "step-00000003" / "checkpoint.pt"
    )
    # The object is an ordinary torch file.
    loaded = torch.load(tmp_path / "step-00000003" / "checkpoint.pt", weights_only=True)
    assert torch.equal(loaded["x"], torch.arange(10))


def test_upload_runs_in_the_background_and_manifest_is_written_last(tmp_path: Path) -> None:
    store = RecordingStore(tmp_path)
    store.gate.clear()  # hold the upload
    weights = torch.zeros(4)
    with make_context(store) as ctx:
        started = time.monotonic()
        ctx.save_checkpoint(1, {"w": weights})
        assert time.monotonic() - started < 5  # returned while the upload is held
        # The loop carries on mutating its tensors; the checkpoint keeps the snapshot.
        weights += 1
        assert not store.exists("step-00000001/manifest.json")
        store.gate.set()
        ctx.wait_for_checkpoints()
        assert store.puts == ["step-00000001/checkpoint.pt", "step-00000001/manifest.json"]
        restored = ctx.restore_latest()
    assert restored is not None
    assert torch.equal(restored[1]["w"], torch.zeros(4))


def test_an_object_without_manifest_is_ignored(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    with make_context(store) as ctx:
        ctx.save_checkpoint(5, {"step": 5})
        ctx.wait_for_checkpoints()
        # An upload that died before its manifest: a valid torch file, but incomplete.
        stray = tmp_path / "stray.pt"
        torch.save({"step": 9}, stray)
        store.put_file("step-00000009/checkpoint.pt", stray)

        restored = ctx.restore_latest()
    assert restored is not None and restored[0] == 5 and restored[1] == {"step": 5}


@pytest.mark.parametrize(
    "damage",
    ["overwrite_object", "truncate_object", "delete_object", "garbage_manifest", "wrong_step"],
)
def test_corrupt_checkpoints_are_skipped(
    tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = LocalStore(tmp_path)
    with make_context(store) as ctx:
        ctx.save_checkpoint(5, {"step": 5})
        ctx.save_checkpoint(10, {"step": 10})
        ctx.wait_for_checkpoints()

        obj = tmp_path / "step-00000010" / "checkpoint.pt"
        manifest = tmp_path / "step-00000010" / "manifest.json"
        if damage == "overwrite_object":
            torch.save({"step": 666}, obj)  # loadable, but not what the manifest describes
        elif damage == "truncate_object":
            obj.write_bytes(obj.read_bytes()[:-10])
        elif damage == "delete_object":
            obj.unlink()
        elif damage == "garbage_manifest":
            manifest.write_text("{not json")
        elif damage == "wrong_step":
            data = json.loads(manifest.read_text())
            data["step"] = 11
            manifest.write_text(json.dumps(data))

        with caplog.at_level(logging.WARNING, "trainyard.sdk"):
            restored = ctx.restore_latest()
    assert restored == (5, {"step": 5})
    assert any("skipping checkpoint at step 10" in r.message for r in caplog.records)


def test_a_failed_upload_is_raised_and_leaves_no_manifest(tmp_path: Path) -> None:
    store = RecordingStore(tmp_path)
    store.fail_with = OSError("disk full")
    ctx = make_context(store)
    ctx.save_checkpoint(1, {"x": 1})
    with pytest.raises(sdk.CheckpointError, match=r"step 1.*disk full"):
        ctx.wait_for_checkpoints()
    assert store.list() == []

    # The next save surfaces a failure of the previous one before doing more work.
    ctx.save_checkpoint(2, {"x": 2})
    with pytest.raises(sdk.CheckpointError, match="step 2"):
        ctx.save_checkpoint(3, {"x": 3})
    # Step 3 was refused, not queued: nothing is left to fail.
    ctx.close()
    assert store.list() == []


def test_close_waits_for_the_upload(tmp_path: Path) -> None:
    store = RecordingStore(tmp_path)
    store.gate.clear()
    ctx = make_context(store)
    ctx.save_checkpoint(1, {"x": torch.ones(1)})
    threading.Timer(0.2, store.gate.set).start()
    ctx.close()
    assert store.exists("step-00000001/manifest.json")


def test_states_torch_cannot_restore_safely_are_refused_at_save(tmp_path: Path) -> None:
    with make_context(LocalStore(tmp_path)) as ctx:
        with pytest.raises(TypeError, match=r"state\['extra'\]\['rng'\] is a numpy.ndarray"):
            ctx.save_checkpoint(1, {"extra": {"rng": np.zeros(3)}})
        with pytest.raises(TypeError, match="must be a dict"):
            ctx.save_checkpoint(1, [torch.ones(1)])  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="step must be >= 0"):
            ctx.save_checkpoint(-1, {})
    assert LocalStore(tmp_path).list() == []


def test_snapshot_copies_tensors_and_keeps_state_dict_metadata() -> None:
    model, _ = model_and_optimizer()
    state = model.state_dict()
    copied = snapshot({"model": state, "shape": torch.Size([2]), "tags": ("a", 1)})
    assert isinstance(copied["model"], OrderedDict)
    assert copied["model"]._metadata == state._metadata  # type: ignore[attr-defined]
    for name, tensor in state.items():
        assert torch.equal(copied["model"][name], tensor)
        assert copied["model"][name].data_ptr() != tensor.data_ptr()
    assert copied["shape"] == torch.Size([2]) and copied["tags"] == ("a", 1)


# --- stopping ---------------------------------------------------------------------------


def wait_for(predicate: Any, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return False


def test_sigterm_sets_should_stop_and_close_restores_the_handler(outside_platform: Path) -> None:
    previous = signal.getsignal(signal.SIGTERM)
    ctx = sdk.init()
    try:
        handler = signal.getsignal(signal.SIGTERM)
        assert callable(handler) and handler is not previous  # else SIGTERM kills pytest
        assert not ctx.should_stop()
        os.kill(os.getpid(), signal.SIGTERM)
        assert wait_for(ctx.should_stop)
    finally:
        ctx.close()
    assert signal.getsignal(signal.SIGTERM) == previous


def test_exit_preempted_waits_for_the_checkpoint_and_exits_75(tmp_path: Path) -> None:
    store = RecordingStore(tmp_path)
    store.gate.clear()
    ctx = make_context(store)
    ctx.save_checkpoint(4, {"x": torch.ones(1)})
    threading.Timer(0.2, store.gate.set).start()
    with pytest.raises(SystemExit) as exited:
        ctx.exit_preempted()
    assert exited.value.code == PREEMPTED_EXIT_CODE == 75
    assert store.exists("step-00000004/manifest.json")


def test_exit_preempted_still_exits_75_when_the_upload_failed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = RecordingStore(tmp_path)
    store.fail_with = OSError("network down")
    ctx = make_context(store)
    ctx.save_checkpoint(4, {"x": 1})
    with caplog.at_level(logging.ERROR, "trainyard.sdk"), pytest.raises(SystemExit) as exited:
        ctx.exit_preempted()
    assert exited.value.code == PREEMPTED_EXIT_CODE
    assert any("checkpoint failed while stopping" in r.message for r in caplog.records)


def test_an_error_in_the_with_block_is_not_masked_by_an_upload_error(tmp_path: Path) -> None:
    store = RecordingStore(tmp_path)
    store.fail_with = OSError("upload broke")
    with pytest.raises(ZeroDivisionError), make_context(store) as ctx:
        ctx.save_checkpoint(1, {"x": 1})
        _ = 1 / 0

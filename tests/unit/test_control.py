"""The runner <-> job contract: environment variables and control lines."""

from __future__ import annotations

import json
import math
import os
import socket
from pathlib import Path

import pytest

from trainyard_platform.shared.control import (
    ENV_JOB_ID,
    MAX_CONTROL_LINE_BYTES,
    MAX_UNIX_PATH,
    PREEMPTED_EXIT_CODE,
    CheckpointMessage,
    JobRuntimeEnv,
    MetricsMessage,
    parse_control_line,
    unix_address,
)
from trainyard_platform.shared.events.payloads import CheckpointRef

FULL = JobRuntimeEnv(
    job_id="job-1",
    allocation_id="alloc-1",
    attempt=2,
    seed=1234,
    hyperparameters={"lr": 0.01, "batch_size": 64, "name": "cnn", "augment": True},
    checkpoint_uri="s3://trainyard/jobs/job-1/checkpoints",
    control_socket="/sandbox/control.sock",
    dataset="sklearn:digits",
    gpu_indices=[0, 3],
)

REF = CheckpointRef(
    uri="s3://b/jobs/j/checkpoints/step-00000010/checkpoint.pt",
    manifest_uri="s3://b/jobs/j/checkpoints/step-00000010/manifest.json",
    step=10,
    size_bytes=1234,
    sha256="ab" * 32,
)


def test_env_round_trip_keeps_every_field_and_type() -> None:
    env = FULL.to_env()
    assert env["TRAINYARD_GPU_INDICES"] == "0,3"
    assert json.loads(env["TRAINYARD_HYPERPARAMETERS"])["augment"] is True
    assert all(isinstance(v, str) for v in env.values())
    restored = JobRuntimeEnv.from_env(env)
    assert restored == FULL
    assert restored is not None
    # JSON keeps ints ints and bools bools; the union must not coerce them to floats.
    assert type(restored.hyperparameters["batch_size"]) is int
    assert type(restored.hyperparameters["augment"]) is bool


def test_optional_variables_are_left_out_when_unset() -> None:
    minimal = JobRuntimeEnv(
        job_id="j", allocation_id="a", attempt=0, seed=0, checkpoint_uri="file:///tmp/c"
    )
    env = minimal.to_env()
    assert not {"TRAINYARD_CONTROL_SOCKET", "TRAINYARD_DATASET", "TRAINYARD_GPU_INDICES"} & set(env)
    assert JobRuntimeEnv.from_env(env) == minimal


def test_empty_gpu_list_is_distinct_from_unset() -> None:
    explicit = FULL.model_copy(update={"gpu_indices": []})
    env = explicit.to_env()
    assert env["TRAINYARD_GPU_INDICES"] == ""
    restored = JobRuntimeEnv.from_env(env)
    assert restored is not None and restored.gpu_indices == []


def test_from_env_is_none_outside_the_platform() -> None:
    env = FULL.to_env()
    del env[ENV_JOB_ID]
    assert JobRuntimeEnv.from_env(env) is None
    assert JobRuntimeEnv.from_env({}) is None


def test_from_env_reads_a_real_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in FULL.to_env().items():
        monkeypatch.setenv(name, value)
    assert JobRuntimeEnv.from_env(os.environ) == FULL


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"TRAINYARD_ATTEMPT": None}, "TRAINYARD_ATTEMPT is missing"),
        ({"TRAINYARD_CHECKPOINT_URI": None}, "TRAINYARD_CHECKPOINT_URI is missing"),
        ({"TRAINYARD_SEED": "forty-two"}, "TRAINYARD_SEED must be an integer"),
        ({"TRAINYARD_GPU_INDICES": "0,a"}, "TRAINYARD_GPU_INDICES must be an integer"),
        ({"TRAINYARD_HYPERPARAMETERS": "{"}, "TRAINYARD_HYPERPARAMETERS is not valid JSON"),
        ({"TRAINYARD_HYPERPARAMETERS": "[1]"}, "must be a JSON object"),
        ({"TRAINYARD_HYPERPARAMETERS": '{"a": [1]}'}, "hyperparameters.a"),
        ({"TRAINYARD_ATTEMPT": "-1"}, "attempt"),
        ({"TRAINYARD_JOB_ID": ""}, "job_id"),
    ],
)
def test_broken_environment_is_a_clear_error(change: dict[str, str | None], message: str) -> None:
    env = FULL.to_env()
    for name, value in change.items():
        if value is None:
            del env[name]
        else:
            env[name] = value
    with pytest.raises(ValueError, match=message):
        JobRuntimeEnv.from_env(env)


def test_metrics_message_round_trip() -> None:
    message = MetricsMessage(step=7, metrics={"loss": 0.25, "accuracy": 1.0})
    line = message.encode()
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert parse_control_line(line) == message
    assert parse_control_line(line.decode()) == message


def test_non_finite_metrics_survive_the_trip() -> None:
    line = MetricsMessage(step=1, metrics={"loss": math.nan, "grad": math.inf}).encode()
    parsed = parse_control_line(line)
    assert isinstance(parsed, MetricsMessage)
    assert math.isnan(parsed.metrics["loss"]) and parsed.metrics["grad"] == math.inf


def test_checkpoint_message_round_trip() -> None:
    parsed = parse_control_line(CheckpointMessage(checkpoint=REF).encode())
    assert isinstance(parsed, CheckpointMessage)
    assert parsed.checkpoint == REF


def test_unknown_fields_are_ignored_for_forward_compatibility() -> None:
    line = json.dumps({"kind": "metrics", "step": 1, "metrics": {}, "added_later": 1})
    assert parse_control_line(line) == MetricsMessage(step=1, metrics={})


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (b"", "empty"),
        (b"   \n", "empty"),
        (b"not json", "not valid JSON"),
        (b"\xff\xfe", "not valid JSON"),
        (b"[1, 2]", "not a JSON object"),
        (b'{"step": 1}', "unknown control message kind None"),
        (b'{"kind": "status"}', "unknown control message kind 'status'"),
        (b'{"kind": "metrics", "step": -1, "metrics": {}}', "step"),
        (b'{"kind": "metrics", "step": 1, "metrics": {"loss": "low"}}', "metrics.loss"),
        (b'{"kind": "checkpoint"}', "checkpoint: Field required"),
        (b"[" * 200_000, "nested too deeply"),
        (b'{"kind": "metrics", "step": 9223372036854775808, "metrics": {}}', "step"),
        (
            b'{"kind": "checkpoint", "checkpoint": {"uri": "u", "manifest_uri": "m", '
            b'"step": 9223372036854775808, "size_bytes": 1, "sha256": "x"}}',
            "step must be 0 to 9223372036854775807",
        ),
    ],
)
def test_bad_lines_raise_value_error_with_a_reason(line: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_control_line(line)


def test_oversized_lines_are_refused_before_parsing() -> None:
    line = (
        b'{"kind": "metrics", "step": 1, "metrics": {}, "pad": "'
        + b"x" * (MAX_CONTROL_LINE_BYTES)
        + b'"}'
    )
    with pytest.raises(ValueError, match="longer than"):
        parse_control_line(line)


def test_preempted_exit_code_is_ex_tempfail() -> None:
    assert PREEMPTED_EXIT_CODE == 75 == getattr(os, "EX_TEMPFAIL", 75)


def test_lines_written_to_a_pipe_are_parsed_in_order() -> None:
    read_fd, write_fd = os.pipe()
    messages = [
        MetricsMessage(step=1, metrics={"loss": 1.0}),
        CheckpointMessage(checkpoint=REF),
        MetricsMessage(step=2, metrics={"loss": 0.5}),
    ]
    with os.fdopen(write_fd, "wb") as writer:
        for message in messages:
            writer.write(message.encode())
    with os.fdopen(read_fd, "rb") as reader:
        assert [parse_control_line(line) for line in reader] == messages


def test_a_socket_in_a_deep_folder_is_still_reachable(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    path = str(deep / "control.sock")
    assert len(path) >= MAX_UNIX_PATH
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(unix_address(path))
    server.listen(1)
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.connect(unix_address(path))
    connection, _ = server.accept()
    client.sendall(b"hello")
    assert connection.recv(5) == b"hello"
    for s in (client, connection, server):
        s.close()
    assert (deep / "control.sock").exists()

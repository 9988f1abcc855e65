"""Two local stacks on one host, each with its own data folder, give their runners job uids
of their own: both named their node ``local-node-1``, got the same uids, and the second
runner refused to start (``dev.py up --data-dir ...`` while another stack ran)."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainyard_platform.deploy.local.stack import LocalStack
from trainyard_platform.services.runner.config import JOB_SLOTS


def _runner_env(data_dir: Path, monkeypatch: pytest.MonkeyPatch, node: str) -> dict[str, str]:
    stack = LocalStack(data_dir)
    monkeypatch.setattr(stack, "_nats_env", lambda kind, node_id: {})
    return stack._service_env_for("runner", node_id=node)


def test_each_data_folder_and_node_has_its_own_job_uids(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    one = _runner_env(tmp_path / "a", monkeypatch, "local-node-1")
    again = _runner_env(tmp_path / "a", monkeypatch, "local-node-1")
    other = _runner_env(tmp_path / "b", monkeypatch, "local-node-1")
    second_node = _runner_env(tmp_path / "a", monkeypatch, "node-2")
    bases = [int(env["TRAINYARD_RUNNER_JOB_UID_BASE"]) for env in (one, again, other, second_node)]
    assert bases[0] == bases[1]  # a restarted stack keeps its uids
    assert len({bases[0], bases[2], bases[3]}) == 3
    for base in bases:
        assert base % 64 == 0 and base >= 200_000 and base + JOB_SLOTS <= 264_000

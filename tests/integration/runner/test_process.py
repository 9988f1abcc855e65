"""``python -m trainyard_platform.services.runner`` as its own process: it serves, and drains on SIGTERM."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import httpx
import pytest

from tests.integration.runner.conftest import EventLog, grant, publish
from trainyard_platform.deploy.local.ports import free_port
from trainyard_platform.services.runner.config import Settings
from trainyard_platform.shared.bus import Bus
from trainyard_platform.shared.events.payloads import JobPreempted, JobProgress, RunnerHeartbeat

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]


async def test_sigterm_drains_the_jobs_and_reports_them_preempted(
    settings: Settings, bus: Bus, events: EventLog, launches: Path, tmp_path: Path
) -> None:
    port = free_port()
    env = {
        **os.environ,
        "TRAINYARD_NATS_URL": settings.nats.url,
        "TRAINYARD_STORAGE_URI": settings.storage.uri,
        "TRAINYARD_RUNNER_WORK_DIR": str(settings.work_dir),
        "TRAINYARD_RUNNER_CODE_DIR": str(settings.code_dir),
        "TRAINYARD_RUNNER_HEARTBEAT_INTERVAL_SECONDS": "0.2",
        "TRAINYARD_RUNNER_DRAIN_TIMEOUT_SECONDS": "10",
        "TRAINYARD_RUNNER_ADMIN_TOKEN": "op-token",
        "TRAINYARD_RUNNER_JOB_UID_BASE": str(settings.job_uid_base),
    }
    runner = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "trainyard_platform.services.runner",
        "--virtual-gpus",
        "2",
        "--node-id",
        settings.node_id,
        "--port",
        str(port),
        cwd=REPO,
        env=env,
        stdout=(tmp_path / "runner.log").open("wb"),
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        await events.first(RunnerHeartbeat, settings.node_id)
        allocation = grant(settings.node_id, ["wait", str(launches)])
        await publish(bus, allocation, settings.node_id)
        await events.first(JobProgress, allocation.job_id)

        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            assert (await client.get("/v1/node")).status_code == 401
            auth = {"Authorization": "Bearer op-token"}
            node = (await client.get("/v1/node", headers=auth)).json()
            assert (await client.get("/healthz")).status_code == 200
        assert node["node_id"] == settings.node_id
        assert node["job_network"] == ("loopback" if os.geteuid() == 0 else "host")
        assert [r["allocation_id"] for r in node["running"]] == [allocation.allocation_id]

        runner.send_signal(signal.SIGTERM)
        preempted = await events.first(JobPreempted, allocation.job_id)
        assert preempted.reason == "runner shutting down"
        assert preempted.checkpoint is not None and preempted.checkpoint.step == 7
        async with asyncio.timeout(30):
            assert await runner.wait() == 0
        last = events.of(RunnerHeartbeat, settings.node_id)[-1]
        assert last.running_allocations == []
    finally:
        if runner.returncode is None:
            runner.kill()
            await runner.wait()

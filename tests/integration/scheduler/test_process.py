"""``python -m trainyard_platform.services.scheduler`` as a process: ready, schedules, shows the queue, drains."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from tests.integration.scheduler.conftest import make_spec, until
from trainyard_platform.deploy.local.ports import free_port
from trainyard_platform.shared.bus import Bus
from trainyard_platform.shared.events import Envelope, parse_envelope
from trainyard_platform.shared.events.payloads import (
    AllocationGranted,
    JobPending,
    JobSubmitted,
    RunnerHeartbeat,
)
from trainyard_platform.shared.events.trust import owner
from trainyard_platform.shared.settings import NatsSettings

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]


async def test_process_schedules_and_serves_the_queue(
    database_url: str, nats_settings: NatsSettings, tmp_path: Path
) -> None:
    port = free_port()
    env = {
        **os.environ,
        "TRAINYARD_DATABASE_URL": database_url,
        "TRAINYARD_NATS_URL": nats_settings.url,
        "TRAINYARD_SCHEDULER_PORT": str(port),
        "TRAINYARD_SCHEDULER_ADMIN_TOKEN": "op-token",
        # Submit order, so the 2-GPU job submitted first takes the node and the 1-GPU job
        # waits (by default the smaller job would go first).
        "TRAINYARD_SCHEDULER_SIZE_WEIGHT": "0",
    }
    log_path = tmp_path / "scheduler.log"
    with log_path.open("wb") as log:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "trainyard_platform.services.scheduler",
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=log,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(base_url=base, timeout=2) as http:

            async def ready() -> bool:
                assert process.returncode is None, log_path.read_text()
                try:
                    return (await http.get("/readyz")).status_code == 200
                except httpx.TransportError:
                    return False

            await until(ready, timeout=60)
            async with Bus.connect(nats_settings, "process-test") as bus:
                seen: list[Envelope] = []  # type: ignore[type-arg]

                async def collect(msg) -> None:  # type: ignore[no-untyped-def]
                    seen.append(parse_envelope(msg.data))

                await bus.nats.subscribe("trainyard.>", cb=collect)
                now = datetime.now(UTC)
                for payload, subject in (
                    (
                        RunnerHeartbeat(
                            node_id="n1", hostname="h", gpu_flavor="cpu", gpu_count=2, sent_at=now
                        ),
                        "n1",
                    ),
                    (JobSubmitted(job_id="j1", spec=make_spec(gpus=2), submitted_at=now), "j1"),
                    (JobSubmitted(job_id="j2", spec=make_spec(gpus=1), submitted_at=now), "j2"),
                ):
                    await bus.publish(
                        Envelope.wrap(payload, source=owner(payload), subject=subject)
                    )
                await until(lambda: any(isinstance(e.data, JobPending) for e in seen))
                assert any(
                    isinstance(e.data, AllocationGranted) and e.subject == "n1" for e in seen
                )

            assert (await http.get("/v1/queue")).status_code == 401
            response = await http.get("/v1/queue", headers={"Authorization": "Bearer op-token"})
            assert response.status_code == 200
            queue = response.json()
            (node,) = queue["nodes"]
            assert (node["node_id"], node["free_gpus"], node["used_gpus"]) == (
                "n1",
                [],
                {"0": "j1", "1": "j1"},
            )
            assert [(a["job_id"], a["gpu_indices"]) for a in queue["allocations"]] == [
                ("j1", [0, 1])
            ]
            (team_queue,) = queue["queues"]
            assert (team_queue["name"], team_queue["team"], team_queue["implicit"]) == (
                "default:vision",
                "vision",
                True,
            )
            assert [(r["job_id"], r["nodes"]) for r in team_queue["running"]] == [
                ("j1", {"n1": [0, 1]})
            ]
            assert [(q["flavor"], q["used"], q["nominal"]) for q in team_queue["quotas"]] == [
                ("cpu", 2, None)
            ]
            (pending,) = team_queue["pending"]
            assert (pending["job_id"], pending["position"], pending["blocking"]) == ("j2", 1, "j1")
            assert pending["reason"].startswith("needs 1 cpu GPU on one node; no cpu GPU is free")
            assert pending["estimated_start"] is not None

            ready = (await http.get("/readyz")).json()
            assert (ready["ready"], ready["role"]) == (True, "leader")
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(process.wait(), timeout=60)
    assert code == 0, log_path.read_text()

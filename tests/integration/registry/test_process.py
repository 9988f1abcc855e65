"""``python -m trainyard_platform.services.registry`` as a process: migrates, registers (copying the checkpoint
into its local store), serves the version and its bytes, drains."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import uuid
from pathlib import Path

import httpx
import pytest

from tests.integration.registry.conftest import EventLog
from tests.integration.registry.test_registry import (
    envelopes,
    ref,
    spec,
    started,
    succeeded,
)
from trainyard_platform.deploy.local.ports import free_port
from trainyard_platform.shared.bus import Bus
from trainyard_platform.shared.settings import NatsSettings
from trainyard_platform.shared.storage import LocalStore

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]


async def test_the_registry_process_registers_and_serves_a_version(
    database_url: str, nats_settings: NatsSettings, bus: Bus, events: EventLog, tmp_path: Path
) -> None:
    port = free_port()
    objects = tmp_path / "objects"
    store = LocalStore(objects)
    env = {
        **os.environ,
        "TRAINYARD_DATABASE_URL": database_url,
        "TRAINYARD_NATS_URL": nats_settings.url,
        "TRAINYARD_REGISTRY_ADMIN_TOKEN": "op-token",
        "TRAINYARD_STORAGE_URI": objects.as_uri(),
    }
    log_path = tmp_path / "registry.log"
    with log_path.open("wb") as log:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "trainyard_platform.services.registry",
            "--port",
            str(port),
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=log,
        )
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=2) as http:
            async with asyncio.timeout(60):
                while True:
                    assert process.returncode is None, log_path.read_text()
                    try:
                        if (await http.get("/readyz")).status_code == 200:
                            break
                    except httpx.TransportError:
                        pass
                    await asyncio.sleep(0.2)

            job = f"job-{uuid.uuid4().hex[:8]}"
            for payload in (
                started(job, "alloc-1", 0, spec("proc")),
                succeeded(job, "alloc-1", ref(store, job, 4)),
            ):
                for envelope in envelopes(payload, job):
                    await bus.publish(envelope)
            await events.wait_for(
                lambda: [e for e in events.events if e.type.startswith("trainyard.model.")],
                what="model.registered",
            )
            detail = await http.get(
                "/v1/models/vision/proc/versions/1",
                headers={"Authorization": "Bearer op-token"},
            )
            assert detail.status_code == 200, detail.text
            assert detail.json()["lineage"]["job_id"] == job
            # A local store has no presigned URLs: the bytes come through the API, verified.
            download = await http.get(
                "/v1/models/vision/proc/versions/1/download",
                headers={"Authorization": "Bearer op-token"},
            )
            assert download.status_code == 200, download.text
            assert download.json()["needs_token"] is True
            content = await http.get(
                download.json()["url"], headers={"Authorization": "Bearer op-token"}
            )
            assert content.status_code == 200, content.text
            assert content.content == store.get_bytes(
                "jobs/" + job + "/checkpoints/step-00000004/checkpoint.pt"
            )
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(process.wait(), timeout=60)
    assert code == 0, log_path.read_text()

"""SIGTERM while the object store hangs: the registry (every service runs the same way,
``runtime.run_service``) stops with status 0 and does not wait for the store.

A call to a hung S3 endpoint (its server paused with SIGSTOP) blocks its thread until the
read timeout, and the readiness check makes one every probe. asyncio's end waited for every
thread of its pool, and Python's exit again: on a local stack with the S3 endpoint paused,
the registry, sent SIGTERM, was still there after its 20 s grace and was killed."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import uuid
from pathlib import Path

import httpx
import pytest

from trainyard_platform.deploy.local.ports import free_port
from trainyard_platform.deploy.local.s3 import S3Server
from trainyard_platform.shared.settings import NatsSettings
from trainyard_platform.shared.storage import open_store

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
READ_TIMEOUT_S = 600
"""The store's read timeout: a thread blocked on the hung store waits this long."""


async def test_sigterm_while_the_object_store_hangs_stops_the_registry(
    database_url: str, nats_settings: NatsSettings, tmp_path: Path
) -> None:
    port = free_port()
    with S3Server(log_dir=tmp_path) as s3:
        uri = f"s3://hung-{uuid.uuid4().hex[:12]}"
        open_store(uri, s3.storage_settings(uri))  # makes the bucket
        env = {
            **os.environ,
            **s3.storage_env(uri),
            "TRAINYARD_STORAGE_S3_READ_TIMEOUT_SECONDS": str(READ_TIMEOUT_S),
            "TRAINYARD_DATABASE_URL": database_url,
            "TRAINYARD_NATS_URL": nats_settings.url,
            "TRAINYARD_REGISTRY_ADMIN_TOKEN": "op-token",
            "TRAINYARD_REGISTRY_SHUTDOWN_GRACE_SECONDS": "5",
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
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as http:
                async with asyncio.timeout(60):
                    while True:
                        assert process.returncode is None, log_path.read_text()
                        try:
                            if (await http.get("/readyz")).status_code == 200:
                                break
                        except httpx.TransportError:
                            pass
                        await asyncio.sleep(0.2)
                s3.send_signal(signal.SIGSTOP)
                ready = await http.get("/readyz")  # its store check now blocks a thread
                assert ready.status_code == 503, ready.text
                assert ready.json()["checks"]["storage"] is False
            process.send_signal(signal.SIGTERM)
            # A guard far below the read timeout: before, the process waited all of it.
            async with asyncio.timeout(120):
                status = await process.wait()
            assert status == 0, log_path.read_text()
        finally:
            s3.send_signal(signal.SIGCONT)
            if process.returncode is None:
                process.kill()
                await process.wait()

"""``python -m trainyard_platform.services.billing`` as a process: seeds prices, bills, serves usage, drains."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import httpx
import pytest

from tests.integration.billing.conftest import grant_of, until
from trainyard_platform.deploy.local.ports import free_port
from trainyard_platform.shared.bus import Bus
from trainyard_platform.shared.events import Envelope, parse_envelope
from trainyard_platform.shared.events.payloads import AllocationReleased, CostRecorded
from trainyard_platform.shared.events.trust import owner
from trainyard_platform.shared.settings import NatsSettings

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]


async def test_process_bills_with_configured_prices(
    database_url: str, nats_settings: NatsSettings, tmp_path: Path
) -> None:
    port = free_port()
    env = {
        **os.environ,
        "TRAINYARD_DATABASE_URL": database_url,
        "TRAINYARD_NATS_URL": nats_settings.url,
        "TRAINYARD_BILLING_PORT": str(port),
        "TRAINYARD_BILLING_PRICES": json.dumps({"h100": 4.2}),
        "TRAINYARD_BILLING_ADMIN_TOKEN": "op-token",
    }
    log_path = tmp_path / "billing.log"
    with log_path.open("wb") as log:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "trainyard_platform.services.billing",
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=log,
        )
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=2) as http:

            async def ready() -> bool:
                assert process.returncode is None, log_path.read_text()
                try:
                    return (await http.get("/readyz")).status_code == 200
                except httpx.TransportError:
                    return False

            await until(ready, timeout=60)
            async with Bus.connect(nats_settings, "process-test") as bus:
                costs: list[CostRecorded] = []

                async def collect(msg) -> None:  # type: ignore[no-untyped-def]
                    event = parse_envelope(msg.data).data
                    if isinstance(event, CostRecorded):
                        costs.append(event)

                await bus.nats.subscribe("trainyard.cost.recorded.v1.*", cb=collect)
                start = datetime(2025, 1, 1, tzinfo=UTC)
                released = AllocationReleased(
                    allocation_id="a1",
                    job_id="j1",
                    node_id="n1",
                    team="nlp",
                    user="cy",
                    gpu_flavor="h100",
                    gpus=8,
                    granted_at=start,
                    released_at=start + timedelta(minutes=15),
                    outcome="succeeded",
                )
                await bus.publish(grant_of(released))  # billing meters what was announced
                await bus.publish(Envelope.wrap(released, source=owner(released), subject="j1"))
                await until(lambda: bool(costs))
            assert costs[0].cost == pytest.approx(8.4)  # 8 GPUs x 0.25 h x 4.2

            body = (
                await http.get(
                    "/v1/usage",
                    params={"team": "nlp"},
                    headers={"Authorization": "Bearer op-token"},
                )
            ).json()
            assert [(j["job_id"], Decimal(j["cost"])) for j in body["jobs"]] == [
                ("j1", Decimal("8.4"))
            ]
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(process.wait(), timeout=60)
    assert code == 0, log_path.read_text()

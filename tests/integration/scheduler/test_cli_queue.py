"""``trainyard queue --all-teams`` against the real scheduler API (uvicorn on loopback, its
PostgreSQL): every team's waiting jobs from ``GET /v1/queue``, and a ``--limit`` past a
queue's head read on from ``GET /v1/queue/{name}/pending``'s pages."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Generator
from datetime import UTC, datetime
from pathlib import Path

import asyncpg
import pytest
import uvicorn
from pydantic import SecretStr

from tests.integration.scheduler.conftest import make_spec
from trainyard import cli
from trainyard_platform.deploy.local.ports import free_port
from trainyard_platform.services.scheduler import repository as repo
from trainyard_platform.services.scheduler.api import create_app
from trainyard_platform.shared.access import service_guard

pytestmark = pytest.mark.integration

TOKEN = "op-token"


class _Server(uvicorn.Server):
    """uvicorn in the test's loop, leaving the signals alone."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


async def test_every_teams_waiting_jobs_with_a_limit_past_the_head(
    pool: asyncpg.Pool,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    now = datetime.now(UTC)
    async with pool.acquire() as conn:
        for n in range(130):
            await repo.insert_job(conn, f"vision-{n:03}", make_spec(team="vision"), now, now)
        await repo.insert_job(conn, "nlp-000", make_spec(team="nlp", gpus=2), now, now)
    port = free_port()
    app = create_app(pool, service_guard(SecretStr(TOKEN)))
    server = _Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    )
    serving = asyncio.create_task(server.serve())
    monkeypatch.setenv("TRAINYARD_CONFIG", str(tmp_path / "config.json"))
    monkeypatch.setenv("TRAINYARD_SCHEDULER_URL", f"http://127.0.0.1:{port}")
    base = ["--url", "http://127.0.0.1:1", "--token", TOKEN, "queue", "--all-teams"]
    try:
        async with asyncio.timeout(10):
            while not server.started:
                await asyncio.sleep(0.05)
        capsys.readouterr()

        assert await asyncio.to_thread(cli.main, [*base, "--limit", "120", "--json"]) == 0
        captured = capsys.readouterr()
        nlp, vision = json.loads(captured.out)
        assert (nlp["team"], [j["job_id"] for j in nlp["pending"]]) == ("nlp", ["nlp-000"])
        # 100 from the head of GET /v1/queue, read on to 120 from the queue's pages.
        assert (vision["team"], vision["waiting"]) == ("vision", 130)
        assert [j["job_id"] for j in vision["pending"]] == [f"vision-{n:03}" for n in range(120)]
        assert "120 of 130 waiting jobs shown (--limit N shows more)" in captured.err

        assert await asyncio.to_thread(cli.main, [*base, "--team", "nlp"]) == 0
        rows = capsys.readouterr().out.splitlines()
        assert [row.split()[1:6] for row in rows[1:]] == [["nlp", "-", "nlp-000", "2", "cpu"]]
    finally:
        server.should_exit = True
        await serving

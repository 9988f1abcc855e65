"""The baseline of ``bench.submission``: a bare Litestar app inserting the posted JSON with
asyncpg, served by uvicorn exactly as the submission service is served.

``python -m bench._submission_baseline --dsn DSN --port PORT [--pool-max N]``. ``POST
/v1/jobs`` parses the body as JSON (Litestar's own decoding), inserts it with a new id into
``bench_baseline.jobs`` (one autocommitted ``INSERT``: durable when it answers) and answers
201 with the id, the JSON and a ``Location`` header, like the service. ``GET /healthz``
answers once the pool is open. No authentication, screening, rate limiting, history or
outbox: the floor the real service is compared with.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
import uvicorn
from litestar import Litestar, Response, get, post

SCHEMA = "bench_baseline"
_pool: asyncpg.Pool | None = None


@post("/v1/jobs")
async def submit(data: dict[str, Any]) -> Response[dict[str, Any]]:
    assert _pool is not None
    job_id = str(uuid.uuid4())
    async with _pool.acquire() as conn:
        await conn.execute(
            "INSERT INTO jobs (id, spec, submitted_at) VALUES ($1, $2::jsonb, now())",
            job_id,
            json.dumps(data),
        )
    return Response(
        {"id": job_id, **data}, status_code=201, headers={"Location": f"/v1/jobs/{job_id}"}
    )


@get("/healthz", sync_to_thread=False)
def healthz() -> dict[str, str]:
    return {"status": "ok"}


def app(dsn: str, pool_max: int) -> Litestar:
    @asynccontextmanager
    async def lifespan(_: Litestar) -> AsyncIterator[None]:
        global _pool
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(
                f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}; "
                f"CREATE TABLE IF NOT EXISTS {SCHEMA}.jobs "
                "(id text PRIMARY KEY, spec jsonb NOT NULL, submitted_at timestamptz NOT NULL)"
            )
        finally:
            await conn.close()
        _pool = await asyncpg.create_pool(
            dsn, min_size=1, max_size=pool_max, server_settings={"search_path": SCHEMA}
        )
        try:
            yield
        finally:
            await _pool.close()

    return Litestar(route_handlers=[submit, healthz], lifespan=[lifespan], debug=False)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench._submission_baseline")
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--pool-max", type=int, default=10)
    args = parser.parse_args()
    # Served as shared.runtime.ServiceRuntime.run serves a service: uvicorn's Server inside
    # asyncio.run (so the same event loop: uvicorn's "auto" loop choice is not applied), the
    # HTTP parser left to uvicorn ("auto": httptools when installed, else h11).
    config = uvicorn.Config(
        app(args.dsn, args.pool_max), host="127.0.0.1", port=args.port, log_level="warning"
    )
    asyncio.run(uvicorn.Server(config).serve())


if __name__ == "__main__":
    main()

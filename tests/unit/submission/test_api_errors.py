"""Error shapes of the HTTP app that need no database: 401 first, JSON always, no tracebacks."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from litestar.testing import TestClient

from trainyard_platform.services.submission.api import AppDeps, create_app
from trainyard_platform.services.submission.config import Settings
from trainyard_platform.shared.storage import LocalStore


class BrokenPool(asyncpg.Pool):  # type: ignore[misc]
    """A pool whose every use fails, with a message that must never reach a user."""

    def __init__(self) -> None:  # no connections: nothing here may reach a database
        self.used = 0

    def acquire(self) -> Any:
        self.used += 1
        raise RuntimeError("password=hunter2 at db.internal:5432")


@pytest.fixture
def pool() -> BrokenPool:
    return BrokenPool()


@pytest.fixture
def client(pool: BrokenPool, tmp_path: Path) -> Iterator[TestClient[Any]]:
    app = create_app(Settings(), AppDeps(pool=pool, store=LocalStore(tmp_path)))
    with TestClient(app) as test_client:
        yield test_client


def test_missing_token_is_401_before_anything_else(
    client: TestClient[Any], pool: BrokenPool
) -> None:
    response = client.post("/v1/jobs", json={"gpus": -1})
    assert response.status_code == 401
    assert response.json() == {
        "detail": "missing, invalid, expired or revoked token (Authorization: Bearer <token>)",
        "errors": [],
    }
    assert response.headers["WWW-Authenticate"] == "Bearer"
    assert pool.used == 0


def test_unexpected_failure_is_a_generic_500(
    client: TestClient[Any], caplog: pytest.LogCaptureFixture
) -> None:
    response = client.get("/v1/jobs", headers={"Authorization": "Bearer ty_x"})
    assert response.status_code == 500
    assert response.json() == {"detail": "internal error", "errors": []}
    assert "hunter2" not in response.text and "Traceback" not in response.text
    assert "hunter2" in caplog.text  # the operator sees it in the log


def test_unknown_route_and_method_are_json(client: TestClient[Any]) -> None:
    missing = client.get("/v2/jobs")
    assert missing.status_code == 404
    assert missing.json()["detail"]
    wrong_method = client.delete("/v1/jobs")
    assert wrong_method.status_code == 405
    assert wrong_method.json()["detail"]

"""What the registry shows a team of a model or dataset another team granted to it: the
model itself, with the owner's job, project, people and checkpoints null (docs/models.md, "Grants").
``trainyard model ls``, ``model show``, ``model alias history`` and ``dataset show`` print such answers
with ``-`` where the owner's work was, never a traceback or ``None``."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from trainyard import cli
from trainyard.client import TrainyardClient

SHA = "b" * 64
MODEL = {
    "team": "ml",
    "name": "m",
    "project": None,
    "versions": 1,
    "latest_version": 1,
    "aliases": {"prod": 1},
    "created_at": "2026-12-01T00:00:00Z",
    "grants": None,
}
ARTIFACT = {"uri": None, "manifest_uri": None, "step": 10, "size_bytes": 4, "sha256": SHA}
VERSION = {
    "id": "0" * 8,
    "team": "ml",
    "model": "m",
    "version": 1,
    "job_id": None,
    "artifact": ARTIFACT,
    "metrics": {"acc": 0.9},
    "registered_at": "2026-12-01T00:00:00Z",
    "owned": True,
    "allocation_id": None,
    "lineage": None,
    "origin": "job_success",
    "source_uri": None,
    "tags": [],
    "description": "",
    "created_by": None,
    "aliases": ["prod"],
}
MOVE = {
    "alias": "prod",
    "from_version": None,
    "to_version": 1,
    "actor": None,
    "at": VERSION["registered_at"],
}
DATASET_VERSION = {
    "team": "ml",
    "name": "d",
    "version": 1,
    "reference": "ml/d:1",
    "uri": "s3://data/d/v1",
    "sha256": SHA,
    "size_bytes": 4,
    "data_schema": {},
    "feature_version": "",
    "producing_job_id": None,
    "created_at": VERSION["registered_at"],
    "created_by": None,
}


def route(request: httpx.Request) -> httpx.Response:
    """The registry as it answers a grantee."""
    path = request.url.path
    answers = {
        "/v1/models": {"models": [MODEL], "next": None},
        "/v1/models/ml/m": MODEL,
        "/v1/models/ml/m/versions": {"team": "ml", "model": "m", "versions": [VERSION]},
        "/v1/models/ml/m/versions/1": VERSION,
        "/v1/models/ml/m/aliases/prod/moves": {"moves": [MOVE], "next": None},
        "/v1/datasets/ml/d/versions/1": DATASET_VERSION,
    }
    return httpx.Response(200, json=answers[path])


@pytest.fixture(autouse=True)
def registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINYARD_CONFIG", str(tmp_path / "config.json"))
    monkeypatch.setenv("TRAINYARD_REGISTRY_URL", "http://registry.test")

    def make(base_url: str, token: str, timeout: float = 10) -> TrainyardClient:
        return TrainyardClient(base_url, token, timeout, transport=httpx.MockTransport(route))

    monkeypatch.setattr(cli, "TrainyardClient", make)


@pytest.mark.parametrize(
    "argv",
    [
        ["model", "ls"],
        ["model", "show", "ml/m"],
        ["model", "show", "ml/m:1"],
        ["model", "alias", "history", "ml/m", "prod"],
        ["dataset", "show", "ml/d:1"],
    ],
)
def test_a_grantee_view_prints_without_the_owner_work(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["--token", "ty_a", *argv]) == 0
    out = capsys.readouterr().out
    assert "None" not in out and "Traceback" not in out
    assert out.strip()


def test_a_granted_version_names_whose_job_made_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--token", "ty_a", "model", "show", "ml/m:1"]) == 0
    out = capsys.readouterr().out
    assert "a job of team ml" in out and SHA in out

"""``trainyard lineage up TEAM/NAME@ALIAS`` traces the version the alias points at, as
``model show`` and ``model download`` take an alias; it was a usage error (``names an
alias; give TEAM/NAME:V``), so a user had to look the number up first."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.unit.client.conftest import routed_api
from trainyard import cli
from trainyard.cli_base import Exit

BASE = ["--url", "http://api.test", "--token", "ty_a"]
GRAPH = {
    "root": "model_version:vision/cnn:3",
    "direction": "upstream",
    "nodes": [
        {
            "id": "model_version:vision/cnn:3",
            "kind": "model_version",
            "team": "vision",
            "name": "cnn",
            "version": 3,
        }
    ],
    "edges": [],
    "hidden": 0,
    "truncated": False,
}


def test_lineage_up_follows_an_alias(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    api = routed_api(tmp_path, monkeypatch, {"TRAINYARD_REGISTRY_URL": "http://registry.test"})

    def route(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models/vision/cnn/versions/by-alias/production":
            return httpx.Response(200, json={"team": "vision", "model": "cnn", "version": 3})
        assert request.url.path == "/v1/lineage/models/vision/cnn/versions/3/upstream"
        return httpx.Response(200, json=GRAPH)

    api["route"] = route
    assert cli.main([*BASE, "lineage", "up", "vision/cnn@production"]) == Exit.OK
    assert capsys.readouterr().out == "model vision/cnn:3\n"
    assert len(api["sent"]) == 2


def test_lineage_down_of_a_dataset_takes_no_alias(
    sent: list[httpx.Request], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main([*BASE, "lineage", "down", "vision/digits@latest"]) == Exit.USAGE
    assert "names an alias" in capsys.readouterr().err
    assert sent == []

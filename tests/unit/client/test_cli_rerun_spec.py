"""``rerun JOB`` submits the job's stored spec again, less what the platform sets."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from trainyard import cli
from trainyard.cli_base import Exit
from trainyard.client import TrainyardClient

JOB = "0b6f3f4e-8a59-4c39-9a43-4f6b2b1f4a11"


def test_a_rerun_leaves_out_the_fields_the_platform_sets_and_keeps_the_parent_pinned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rerun leaves out ``user``, ``team`` and ``reproduces`` (no request may give them)
    and sends back the id of the parent version the job was admitted with
    (``parent_model_version_id``), a pin: the rerun fine-tunes from that very version, or
    its admission refuses it, naming the field."""
    stored = {
        "name": "tuned",
        "user": "alice",
        "team": "vision",
        "entrypoint": "train.py",
        "gpus": 1,
        "gpu_flavor": "cpu",
        "parent_model": "vision/base:1",
        "parent_model_version_id": "5d1e0c1e-2f1b-4d55-9a43-0c6b2b1f4a11",
        "reproduces": "an-earlier-job",
    }
    sent: list[dict[str, Any]] = []

    def route(request: httpx.Request) -> httpx.Response:
        if request.method == "GET" and request.url.path == f"/v1/jobs/{JOB}":
            return httpx.Response(200, json={"id": JOB, "status": "SUCCEEDED", "spec": stored})
        if request.method == "POST" and request.url.path == "/v1/jobs":
            sent.append(json.loads(request.content))
            return httpx.Response(422, json={"detail": "stop here", "errors": []})
        return httpx.Response(404, json={"detail": "no", "errors": []})

    def make(base_url: str, token: str, timeout: float = 10) -> TrainyardClient:
        return TrainyardClient(base_url, token, timeout, transport=httpx.MockTransport(route))

    monkeypatch.setattr(cli, "TrainyardClient", make)
    monkeypatch.setenv("TRAINYARD_CONFIG", str(tmp_path / "config.json"))
    monkeypatch.setenv("TRAINYARD_TOKEN", "ty_a")
    assert cli.main(["rerun", JOB]) == Exit.ERROR
    (body,) = sent
    assert body["parent_model"] == "vision/base:1"
    assert body["parent_model_version_id"] == "5d1e0c1e-2f1b-4d55-9a43-0c6b2b1f4a11"
    assert not {"user", "team", "reproduces"} & set(body)

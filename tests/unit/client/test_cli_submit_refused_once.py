"""A spec the API refuses is said once, on its line, and before its code is uploaded.

``gpu_flavor: a10O`` (a typo) packed and uploaded the code, then printed "no cost
estimate: 422 ... gpu_flavor" (billing's refusal of the same spec) just before the spec's
own error: the one problem twice, after work done for a job that could never be
submitted."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from trainyard import cli

from .conftest import routed_api

SPEC = "apiVersion: trainyard.dev/v1\nkind: Job\nname: a\ngpus: 1\ngpu_flavor: a10O\n"
FLAVOR = {"field": "gpu_flavor", "message": "unknown flavor 'a10O'; allowed: cpu, a100"}


def _api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[httpx.Request]:
    state = routed_api(
        tmp_path,
        monkeypatch,
        {"TRAINYARD_URL": "http://api.test", "TRAINYARD_BILLING_URL": "http://billing.test"},
    )

    def route(request: httpx.Request) -> httpx.Response:
        if request.url.path in ("/v1/jobs", "/v1/costs/estimate"):
            # Without its code the job has a second error, which is the code's to settle.
            code = [] if "code" in request.content.decode() else [{"field": "code", "message": "x"}]
            return httpx.Response(422, json={"detail": "invalid", "errors": [FLAVOR, *code]})
        return httpx.Response(404, json={"detail": "no such thing", "errors": []})

    state["route"] = route
    sent: list[httpx.Request] = state["sent"]
    return sent


def test_a_refused_spec_is_said_once_and_before_its_code_is_uploaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    sent = _api(tmp_path, monkeypatch)
    (tmp_path / "train.py").write_text("print(1)\n")
    (tmp_path / "job.yaml").write_text(SPEC + "entrypoint: train.py\n")
    assert cli.main(["--token", "ty_a", "submit", str(tmp_path / "job.yaml")]) == 1
    assert capsys.readouterr().err.splitlines() == [
        f"trainyard: error: {tmp_path / 'job.yaml'}:5:13: gpu_flavor: unknown flavor 'a10O'; "
        "allowed: cpu, a100"
    ]
    assert [(r.method, r.url.path, r.url.params.get("dry_run")) for r in sent] == [
        ("POST", "/v1/jobs", "true")  # nothing packed is uploaded, nothing estimated
    ]


def test_a_failed_estimate_is_not_said_of_a_job_the_api_refuses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _api(tmp_path, monkeypatch)
    (tmp_path / "job.yaml").write_text(SPEC + "entrypoint: train\n")
    assert cli.main(["--token", "ty_a", "submit", str(tmp_path / "job.yaml"), "--no-code"]) == 1
    err = capsys.readouterr().err
    assert "no cost estimate" not in err
    assert err.count("gpu_flavor") == 1

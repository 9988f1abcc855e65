"""``logs --json`` prints each chunk of output as it comes, one JSON object a line (JSON
Lines), so ``-f`` can stream it; docs/cli.md said ``--json`` printed "an object, or a list
for ``ls``", which a script reading the whole output as one JSON document then failed on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainyard import cli

from .conftest import log_pages, routed_api

ROOT = Path(__file__).resolve().parents[3]
JOB = "abc12345-0000-4000-8000-000000000001"


def test_logs_as_json_are_json_lines_and_the_doc_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    state = routed_api(tmp_path, monkeypatch, {"TRAINYARD_URL": "http://api.test"})
    monkeypatch.setenv("TRAINYARD_TOKEN", "ty_a")
    chunks = [
        {"seq": 1, "stream": "a0000-n1", "text": "epoch 1\n"},
        {"seq": 2, "stream": "a0000-n1", "text": "epoch 2\n"},
    ]

    state["route"] = log_pages(True, chunks)
    assert cli.main(["--json", "logs", JOB]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [json.loads(line) for line in lines] == chunks
    doc = " ".join((ROOT / "docs" / "cli.md").read_text().split())
    assert "`logs --json` prints one JSON object a line (JSON Lines" in doc

"""``trainyard audit --ndjson``: the service's NDJSON export of a window written to stdout
line by line as it streams (``Accept: application/x-ndjson``), with no page size; a
refusal, an answer that is no export and a line that is no JSON object are errors, never a
short export that looks whole."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.unit.client.conftest import routed_api
from trainyard import cli
from trainyard.cli_base import Exit

BASE = ["--url", "http://submission.test", "--token", "ty_op"]
NDJSON = {"Content-Type": "application/x-ndjson"}
ENTRIES = [{"id": i, "action": "put queue", "target": f"q{i}"} for i in (3, 7, 9)]


@pytest.fixture
def api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    return routed_api(tmp_path, monkeypatch, {})


def _lines(entries: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(e).encode() + b"\n" for e in entries)


def test_every_line_is_written_as_the_service_sent_it(
    api: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    api["route"] = lambda r: httpx.Response(200, content=_lines(ENTRIES), headers=NDJSON)
    argv = ["audit", "--ndjson", "--since", "2026-03-01T00:00:00Z", "--before", "10"]

    assert cli.main([*BASE, *argv]) == Exit.OK

    assert capsys.readouterr().out == _lines(ENTRIES).decode()
    (sent,) = api["sent"]
    assert sent.headers["Accept"] == "application/x-ndjson"
    assert dict(sent.url.params) == {"since": "2026-03-01T00:00:00Z", "before": "10"}


def test_a_refusal_is_an_error_naming_the_field(
    api: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    body = {"detail": "invalid", "errors": [{"field": "until", "message": "must not be before"}]}
    api["route"] = lambda r: httpx.Response(422, json=body)

    assert cli.main([*BASE, "audit", "--ndjson", "--until", "x"]) != Exit.OK

    captured = capsys.readouterr()
    assert captured.out == "" and "until: must not be before" in captured.err


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        # A service older than this client answers its JSON page.
        (httpx.Response(200, json=ENTRIES), "not an NDJSON export"),
        (httpx.Response(200, content=b'{"id": 1}\n[1]\n', headers=NDJSON), "no JSON object"),
    ],
)
def test_an_answer_that_is_no_export_is_an_error(
    api: dict[str, Any], capsys: pytest.CaptureFixture[str], answer: httpx.Response, said: str
) -> None:
    api["route"] = lambda r: answer

    assert cli.main([*BASE, "audit", "--ndjson"]) != Exit.OK

    assert said in capsys.readouterr().err


def test_ndjson_takes_no_page_size(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main([*BASE, "audit", "--ndjson", "--limit", "5"])
    assert "not allowed with argument" in capsys.readouterr().err


class _BrokenOff(httpx.SyncByteStream):
    """An export whose transfer ends after its first line, as when the service loses its
    database mid-export (the answer ends without its final chunk)."""

    def __iter__(self) -> Any:
        yield _lines(ENTRIES[:1])
        raise httpx.RemoteProtocolError("peer closed connection without sending complete body")


def test_an_export_that_breaks_off_is_an_error_after_the_lines_written(
    api: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    api["route"] = lambda r: httpx.Response(200, stream=_BrokenOff(), headers=NDJSON)

    assert cli.main([*BASE, "audit", "--ndjson"]) != Exit.OK

    captured = capsys.readouterr()
    assert captured.out == _lines(ENTRIES[:1]).decode()
    assert "the audit export from http://submission.test broke off" in captured.err

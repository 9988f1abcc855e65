"""``trainyard model alias set|rm --from VERSION``: a promotion that goes ahead only while
the alias still points where the user last saw it. Before, ``alias set`` moved the alias
whatever another member had moved it to since: a promotion decided on what was seen
silently undid another's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.unit.client.conftest import routed_api
from trainyard import cli
from trainyard.cli_base import Exit

REGISTRY = "http://registry.test"
BASE = ["--url", "http://submission.test", "--token", "ty_member"]
ALIAS = f"{REGISTRY}/v1/models/vision/digits/aliases/production"
STALE = 'alias \'production\' of model vision/digits was changed since it was read (its ETag is now "b", not "a")'


@pytest.fixture
def api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    return routed_api(tmp_path, monkeypatch, {"TRAINYARD_REGISTRY_URL": REGISTRY})


def _pointing(version: int, put: httpx.Response | None = None) -> Any:
    def route(request: httpx.Request) -> httpx.Response:
        if request.method == "GET":
            body = {"team": "vision", "model": "digits", "alias": "production", "version": version}
            return httpx.Response(200, json=body, headers={"ETag": '"a"'})
        if put is not None:
            return put
        body = {"team": "vision", "model": "digits", "alias": "production"}
        return httpx.Response(200, json={**body, "version": 3, "previous": version})

    return route


def test_set_from_reads_the_alias_and_sends_its_etag_back(
    api: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    api["route"] = _pointing(2)
    argv = ["model", "alias", "set", "vision/digits", "production", "3", "--from", "2"]
    assert cli.main([*BASE, *argv]) == Exit.OK
    sent = [(r.method, str(r.url), r.headers.get("If-Match")) for r in api["sent"]]
    assert sent == [("GET", ALIAS, None), ("PUT", ALIAS, '"a"')]
    assert "vision/digits@production -> version 3 (was 2)" in capsys.readouterr().out
    # Without --from, as before: one PUT, no condition.
    api["sent"].clear()
    assert cli.main([*BASE, *argv[:-2]]) == Exit.OK
    assert [(r.method, r.headers.get("If-Match")) for r in api["sent"]] == [("PUT", None)]


def test_set_from_a_version_the_alias_no_longer_points_at_changes_nothing(
    api: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    api["route"] = _pointing(4)
    argv = ["model", "alias", "rm", "vision/digits", "production", "--from", "2"]
    assert cli.main([*BASE, *argv]) == Exit.ERROR
    assert [r.method for r in api["sent"]] == ["GET"]
    assert capsys.readouterr().err == (
        "trainyard: error: vision/digits@production points at version 4, not 2: someone "
        "moved it; nothing changed\n"
    )


def test_a_move_between_the_read_and_the_write_is_one_plain_line(
    api: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    refused = httpx.Response(
        412,
        json={
            "detail": f"If-Match: {STALE}: nothing changed",
            "errors": [{"field": "If-Match", "message": f"{STALE}: nothing changed"}],
        },
    )
    api["route"] = _pointing(2, refused)
    argv = ["model", "alias", "set", "vision/digits", "production", "3", "--from", "2"]
    assert cli.main([*BASE, *argv]) == Exit.ERROR
    assert capsys.readouterr().err == (
        "trainyard: error: registry: nothing was changed: someone else changed it since you "
        f"read it ({STALE}). Run `trainyard model alias history vision/digits production` "
        "to see it as it is now, then repeat the command with --from set to where it "
        "points now if your change still applies.\n"
    )


def test_set_from_none_only_creates(
    api: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    exists = httpx.Response(
        412,
        json={
            "detail": "If-None-Match: alias exists already",
            "errors": [{"field": "If-None-Match", "message": "exists already"}],
        },
    )
    api["route"] = lambda r: exists
    argv = ["model", "alias", "set", "vision/digits", "production", "3", "--from", "none"]
    assert cli.main([*BASE, *argv]) == Exit.ERROR
    assert [(r.method, r.headers.get("If-None-Match")) for r in api["sent"]] == [("PUT", "*")]
    assert capsys.readouterr().err == (
        "trainyard: error: vision/digits@production exists already (someone set it): nothing "
        "changed; see `trainyard model alias history vision/digits production`\n"
    )

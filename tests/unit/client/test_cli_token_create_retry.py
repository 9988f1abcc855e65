"""``trainyard token create`` sends ``POST /v1/tokens`` under an ``Idempotency-Key`` of its
own and sends it again, under the same key, when no answer came in time or the API was away:
a token the server made for a request whose answer was lost is found by the key (answered
without its secret, which only that lost answer held), revoked, and another made under a
new key. Before, the CLI sent no key and gave up at the first timeout: a retry by hand made
a second live token, and the first stayed live with nobody holding it. The fake API below
keeps tokens by key as the submission API does (services/submission/identity.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.unit.client.conftest import routed_api
from trainyard import cli, cli_access
from trainyard.cli_base import Exit

BASE = ["--url", "http://submission.test", "--token", "ty_me"]


class FakeTokens:
    """``POST /v1/tokens`` and ``DELETE /v1/tokens/{id}`` with idempotency keys; ``lose``:
    how many of the next creations are made and then not answered (a read timeout)."""

    def __init__(self, lose: int = 0, away: int = 0) -> None:
        self.lose = lose
        self.away = away
        self.by_key: dict[str, int] = {}
        self.live: set[int] = set()

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.method == "DELETE":
            self.live.discard(int(request.url.path.rsplit("/", 1)[1]))
            return httpx.Response(204)
        if self.away:
            self.away -= 1
            return httpx.Response(503, json={"detail": "database unavailable", "errors": []})
        key = request.headers["Idempotency-Key"]
        if key in self.by_key:
            token_id = self.by_key[key]
            return httpx.Response(200, json={"id": token_id, "name": "ci", "token": None})
        token_id = len(self.by_key) + 1
        self.by_key[key] = token_id
        self.live.add(token_id)
        if self.lose:
            self.lose -= 1
            raise httpx.ReadTimeout("timed out", request=request)
        body = {"id": token_id, "name": "ci", "token": f"ty_secret{token_id}"}
        return httpx.Response(201, json=body)


@pytest.fixture
def api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    pauses: list[float] = []
    monkeypatch.setattr(cli_access.time, "sleep", pauses.append)
    state = routed_api(tmp_path, monkeypatch, {})
    state["pauses"] = pauses
    return state


def _keys(api: dict[str, Any]) -> list[str | None]:
    return [r.headers.get("Idempotency-Key") for r in api["sent"] if r.method == "POST"]


def test_a_lost_answer_is_tried_again_and_its_orphan_revoked(
    api: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    fake = api["route"] = FakeTokens(lose=1)

    assert cli.main([*BASE, "token", "create", "--name", "ci"]) == Exit.OK

    out, err = capsys.readouterr()
    assert out == "ty_secret2\n"  # the only secret anyone holds
    assert fake.live == {2}  # token 1, whose secret was lost, is revoked
    first, retry, fresh = _keys(api)
    assert first is not None and first == retry and fresh not in (None, first)
    assert [json.loads(r.content) for r in api["sent"] if r.method == "POST"] == [
        {"name": "ci"}
    ] * 3
    assert "trying again" in err and "token 1 was made by an earlier try" in err
    # it repeats the request itself, under its key: no advice to look before repeating it
    assert "look before you repeat it" not in err
    assert api["pauses"] == [cli_access.TOKEN_PAUSE_S]


def test_an_api_away_is_waited_for_under_the_same_key(
    api: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    fake = api["route"] = FakeTokens(away=2)

    assert cli.main([*BASE, "token", "create"]) == Exit.OK

    assert capsys.readouterr().out == "ty_secret1\n"
    assert fake.live == {1}
    assert len(set(_keys(api))) == 1 and len(_keys(api)) == 3
    assert api["pauses"] == [cli_access.TOKEN_PAUSE_S, 2 * cli_access.TOKEN_PAUSE_S]


def test_it_gives_up_after_its_tries_saying_the_last_may_have_been_made(
    api: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """Every answer lost: the first token is found by its retry and revoked; the last try's
    token, if made, is beyond reach of any retry, and the error says it may exist."""
    fake = api["route"] = FakeTokens(lose=cli_access.TOKEN_TRIES)

    assert cli.main([*BASE, "token", "create"]) != Exit.OK

    err = capsys.readouterr().err
    assert "no answer from http://submission.test/ to POST /v1/tokens" in err
    assert "may have done it all the same" in err
    assert len(_keys(api)) == cli_access.TOKEN_TRIES
    assert fake.live == {2}


def test_a_refusal_is_not_sent_again(
    api: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    body = {"detail": "too many", "errors": [{"field": "Authorization", "message": "full"}]}
    api["route"] = lambda r: httpx.Response(409, json=body)

    assert cli.main([*BASE, "token", "create"]) != Exit.OK

    assert len(_keys(api)) == 1 and api["pauses"] == []
    assert "409 too many" in capsys.readouterr().err

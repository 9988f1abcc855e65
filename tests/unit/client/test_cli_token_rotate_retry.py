"""``trainyard token rotate`` sends ``POST /v1/tokens/rotate`` under an ``Idempotency-Key``
of its own and sends it again, under the same key and with the same token, when no answer
came in time or the API was away: the rotation the server made is answered with the new
token and a new secret, so the user ends holding a working token. Before, the CLI sent no
key and gave up at the first timeout: the token it held was revoked by the rotation whose
answer was lost, and a retry by hand was refused (401), the user left with no working
token. The fake API below rotates as the submission API does
(services/submission/identity.py, ``rotate_token`` and ``replay_rotation``)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.unit.client.conftest import routed_api
from trainyard import cli, cli_access
from trainyard.cli_base import Exit

BASE = ["--url", "http://submission.test", "--token", "ty_old"]


class FakeRotation:
    """``POST /v1/tokens/rotate``: ``live`` secrets (token id by secret); a revoked token is
    let in only for the retry of the rotation that revoked it, under its key; ``lose``: how
    many of the next answers are lost after the work is done (a read timeout)."""

    def __init__(self, lose: int = 0, revoked_since: bool = False) -> None:
        self.lose = lose
        self.revoked_since = revoked_since
        self.live: dict[str, int] = {"ty_old": 1}
        self.rotated: dict[str, tuple[str, int]] = {}  # old secret: (key, new token id)
        self.secrets = (f"ty_new{n}" for n in itertools.count(1))

    def __call__(self, request: httpx.Request) -> httpx.Response:
        presented = request.headers["Authorization"].removeprefix("Bearer ")
        key = request.headers["Idempotency-Key"]
        if presented in self.live:
            self.live.pop(presented)
            token_id, status = 2, 201
            self.rotated[presented] = (key, token_id)
        elif self.rotated.get(presented, ("", 0))[0] == key:
            token_id, status = self.rotated[presented][1], 200
            for secret in [s for s, i in self.live.items() if i == token_id]:
                self.live.pop(secret)  # the lost secret dies
            if self.revoked_since:
                return httpx.Response(200, json={"id": token_id, "name": "ci", "token": None})
        else:
            return httpx.Response(401, json={"detail": "invalid token", "errors": []})
        secret = next(self.secrets)
        self.live[secret] = token_id
        if self.lose:
            self.lose -= 1
            raise httpx.ReadTimeout("timed out", request=request)
        return httpx.Response(status, json={"id": token_id, "name": "ci", "token": secret})


@pytest.fixture
def api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    pauses: list[float] = []
    monkeypatch.setattr(cli_access.time, "sleep", pauses.append)
    state = routed_api(tmp_path, monkeypatch, {})
    state["pauses"] = pauses
    return state


def _keys(api: dict[str, Any]) -> list[str | None]:
    return [r.headers.get("Idempotency-Key") for r in api["sent"]]


def test_a_lost_answer_is_tried_again_and_the_user_holds_a_working_token(
    api: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    fake = api["route"] = FakeRotation(lose=1)

    assert cli.main([*BASE, "token", "rotate", "--days", "7"]) == Exit.OK

    out, err = capsys.readouterr()
    assert out == "ty_new2\n"
    assert fake.live == {"ty_new2": 2}  # the one printed works; the lost one and the old do not
    first, retry = _keys(api)
    assert first is not None and first == retry
    assert [json.loads(r.content) for r in api["sent"]] == [{"expires_in_days": 7}] * 2
    assert "trying again" in err
    # it repeats the request itself, under its key: no advice to look before repeating it
    assert "look before you repeat it" not in err
    assert api["pauses"] == [cli_access.TOKEN_PAUSE_S]


def test_a_new_token_revoked_since_is_an_error_saying_so(
    api: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    api["route"] = FakeRotation(lose=1, revoked_since=True)

    assert cli.main([*BASE, "token", "rotate"]) != Exit.OK

    out, err = capsys.readouterr()
    assert out == ""
    assert "token 2 replaced this one by an earlier try" in err
    assert "revoked or expired since" in err


def test_a_refusal_is_not_sent_again(
    api: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    api["route"] = lambda r: httpx.Response(401, json={"detail": "invalid token", "errors": []})

    assert cli.main([*BASE, "token", "rotate"]) != Exit.OK

    assert len(_keys(api)) == 1 and api["pauses"] == []

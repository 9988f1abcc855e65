"""`--url` naming one of a context's own services (its scheduler's, for `deadletters` or
`audit` of that service) was refused, exit 7, `no token for URL: the token of context 'op'
is sent to <its submission API> only: trainyard login URL`, though every `nodes` and `admin`
command sends that token to that very URL, and `login` of a scheduler's URL fails (it is no
submission API). The operator had to copy the token out of the config file to read the
scheduler's dead letters."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from trainyard import cli

from .conftest import routed_api

PAGE = {"consumer": "scheduler", "dead_letters": [], "next_after": None, "total": 0}
OP = {
    "url": "http://a.test",
    "token": "ty_op",
    "scheduler_url": "http://s.test/",
    "registry_url": "http://r.test",
}


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    for variable in ("TRAINYARD_CONTEXT", "TRAINYARD_TOKEN", "TRAINYARD_URL"):
        monkeypatch.delenv(variable, raising=False)
    state = routed_api(tmp_path, monkeypatch, {})
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"current": "op", "contexts": {"op": OP}}))
    config.chmod(0o600)
    state["route"] = lambda r: httpx.Response(200, json=PAGE)
    return state


@pytest.mark.parametrize("url", ["http://s.test", "http://s.test/", "http://r.test"])
def test_a_url_of_the_context_s_own_service_gets_its_token(
    state: dict[str, object], url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["deadletters", "list", "--url", url]) == 0, capsys.readouterr().err
    sent = state["sent"]
    assert isinstance(sent, list) and sent
    assert {str(r.url.host) for r in sent} == {httpx.URL(url).host}
    assert {r.headers["Authorization"] for r in sent} == {"Bearer ty_op"}


def test_another_url_still_gets_no_token_of_the_context(
    state: dict[str, object], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TRAINYARD_URL", "http://elsewhere.test")
    assert cli.main(["deadletters", "list"]) == 7
    assert state["sent"] == []
    err = capsys.readouterr().err
    assert (
        "no token for http://elsewhere.test: the token of context 'op' is sent to "
        "http://a.test, http://r.test and http://s.test only"
    ) in err
    assert "ty_op" not in err

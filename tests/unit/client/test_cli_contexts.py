"""``trainyard login`` and contexts; job ids by unique prefix (against a fake API)."""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from trainyard import cli
from trainyard.client import TrainyardClient

JOBS = [
    {"id": "abc12345-0000-4000-8000-000000000001", "name": "one", "status": "RUNNING"},
    {"id": "abc12399-0000-4000-8000-000000000002", "name": "two", "status": "PENDING"},
    {"id": "def00000-0000-4000-8000-000000000003", "name": "three", "status": "FAILED"},
]


class Api(list[httpx.Request]):
    tokens: dict[str, dict[str, Any]]


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "home" / "trainyard" / "config.json"
    monkeypatch.setenv("TRAINYARD_CONFIG", str(path))
    for name in ("URL", "TOKEN", "CONTEXT", "REGISTRY_URL", "BILLING_URL"):
        monkeypatch.delenv(f"TRAINYARD_{name}", raising=False)
    return path


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> Api:
    seen = Api()
    seen.tokens = {
        "ty_a": {"user": "alice", "team": "vision", "role": "member"},
        "ty_b": {"user": "bob", "team": "nlp", "role": "member"},
    }

    def route(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        token = request.headers.get("Authorization", "").removeprefix("Bearer ")
        if token not in seen.tokens:
            return httpx.Response(401, json={"detail": "invalid token", "errors": []})
        if request.url.path == "/v1/me":
            return httpx.Response(200, json=seen.tokens[token])
        if request.url.path == "/v1/jobs":
            prefix = request.url.params.get("id_prefix", "")
            return httpx.Response(200, json=[j for j in JOBS if j["id"].startswith(prefix)])
        job_id = request.url.path.rsplit("/", 1)[-1]
        job = next((j for j in JOBS if j["id"] == job_id), None)
        if job is None:
            return httpx.Response(404, json={"detail": f"job {job_id} not found", "errors": []})
        return httpx.Response(200, json=job)

    def make(base_url: str, token: str, timeout: float = 10) -> TrainyardClient:
        return TrainyardClient(base_url, token, timeout, transport=httpx.MockTransport(route))

    monkeypatch.setattr(cli, "TrainyardClient", make)
    return seen


def test_login_checks_the_token_and_stores_a_private_context(
    config: Path, api: Api, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["login", "http://a.test/", "--token", "ty_a", "--name", "a"]) == 0
    assert "logged in to http://a.test as vision/alice (context 'a'" in capsys.readouterr().out
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    assert stat.S_IMODE(config.parent.stat().st_mode) == 0o700
    stored = json.loads(config.read_text())
    assert stored["current"] == "a" and stored["contexts"]["a"]["token"] == "ty_a"
    assert cli.main(["login", "http://a.test", "--token", "ty_wrong"]) == 4
    assert "401 invalid token" in capsys.readouterr().err
    assert set(json.loads(config.read_text())["contexts"]) == {"a"}  # nothing stored


@pytest.mark.parametrize("url", ["http://a.test/ui/", "http://a.test/ui", "http://a.test/v1"])
def test_login_to_a_url_that_is_not_the_api_says_so(
    config: Path, api: Api, capsys: pytest.CaptureFixture[str], url: str
) -> None:
    """``login http://127.0.0.1:PORT/ui/`` (the dashboard's address, which ``dev.py up``
    prints too) ended "404 no file or directory match the path v1/me was found", exit 3,
    naming no URL and no way out."""
    assert cli.main(["login", url, "--token", "ty_a"]) == 2
    base = url.rstrip("/")
    assert capsys.readouterr().err.splitlines() == [
        f"trainyard: error: {base} is not the submission API (GET {base}/v1/me answered 404); "
        "give the API's base URL, without a path such as /ui/ (the dashboard's)"
    ]
    assert not config.exists()  # nothing stored


def test_contexts_switch_and_the_environment_overrides(
    config: Path, api: Api, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["login", "http://a.test", "--token", "ty_a", "--name", "a"]) == 0
    assert cli.main(["login", "http://b.test", "--token", "ty_b", "--name", "b"]) == 0
    capsys.readouterr()
    assert cli.main(["context", "ls"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["CURRENT", "NAME", "URL", "USER"]
    assert lines[1].split() == ["a", "http://a.test", "vision/alice"]
    assert lines[2].split() == ["*", "b", "http://b.test", "nlp/bob"]
    assert "ty_" not in "\n".join(lines)
    api.clear()
    assert cli.main(["whoami", "--json"]) == 0
    assert (api[-1].url.host, api[-1].headers["Authorization"]) == ("b.test", "Bearer ty_b")
    assert cli.main(["context", "use", "a"]) == 0
    assert cli.main(["whoami", "--json"]) == 0
    assert (api[-1].url.host, api[-1].headers["Authorization"]) == ("a.test", "Bearer ty_a")
    assert cli.main(["whoami", "--json", "--context", "b"]) == 0
    assert api[-1].url.host == "b.test"
    monkeypatch.setenv("TRAINYARD_TOKEN", "ty_b")
    assert cli.main(["whoami", "--json"]) == 0
    assert (api[-1].url.host, api[-1].headers["Authorization"]) == ("a.test", "Bearer ty_b")
    # --context picks the context, which fills in only what the variables leave out.
    assert cli.main(["whoami", "--json", "--context", "a"]) == 0
    assert (api[-1].url.host, api[-1].headers["Authorization"]) == ("a.test", "Bearer ty_b")
    monkeypatch.delenv("TRAINYARD_TOKEN")
    # The context's token never goes to another server.
    assert cli.main(["whoami", "--json", "--url", "http://elsewhere.test"]) == 7
    assert cli.main(["context", "use", "nope"]) == 7
    assert "no context 'nope' (contexts: a, b)" in capsys.readouterr().err
    assert cli.main(["logout", "a"]) == 0
    assert cli.main(["whoami", "--json"]) == 7  # no current context any more


def test_a_config_file_others_may_read_is_refused(
    config: Path, api: Api, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["login", "http://a.test", "--token", "ty_a"]) == 0
    config.chmod(0o644)
    assert cli.main(["whoami", "--json"]) == 1
    assert "others may read it (mode 0644); run: chmod 600" in capsys.readouterr().err


@pytest.mark.parametrize(
    "content",
    [
        "[]",
        '"x"',
        "null",
        '{"contexts": []}',
        '{"contexts": {"a": "http://a.test"}}',
        '{"contexts": {"a": {"url": 1}}, "current": []}',
        '{"current": "a", "contexts": {"a": {"url": "http://a.test", "token": "ty_a", "x": 1}}}',
    ],
)
def test_a_config_file_of_another_shape_is_named_not_a_python_error(
    content: str, config: Path, api: Api, capsys: pytest.CaptureFixture[str]
) -> None:
    """``[]`` ended "cannot read FILE: 'list' object has no attribute 'get'"."""
    config.parent.mkdir(parents=True)
    config.write_text(content)
    config.chmod(0o600)
    code = cli.main(["whoami", "--json"])
    err = capsys.readouterr().err
    if '"x": 1' in content:  # an unknown key of a context is left alone
        assert code == 0, err
        return
    assert code == 1, err
    assert err == (
        f"trainyard: error: cannot read {config}: not a trainyard config (a JSON object: "
        '{"current": NAME, "contexts": {NAME: {"url": ..., "token": ...}}}); fix or remove it\n'
    )


def test_a_config_path_that_is_a_folder_is_named(
    tmp_path: Path, api: Api, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A folder ended "FOLDER holds tokens but others may read it (mode 1777)"."""
    folder = tmp_path / "shared"
    folder.mkdir(mode=0o777)
    folder.chmod(0o1777)
    monkeypatch.setenv("TRAINYARD_CONFIG", str(folder))
    assert cli.main(["whoami", "--json"]) == 1
    assert capsys.readouterr().err == f"trainyard: error: cannot read {folder}: not a file\n"


def test_a_unique_prefix_names_a_job_and_an_ambiguous_one_lists_candidates(
    config: Path, api: Api, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TRAINYARD_TOKEN", "ty_a")
    assert cli.main(["describe", "def0", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["name"] == "three"
    assert api[-2].url.params["id_prefix"] == "def0"
    assert cli.main(["describe", "ABC123"]) == 3
    err = capsys.readouterr().err
    assert "'abc123' is ambiguous: it starts the ids of abc12345 (one, RUNNING), abc12399 " in err
    assert cli.main(["get", "abc1234", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["name"] == "one"
    assert cli.main(["get", "fff"]) == 3
    assert "no job of your team has an id starting with 'fff'" in capsys.readouterr().err
    assert cli.main(["describe", JOBS[0]["id"], "--json"]) == 0  # a full id: no look-up
    assert "id_prefix" not in api[-1].url.params


def test_tokens_lists_them(
    config: Path, api: Api, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TRAINYARD_TOKEN", "ty_a")
    cli.main(["tokens", "--json"])
    assert api[-1].url.path == "/v1/tokens"


@pytest.mark.parametrize("shell", ["bash", "zsh", "tcsh"])
def test_completion_scripts_know_the_commands(
    shell: str, config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["completion", shell]) == 0
    script = capsys.readouterr().out
    for name in ("submit", "attach", "rerun", "experiments", "context"):
        assert name in script


@pytest.mark.parametrize(
    "token", ["ty_a\nb", "ty_\u00e9", "ty_\udcff", "ty a", "ty_a\x01", "ty_" + "a" * 1022]
)
def test_a_malformed_token_is_refused_before_any_request_and_never_shown(
    token: str,
    config: Path,
    api: Api,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """No API accepts such a token (RFC 6750 ``b64token``, at most 1024 characters): it is
    refused naming where it came from, exit 4, without a request, a Python exception's
    text or the token itself in the message."""
    assert cli.main(["login", "http://a.test", "--token", "ty_a", "--name", "a"]) == 0
    capsys.readouterr()
    api.clear()
    monkeypatch.setenv("TRAINYARD_TOKEN", token)
    assert cli.main(["ls"]) == 4
    err = capsys.readouterr().err
    assert err.startswith("trainyard: error: the token from TRAINYARD_TOKEN is malformed: ")
    monkeypatch.delenv("TRAINYARD_TOKEN")
    assert cli.main(["ls", "--token", token]) == 4
    err2 = capsys.readouterr().err
    assert "the token from --token is malformed: " in err2
    assert cli.main(["login", "http://a.test", "--token", token, "--name", "b"]) == 4
    err3 = capsys.readouterr().err
    assert "the token given is malformed: " in err3
    for shown in (err, err2, err3):
        assert token.strip() not in shown and "Error" not in shown and len(shown) < 300
    assert api == []  # nothing was sent
    assert set(json.loads(config.read_text())["contexts"]) == {"a"}  # nothing stored


def test_a_malformed_token_in_a_context_is_named_by_its_context(
    config: Path, api: Api, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["login", "http://a.test", "--token", "ty_a", "--name", "a"]) == 0
    stored = json.loads(config.read_text())
    stored["contexts"]["a"]["token"] = "ty_a b"
    config.write_text(json.dumps(stored))
    capsys.readouterr()
    assert cli.main(["ls"]) == 4
    assert "the token of context 'a' is malformed: " in capsys.readouterr().err


@pytest.mark.parametrize(
    "command",
    [
        *([name] for name in ("describe", "get", "cancel", "logs", "wait", "attach", "rerun")),
        ["rerun", "--reproduce"],
        ["reproduction"],
        ["metrics"],
        ["tag", "t"],
        ["note", "n"],
        ["cost"],
    ],
)
@pytest.mark.parametrize("ref", ["", "  ", ".", "..", "../me", "a/b", "?x=1", "#x", "%2e"])
def test_a_job_reference_is_one_path_segment_or_refused_without_a_request(
    command: list[str],
    ref: str,
    config: Path,
    api: Api,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``describe ''`` asked ``GET /v1/jobs/``, the job list, and ended 'unexpected
    response: expected a JSON object' (exit 5, as if the API were unreachable); ``logs ..``
    asked for the logs of a job named 'logs', ``cancel ''`` answered 405. An empty JOB is a
    usage error, ``.`` and ``..`` name no job; anything else reaches the API as one path
    segment of ``/v1/jobs/``."""
    monkeypatch.setenv("TRAINYARD_TOKEN", "ty_a")
    monkeypatch.setenv("TRAINYARD_REGISTRY_URL", "http://registry.test")
    monkeypatch.setenv("TRAINYARD_BILLING_URL", "http://billing.test")
    code = cli.main(
        [*command[:1], ref, *command[1:]] if command[1:2] != ["--reproduce"] else [*command, ref]
    )
    err = capsys.readouterr().err
    if not ref.strip():
        assert code == 2, err
        assert err == "trainyard: error: JOB is empty: give a job id or the beginning of one\n"
        assert api == []
    elif ref in (".", ".."):
        assert code == 3, err
        assert err == f"trainyard: error: no job of your team has the id {ref!r}\n"
        assert api == []
    else:
        assert code == 3, err  # the fake API's 404
        segment = quote(ref, safe="").encode()
        assert api and all(r.url.raw_path.startswith(b"/v1/jobs/" + segment) for r in api)


@pytest.mark.parametrize(
    "url", ["notaurl", "ftp://a.test", "http://", "a.test:8080", "http://[::1"]
)
def test_a_url_that_is_no_http_url_is_a_usage_error_naming_its_source(
    url: str,
    config: Path,
    api: Api,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``TRAINYARD_URL=notaurl`` ended "cannot reach notaurl/: Request URL is missing an
    'http://' or 'https://' protocol." with exit 5, as if a server were down."""
    monkeypatch.setenv("TRAINYARD_TOKEN", "ty_a")
    expected = f"is not an http:// or https:// URL: {url!r}\n"
    monkeypatch.setenv("TRAINYARD_URL", url)
    assert cli.main(["ls"]) == 2
    assert capsys.readouterr().err == f"trainyard: error: the URL from TRAINYARD_URL {expected}"
    monkeypatch.delenv("TRAINYARD_URL")
    assert cli.main(["ls", "--url", url]) == 2
    assert capsys.readouterr().err == f"trainyard: error: the URL from --url {expected}"
    assert cli.main(["login", url, "--token", "ty_a"]) == 2
    assert capsys.readouterr().err == f"trainyard: error: the URL given {expected}"
    argv = ["login", "http://a.test", "--token", "ty_a", "--registry-url", url]
    assert cli.main(argv) == 2
    assert capsys.readouterr().err == f"trainyard: error: the URL from --registry-url {expected}"
    monkeypatch.setenv("TRAINYARD_REGISTRY_URL", url)
    assert cli.main(["model", "ls"]) == 2
    err = capsys.readouterr().err
    assert err == f"trainyard: error: the URL from TRAINYARD_REGISTRY_URL {expected}"
    assert api == []
    assert not config.exists()


def test_a_config_file_that_is_a_link_stays_a_link(config: Path, api: Api, tmp_path: Path) -> None:
    # A config kept elsewhere (a dotfiles folder) and linked into place was read through
    # its link, then replaced by a file of its own at the first login: the file it named
    # never saw the new context again.
    kept = tmp_path / "dotfiles" / "trainyard.json"
    kept.parent.mkdir()
    assert cli.main(["login", "http://a.test", "--token", "ty_a", "--name", "a"]) == 0
    config.rename(kept)
    config.symlink_to(kept)
    assert cli.main(["login", "http://b.test", "--token", "ty_b", "--name", "b"]) == 0
    assert config.is_symlink()
    assert sorted(json.loads(kept.read_text())["contexts"]) == ["a", "b"]
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    assert cli.main(["logout", "a"]) == 0
    assert config.is_symlink() and sorted(json.loads(kept.read_text())["contexts"]) == ["b"]


def test_a_refused_token_is_named_by_where_it_came_from(
    config: Path, api: Api, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A token that expired or was revoked after login answered only "401 invalid token":
    # not which token (a context's, TRAINYARD_TOKEN, --token), nor what to do.
    assert cli.main(["login", "http://a.test", "--token", "ty_a", "--name", "lab"]) == 0
    capsys.readouterr()
    del api.tokens["ty_a"]  # revoked, or expired, since
    assert cli.main(["whoami"]) == 4
    err = capsys.readouterr().err
    assert err.startswith("trainyard: error: 401 invalid token")
    assert "the token of context 'lab' was refused" in err
    assert "trainyard login http://a.test --name lab" in err and "ty_a" not in err
    monkeypatch.setenv("TRAINYARD_TOKEN", "ty_zz")
    assert cli.main(["whoami"]) == 4
    assert "the token from TRAINYARD_TOKEN was refused" in capsys.readouterr().err
    assert cli.main(["whoami", "--token", "ty_yy"]) == 4
    assert "the token from --token was refused" in capsys.readouterr().err
    # login says nothing of a context: the token refused is the one it was given.
    assert cli.main(["login", "http://a.test", "--token", "ty_xx"]) == 4
    assert "was refused" not in capsys.readouterr().err


@pytest.mark.parametrize("named_by", ["--context", "TRAINYARD_CONTEXT"])
def test_a_context_named_but_not_stored_is_refused_though_the_environment_gives_the_rest(
    config: Path,
    api: Api,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    named_by: str,
) -> None:
    """With TRAINYARD_URL and TRAINYARD_TOKEN set, `--context nope` was ignored without a
    word: the command went to the variables' server, the typo unnoticed."""
    assert cli.main(["login", "http://a.test", "--token", "ty_a", "--name", "a"]) == 0
    monkeypatch.setenv("TRAINYARD_URL", "http://b.test")
    monkeypatch.setenv("TRAINYARD_TOKEN", "ty_b")
    monkeypatch.setenv("TRAINYARD_BILLING_URL", "http://billing.test")
    options = ["--context", "nope"] if named_by == "--context" else []
    if named_by == "TRAINYARD_CONTEXT":
        monkeypatch.setenv("TRAINYARD_CONTEXT", "nope")
    capsys.readouterr()
    api.clear()
    for command in (["whoami"], ["cost"]):
        assert cli.main([*command, *options]) == 7
        assert capsys.readouterr().err == (
            f"trainyard: error: no context 'nope' (named by {named_by}) (contexts: a): "
            "trainyard login URL --name nope stores one (trainyard context ls lists them)\n"
        )
    assert list(api) == []


@pytest.mark.parametrize(
    ("contexts", "how"),
    [
        (
            {"a": {"url": "http://a.test", "token": "ty_a"}},
            "(contexts: a): trainyard context use CTX picks one, or trainyard login URL "
            "--name gone stores it",
        ),
        ({}, "(contexts: none): trainyard login URL --name gone stores it"),
    ],
    ids=["others", "none"],
)
def test_a_current_context_the_config_lacks_is_said_so(
    config: Path,
    api: Api,
    capsys: pytest.CaptureFixture[str],
    contexts: dict[str, Any],
    how: str,
) -> None:
    """It said `no token (no context: not logged in)`, to a user who had logged in: the
    config file's `current` names a context it does not hold."""
    config.parent.mkdir(parents=True)
    config.write_text(json.dumps({"current": "gone", "contexts": contexts}))
    config.chmod(0o600)
    assert cli.main(["whoami"]) == 7
    assert capsys.readouterr().err == (
        f"trainyard: error: no token: the current context 'gone' of {config} does not exist {how}\n"
    )
    assert list(api) == []

"""Every command that lacks part of its context exits ``Exit.NOT_CONFIGURED`` (7), saying
what is missing and how to set it.

The CLI said so with exit 4 for no token, 1 for no registry, billing or scheduler URL and for
``--context`` naming no context, 1 for ``context use`` of an unknown context and 3 for
``logout`` or ``context rm`` of one: a script could not tell "set up first" from a refusal,
a failure or a missing job. Every command of the parser is run here with nothing configured
(no config file, no ``TRAINYARD_*`` variable), so a command added later is checked too.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import httpx
import pytest

from trainyard import cli
from trainyard.cli_base import Exit
from trainyard.client import TrainyardClient

JOB = "3f2a9c1e-5b7d-4e21-9a0c-7d1e2f3a4b5c"
SPEC = "apiVersion: trainyard.dev/v1\nkind: Job\nname: nc\nentrypoint: train.py\ngpus: 1\ngpu_flavor: cpu\n"

NEEDS_NO_CONTEXT = {
    "login": "it makes a context, from its URL argument and a token",
    "context ls": "it lists the contexts, none included",
    "schema": "it prints the job spec's schema",
    "version": "it prints the client's version",
    "completion": "it prints a shell script",
    "trace": "it reads a span file; a server only helps it find a trace",
}
"""Commands that work with nothing configured, and why."""

VALUES = {
    "JOB": JOB,
    "KEY": "loss",
    "EXP": "exp",
    "TAG": "t",
    "TEAM/NAME": "vision/cnn",
    "TEAM/NAME[:V|@ALIAS]": "vision/cnn:1",
    "TEAM/NAME[:V]": "vision/digits:1",
    "TEAM/MODEL:V|@ALIAS": "vision/cnn:1",
    "TEAM/DATASET:V": "vision/digits:1",
    "ALIAS": "prod",
    "VERSION": "1",
    "TEAM": "audio",
    "NODE": "node-1",
    "NAME": "gold",
    "FLAVOR": "cpu",
    "SEQ": "1",
    "SPEC": "job.yaml",
    "CTX": "cnn",
    "ID": "1",
    "TEXT": "a note",
    "ROLE": "member",
}
"""A valid value of each positional argument, by metavar (else by name)."""

OPTIONS = {
    "model register": ["--job", JOB],
    "model download": ["-o", "out.pt"],
    "dataset register": ["--uri", "s3://bucket/digits", "--sha256", "ab" * 32, "--size", "10"],
    "nodes cordon": ["--reason", "maintenance"],
    "admin prices set": ["--gpu-hour", "1.5"],
    "budget set": ["--amount", "100"],
    "submit": ["--no-code"],
    "sweep": ["--no-code", "--grid", "lr=0.1,0.01"],
}
"""The required options of a command (or those that keep it from reading local files)."""

MISSING = re.compile(
    r"trainyard: error: no (token|registry URL|billing URL|scheduler URL|context '[^']*'"
    r"|current context).*?: .*(trainyard login|trainyard logout NAME|TRAINYARD_\w+).*"
)
"""One line: what is missing, then how to set it."""


def _commands() -> list[list[str]]:
    """Every command of the parser, with valid positional arguments and required options."""
    found: list[list[str]] = []

    def walk(parser: argparse.ArgumentParser, words: list[str]) -> None:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if subs:
            for name, sub in subs[0].choices.items():
                walk(sub, [*words, name])
            return
        name = " ".join(words)
        if name in NEEDS_NO_CONTEXT or words[0] in NEEDS_NO_CONTEXT:
            return
        argv = [*words, *OPTIONS.get(name, [])]
        for action in parser._actions:
            if action.option_strings or action.dest == "help":
                continue
            if action.nargs in ("?", "*") and action.dest not in ("sequences",):
                continue
            argv.append(VALUES[str(action.metavar or action.dest)])
        found.append(argv)

    walk(cli._parser(), [])
    return found


COMMANDS = _commands()


@pytest.fixture
def nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[httpx.Request]:
    """No config file, no ``TRAINYARD_*`` variable; every request the CLI makes (none is
    expected), in the folder of a valid spec ``job.yaml``."""
    monkeypatch.setenv("TRAINYARD_CONFIG", str(tmp_path / "config.json"))
    for name in ("URL", "TOKEN", "CONTEXT", "REGISTRY_URL", "BILLING_URL", "SCHEDULER_URL"):
        monkeypatch.delenv(f"TRAINYARD_{name}", raising=False)
    (tmp_path / "job.yaml").write_text(SPEC)
    monkeypatch.chdir(tmp_path)
    sent: list[httpx.Request] = []

    def route(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(404, json={"detail": "no such thing", "errors": []})

    def make(base_url: str, token: str, timeout: float = 10) -> TrainyardClient:
        return TrainyardClient(base_url, token, timeout, transport=httpx.MockTransport(route))

    monkeypatch.setattr(cli, "TrainyardClient", make)
    return sent


def test_every_command_is_run_but_those_that_need_no_context() -> None:
    """The walk finds the commands (a few named here), and each command said to need no
    context is one of the parser's, so the list cannot outlive a command it names."""
    words = cli_words()
    names = {" ".join(a for a in argv if a in words) for argv in COMMANDS}
    assert {"ls", "submit", "model alias set", "nodes cordon", "deadletters redrive"} <= names
    assert all(name.split()[0] in words for name in NEEDS_NO_CONTEXT)


def cli_words() -> set[str]:
    """Every command word of the parser, at any level."""
    words: set[str] = set()
    parsers = [cli._parser()]
    while parsers:
        parser = parsers.pop()
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                words.update(action.choices)
                parsers.extend(action.choices.values())
    return words


@pytest.mark.parametrize("argv", COMMANDS, ids=lambda argv: " ".join(argv))
def test_a_command_with_nothing_configured_says_what_is_missing_and_exits_7(
    argv: list[str], nothing: list[httpx.Request], capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli.main(argv)
    out, err = capsys.readouterr()
    assert code == Exit.NOT_CONFIGURED == 7, err
    assert out == ""
    assert MISSING.fullmatch(err.rstrip("\n")), err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert nothing == []  # nothing was sent anywhere


def _contexts(tmp_path: Path) -> None:
    """Contexts ``a`` (current) and ``b``, each with a URL and a token."""
    (tmp_path / "config.json").write_text(
        '{"current": "a", "contexts": {'
        '"a": {"url": "http://a.test", "token": "ty_a"},'
        '"b": {"url": "http://b.test", "token": "ty_b"}}}'
    )
    (tmp_path / "config.json").chmod(0o600)


@pytest.mark.parametrize(
    ("argv", "env", "said"),
    [
        (
            ["ls", "--context", "nope"],
            {},
            "no context 'nope' (named by --context) (contexts: a, b)",
        ),
        (["ls"], {"TRAINYARD_CONTEXT": "nope"}, "no context 'nope' (named by TRAINYARD_CONTEXT)"),
        (["context", "use", "nope"], {}, "no context 'nope' (contexts: a, b): trainyard login"),
        (["context", "rm", "nope"], {}, "no context 'nope' (contexts: a, b): trainyard login"),
        (["logout", "nope"], {}, "no context 'nope' (contexts: a, b): trainyard login"),
        (
            ["ls", "--url", "http://elsewhere.test"],
            {},
            "no token for http://elsewhere.test: the token of context 'a' is sent to "
            "http://a.test only: trainyard login http://elsewhere.test, set TRAINYARD_TOKEN",
        ),
        (["model", "ls"], {}, "no registry URL: set TRAINYARD_REGISTRY_URL or trainyard login"),
    ],
)
def test_a_context_named_but_missing_or_lacking_is_exit_7_naming_it(
    argv: list[str],
    env: dict[str, str],
    said: str,
    nothing: list[httpx.Request],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _contexts(tmp_path)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert cli.main(argv) == Exit.NOT_CONFIGURED
    err = capsys.readouterr().err
    assert err.startswith(f"trainyard: error: {said}") and err.count("\n") == 1, err
    assert nothing == []


def test_a_token_without_a_url_says_the_local_default_was_tried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """No server configured (only a token): the CLI tries a local stack's URL, as
    docs/cli.md says; when nothing answers there it says no URL is configured and how to
    give one, its exit code still 5 (unreachable)."""
    monkeypatch.setenv("TRAINYARD_CONFIG", str(tmp_path / "config.json"))
    for name in ("URL", "CONTEXT"):
        monkeypatch.delenv(f"TRAINYARD_{name}", raising=False)
    monkeypatch.setenv("TRAINYARD_TOKEN", "ty_a")

    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    def make(base_url: str, token: str, timeout: float = 10) -> TrainyardClient:
        return TrainyardClient(base_url, token, timeout, transport=httpx.MockTransport(refuse))

    monkeypatch.setattr(cli, "TrainyardClient", make)
    assert cli.main(["whoami"]) == Exit.UNREACHABLE
    err = capsys.readouterr().err
    assert err.startswith("trainyard: error: cannot reach http://127.0.0.1:8080")
    assert err.endswith(
        "trainyard: error: no URL is configured, so http://127.0.0.1:8080 (a local stack's) "
        "was tried: trainyard login URL, set TRAINYARD_URL or pass --url\n"
    )
    # A URL given is not the default: a server that does not answer is just that.
    assert cli.main(["whoami", "--url", "http://127.0.0.1:8080"]) == Exit.UNREACHABLE
    assert "no URL is configured" not in capsys.readouterr().err

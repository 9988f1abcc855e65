"""``submit``/``rerun`` overrides: ``--set`` values read as YAML scalars, labels merged."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import httpx
import pytest

from trainyard import cli
from trainyard.cli import seconds_arg
from trainyard.cli_base import CliError, Exit
from trainyard.cli_jobs import _overridden, key_value, scalar, set_values
from trainyard.client import TrainyardClient


@pytest.mark.parametrize(
    ("text", "value"),
    [("1e-3", 0.001), ("3", 3), ("0.5", 0.5), ("true", True), ("adam", "adam"), ("-2", -2)],
)
def test_set_values_are_yaml_scalars(text: str, value: object) -> None:
    assert scalar(text) == value


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("no", "no"),  # YAML 1.1 (PyYAML's default) read these as False, True, 8
        ("yes", "yes"),
        ("on", "on"),
        ("010", 10),
        ("0x10", 16),
        ("1e3", 1000.0),
        ("2026-01-01", "2026-01-01"),
        ("", ""),
        ("null", "null"),
        ("[1, 2]", "[1, 2]"),
    ],
)
def test_set_values_read_as_a_spec_files_values_do(text: str, value: object) -> None:
    """The spec file is YAML 1.2's core schema (docs/job-spec.md): ``--set`` the same, so
    ``--set country=no`` is the string 'no' in both, never False."""
    assert scalar(text) == value
    assert type(scalar(text)) is type(value)


@pytest.mark.parametrize("text", ["1e999", "-1e999", ".inf", "-.inf", ".nan", ".NaN"])
def test_a_set_value_that_is_no_finite_number_is_a_usage_error(text: str) -> None:
    """``--set lr=1e999`` ended "unexpected ValueError: Out of range float values are not
    JSON compliant"."""
    with pytest.raises(CliError) as refused:
        set_values([("bs", "8"), ("lr", text)])
    assert str(refused.value) == f"--set lr={text}: not a finite number"
    assert refused.value.code == Exit.USAGE


def test_overrides_merge_into_the_spec() -> None:
    args = argparse.Namespace(
        name="n2", project=None, experiment="sweep", label=[("a", "1")], set=[("lr", "1e-2")]
    )
    spec = {"name": "n", "labels": {"b": "2"}, "hyperparameters": {"lr": 0.1, "bs": 8}}
    assert _overridden(spec, args) == {
        "name": "n2",
        "experiment": "sweep",
        "labels": {"b": "2", "a": "1"},
        "hyperparameters": {"lr": 0.01, "bs": 8},
    }


def test_key_value_needs_an_equals_sign() -> None:
    assert key_value("a=b=c") == ("a", "b=c")
    with pytest.raises(argparse.ArgumentTypeError):
        key_value("ab")


@pytest.mark.parametrize("command", [["wait", "abc"], ["attach", "abc"], ["submit", "job.yaml"]])
@pytest.mark.parametrize("value", ["nan", "-5", "-inf", "abc", ""])
def test_a_timeout_that_is_no_number_of_seconds_is_a_usage_error(
    command: list[str], value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``wait JOB --timeout nan`` waited for ever (no time compares with NaN) and
    ``--timeout -5`` ended "did not finish within -5s" (exit 6)."""
    with pytest.raises(SystemExit) as stopped:
        cli.main([*command, f"--timeout={value}"])
    assert stopped.value.code == Exit.USAGE
    err = capsys.readouterr().err
    assert f"argument --timeout: {value!r} is not a number of seconds (0 or more)" in err


@pytest.mark.parametrize(("value", "seconds"), [("0", 0.0), ("2.5", 2.5), ("inf", math.inf)])
def test_a_timeout_is_seconds_from_zero_to_no_limit(value: str, seconds: float) -> None:
    assert seconds_arg(value) == seconds


def test_api_errors_about_overridden_values_name_the_option_not_the_files_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``submit job.yaml --name 'bad name'`` put the API's refusal of the name on the file's
    line of ``name:`` ("job.yaml:1:7: name: ..."), which holds a good name; a value that came
    from the command line is named by its option, the rest stays on the file's lines."""
    spec = tmp_path / "job.yaml"
    spec.write_text(
        "name: good\ngpus: 1\ngpu_flavor: cpu\nentrypoint: train\n"
        "labels: {team: a}\nhyperparameters: {lr: 0.1}\n"
    )
    errors = [
        {"field": "name", "message": "must match ^[A-Za-z0-9._-]{1,100}$"},
        {"field": "labels.bad key.[key]", "message": "label key 'bad key' must be ..."},
        {"field": "hyperparameters.lr", "message": "too large"},
        {"field": "gpus", "message": "too many"},
    ]

    def route(request: httpx.Request) -> httpx.Response:
        if request.method == "POST" and request.url.path == "/v1/jobs":
            return httpx.Response(422, json={"detail": "invalid job spec", "errors": errors})
        return httpx.Response(404, json={"detail": "no", "errors": []})

    def make(base_url: str, token: str, timeout: float = 10) -> TrainyardClient:
        return TrainyardClient(base_url, token, timeout, transport=httpx.MockTransport(route))

    monkeypatch.setattr(cli, "TrainyardClient", make)
    monkeypatch.setenv("TRAINYARD_CONFIG", str(tmp_path / "config.json"))
    monkeypatch.setenv("TRAINYARD_TOKEN", "ty_a")
    argv = ["submit", str(spec), "--no-code", "--name", "bad name", "--label", "bad key=1"]
    assert cli.main([*argv, "--set", "lr=1e30"]) == Exit.ERROR
    lines = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert lines == [
        "trainyard: error: --name: name: must match ^[A-Za-z0-9._-]{1,100}$",
        "trainyard: error: --label bad key: labels.bad key.[key]: label key 'bad key' must be ...",
        "trainyard: error: --set lr: hyperparameters.lr: too large",
        f"trainyard: error: {spec}:2:7: gpus: too many",
    ]


def test_a_bad_key_an_option_added_is_named_by_the_option(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The API names a mapping's bad key on the mapping, the key in the message
    (``shared.http_errors``: ``labels``, "label key 'bad key' must be ..."), so a key that
    ``--label`` or ``--set`` added was put on the file's ``labels:`` or ``hyperparameters:``
    line, which holds only good keys; an error about a key of the file stays there."""
    spec = tmp_path / "job.yaml"
    spec.write_text(
        "name: good\ngpus: 1\ngpu_flavor: cpu\nentrypoint: train\n"
        "labels: {team: a}\nhyperparameters: {lr: 0.1}\n"
    )
    long = "k" * 300
    errors = [
        {"field": "labels", "message": "label key 'bad key' must be a Kubernetes-style key"},
        {"field": "hyperparameters", "message": f"key '{long}': at most 100 characters"},
        {"field": "labels", "message": "label key 'team' is reserved"},
    ]

    def route(request: httpx.Request) -> httpx.Response:
        if request.method == "POST" and request.url.path == "/v1/jobs":
            return httpx.Response(422, json={"detail": "invalid job spec", "errors": errors})
        return httpx.Response(404, json={"detail": "no", "errors": []})

    def make(base_url: str, token: str, timeout: float = 10) -> TrainyardClient:
        return TrainyardClient(base_url, token, timeout, transport=httpx.MockTransport(route))

    monkeypatch.setattr(cli, "TrainyardClient", make)
    monkeypatch.setenv("TRAINYARD_CONFIG", str(tmp_path / "config.json"))
    monkeypatch.setenv("TRAINYARD_TOKEN", "ty_a")
    argv = ["submit", str(spec), "--no-code", "--label", "bad key=1", "--set", f"{long}=1"]
    assert cli.main(argv) == Exit.ERROR
    lines = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert lines == [
        "trainyard: error: --label bad key: labels: label key 'bad key' must be a "
        "Kubernetes-style key",
        f"trainyard: error: --set {long}: hyperparameters: key '{long}': at most 100 characters",
        f"trainyard: error: {spec}:5:9: labels: label key 'team' is reserved",
    ]

"""A spec value that looks like a credential is warned about, on its line, before it is sent.

A spec is stored with its job and readable by the whole team (``describe --json``, the
dashboard), and the platform hands jobs no secrets of the user's: a person who writes
``hyperparameters: {hf_token: hf_abc}`` (there is no ``env`` field) was told nothing."""

from __future__ import annotations

import pytest

from trainyard.cli_jobs import set_values
from trainyard.secret_names import looks_secret
from trainyard.spec import parse

HEAD = "apiVersion: trainyard.dev/v1\nkind: Job\nname: a\ngpus: 1\ngpu_flavor: cpu\n"
WHY = (
    "looks like a secret: a spec is stored with the job and readable by your team "
    "(describe --json, the dashboard); give the job no credentials in its spec"
)


@pytest.mark.parametrize(
    "name",
    [
        "hf_token",
        "HF_TOKEN",
        "wandb-api-key",
        "apiKey",
        "AWS_SECRET_ACCESS_KEY",
        "password",
        "db_passwd",
        "private_key",
        "client_secret",
        "credentials",
        "accessKey",
    ],
)
def test_credential_names(name: str) -> None:
    assert looks_secret(name)


@pytest.mark.parametrize(
    "name",
    ["max_tokens", "tokenizer", "num_tokens", "key_dim", "lr", "secretary", "passes", "keys"],
)
def test_names_that_are_no_credential(name: str) -> None:
    assert not looks_secret(name)


def test_secret_looking_fields_are_warned_about_on_their_lines() -> None:
    warnings: list[str] = []
    parse(
        HEAD
        + "entrypoint: train\n"
        + "hyperparameters: {lr: 0.1, hf_token: hf_abc, max_tokens: 512}\n"
        + "labels: {api-key: x}\n"
        + "args: [--epochs, '3', --wandb-api-key, abc, --password=pw, --tokenizer=bpe]\n",
        "job.yaml",
        warnings.append,
    )
    assert warnings == [
        f"job.yaml:7:28: hyperparameters.hf_token: {WHY}",
        f"job.yaml:8:10: labels.api-key: {WHY}",
        f"job.yaml:9:40: args[3]: {WHY}",
        f"job.yaml:9:45: args[4]: {WHY}",
    ]


def test_a_spec_without_such_names_gets_no_warning() -> None:
    warnings: list[str] = []
    parse(
        HEAD + "entrypoint: train\nhyperparameters: {max_tokens: 5}\n", "job.yaml", warnings.append
    )
    assert warnings == []


def test_a_set_option_that_looks_like_a_secret_is_warned_about(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert set_values([("HF_TOKEN", "hf_abc"), ("max_tokens", "5")]) == {
        "HF_TOKEN": "hf_abc",
        "max_tokens": 5,
    }
    assert capsys.readouterr().err.splitlines() == [f"warning: --set HF_TOKEN: {WHY}"]

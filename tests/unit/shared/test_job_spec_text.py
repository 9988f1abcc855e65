"""The wire ``JobSpec`` refuses control characters itself, whoever produced the spec: the
submission API refused them at its edge, but a grant from any other producer reached the
runner with a NUL in its argv, whose spawn then failed as the node's fault."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from trainyard_platform.shared.events.payloads import JobSpec

BASE: dict[str, Any] = {
    "name": "n",
    "team": "t",
    "user": "u",
    "gpus": 1,
    "gpu_flavor": "cpu",
    "seed": 1,
    "max_runtime_seconds": 60,
}


def refusal(**fields: Any) -> list[tuple[tuple[str | int, ...], str]]:
    with pytest.raises(ValidationError) as caught:
        JobSpec.model_validate(BASE | fields)
    return [(e["loc"], e["msg"]) for e in caught.value.errors()]


@pytest.mark.parametrize(
    ("fields", "loc"),
    [
        ({"command": ["python", "train\x00.py"]}, ("command", 1)),
        ({"args": ["--lr", "0.1\x00"]}, ("args", 1)),
        ({"args": ["\x1b[31mred"]}, ("args", 0)),
        ({"entrypoint": "train\x00.py"}, ("entrypoint",)),
        ({"name": "a\x00b"}, ("name",)),
        ({"team": "t\n"}, ("team",)),
        ({"user": "u\x7f"}, ("user",)),
        ({"gpu_flavor": "cpu\x00"}, ("gpu_flavor",)),
        ({"priority": "high\x00"}, ("priority",)),
        ({"image": "img\x00"}, ("image",)),
        ({"dataset": "s3://b/\x00"}, ("dataset",)),
        ({"project": "p\u202e"}, ("project",)),
        ({"experiment": "e\x00"}, ("experiment",)),
        ({"requirements": ["torch\x00"]}, ("requirements", 0)),
        ({"labels": {"k": "v\x00"}}, ("labels", "k")),
        ({"labels": {"k\x00": "v"}}, ("labels", "k\x00", "[key]")),
        ({"hyperparameters": {"lr\x00": 1}}, ("hyperparameters", "lr\x00", "[key]")),
        ({"hyperparameters": {"note": "a\x00b"}}, ("hyperparameters", "note")),
        ({"reproduces": "j\x00"}, ("reproduces",)),
        ({"code": {"kind": "git", "repository": "r\x00", "commit": "0" * 40}}, None),
    ],
)
def test_control_characters_are_refused_naming_the_field(
    fields: dict[str, Any], loc: tuple[str | int, ...] | None
) -> None:
    errors = refusal(**fields)
    assert len(errors) == 1, errors
    found, message = errors[0]
    if loc is not None:
        assert found == loc
    else:
        assert found[0] == "code" and found[-1] == "repository"
    assert "must not contain control characters (found U+" in message


def test_the_refusal_says_which_character_and_what_free_text_may_hold() -> None:
    [(_, message)] = refusal(command=["a\x00"])
    assert "found U+0000; allowed: tab, newline and carriage return only" in message
    [(_, message)] = refusal(name="a\x00")
    assert "found U+0000; allowed: none" in message


def test_free_text_keeps_tab_newline_carriage_return_and_bidi_marks() -> None:
    """The same rule as the submission API's (``shared.http_errors.check_json``)."""
    text = "line one\n\tline two\r\n\u202eright to left"
    spec = JobSpec.model_validate(
        BASE | {"command": ["sh", "-c", text], "args": [text], "hyperparameters": {"n": text}}
    )
    assert spec.command[2] == text and spec.args == [text] and spec.hyperparameters["n"] == text

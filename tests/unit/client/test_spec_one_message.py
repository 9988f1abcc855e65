"""A value of the wrong type is told its type, once: not also the bounds and the form of
the type it should have been.

``seed: 1e400`` gave three lines (``must be at most 4294967295``, ``must be an integer``,
``must be a finite number``), ``gpus: 100.5`` two, the first of which (``must be at most
64``) sent the user after the wrong fix."""

from __future__ import annotations

import pytest

from trainyard.spec import SpecError, parse

BASE = "name: a\nentrypoint: m\ngpu_flavor: cpu\n"


@pytest.mark.parametrize(
    ("more", "says"),
    [
        ("gpus: 100.5\n", ["j.yaml:4:7: gpus: must be an integer"]),
        ("gpus: -1.5\n", ["j.yaml:4:7: gpus: must be an integer"]),
        ("gpus: 1\nseed: 1e400\n", ["j.yaml:5:7: seed: must be an integer"]),
        (
            "gpus: 1\nmax_runtime_seconds: .inf\n",
            ["j.yaml:5:22: max_runtime_seconds: must be an integer"],
        ),
        ("gpus: 1\nlabels: [.inf]\n", ["j.yaml:5:9: labels: must be a mapping"]),
        # A value of the right type still gets every problem it has.
        (
            "gpus: 1\nhyperparameters: {lr: .inf}\n",
            ["j.yaml:5:23: hyperparameters.lr: must be a finite number"],
        ),
        ("gpus: 65\n", ["j.yaml:4:7: gpus: must be at most 64"]),
    ],
)
def test_one_message_per_mistyped_value(more: str, says: list[str]) -> None:
    with pytest.raises(SpecError) as caught:
        parse(BASE + more, "j.yaml")
    assert str(caught.value).splitlines() == says


@pytest.mark.parametrize(
    ("more", "says"),
    [
        (f"name: {'a' * 101}\n", "must be 1 to 100 letters, digits, '.', '_' or '-'"),
        ("name: a\nexperiment: ''\n", "must be 1 to 100 letters, digits, '.', '_' or '-'"),
    ],
)
def test_a_value_too_long_for_its_form_is_told_the_form_once(more: str, says: str) -> None:
    """``name`` of 101 letters was told ``must be at most 100 characters`` and then the
    form, whose words say the bounds already: two lines for one mistake."""
    with pytest.raises(SpecError) as caught:
        parse("gpus: 1\nentrypoint: m\ngpu_flavor: cpu\n" + more, "j.yaml")
    (line,) = str(caught.value).splitlines()
    assert line.endswith(says)

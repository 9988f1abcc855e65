"""``submit``/``rerun`` overrides: ``--set`` values read as YAML scalars, labels merged."""

from __future__ import annotations

import argparse

import pytest

from trainyard.cli_jobs import _overridden, _scalar, key_value


@pytest.mark.parametrize(
    ("text", "value"),
    [("1e-3", 0.001), ("3", 3), ("0.5", 0.5), ("true", True), ("adam", "adam"), ("-2", -2)],
)
def test_set_values_are_yaml_scalars(text: str, value: object) -> None:
    assert _scalar(text) == value


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

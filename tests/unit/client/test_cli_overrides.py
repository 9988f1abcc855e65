"""``submit``/``rerun`` overrides: ``--set`` values read as YAML scalars, labels merged."""

from __future__ import annotations

import argparse

import pytest

from trainyard.cli_base import CliError, Exit
from trainyard.cli_jobs import _overridden, _scalar, key_value, set_values


@pytest.mark.parametrize(
    ("text", "value"),
    [("1e-3", 0.001), ("3", 3), ("0.5", 0.5), ("true", True), ("adam", "adam"), ("-2", -2)],
)
def test_set_values_are_yaml_scalars(text: str, value: object) -> None:
    assert _scalar(text) == value


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
    assert _scalar(text) == value
    assert type(_scalar(text)) is type(value)


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

"""``--set`` of a key the spec (or the job rerun) does not have, but that is a typo away
from one it has (``--set lrr=1e-3`` for ``lr``), added a new hyper-parameter without a
word: the job then ran with its old ``lr``. It still adds it (the code may read a
parameter the spec leaves to its defaults), with a warning naming the key meant."""

from __future__ import annotations

import argparse

import pytest

from trainyard.cli_jobs import _overridden

SPEC = {"name": "digits", "hyperparameters": {"lr": 0.003, "batch_size": 64, "epochs": 8}}


def _set(*pairs: tuple[str, str]) -> argparse.Namespace:
    return argparse.Namespace(set=list(pairs), label=None, name=None, project=None)


def test_a_key_a_typo_away_from_the_spec_s_is_added_with_a_warning(
    capsys: pytest.CaptureFixture[str],
) -> None:
    spec = _overridden(SPEC, _set(("lrr", "1e-3")))
    assert spec["hyperparameters"] == {"lr": 0.003, "batch_size": 64, "epochs": 8, "lrr": 0.001}
    assert capsys.readouterr().err.splitlines() == [
        "warning: --set lrr: the spec has no hyper-parameter 'lrr'; did you mean 'lr'? "
        "(it is added as a new one)"
    ]


def test_known_keys_and_unrelated_new_ones_pass_silently(
    capsys: pytest.CaptureFixture[str],
) -> None:
    spec = _overridden(SPEC, _set(("lr", "1e-3"), ("weight_decay", "0.1")))
    assert spec["hyperparameters"]["lr"] == 0.001
    assert spec["hyperparameters"]["weight_decay"] == 0.1
    assert _overridden({"name": "x"}, _set(("lr", "1")))["hyperparameters"] == {"lr": 1}
    assert capsys.readouterr().err == ""

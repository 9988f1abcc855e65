"""An integer of more digits than Python converts (4300) in a spec file, or in ``--set``,
was a ``ValueError`` of ``int()``: the CLI said ``unexpected ValueError: Exceeds the limit
(4300 digits) for integer string conversion ...``, naming neither the file nor the field.
It is refused as every number too big for the job is, on its field's line."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from trainyard import cli
from trainyard.spec import SpecError, parse

LONG = "9" * 5000
HEX = "F" * 5000
"""Of more than 6,000 decimal digits."""
HEAD = "name: digits\nentrypoint: train\ngpus: 1\ngpu_flavor: cpu\n"


def _problems(text: str, file: str) -> list[str]:
    with pytest.raises(SpecError) as caught:
        parse(text, file)
    return str(caught.value).splitlines()


def test_a_long_integer_in_yaml_is_named_at_its_field() -> None:
    text = HEAD + f"seed: {LONG}\nhyperparameters:\n  n: -{LONG}\n"
    assert _problems(text, "job.yaml") == [
        "job.yaml:5:7: seed: must be an integer",
        "job.yaml:7:6: hyperparameters.n: must be a finite number",
    ]


def test_a_long_integer_in_json_is_named_at_its_field() -> None:
    text = textwrap.dedent(
        f"""\
        {{"name": "digits", "entrypoint": "train", "gpus": 1, "gpu_flavor": "cpu",
         "seed": {LONG}}}
        """
    )
    assert _problems(text, "job.json") == ["job.json:2:10: seed: must be an integer"]


def test_a_long_integer_in_quotes_is_named_at_its_field() -> None:
    (problem,) = _problems(HEAD + f'seed: "{LONG}"\n', "job.yaml")
    assert problem.startswith("job.yaml:5:7: seed: must be an integer")


def test_a_long_integer_of_set_is_a_usage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TRAINYARD_CONFIG", str(tmp_path / "config.json"))
    spec = tmp_path / "job.yaml"
    spec.write_text(HEAD)
    assert cli.main(["submit", str(spec), "--no-code", "--set", f"n={LONG}"]) == 2
    err = capsys.readouterr().err
    assert err.endswith(f"\ntrainyard: error: --set n={LONG}: not a finite number\n")


def test_a_long_hexadecimal_integer_is_named_at_its_field() -> None:
    """`int()` reads a hexadecimal integer of any length: the schema check then wrote it in
    decimal in its message (`... is greater than the maximum`) and raised ValueError."""
    text = HEAD + f"seed: 0x{HEX}\nhyperparameters:\n  n: 0o{'7' * 5000}\n"
    assert _problems(text, "job.yaml") == [
        "job.yaml:5:7: seed: must be an integer",
        "job.yaml:7:6: hyperparameters.n: must be a finite number",
    ]


def test_a_long_hexadecimal_integer_of_set_is_a_usage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TRAINYARD_CONFIG", str(tmp_path / "config.json"))
    spec = tmp_path / "job.yaml"
    spec.write_text(HEAD)
    assert cli.main(["submit", str(spec), "--no-code", "--set", f"n=0x{HEX}"]) == 2
    err = capsys.readouterr().err
    assert err.endswith(f"\ntrainyard: error: --set n=0x{HEX}: not a finite number\n")


@pytest.mark.parametrize("seed", ["4294967295", "0xFFFFFFFF", "0o37777777777"])
def test_the_largest_seed_is_taken_however_written(seed: str) -> None:
    assert parse(HEAD + f"seed: {seed}\n", "job.yaml").spec["seed"] == 4294967295

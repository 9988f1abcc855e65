"""Job spec files: YAML or JSON, each problem named by its line and field."""

from __future__ import annotations

import io
import textwrap
from pathlib import Path

import pytest

from trainyard import spec as spec_module
from trainyard.spec import SpecError, SpecFile, load, parse

GOOD = textwrap.dedent(
    """\
    apiVersion: trainyard.dev/v1
    kind: Job
    name: digits
    entrypoint: train
    gpus: 1
    gpu_flavor: cpu
    """
)


def _problems(text: str, file: str = "job.yaml") -> list[str]:
    with pytest.raises(SpecError) as caught:
        parse(text, file)
    return str(caught.value).splitlines()


def test_yaml_is_read_as_yaml_1_2_core() -> None:
    text = GOOD + "hyperparameters:\n  lr: 1e-3\n  on: yes\n  day: 2024-01-01\n  n: 0x10\n"
    spec = parse(text, "job.yaml").spec
    assert spec["hyperparameters"] == {"lr": 0.001, "on": "yes", "day": "2024-01-01", "n": 16}
    assert "apiVersion" not in spec and "kind" not in spec  # sent without them


def test_an_unknown_field_names_its_line_and_the_close_name() -> None:
    text = GOOD + "hyperparameter:\n  lr: 0.1\n"
    assert _problems(text) == [
        "job.yaml:7:1: hyperparameter: unknown field 'hyperparameter': "
        "did you mean 'hyperparameters'?"
    ]


def test_malformed_yaml_names_its_line_and_field() -> None:
    text = GOOD + "hyperparameters:\n  lr: 0.1\n   batch: 4\n"
    (problem,) = _problems(text)
    assert problem.startswith("job.yaml:9:")
    assert "batch: invalid YAML: mapping values are not allowed here" in problem


def test_every_bad_value_is_named_at_its_line_all_at_once() -> None:
    text = textwrap.dedent(
        """\
        name: "a b"
        entrypoint: train
        gpus: 100
        gpu_flavor: cpu
        args: [ok, 3]
        code: {kind: git, repository: https://h/r, commit: abc}
        labels: {"": x}
        """
    )
    assert _problems(text) == [
        "job.yaml:1:7: name: must be 1 to 100 letters, digits, '.', '_' or '-'",
        "job.yaml:3:7: gpus: must be at most 64",
        'job.yaml:5:12: args[1]: must be a string (quote it: "3")',
        "job.yaml:6:52: code.commit: must be a whole commit id: 40 lower-case hexadecimal digits",
        "job.yaml:7:9: labels: key '': must be at least 1 character",
    ]


def test_a_missing_field_and_a_key_given_twice() -> None:
    # A key given twice is found while reading, before the schema.
    assert _problems("name: a\nname: b\n") == ["job.yaml:2:1: name: given twice"]
    assert _problems("name: a\n") == [
        "job.yaml:1:1: gpus: field required",
        "job.yaml:1:1: gpu_flavor: field required",
    ]


def test_json_errors_name_their_line() -> None:
    assert _problems('{"name": "a",\n "gpus": 1 "x"}', "job.json") == [
        "job.json:2:12: gpus: invalid JSON: Expecting ',' delimiter"
    ]
    good = '{"name": "a", "entrypoint": "t", "gpu_flavor": "cpu",\n "gpus": 0}'
    assert _problems(good, "job.json") == ["job.json:2:10: gpus: must be at least 1"]


@pytest.mark.parametrize(
    ("file", "text"),
    [
        *((f, t) for f in ("job.json", "job.yaml", "job.spec") for t in ("", "\n", "  \n\n")),
        ("job.yaml", "# just a comment\n"),
    ],
)
def test_an_empty_file_says_so_whatever_its_format(file: str, text: str) -> None:
    """An empty ``job.json`` said "job.json:1:1: invalid JSON: Expecting value" where an
    empty ``job.yaml`` says it is empty."""
    assert _problems(text, file) == [f"{file}: is empty; a job spec is a mapping"]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('{"name": "a",\n "gpus": 1,\n}', "job.json:2:11: gpus: invalid JSON: a trailing comma"),
        (
            '{"args": ["a", "b",],\n "gpus": 1}',
            "job.json:1:19: args: invalid JSON: a trailing comma",
        ),
        (
            '{"name": "a", , "gpus": 1}',
            "job.json:1:15: name: invalid JSON: Expecting property name",
        ),
    ],
)
def test_a_trailing_comma_in_json_is_named_so(text: str, says: str) -> None:
    """``{"gpus": 1,}`` said "Expecting property name enclosed in double quotes" at the
    brace: a person who wrote a trailing comma (JavaScript and Python allow it) cannot tell
    from that what to change."""
    (problem,) = _problems(text, "job.json")
    assert problem.startswith(says)
    if "trailing" in says:
        assert problem.endswith("(JSON allows none): remove it")


def test_a_tab_in_yaml_says_yaml_indents_with_spaces() -> None:
    """A tab in the indentation said only "found character '\\t' that cannot start any
    token"; the fix is to indent with spaces."""
    assert _problems(GOOD + "hyperparameters:\n\tlr: 1\n") == [
        "job.yaml:8:1: lr: invalid YAML: found character '\\t' that cannot start any token "
        "(YAML indents with spaces, never tabs)"
    ]


@pytest.mark.parametrize(
    ("line", "says"),
    [
        (
            "requirements: numpy",
            "requirements: must be a list (in YAML: [a, b], or one '- a' per line)",
        ),
        ("labels: {epoch: 3}", 'labels.epoch: must be a string (quote it: "3")'),
        ("labels: {fast: true}", 'labels.fast: must be a string (quote it: "true")'),
        (
            "register_model: yes",
            "register_model: must be true or false (YAML 1.2 reads 'yes' as a string: write true)",
        ),
        (
            "register_model: off",
            "register_model: must be true or false (YAML 1.2 reads 'off' as a string: write false)",
        ),
        ('seed: "42"', "seed: must be an integer (remove the quotes: 42)"),
        ("seed: 4.5", "seed: must be an integer"),
    ],
)
def test_a_value_of_the_wrong_type_says_how_to_write_it(line: str, says: str) -> None:
    """``register_model: yes`` said only "must be true or false" (YAML 1.2 reads ``yes`` as a
    string, unlike YAML 1.1), ``labels: {epoch: 3}`` only "must be a string": the fix is one
    word, and the message now says it."""
    (problem,) = _problems(GOOD + line + "\n")
    assert problem.split(": ", 1)[1] == says


def test_api_version_and_kind() -> None:
    warnings: list[str] = []
    plain = GOOD.replace("apiVersion: trainyard.dev/v1\nkind: Job\n", "")
    parse(plain, "job.yaml", warnings.append)
    assert warnings == [
        "job.yaml: no apiVersion/kind; read as apiVersion: trainyard.dev/v1, kind: Job "
        "(add both to the file)"
    ]
    wrong = GOOD.replace("trainyard.dev/v1", "batch/v1").replace("kind: Job", "kind: Pod")
    assert _problems(wrong) == [
        "job.yaml:1:13: apiVersion: must be 'trainyard.dev/v1'",
        "job.yaml:2:7: kind: must be 'Job'",
    ]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "job.yaml: is empty"),
        ("- a\n- b\n", "must hold one mapping"),
        (GOOD + "seed: !!binary aGk=\n", "unsupported YAML tag"),
        (GOOD + "hyperparameters: {x: .nan}\n", "hyperparameters.x: must be a finite number"),
    ],
)
def test_files_that_are_no_spec(text: str, says: str) -> None:
    assert says in "\n".join(_problems(text))


def test_the_apis_field_errors_land_on_the_files_lines(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(GOOD + "args:\n  - a\n  - b\nhyperparameters:\n  a.b: 1\n")
    spec: SpecFile = load(path)
    error = spec.explain(
        [
            {"field": "entrypoint", "message": "must be a dotted Python module"},
            {"field": "args[1]", "message": "bad"},
            {"field": "hyperparameters.a.b", "message": "bad too"},
            {"field": "body", "message": "whole"},
        ]
    )
    assert str(error).splitlines() == [
        f"{path}:4:13: entrypoint: must be a dotted Python module",
        f"{path}:9:5: args[1]: bad",
        f"{path}:11:8: hyperparameters.a.b: bad too",
        f"{path}: body: whole",
    ]


def test_an_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="cannot read"):
        load(tmp_path / "nope.yaml")


def test_an_alias_bomb_or_a_cycle_is_refused_quickly() -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}]" for i in range(1, 12)]
    (problem,) = _problems("\n".join(lines) + "\n")
    assert "too large" in problem
    (problem,) = _problems("name: &n [*n]\n")
    assert "too large" in problem


@pytest.mark.parametrize(
    ("text", "file"),
    [
        ("a: " + "[" * 5000 + "]" * 5000 + "\n", "job.yaml"),  # flow style
        ("a:\n" + "".join("  " * i + "-\n" for i in range(3000)), "job.yaml"),  # block style
        ('{"a": ' + "[" * 5000 + "]" * 5000 + "}", "job.json"),
        ('{"a": ' + '{"b": ' * 5000 + "1" + "}" * 5001, "job.json"),
    ],
)
def test_nesting_beyond_the_parsers_reach_is_a_spec_error(text: str, file: str) -> None:
    """YAML's composer and JSON's decoder recurse per level: thousands of levels ended
    "unexpected RecursionError" with no file or line; they are refused, like 33 levels."""
    (problem,) = _problems(text, file)
    assert problem == f"{file}: nested too deeply: at most 32 levels"


def test_a_spec_too_big_to_be_one_is_refused_unread(tmp_path: Path) -> None:
    # A 60 MB file was read whole (19 s) and then said only "missing fields"; a device that
    # never ends (/dev/zero) was read until memory ran out.
    big = tmp_path / "job.yaml"
    big.write_text("# " + "x" * (spec_module.MAX_SPEC_BYTES + 10) + "\nname: a\n")
    with pytest.raises(SpecError) as refused:
        spec_module.load(big)
    assert f"is over {spec_module.MAX_SPEC_BYTES} bytes" in str(refused.value)
    endless = io.BytesIO(b"a" * (spec_module.MAX_SPEC_BYTES + 1))
    with pytest.raises(SpecError, match="is over"):
        spec_module.load_stream(endless, "<stdin>")
    if Path("/dev/zero").exists():
        with pytest.raises(SpecError, match="is over"):
            spec_module.load(Path("/dev/zero"))


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (
            GOOD + "hyperparameters:\n  note: a\x00b\n",
            "job.yaml:8:10: note: invalid YAML: character U+0000 is not allowed",
        ),
        ("\x01name: x\n", "job.yaml:1:1: invalid YAML: character U+0001 is not allowed"),
    ],
)
def test_a_control_character_in_yaml_is_named_at_its_line(text: str, says: str) -> None:
    """PyYAML's words were two lines, the second naming `"<unicode string>", position 97`:
    neither the file nor a line of it."""
    (problem,) = _problems(text)
    assert problem == says + " (YAML holds no control characters but tab and line breaks)"

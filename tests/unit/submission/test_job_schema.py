"""The published JSON Schema of a job spec, and the API's answer to unknown fields and to
``apiVersion``/``kind``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from trainyard.spec import load, parse, schema_text
from trainyard_platform.services.submission.jobschema import render
from trainyard_platform.services.submission.schemas import parse_job_request
from trainyard_platform.shared.http_errors import RequestInvalid

ROOT = Path(__file__).parents[3]
FLAVORS = ["cpu", "h200"]
GOOD: dict[str, Any] = {"name": "n", "entrypoint": "train", "gpus": 1, "gpu_flavor": "cpu"}


def _errors(body: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(RequestInvalid) as caught:
        parse_job_request(json.dumps(body).encode(), FLAVORS)
    return {e.field: e.message for e in caught.value.errors}


def test_the_committed_schema_is_the_one_the_models_give() -> None:
    committed = (ROOT / "client" / "trainyard" / "schemas" / "job.v1.json").read_text()
    assert committed == render(), (
        "client/trainyard/schemas/job.v1.json is out of date; regenerate it with "
        "python -m trainyard_platform.services.submission.jobschema > client/trainyard/schemas/job.v1.json"
    )
    assert schema_text() == committed  # what `trainyard schema` prints


def test_the_schema_documents_every_field_for_editors() -> None:
    schema = json.loads(render())
    assert schema["$schema"].endswith("2020-12/schema")
    assert schema["additionalProperties"] is False
    assert {"apiVersion", "kind", "project", "experiment", "labels"} <= set(schema["properties"])
    undocumented = [k for k, v in schema["properties"].items() if not v.get("description")]
    assert undocumented == [], undocumented


@pytest.mark.parametrize(
    ("typo", "message"),
    [
        ("hyperparameter", "unknown field 'hyperparameter': did you mean 'hyperparameters'?"),
        ("maxRestarts", "unknown field 'maxRestarts': did you mean 'max_restarts'?"),
        ("apiversion", "unknown field 'apiversion': did you mean 'apiVersion'?"),
        ("zzz", "unknown field 'zzz'"),
    ],
)
def test_the_api_refuses_an_unknown_field_naming_the_close_one(typo: str, message: str) -> None:
    assert _errors({**GOOD, typo: 1}) == {typo: message}


def test_an_unknown_field_of_the_code_names_the_close_one_of_its_kind() -> None:
    code = {"kind": "git", "repository": "https://h/r", "commit": "a" * 40, "comit": "x"}
    assert _errors({**GOOD, "code": code}) == {
        "code.comit": "unknown field 'comit': did you mean 'commit'?"
    }


def test_api_version_and_kind_are_optional_but_checked() -> None:
    with_them = {**GOOD, "apiVersion": "trainyard.dev/v1", "kind": "Job"}
    spec = parse_job_request(json.dumps(with_them).encode(), FLAVORS).to_spec("u", "t")
    assert spec.name == "n"
    assert parse_job_request(json.dumps(GOOD).encode(), FLAVORS).api_version is None
    errors = _errors({**GOOD, "apiVersion": "trainyard.dev/v2", "kind": "Pod"})
    assert set(errors) == {"apiVersion", "kind"}


EXAMPLES = sorted(p.name for p in (ROOT / "examples").glob("*.job.*"))


def test_every_example_spec_is_checked() -> None:
    assert {"digits.job.json", "digits.job.yaml", "ddp_digits.job.json"} <= set(EXAMPLES)


@pytest.mark.parametrize("example", EXAMPLES)
def test_the_examples_are_valid_specs(example: str) -> None:
    spec = load(ROOT / "examples" / example).spec
    # As `trainyard submit` sends it: with the code it packed from the spec's folder.
    spec["code"] = {"kind": "bundle", "sha256": "0" * 64, "size_bytes": 1}
    parse_job_request(json.dumps(spec).encode(), FLAVORS)


def _doc_specs() -> list[tuple[str, str]]:
    """The specs the documents show as files a user writes: docs/job-spec.md's first
    ``yaml`` block, and the README's ``job.yaml`` of "Your own project" (its comments)."""
    doc = (ROOT / "docs" / "job-spec.md").read_text()
    first = doc.split("```yaml\n", 1)[1].split("```", 1)[0]
    readme = (ROOT / "README.md").read_text()
    shown = readme.split("cat job.yaml", 1)[1].split("\ntrainyard submit", 1)[0]
    own = "\n".join(line.split("# ", 1)[1] for line in shown.splitlines() if "# " in line)
    return [("docs/job-spec.md", first), ("README.md", own)]


@pytest.mark.parametrize(("where", "text"), _doc_specs())
def test_the_documents_specs_are_valid(where: str, text: str) -> None:
    spec = parse(text, where).spec
    assert spec["name"] and spec["gpus"] >= 1
    spec["code"] = {"kind": "bundle", "sha256": "0" * 64, "size_bytes": 1}
    parse_job_request(json.dumps(spec).encode(), FLAVORS)


def test_the_yaml_example_is_the_json_one_with_a_project_experiment_and_labels() -> None:
    """docs/job-spec.md says what tells the two apart; nothing else may."""
    as_yaml = load(ROOT / "examples" / "digits.job.yaml").spec
    as_json = load(ROOT / "examples" / "digits.job.json").spec
    assert {
        k: v for k, v in as_yaml.items() if k not in ("project", "experiment", "labels")
    } == as_json
    assert {"project", "experiment", "labels"} <= set(as_yaml)

"""docs/job-spec.md names every variable the runner gives a job (``trainyard.control``).

Only ``TRAINYARD_DATASET`` was in any document: a job run by ``command`` (a shell script)
had no page saying where its id, seed, hyper-parameters or checkpoint folder are."""

from __future__ import annotations

from pathlib import Path

from trainyard import control

DOC = (Path(__file__).resolve().parents[3] / "docs" / "job-spec.md").read_text()


def test_every_runtime_variable_is_documented() -> None:
    variables = [v for k, v in vars(control).items() if k.startswith("ENV_")]
    assert len(variables) >= 9
    assert [v for v in variables if f"| `{v}` |" not in DOC] == []

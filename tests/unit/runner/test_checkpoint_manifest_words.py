"""A checkpoint whose manifest is bad fails the job with a reason its user reads: the
manifest field and what is wrong in plain words (``size_bytes: must be an integer``), as the
API says a bad field, never pydantic's text (``1 validation error for Manifest ...
Input should be a valid integer``)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_openapi_fuzz import NOT_PLAIN
from trainyard_platform.services.runner.checkpoints import StagedCheckpointInvalid, commit_staged
from trainyard_platform.shared.storage import LocalStore

STEP = 3
DATA = b"weights"
GOOD: dict[str, Any] = {
    "step": STEP,
    "object": f"step-{STEP:08d}/checkpoint.pt",
    "size_bytes": len(DATA),
    "sha256": hashlib.sha256(DATA).hexdigest(),
}
BAD: list[Any] = [None, True, -1, 1.5, 2**70, "", "x", "../../etc/passwd", [], {}]


def _refusal(tmp_path: Path, manifest: bytes) -> str:
    staging = tmp_path / "staging"
    folder = staging / f"step-{STEP:08d}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "checkpoint.pt").write_bytes(DATA)
    (folder / "manifest.json").write_bytes(manifest)
    with pytest.raises(StagedCheckpointInvalid) as refused:
        commit_staged(staging, STEP, LocalStore(tmp_path / "store"), attempt=1)
    return str(refused.value)


def test_every_bad_manifest_field_is_said_in_plain_words(tmp_path: Path) -> None:
    wrong = []
    for name in GOOD:
        for bad in [*BAD, "missing"]:
            manifest = dict(GOOD)
            if bad == "missing":
                del manifest[name]
            else:
                manifest[name] = bad
            if manifest == GOOD:
                continue
            try:
                said = _refusal(tmp_path, json.dumps(manifest).encode())
            except pytest.fail.Exception:
                continue  # taken (a string "x" is a fine object name of no step: refused apart)
            if any(phrase in said for phrase in NOT_PLAIN) or "\n" in said:
                wrong.append(f"{name}={bad!r}: {said}")
            elif said.startswith(f"manifest of step {STEP} is invalid: ") and name not in said:
                wrong.append(f"{name}={bad!r}: names no field: {said}")
    for whole in (b"", b"{", b"[]", b"null", b'"x"'):
        said = _refusal(tmp_path, whole)
        if any(phrase in said for phrase in NOT_PLAIN) or "\n" in said:
            wrong.append(f"{whole!r}: {said}")
    assert not wrong, "\n".join(wrong)


def test_the_words_for_the_commonest_mistakes(tmp_path: Path) -> None:
    said = _refusal(tmp_path, json.dumps(GOOD | {"size_bytes": "many"}).encode())
    assert said == f"manifest of step {STEP} is invalid: size_bytes: must be an integer"
    said = _refusal(tmp_path, json.dumps({k: v for k, v in GOOD.items() if k != "sha256"}).encode())
    assert said == f"manifest of step {STEP} is invalid: sha256: field required"
    said = _refusal(tmp_path, b"{")
    assert said.startswith(f"manifest of step {STEP} is invalid: must be valid JSON (")
    said = _refusal(tmp_path, json.dumps(GOOD | {"object": "../x"}).encode())
    assert said.startswith(f"manifest of step {STEP} is invalid: object: ")

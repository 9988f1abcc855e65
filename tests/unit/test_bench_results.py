"""Benchmark results are published with the repository: they name files relative to it, never
by a path of the machine that ran them (``/home/...``, ``/tmp/...``)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"
MACHINE_PATH = re.compile(r"(?<![\w:/.])/(home|root|tmp|work|Users|mnt|opt|var|usr|srv)/")


def strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield str(key)
            yield from strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from strings(item)


@pytest.mark.parametrize("path", sorted(RESULTS.glob("*.json")), ids=lambda p: p.name)
def test_results_name_no_machine_path(path: Path) -> None:
    found = [s for s in strings(json.loads(path.read_text())) if MACHINE_PATH.search(s)]
    assert found == []

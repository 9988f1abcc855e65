"""How ``bench.mutation`` stores a module's result: a run limited to some functions
(``--only``) merges into the module's previous complete record instead of replacing it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.mutation import record, summarise

FULL: dict[str, Any] = {
    "module": "shared/m.py",
    "mutants": 4,
    "killed": 2,
    "survived": 2,
    "not_checked": 0,
    "survivors": ["m.x_f__mutmut_1", "m.x_g__mutmut_1"],
    "source": "abc",
    "date": "2026-01-01T00:00:00Z",
    "seconds": 100.0,
    "only": [],
}


def only_run(statuses: dict[str, str]) -> dict[str, Any]:
    return {
        **summarise(statuses),
        "module": "shared/m.py",
        "source": "def",
        "date": "2026-01-02T00:00:00Z",
        "seconds": 10.0,
        "only": ["m.x_f*"],
        "statuses": statuses,
    }


def stored(out: Path) -> dict[str, Any]:
    module: dict[str, Any] = json.loads(out.read_text())["modules"]["shared/m.py"]
    return module


def test_an_only_run_keeps_the_earlier_verdicts_of_what_it_did_not_check(tmp_path: Path) -> None:
    out = tmp_path / "mutation.json"
    record(dict(FULL), out)
    record(
        only_run(
            {
                "m.x_f__mutmut_1": "killed",  # a survivor killed now
                "m.x_f__mutmut_2": "survived",  # a new survivor
                "m.x_g__mutmut_1": "not_checked",  # earlier survivor, not looked at now
                "m.x_g__mutmut_2": "not_checked",  # earlier killed
            }
        ),
        out,
    )
    merged = stored(out)
    assert merged["survivors"] == ["m.x_f__mutmut_2", "m.x_g__mutmut_1"]
    assert (merged["mutants"], merged["killed"], merged["not_checked"]) == (4, 2, 0)
    assert merged["score"] == 0.5
    assert merged["checked_now"] == 2
    assert merged["merged_from"] == {"source": "abc", "date": FULL["date"], "seconds": 100.0}
    assert merged["source"] == "def" and "statuses" not in merged


def test_without_a_complete_earlier_record_an_only_run_is_stored_as_it_is(tmp_path: Path) -> None:
    out = tmp_path / "mutation.json"
    record(only_run({"m.x_f__mutmut_1": "killed", "m.x_g__mutmut_1": "not_checked"}), out)
    alone = stored(out)
    assert (alone["mutants"], alone["killed"], alone["not_checked"]) == (2, 1, 1)
    assert "merged_from" not in alone and "statuses" not in alone


def test_mutant_names_are_stored_as_mutmut_spells_them(tmp_path: Path) -> None:
    out = tmp_path / "mutation.json"
    record({**FULL, "survivors": ["m.xǁCǁf__mutmut_1"]}, out)
    assert "m.xǁCǁf__mutmut_1" in out.read_text(encoding="utf-8")  # not "\u01c1"
    assert stored(out)["survivors"] == ["m.xǁCǁf__mutmut_1"]

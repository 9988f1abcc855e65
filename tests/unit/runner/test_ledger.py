"""The allocation ledger: survives restarts, moves forward only, holds terminal events."""

from __future__ import annotations

import os
import time
from datetime import timedelta
from pathlib import Path

import pytest

from trainyard_platform.services.runner.domain import (
    AllocationState,
    IllegalTransition,
    JobIdentity,
)
from trainyard_platform.services.runner.ledger import Ledger, safe_file_name

JOB = JobIdentity("job-1", "alloc-1", "node-a", epoch=2, attempt=1)


def test_an_allocation_moves_from_launched_to_ending_to_finished(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path)
    assert ledger.get("alloc-1") is None
    ledger.launched(JOB, {"traceparent": "00-abc-def-01"})
    entry = ledger.get("alloc-1")
    assert entry is not None and entry.state is AllocationState.LAUNCHED
    assert entry.job == JOB

    ledger.ending(JOB, '{"the": "event"}', {"traceparent": "00-abc-def-01"})
    assert [e.allocation_id for e in ledger.unfinished()] == ["alloc-1"]
    ending = Ledger(tmp_path).get("alloc-1")  # another process reads the same
    assert ending is not None and ending.terminal_event == '{"the": "event"}'

    ledger.finished("alloc-1")
    ledger.finished("alloc-1")  # idempotent
    done = ledger.get("alloc-1")
    assert done is not None and done.state is AllocationState.FINISHED
    assert done.terminal_event == '{"the": "event"}'
    assert ledger.unfinished() == []


def test_the_start_is_kept_through_the_end_and_said_before_it(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path)
    ledger.launched(JOB, {}, '{"the": "start"}')
    launched = ledger.get("alloc-1")
    assert launched is not None and launched.said() == ['{"the": "start"}']
    ledger.ending(JOB, '{"the": "end"}', {})
    ledger.finished("alloc-1")
    done = Ledger(tmp_path).get("alloc-1")  # what a restarted runner finds
    assert done is not None and done.said() == ['{"the": "start"}', '{"the": "end"}']


def test_a_launch_is_recorded_once(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path)
    ledger.launched(JOB, {})
    with pytest.raises(ValueError, match="already"):
        ledger.launched(JOB, {})


def test_a_finished_allocation_cannot_end_again(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path)
    ledger.ending(JOB, "{}", {})  # never launched here (e.g. revoked first): straight to ending
    ledger.finished("alloc-1")
    with pytest.raises(IllegalTransition):
        ledger.ending(JOB, "{}", {})


def test_ids_from_events_never_escape_the_folder(tmp_path: Path) -> None:
    assert safe_file_name("3f2c-alloc_1.x") == "3f2c-alloc_1.x"
    for hostile in ("../../etc/passwd", "a/b", "..", "", "x" * 300, "a..b"):
        name = safe_file_name(hostile)
        assert name.startswith("sha256-") and "/" not in name
    ledger = Ledger(tmp_path / "ledger")
    ledger.launched(JobIdentity("j", "../../escape", "n", 1, 1), {})
    assert [p.parent for p in tmp_path.rglob("*.json")] == [tmp_path / "ledger"]
    assert ledger.get("../../escape") is not None


def test_old_finished_entries_are_pruned_and_unfinished_ones_kept(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path)
    ledger.launched(JOB, {})
    old = JobIdentity("job-2", "alloc-2", "node-a", 1, 1)
    ledger.ending(old, "{}", {})
    ledger.finished("alloc-2")
    long_ago = time.time() - 30 * 86400
    for path in tmp_path.glob("*.json"):
        os.utime(path, (long_ago, long_ago))
    assert ledger.prune(timedelta(days=14)) == 1
    assert ledger.get("alloc-2") is None and ledger.get("alloc-1") is not None


def test_unreadable_files_are_skipped(tmp_path: Path) -> None:
    (tmp_path / "garbage.json").write_text("not json")
    assert Ledger(tmp_path).entries() == []
    assert Ledger(tmp_path / "missing").entries() == []

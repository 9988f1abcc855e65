"""Which objects of the store the storage collector may delete: pure rules, no I/O.

The collector only ever looks at two kinds of keys:
- job checkpoints, ``jobs/<job>/checkpoints/<folder>/...`` (the runner's layout: one folder
  per checkpoint, its object and its manifest), and
- the registry's copies, ``registry/...``.
Everything else in the store (code bundles, logs, anything another service writes) is
never a candidate.

Contract of ``plan``:
- A checkpoint folder is kept when it is one of its job's ``keep`` newest recorded
  checkpoints (highest step, then the latest saved: a running job's latest committed
  checkpoint is always among them), or when ``References.protected`` names an object in it
  (a live model version's artifact or lineage parent, a checkpoint a running job resumed
  from, the latest of each attempt of a job running or failed: a late success can still
  replace a failure), or when it holds one of the runner's
  retention marks (``resumed-a<k>``, ``succeeded-a<k>``: docs/architecture.md, "Checkpoint
  retention") and its job is running in the registry's records (``References.running``):
  the checkpoint a newer attempt resumes from before its start is heard, and a success's
  artifact before its success is heard and registered. Once the job has ended (its
  success registered in the transaction that records the end) its marks count for
  nothing: every node can write a mark, so a forged one keeps its folder only as long as
  its job runs. A recorded folder beyond that is ``beyond retention``; a folder no
  ``checkpoint.saved`` recorded is ``unreferenced``.
- A registry key is kept when it is a live version's artifact (in ``protected``), else
  ``unreferenced`` (a copy whose registration rolled back, a deleted version's leftover).
- The answer maps each deletable key to its reason. Whether it is deleted *now* is the
  collector's grace rule (``collector``), not this module's.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

Reason = Literal["beyond retention", "unreferenced"]

_CHECKPOINT = re.compile(r"(jobs/[^/]+/checkpoints/[^/]+/).+")
_MARK = re.compile(r"(jobs/([^/]+)/checkpoints/[^/]+/)(?:resumed|succeeded)-a[0-9]{4,}")
"""A runner's retention mark (``services/runner/checkpoints.py``): its folder and its job."""
REGISTRY_PREFIX = "registry/"


@dataclass(frozen=True)
class Recorded:
    """A checkpoint ``checkpoint.saved`` recorded, by its object's key."""

    job_id: str
    key: str
    step: int
    saved_at: datetime


@dataclass(frozen=True)
class References:
    """What the database says is in use (see the module docstring)."""

    recorded: list[Recorded] = field(default_factory=list)
    protected: set[str] = field(default_factory=set)
    """Keys that must stay: live versions' artifacts (registry copies, or a job's checkpoint
    for versions registered before copies), their lineage's parent checkpoints, and the
    checkpoints running jobs resumed from, and each attempt's latest of a job running or
    failed (what a success of that attempt registers, heard or not, a late one replacing
    the failure included)."""
    running: set[str] = field(default_factory=set)
    """The jobs started and not ended in the registry's records: their folders' retention
    marks count."""


def checkpoint_folder(key: str) -> str | None:
    """``jobs/<job>/checkpoints/<folder>/`` of a checkpoint key, or None for other keys."""
    match = _CHECKPOINT.fullmatch(key)
    return match.group(1) if match else None


def plan(keys: Iterable[str], refs: References, keep: int) -> dict[str, Reason]:
    """Every deletable key of ``keys`` with its reason (module docstring)."""
    if keep < 1:
        raise ValueError(f"a job keeps at least its latest checkpoint, not {keep}")
    keys = list(keys)
    kept_folders, recorded_folders = _folders(refs, keep)
    kept_folders |= _marked_running(keys, refs.running)
    deletable: dict[str, Reason] = {}
    for key in keys:
        if key in refs.protected:
            continue
        if key.startswith(REGISTRY_PREFIX):
            deletable[key] = "unreferenced"
            continue
        folder = checkpoint_folder(key)
        if folder is None or folder in kept_folders:
            continue
        deletable[key] = "beyond retention" if folder in recorded_folders else "unreferenced"
    return deletable


def _folders(refs: References, keep: int) -> tuple[set[str], set[str]]:
    """(folders kept, folders recorded)."""
    by_job: dict[str, list[Recorded]] = {}
    recorded: set[str] = set()
    for checkpoint in refs.recorded:
        folder = checkpoint_folder(checkpoint.key)
        if folder is None:
            continue
        recorded.add(folder)
        by_job.setdefault(checkpoint.job_id, []).append(checkpoint)
    kept = {f for f in map(checkpoint_folder, refs.protected) if f is not None}
    for checkpoints in by_job.values():
        newest = sorted(checkpoints, key=lambda c: (c.step, c.saved_at), reverse=True)
        kept.update(f for f in (checkpoint_folder(c.key) for c in newest[:keep]) if f)
    return kept, recorded


def _marked_running(keys: Iterable[str], running: set[str]) -> set[str]:
    """The folders of ``keys`` holding a retention mark whose job is ``running``."""
    marks = (_MARK.fullmatch(key) for key in keys)
    return {m.group(1) for m in marks if m is not None and m.group(2) in running}


def deletion_order(keys: Iterable[str]) -> list[str]:
    """Manifests first: a checkpoint without its manifest is incomplete to every reader
    (the runner's rule), so a pass cut short never leaves one that looks complete."""
    return sorted(keys, key=lambda k: (not k.endswith("/manifest.json"), k))


def due(
    deletable: Mapping[str, Reason], first_seen: Mapping[str, datetime], cutoff: datetime
) -> list[str]:
    """The deletable keys first seen deletable at or before ``cutoff``."""
    return [k for k in deletable if k in first_seen and first_seen[k] <= cutoff]

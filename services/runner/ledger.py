"""The node's memory of its allocations, kept in files so it outlives the runner process.

One JSON file per allocation in ``<work_dir>/ledger/<node_id>/``, replaced atomically
(temp file, fsync, rename) on every state change:

- ``launched`` once the grant is accepted, before it is acknowledged and before the job
  starts: a redelivered ``allocation.granted`` is not run twice, and after a crash the next
  runner knows the job (or its launch) was lost;
- ``spawned`` once the job's process exists, with its process group and the ``job.started``
  said for it (a job whose process was never spawned was never said to have started);
- ``ending`` with the terminal event (and its trace headers) stored *before* it is published:
  if the publish never happens (NATS down, runner killed), the next runner publishes it (one
  that cannot be stored, a full disk, is published all the same: ``end_allocation``);
- ``finished`` once the terminal event was published.

A small, local outbox for the one event per allocation that must not be lost. Files of
finished allocations older than ``retention`` are pruned at start.

Blocking file I/O: call through ``asyncio.to_thread``.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from trainyard_platform.services.runner.domain import AllocationState, JobIdentity

_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


def safe_file_name(name: str) -> str:
    """``name`` itself when it is a harmless file name, else its sha256 (ids come from
    events: never join one onto a path unchecked)."""
    if _SAFE_NAME.match(name) and ".." not in name:
        return name
    return "sha256-" + hashlib.sha256(name.encode()).hexdigest()


class LedgerEntry(BaseModel):
    model_config = ConfigDict(frozen=True)

    allocation_id: str
    job_id: str
    node_id: str
    epoch: int
    attempt: int
    state: AllocationState
    started_event: str | None = None
    """The ``job.started`` envelope (CloudEvents JSON) the runner said once the job's process
    was spawned (None: it never was): after a broker loss, a runner restarted since (its
    journal gone) says it again before the end, so a view that had not heard the start does
    not wait for it in vain."""
    terminal_event: str | None = None
    """The terminal envelope (CloudEvents JSON) once the job ended."""
    trace_headers: dict[str, str] = Field(default_factory=dict)
    """``traceparent`` of the job's trace, so a republished event stays in it."""
    updated_at: datetime
    process_group: int | None = None
    """The job's process group once spawned, so a later runner can kill what is left."""
    process_started: int | None = None
    """Start time of the group's leader (clock ticks since boot): tells a recycled id."""

    def said(self) -> list[str]:
        """What this node said about the allocation that the ledger kept, in order: its
        ``job.started`` and its terminal event, where there are."""
        return [e for e in (self.started_event, self.terminal_event) if e is not None]

    @property
    def job(self) -> JobIdentity:
        return JobIdentity(self.job_id, self.allocation_id, self.node_id, self.epoch, self.attempt)


class Ledger:
    """Allocation states of one node (see the module docstring)."""

    def __init__(self, folder: Path) -> None:
        self._folder = folder

    def _path(self, allocation_id: str) -> Path:
        return self._folder / f"{safe_file_name(allocation_id)}.json"

    def get(self, allocation_id: str) -> LedgerEntry | None:
        try:
            return LedgerEntry.model_validate_json(self._path(allocation_id).read_bytes())
        except FileNotFoundError:
            return None

    def launched(
        self, job: JobIdentity, trace_headers: dict[str, str], started_event: str | None = None
    ) -> LedgerEntry:
        if self.get(job.allocation_id) is not None:
            raise ValueError(f"allocation {job.allocation_id} is in the ledger already")
        entry = LedgerEntry(
            allocation_id=job.allocation_id,
            job_id=job.job_id,
            node_id=job.node_id,
            epoch=job.epoch,
            attempt=job.attempt,
            state=AllocationState.LAUNCHED,
            started_event=started_event,
            trace_headers=trace_headers,
            updated_at=datetime.now(UTC),
        )
        self._write(entry)
        return entry

    def spawned(
        self,
        allocation_id: str,
        process_group: int | None,
        started: int | None,
        started_event: str | None = None,
    ) -> None:
        """Record the launched job's process group (before anything else can go wrong) and
        the ``job.started`` said for it."""
        current = self.get(allocation_id)
        if current is None:
            raise KeyError(f"allocation {allocation_id} is not in the ledger")
        self._write(
            current.model_copy(
                update={
                    "process_group": process_group,
                    "process_started": started,
                    "started_event": started_event or current.started_event,
                    "updated_at": datetime.now(UTC),
                }
            )
        )

    def ending(
        self, job: JobIdentity, terminal_event: str, trace_headers: dict[str, str]
    ) -> LedgerEntry:
        """Store the terminal event; an allocation unknown so far (it never launched) is
        recorded straight into ``ending``."""
        current = self.get(job.allocation_id)
        if current is not None:
            current.state.check(AllocationState.ENDING)
        entry = LedgerEntry(
            allocation_id=job.allocation_id,
            job_id=job.job_id,
            node_id=job.node_id,
            epoch=job.epoch,
            attempt=job.attempt,
            state=AllocationState.ENDING,
            started_event=current.started_event if current is not None else None,
            terminal_event=terminal_event,
            trace_headers=trace_headers,
            updated_at=datetime.now(UTC),
        )
        self._write(entry)
        return entry

    def finished(self, allocation_id: str) -> None:
        current = self.get(allocation_id)
        if current is None:
            raise KeyError(f"allocation {allocation_id} is not in the ledger")
        if current.state is AllocationState.FINISHED:
            return
        current.state.check(AllocationState.FINISHED)
        self._write(
            current.model_copy(
                update={"state": AllocationState.FINISHED, "updated_at": datetime.now(UTC)}
            )
        )

    def entries(self) -> list[LedgerEntry]:
        found = []
        if not self._folder.is_dir():
            return []
        for path in sorted(self._folder.glob("*.json")):
            try:
                found.append(LedgerEntry.model_validate_json(path.read_bytes()))
            except (OSError, ValidationError):
                continue  # unreadable leftovers are not ours to interpret
        return found

    def unfinished(self) -> list[LedgerEntry]:
        return [e for e in self.entries() if not e.state.is_terminal]

    def prune(self, retention: timedelta) -> int:
        """Delete finished entries older than ``retention``; returns how many."""
        cutoff = time.time() - retention.total_seconds()
        removed = 0
        for entry in self.entries():
            path = self._path(entry.allocation_id)
            if entry.state.is_terminal and path.stat().st_mtime < cutoff:
                path.unlink(missing_ok=True)
                removed += 1
        return removed

    def _write(self, entry: LedgerEntry) -> None:
        # Private to the runner: jobs run as other users and must not read it.
        self._folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        path = self._path(entry.allocation_id)
        fd, tmp = tempfile.mkstemp(dir=self._folder, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(entry.model_dump_json().encode())
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

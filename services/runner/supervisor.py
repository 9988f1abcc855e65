"""Supervision of one running allocation, from spawn to its one terminal event.

While the job runs: control lines become ``job.progress`` (throttled, the newest kept) and
``checkpoint.saved``; output lines go to the runner's log (prefixed with the job id), to
``<work_dir>/jobs/<job>/<allocation>.log`` and to a tail kept for ``job.failed``. A stop
request (revocation, runner shutdown, max runtime) sends SIGTERM and, after its grace,
SIGKILL to the job's process group; the earliest deadline wins, the first reason is kept.

When the job has exited and its pipes are drained: the held-back progress is sent, the log
is uploaded to ``logs/<job>/<allocation>.log`` in the object store, the outcome is decided
(``domain.decide_outcome``) and the terminal event is stored in the ledger, then published.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO

from services.runner import domain
from services.runner.domain import JobIdentity, JobResults, LogTail, ProgressThrottle, StopRequest
from services.runner.ledger import Ledger
from services.runner.process import JobProcess
from services.runner.publishing import JobEvents
from shared.control import ENV_CONTROL_FD, CheckpointMessage, MetricsMessage, parse_control_line
from shared.events import Envelope, Payload
from shared.events.payloads import CheckpointRef
from shared.storage import ObjectStore

log = logging.getLogger(__name__)
job_output_log = logging.getLogger("services.runner.job")

_PIPE_DRAIN_S = 10.0
"""After the job exited (and its group was killed), how long its pipes may take to close."""


class JobRun:
    """One allocation being run on this node."""

    def __init__(
        self,
        job: JobIdentity,
        *,
        events: JobEvents,
        ledger: Ledger,
        store: ObjectStore,
        log_path: Path,
        trace_headers: dict[str, str],
        progress_interval_s: float,
        log_tail_lines: int,
    ) -> None:
        self.job = job
        self.started_at = datetime.now(UTC)
        self.stop_request: StopRequest | None = None
        self._events = events
        self._ledger = ledger
        self._store = store
        self._log_path = log_path
        self._trace_headers = trace_headers
        self._throttle: ProgressThrottle[MetricsMessage] = ProgressThrottle(progress_interval_s)
        self._flush_timer: asyncio.TimerHandle | None = None
        self._kill_timer: asyncio.TimerHandle | None = None
        self._kill_at: float | None = None
        self._tail = LogTail(log_tail_lines)
        self._last_metrics: dict[str, float] = {}
        self._last_checkpoint: CheckpointRef | None = None
        self._process: JobProcess | None = None
        self._log_file: BinaryIO | None = None
        self._ended = False

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    async def start(self, argv: Sequence[str], *, cwd: Path, env: Mapping[str, str]) -> None:
        """Spawn the job (raises, e.g. ``OSError``, when it cannot be started)."""
        self._log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_file = self._log_path.open("ab")
        try:
            self._process = await JobProcess.start(
                argv, cwd=cwd, env=env, control_fd_var=ENV_CONTROL_FD
            )
        except BaseException:
            self._log_file.close()
            raise
        log.info(
            "job %s allocation %s started: pid %d, %s",
            self.job.job_id,
            self.job.allocation_id,
            self._process.pid,
            " ".join(argv),
        )

    def request_stop(self, stop: StopRequest, grace_s: float) -> None:
        """SIGTERM now (first request only), SIGKILL at the earliest deadline asked for."""
        process = self._process
        if process is None or process.returncode is not None or self._ended:
            return
        if self.stop_request is None:
            self.stop_request = stop
            log.info(
                "stopping job %s allocation %s (%s): SIGTERM, SIGKILL in %g s",
                self.job.job_id,
                self.job.allocation_id,
                stop.reason,
                grace_s,
            )
            process.terminate()
        loop = asyncio.get_running_loop()
        kill_at = loop.time() + grace_s
        if self._kill_at is None or kill_at < self._kill_at:
            if self._kill_timer is not None:
                self._kill_timer.cancel()
            self._kill_at = kill_at
            self._kill_timer = loop.call_at(kill_at, self._kill)

    def _kill(self) -> None:
        if self._process is not None and self._process.returncode is None:
            log.warning(
                "job %s allocation %s did not stop within its grace: SIGKILL",
                self.job.job_id,
                self.job.allocation_id,
            )
            self._process.kill_group()

    async def supervise(self, max_runtime_s: int, kill_grace_s: float) -> domain.Outcome:
        """Run until the job has exited and its terminal event is published."""
        process = self._process
        assert process is not None, "start() first"
        loop = asyncio.get_running_loop()
        readers = [
            asyncio.create_task(self._read_control(process), name=f"control {self.job.job_id}"),
            asyncio.create_task(self._read_output(process), name=f"output {self.job.job_id}"),
        ]
        deadline = loop.call_later(
            max_runtime_s,
            lambda: self.request_stop(domain.max_runtime_stop(max_runtime_s), kill_grace_s),
        )
        try:
            exit_code = await process.wait()
        finally:
            deadline.cancel()
            if self._kill_timer is not None:
                self._kill_timer.cancel()
            # Whatever the job left running in its group goes with it (and closes the pipes).
            process.kill_group()
            done, stuck = await asyncio.wait(readers, timeout=_PIPE_DRAIN_S)
            for task in stuck:
                task.cancel()
            for task in done:
                if not task.cancelled() and task.exception() is not None:
                    log.error(
                        "job %s: reading its %s failed",
                        self.job.job_id,
                        task.get_name(),
                        exc_info=task.exception(),
                    )
            process.close()
            if self._log_file is not None:
                self._log_file.close()
        outcome = domain.decide_outcome(exit_code, self.stop_request)
        log.info(
            "job %s allocation %s %s: %s",
            self.job.job_id,
            self.job.allocation_id,
            outcome.kind,
            outcome.reason,
        )
        await self._end(outcome)
        return outcome

    async def _end(self, outcome: domain.Outcome) -> None:
        self._ended = True
        if self._flush_timer is not None:
            self._flush_timer.cancel()
        held = self._throttle.flush()
        if held is not None:
            self._emit_progress(held)
        await self._upload_log()
        results = JobResults(self._last_metrics, self._last_checkpoint, self._tail.text())
        payload = domain.terminal_event(self.job, outcome, results, datetime.now(UTC))
        await end_allocation(self.job, payload, self._events, self._ledger, self._trace_headers)

    async def _upload_log(self) -> None:
        key = f"logs/{self.job.job_id}/{self.job.allocation_id}.log"
        try:
            await asyncio.to_thread(self._store.put_file, key, self._log_path)
        except Exception as exc:  # the log is a convenience; the outcome must still go out
            log.warning("could not upload the log of job %s to %s: %s", self.job.job_id, key, exc)

    # --- the job's output ---------------------------------------------------------------

    async def _read_output(self, process: JobProcess) -> None:
        async for raw in process.output_lines():
            if self._log_file is not None:
                # Small appends to a local file; flushed per line so `tail -f` follows along.
                self._log_file.write(raw)
                self._log_file.flush()
            line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
            self._tail.add(line)
            job_output_log.info("[%s] %s", self.job.job_id, line)

    async def _read_control(self, process: JobProcess) -> None:
        async for raw in process.control_lines():
            try:
                message = parse_control_line(raw)
            except ValueError as exc:
                log.warning("job %s sent a bad control line: %s", self.job.job_id, exc)
                continue
            if isinstance(message, MetricsMessage):
                self._on_metrics(message)
            else:
                self._on_checkpoint(message)

    def _on_metrics(self, message: MetricsMessage) -> None:
        dropped = sorted(set(message.metrics) - set(domain.publishable_metrics(message.metrics)))
        if dropped:
            log.warning(
                "job %s reported non-finite %s at step %d (not publishable: left out of events)",
                self.job.job_id,
                ", ".join(f"{k}={message.metrics[k]}" for k in dropped),
                message.step,
            )
        # The newest value of every metric the job reported, for job.succeeded.
        self._last_metrics.update(message.metrics)
        now = time.monotonic()
        ready = self._throttle.offer(message, now)
        if ready is not None:
            self._emit_progress(ready)
            return
        due = self._throttle.next_due()
        if self._flush_timer is None and due is not None:
            self._flush_timer = asyncio.get_running_loop().call_later(
                max(0.0, due - now), self._flush_progress
            )

    def _flush_progress(self) -> None:
        self._flush_timer = None
        item = self._throttle.due(time.monotonic())
        if item is not None:
            self._emit_progress(item)

    def _emit_progress(self, message: MetricsMessage) -> None:
        self._events.emit(
            _wrap(
                domain.progress_event(self.job, message),
                self.job,
                domain.progress_event_id(self.job, message),
            )
        )

    def _on_checkpoint(self, message: CheckpointMessage) -> None:
        self._last_checkpoint = message.checkpoint
        self._events.emit(
            _wrap(
                domain.checkpoint_event(self.job, message, datetime.now(UTC)),
                self.job,
                domain.checkpoint_event_id(self.job, message),
            )
        )


def _wrap(payload: Payload, job: JobIdentity, event_id: str) -> Envelope[Payload]:
    return Envelope.wrap(payload, source=domain.SOURCE, subject=job.job_id, event_id=event_id)


async def end_allocation(
    job: JobIdentity,
    payload: Payload,
    events: JobEvents,
    ledger: Ledger,
    trace_headers: dict[str, str],
) -> None:
    """Store the terminal event in the ledger, publish it after the job's earlier events,
    then mark the allocation finished."""
    envelope = _wrap(payload, job, domain.event_id(job.allocation_id, "end"))
    await asyncio.to_thread(ledger.ending, job, envelope.to_json().decode(), trace_headers)
    events.emit(envelope)
    await events.close()
    await asyncio.to_thread(ledger.finished, job.allocation_id)

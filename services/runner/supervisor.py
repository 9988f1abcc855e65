"""Supervision of one running allocation, from spawn to its one terminal event.

While the job runs: lines on its control socket become ``job.metrics`` (every point within
the job's bound, ``metric_limits``, in batches: ``domain.MetricBatcher``; what the bound
drops is counted in notices in the job's log), ``job.progress`` (throttled, the newest kept) and, for checkpoints it staged, an upload to the job's own prefix
(``checkpoints.commit_staged``) followed by ``checkpoint.saved``. A job that resumed has,
beside it, the checkpoints its earlier attempts left older than the one it resumed from
pruned (``checkpoints.prune_earlier_attempts``; the end waits for it). Its output goes to
``<work_dir>/jobs/<job>/<allocation>.log``, is shipped to the object store in chunks about
every second (``logstream.LogShipper``) and feeds a tail kept for ``job.failed``; it never
goes into the runner's own log. A job of several processes (under torchrun) has each rank's
output read from a pipe of its own (``process.RankPipes``), each line whole, ending with a
newline and prefixed with its rank (``logstream.rank_lines``). Output is handled a chunk at
a time (as read for a job of one process, whose progress bars are not held back; in blocks
of whole lines, ``process.line_blocks``, for a rank's), never a line at a time: what a
job's output costs the runner is bounded by its bytes, even past ``max_output_bytes``. A
stop request (revocation, runner shutdown, max runtime: what is left of the job's
``max_runtime_seconds`` since its grant, ``deadline``) sends SIGTERM and, after its grace, SIGKILL to
the job's process group; the earliest deadline wins, the first reason is kept. So does a
job over its disk limit: its sandbox is measured every few seconds (``disk_watch``), and it
fails as ``user_error`` naming the limit.

When the job has exited: its group and every process of its uid are killed (without a
uid of its own: what it moved out of its group, re-parented to the runner, ``orphans``) and its
uid's files in the folders every user may write to, its System V IPC objects, its
POSIX message queues and its keyrings' keys (``sandbox.remove_leftovers_of``) are removed, its control connections are read to the end
and every checkpoint it staged is uploaded, the held-back metric points and progress are sent, the log's last
chunk is shipped (and the local files of what the store took removed), old checkpoints
beyond the retention are deleted, the outcome is decided
(``domain.decide_outcome``) and the terminal event is stored in the ledger, then published.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import shutil
import time
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime
from pathlib import Path

from trainyard_platform.services.runner import (
    background,
    checkpoints,
    disk_watch,
    domain,
    orphans,
    usage_metrics,
)
from trainyard_platform.services.runner.deadline import AttemptDeadline
from trainyard_platform.services.runner.domain import (
    JobIdentity,
    JobResults,
    LogTail,
    ProgressThrottle,
    StopRequest,
)
from trainyard_platform.services.runner.gpus import GpuUsage
from trainyard_platform.services.runner.ledger import Ledger
from trainyard_platform.services.runner.logstream import (
    CappedFile,
    LogShipper,
    last_lines,
    rank_lines,
    remove_shipped,
    stream_prefix,
)
from trainyard_platform.services.runner.metric_limits import MetricLimits
from trainyard_platform.services.runner.process import (
    JobProcess,
    LineCutter,
    RankPipes,
    read_lines,
)
from trainyard_platform.services.runner.publishing import JobEvents
from trainyard_platform.services.runner.sandbox import (
    Sandbox,
    kill_leftovers,
    remove_leftovers_of,
)
from trainyard_platform.shared.control import (
    MAX_CONTROL_LINE_BYTES,
    CheckpointMessage,
    MetricsMessage,
    parse_control_line,
    unix_address,
)
from trainyard_platform.shared.events import Envelope, Payload
from trainyard_platform.shared.events.payloads import (
    MAX_METRIC_POINTS,
    CheckpointRef,
    MetricPoint,
)
from trainyard_platform.shared.logs import error_text
from trainyard_platform.shared.storage import ObjectStore

log = logging.getLogger(__name__)

_PIPE_DRAIN_S = 10.0
"""After the job exited (and its group was killed), how long its output may take to close."""
WARNINGS_PER_KIND = 5
"""Warnings about what one job sent (a bad control line, a refused checkpoint, ...) logged
per kind; the rest are counted and their number logged when the job ends: the job decides
how often it sends them, and the runner's log is the operator's."""
MAX_CONTROL_CONNECTIONS = 64
"""Control connections one job may have open at once. The SDK opens one per process that
reports (a rank); each costs the runner a descriptor and a line buffer of up to
``MAX_CONTROL_LINE_BYTES``, so a job opening them without end would exhaust the runner's
descriptors (and memory) for every job on the node. One more is closed at once."""

MAX_WAITING_CHECKPOINTS = 64
"""Checkpoints announced during an upload that the runner remembers, to remove the staged
folders of all but the newest when the upload ends. The job decides how many it announces
(one control line each, the same step again too): past this many the oldest is forgotten,
so they cannot fill the runner's memory."""


class JobRun:
    """One allocation being run on this node."""

    def __init__(
        self,
        job: JobIdentity,
        *,
        events: JobEvents,
        ledger: Ledger,
        store: ObjectStore,
        checkpoint_store: ObjectStore,
        sandbox: Sandbox,
        log_path: Path,
        trace_headers: dict[str, str],
        progress_interval_s: float,
        log_tail_lines: int,
        metrics_batch_points: int = MAX_METRIC_POINTS,
        metrics_batch_interval_s: float = 1.0,
        log_ship_interval_s: float = 1.0,
        checkpoints_keep: int = 3,
        resumed_from: CheckpointRef | None = None,
        gpus: int = 1,
        usage: GpuUsage | None = None,
        gpu_indices: Sequence[int] = (),
        usage_interval_s: float = 5.0,
        max_output_bytes: int = 2 * 1024**3,
        max_checkpoint_bytes: int = checkpoints.MAX_CHECKPOINT_BYTES,
        checkpoint_upload_wait_s: float = 900.0,
        metrics_points_per_second: float = 1000.0,
        metrics_max_keys: int = 1000,
        max_processes: int | None = None,
        disk_limit_bytes: int | None = None,
        disk_check_interval_s: float = 5.0,
    ) -> None:
        self.job = job
        self.started_at = datetime.now(UTC)
        self.stop_request: StopRequest | None = None
        self._events = events
        self._ledger = ledger
        self._store = store
        self._checkpoint_store = checkpoint_store
        self._sandbox = sandbox
        self._gpus = gpus
        self._usage = usage
        self._gpu_indices = list(gpu_indices)
        self._usage_interval_s = usage_interval_s
        self._utilization = domain.RunningMean()
        """The GPU samples' mean: one every ``usage_interval_s`` for as long as the job runs,
        so none is kept one by one."""
        self._last_step = 0
        self._checkpoints_keep = checkpoints_keep
        self._resumed_from = resumed_from
        self._log_path = log_path
        self._shipper = LogShipper(
            store,
            stream_prefix(job.job_id, job.attempt, job.node_id),
            log_path,
            log_ship_interval_s,
        )
        self._max_output_bytes = max_output_bytes
        self._max_checkpoint_bytes = max_checkpoint_bytes
        self._upload_wait_s = checkpoint_upload_wait_s
        self._committing: int | None = None
        """The step being uploaded, until it is committed or given up for a newer one."""
        self._upload_error = ""
        """Why the latest upload failed since the last one that worked ("": none failed),
        for the report of a checkpoint left unuploaded and whose failure that is."""
        self._lost_checkpoint: domain.LostCheckpoint | None = None
        """A checkpoint the job staged that its end could not wait to upload."""
        self._upload: tuple[checkpoints.Upload, asyncio.Future[CheckpointRef]] | None = None
        """The upload of ``_committing`` under way in its thread, and its result."""
        self._refused_checkpoint: domain.RefusedCheckpoint | None = None
        """The newest checkpoint the job staged that the runner refused."""
        self._max_processes = max_processes
        self._disk_limit_bytes = disk_limit_bytes
        self._disk_check_interval_s = disk_check_interval_s
        self._metrics_path = log_path.with_suffix(".metrics.jsonl")
        self._metrics_file: CappedFile | None = None
        self._metrics_shipper = LogShipper(
            store,
            stream_prefix(job.job_id, job.attempt, job.node_id, "metrics"),
            self._metrics_path,
            log_ship_interval_s,
            suffix=".jsonl",
        )
        self._sampler: asyncio.Task[None] | None = None
        self._pruner: asyncio.Task[None] | None = None
        """The prune of earlier attempts' checkpoints this attempt started with."""
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._refused_connections = 0
        self._warnings: dict[str, int] = {}
        self._staged_steps: set[int] = set()
        """Steps announced and not yet taken by the uploader (``MAX_WAITING_CHECKPOINTS``)."""
        self._staged = asyncio.Event()
        self._uploader: asyncio.Task[None] | None = None
        self._closing_control = False
        self._trace_headers = trace_headers
        self._throttle: ProgressThrottle[MetricsMessage] = ProgressThrottle(progress_interval_s)
        self._flush_timer: asyncio.TimerHandle | None = None
        self._batcher = domain.MetricBatcher(metrics_batch_points, metrics_batch_interval_s)
        self._limits = MetricLimits(metrics_points_per_second, metrics_max_keys)
        self._batch_timer: asyncio.TimerHandle | None = None
        self._kill_timer: asyncio.TimerHandle | None = None
        self._kill_at: float | None = None
        self._tail = LogTail(log_tail_lines)
        self._tail_lines = log_tail_lines
        self._last_metrics: dict[str, float] = {}
        self._last_checkpoint: CheckpointRef | None = resumed_from
        self._saved: list[CheckpointRef] = []
        """The checkpoints this attempt committed: retention chooses among these and the
        one it resumed from, never among what the store lists (``apply_retention``)."""
        self._data_waits = domain.RunningMean()
        """The job's ``data_wait_fraction`` reports' mean: the job decides how many there
        are, so none is kept one by one."""
        self._process: JobProcess | None = None
        self._log_file: CappedFile | None = None
        self._ranks: tuple[int, ...] = ()
        """The global ranks of the job's processes here, by local rank; empty for one."""
        self._rank_pipes: RankPipes | None = None
        self._ended = False
        self._torchrun = False
        """Whether the job runs under torchrun (its worker's exit code is the one judged)."""

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def gpu_indices(self) -> list[int]:
        return list(self._gpu_indices)

    async def exited(self) -> None:
        """Return once the job's process has exited (its events may still be on their way)."""
        if self._process is not None:
            await self._process.wait()

    async def start(
        self, argv: Sequence[str], *, env: dict[str, str], ranks: Sequence[int] = ()
    ) -> None:
        """Open the control socket and spawn the job in its sandbox (raises, e.g.
        ``OSError``, when it cannot be started); a job of several processes (``ranks``, the
        global rank of each local rank: ``launch.ranks``) has their output pipes opened
        first, in the sandbox's ``rank_output`` its ``argv`` points them to."""
        self._log_path.parent.mkdir(parents=True, exist_ok=True)
        limit = self._max_output_bytes
        self._log_file = CappedFile(
            self._log_path,
            limit,
            f"\n[trainyard: this attempt's output passed {limit} bytes; the rest is not kept]\n".encode(),
        )
        self._metrics_file = CappedFile(self._metrics_path, limit)  # JSON lines: no notice
        self._torchrun = domain.TORCHRUN_MODULE in argv
        self._ranks = tuple(ranks)
        try:
            if self._ranks:
                self._rank_pipes = await RankPipes.open(
                    self._sandbox.rank_output, len(self._ranks), self._sandbox.user
                )
            self._server = await self._open_control_socket()
            if not self._sandbox.user.isolated:
                # What the job moves out of its group is re-parented here, not to init, to
                # be killed at its end (``orphans``).
                orphans.become_subreaper()
            self._process = await JobProcess.start(
                argv,
                cwd=self._sandbox.code,
                env=env,
                user=self._sandbox.user,
                max_processes=self._max_processes,
                cgroup=self._sandbox.cgroup,
                own_network=self._sandbox.own_network,
            )
        except BaseException:
            self._log_file.close()
            self._metrics_file.close()
            if self._server is not None:
                self._server.close()
            if self._rank_pipes is not None:
                self._rank_pipes.close()
            raise
        self._shipper.start()
        self._metrics_shipper.start()
        if self._resumed_from is not None:
            # Beside the job, not before it: storage freed a little later is better than a
            # start held up by the store.
            self._pruner = background.start(
                self._prune_earlier_attempts(self._resumed_from),
                f"the checkpoint prune of allocation {self.job.allocation_id}",
                self.job.job_id,
            )
        if self._usage is not None and self._gpu_indices:
            self._sampler = background.start(
                self._sample_usage(),
                f"the GPU sampling of allocation {self.job.allocation_id}",
                self.job.job_id,
            )
        log.info(
            "job %s allocation %s started: pid %d, uid %s, %s",
            self.job.job_id,
            self.job.allocation_id,
            self._process.pid,
            self._sandbox.user.uid if self._sandbox.user.isolated else "(runner's)",
            " ".join(argv),
        )

    async def _open_control_socket(self) -> asyncio.Server:
        """Listen on the sandbox's control socket, which only the job's uid may connect to
        from the moment it exists: it is bound in a folder of the runner's alone (a socket
        gets its mode from the umask, and other jobs pass through the sandbox's root), made
        0600 and the job's, and only then moved into place."""
        final = self._sandbox.control_socket
        private = final.parent / ".control"
        private.mkdir(mode=0o700)
        try:
            bound = private / final.name
            server = await asyncio.start_unix_server(
                self._on_connection,
                path=unix_address(str(bound)),
                limit=MAX_CONTROL_LINE_BYTES + 1,
            )
            try:
                os.chmod(bound, 0o600)
                user = self._sandbox.user
                if user.uid is not None and user.gid is not None:
                    os.chown(bound, user.uid, user.gid)
                os.rename(bound, final)
            except BaseException:
                server.close()
                raise
        finally:
            with contextlib.suppress(OSError):
                bound.unlink()
            private.rmdir()
        return server

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

    def abandon(self, reason: str) -> None:
        """Kill the job at once (its group and its uid's processes), for a failure of the
        runner's own that keeps it from supervising the job (``reason``): whatever stop was
        asked before, it ends failed as ``platform_error`` (``domain.decide_outcome``)."""
        self.stop_request = StopRequest("platform", reason)
        if self._process is not None and self._process.returncode is None:
            self._kill_everything(self._process)

    def _kill(self) -> None:
        if self._process is not None and self._process.returncode is None:
            log.warning(
                "job %s allocation %s did not stop within its grace: SIGKILL",
                self.job.job_id,
                self.job.allocation_id,
            )
            self._kill_everything(self._process)

    def _kill_everything(self, process: JobProcess) -> None:
        """SIGKILL the job's process group and, when the job runs as a user of its own,
        every process of that user: torchrun starts its workers in sessions of their own,
        out of the group's reach, and a job may double-fork; the uid reaches them all."""
        process.kill_group()
        uid = self._sandbox.user.uid
        if uid is not None:
            kill_leftovers(range(uid, uid + 1), [])

    async def _kill_orphans(self) -> None:
        """Without a uid of its own, what the job started outside its group (re-parented
        to the runner, ``orphans``) is killed and reaped."""
        try:
            killed = await asyncio.to_thread(orphans.kill_orphans, self.job.allocation_id)
        except OSError:
            log.exception("job %s: its leftover processes could not be killed", self.job.job_id)
            return
        if killed:
            log.info(
                "job %s allocation %s: killed %d processes it left outside its group",
                self.job.job_id,
                self.job.allocation_id,
                killed,
            )

    async def supervise(self, deadline: AttemptDeadline, kill_grace_s: float) -> domain.Outcome:
        """Run until the job has exited and its terminal event is published. The job is
        stopped for its max runtime once ``deadline`` passes: what is left of its
        ``max_runtime_seconds`` since its grant, not the whole of it."""
        process = self._process
        assert process is not None, "start() first"
        loop = asyncio.get_running_loop()
        # Several processes: each line of the launcher's a line of its own too.
        readers = [
            asyncio.create_task(
                self._read_output(self._output_of(process)), name=f"output {self.job.job_id}"
            ),
        ]
        pipes = self._rank_pipes
        if pipes is not None:
            readers += [
                asyncio.create_task(
                    self._read_output(pipes.lines(local_rank), rank),
                    name=f"output of rank {rank} {self.job.job_id}",
                )
                for local_rank, rank in enumerate(self._ranks)
            ]
        max_runtime = domain.max_runtime_stop(deadline.max_runtime_s)
        timer = loop.call_later(
            deadline.remaining(), lambda: self.request_stop(max_runtime, kill_grace_s)
        )
        disk_watch_task = (
            asyncio.create_task(self._watch_disk(self._disk_limit_bytes, kill_grace_s))
            if self._disk_limit_bytes
            else None
        )
        try:
            exit_code = await process.wait()
        finally:
            timer.cancel()
            if disk_watch_task is not None:
                disk_watch_task.cancel()
            if self._kill_timer is not None:
                self._kill_timer.cancel()
            # Whatever the job left running goes with it (and closes the pipes), and so do
            # its files where every user may write (the next job of its uid may be another
            # team's).
            self._kill_everything(process)
            if self._sandbox.user.uid is not None:
                uid = self._sandbox.user.uid
                await asyncio.to_thread(remove_leftovers_of, range(uid, uid + 1))
            else:
                await self._kill_orphans()
            if pipes is not None:
                pipes.release()  # each rank's pipe ends once the job's processes are gone
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
            if pipes is not None:
                pipes.close()
            await self._close_control()
            if self._log_file is not None:
                # The control connections are read to the end: the last word on dropped
                # metrics goes after the job's last output.
                self._say_dropped_metrics(final=True)
                self._log_file.close()
            if self._metrics_file is not None:
                self._metrics_file.close()
            if self._limits.points_dropped_total or self._limits.values_dropped_total:
                log.warning(
                    "job %s: %d metric points left out of its series for their pace, %d "
                    "values dropped for their keys",
                    self.job.job_id,
                    self._limits.points_dropped_total,
                    self._limits.values_dropped_total,
                )
            for kind, count in self._warnings.items():
                if count > WARNINGS_PER_KIND:
                    log.warning(
                        "job %s: %d more warnings (%s) were not logged",
                        self.job.job_id,
                        count - WARNINGS_PER_KIND,
                        kind,
                    )
            for what, capped in (("output", self._log_file), ("metric series", self._metrics_file)):
                if capped is not None and capped.full:
                    log.warning(
                        "job %s: its %s passed %d bytes; %d more bytes were not kept",
                        self.job.job_id,
                        what,
                        self._max_output_bytes,
                        capped.dropped,
                    )
        cgroup = self._sandbox.cgroup
        outcome = domain.decide_outcome(
            exit_code,
            self.stop_request,
            self._tail.text(),
            torchrun=self._torchrun,
            memory=cgroup.memory_evidence() if cgroup is not None else None,
        )
        outcome = domain.with_lost_checkpoint(outcome, self._lost_checkpoint, self._last_checkpoint)
        if self._lost_checkpoint is None:
            # A lost checkpoint was staged after any refused one: it is the final one then.
            outcome = domain.with_refused_checkpoint(
                outcome, self._refused_checkpoint, self._last_checkpoint
            )
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
        if self._batch_timer is not None:
            self._batch_timer.cancel()
        batch = self._batcher.flush()
        if batch is not None:
            self._emit_metrics(*batch)
        held = self._throttle.flush()
        if held is not None:
            self._emit_progress(held)
        if self._sampler is not None:
            self._sampler.cancel()
        shipped = [
            path
            for path, shipper in (
                (self._log_path, self._shipper),
                (self._metrics_path, self._metrics_shipper),
            )
            if await shipper.close()
        ]
        # In the store now: the node's disk does not keep every attempt's output.
        await asyncio.to_thread(remove_shipped, shipped)
        if self._pruner is not None:
            await self._pruner
        await self._retain_checkpoints(succeeded=outcome.kind == "succeeded")
        metrics = domain.end_metrics(
            self._last_metrics,
            self._utilization,
            self._data_waits,
            (datetime.now(UTC) - self.started_at).total_seconds(),
            self._gpus,
        )
        results = JobResults(metrics, self._last_checkpoint, self._tail.text())
        payload = domain.terminal_event(self.job, outcome, results, datetime.now(UTC))
        await end_allocation(self.job, payload, self._events, self._ledger, self._trace_headers)

    async def _watch_disk(self, limit_bytes: int, kill_grace_s: float) -> None:
        """Measure the job's sandbox every ``disk_check_interval_s`` and stop the job, as for
        its max runtime, once it is over ``limit_bytes`` (``disk_watch``). A measurement
        that fails is logged and tried again: the watch never ends the supervision."""
        failures = 0
        while True:
            await asyncio.sleep(self._disk_check_interval_s)
            try:
                use = await asyncio.to_thread(disk_watch.measure, [self._sandbox.root], limit_bytes)
            except Exception as exc:
                failures += 1
                if failures == 1:
                    log.warning("job %s: its disk use was not measured: %s", self.job.job_id, exc)
                continue
            why = disk_watch.over_limit(use, limit_bytes)
            if why is not None:
                log.warning(
                    "job %s allocation %s: %s", self.job.job_id, self.job.allocation_id, why
                )
                self.request_stop(StopRequest("over_limit", why), kill_grace_s)
                return

    async def _prune_earlier_attempts(self, resumed: CheckpointRef) -> None:
        """Delete the checkpoints of the job's earlier attempts this one no longer needs
        (``checkpoints.prune_earlier_attempts``: older than ``resumed``, beyond the job's
        ``checkpoints_keep``); a failure is logged, and the next attempt or the registry's
        collector frees them."""
        try:
            deleted = await asyncio.to_thread(
                checkpoints.prune_earlier_attempts,
                self._checkpoint_store,
                self.job.attempt,
                resumed,
                self._checkpoints_keep,
            )
        except Exception as exc:
            log.warning(
                "checkpoint prune of job %s's earlier attempts failed: %s", self.job.job_id, exc
            )
            return
        if deleted:
            log.info("job %s: deleted %d checkpoints of earlier attempts", self.job.job_id, deleted)

    async def _retain_checkpoints(self, *, succeeded: bool) -> None:
        """Delete this attempt's checkpoints beyond the retention
        (``checkpoints.apply_retention``) and, when it ``succeeded``, mark its artifact
        (its last checkpoint) so that no later attempt's retention deletes it
        (``checkpoints.mark_succeeded``: its success may be reported late). A failure is
        logged: the outcome is never held up or lost for storage."""
        last = self._last_checkpoint
        if succeeded and last is not None:
            try:
                await asyncio.to_thread(
                    checkpoints.mark_succeeded, self._checkpoint_store, last, self.job.attempt
                )
            except Exception as exc:
                log.warning("job %s: its artifact was not marked: %s", self.job.job_id, exc)
        protected = {
            ref.uri for ref in (self._resumed_from, self._last_checkpoint) if ref is not None
        }
        try:
            deleted = await asyncio.to_thread(
                checkpoints.apply_retention,
                self._checkpoint_store,
                self._checkpoints_keep,
                [ref for ref in (self._resumed_from, *self._saved) if ref is not None],
                protected,
                attempt=self.job.attempt,
            )
        except Exception as exc:  # storage freed later is better than an outcome lost now
            log.warning("checkpoint retention of job %s failed: %s", self.job.job_id, exc)
            return
        if deleted:
            log.info("job %s: deleted %d old checkpoints", self.job.job_id, deleted)

    # --- the job's output ---------------------------------------------------------------

    def _output_of(self, process: JobProcess) -> AsyncIterator[bytes]:
        """The main process's output as ``_read_output`` takes it: for a job of one process
        its bytes as read, whole lines or not; under torchrun its own lines, whole."""
        return process.output() if self._ranks else process.chunks()

    async def _read_output(self, output: AsyncIterator[bytes], rank: int | None = None) -> None:
        """Copy ``output`` to the job's log and tail. A job of one process: ``output`` is
        its bytes as read (``JobProcess.chunks``), written as they come, whole lines or not
        (a progress bar's ``\\r`` updates show at once), and cut into lines for the tail
        only (``process.LineCutter``: a partial last line is joined with what follows it).
        A job of several: ``output`` is blocks of whole lines (``process.line_blocks``),
        each line a line of its own prefixed with ``rank`` (the launcher's own lines,
        ``rank`` None, without one). Each chunk or block is handled at once, whatever its
        number of lines; past ``max_output_bytes`` its bytes are only counted as they came
        (``CappedFile.dropped``), without prefix (but the rest of the block that passes it,
        prefixed already)."""
        if self._ranks:
            async for block in output:
                self._copy_output(block, [block], rank)
            return
        lines = LineCutter()
        try:
            async for chunk in output:
                self._copy_output(chunk, lines.cut(chunk), None)
        finally:  # a last line without a newline is the tail's too, even if cut short
            self._copy_output(b"", lines.rest(), None)

    def _copy_output(self, data: bytes, blocks: list[bytes], rank: int | None) -> None:
        """Write ``data`` to the log (prefixed with ``rank`` for a job of several
        processes) and the last lines of ``blocks`` (whole lines) to the tail."""
        log_file = self._log_file
        if log_file is not None and data:
            # Flushed per chunk so `tail -f` follows along. Past the cap the block is only
            # counted: no prefix is paid for bytes kept nowhere.
            kept = self._ranks and not log_file.full
            log_file.write(rank_lines(data, rank) if kept else data)
        count = self._tail_lines
        for block in blocks:
            # Each line as the log holds it; an empty one is a line of the tail too.
            for line in last_lines(block, count):
                if self._ranks:
                    line = rank_lines(line, rank)
                self._tail.add(line.decode("utf-8", errors="replace").rstrip("\r\n"))

    # --- the control socket -------------------------------------------------------------

    async def _on_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        if len(self._connections) >= MAX_CONTROL_CONNECTIONS:
            self._refused_connections += 1
            if self._refused_connections == 1:
                log.warning(
                    "job %s opened more than %d control connections: the others are closed",
                    self.job.job_id,
                    MAX_CONTROL_CONNECTIONS,
                )
            writer.close()
            return
        self._connections.add(task)
        try:
            async for raw in read_lines(reader):
                try:
                    message = parse_control_line(raw)
                except ValueError as exc:
                    self._warn("bad control line", "job %s sent a bad control line: %s", exc)
                    continue
                if isinstance(message, MetricsMessage):
                    self._on_metrics(message)
                else:
                    self._on_checkpoint(message)
        finally:
            self._connections.discard(task)
            writer.close()

    async def _close_control(self) -> None:
        """Stop accepting connections, let the open ones finish (the job has exited, so
        they end), then let the uploader commit what was staged, before the outcome goes
        out."""
        if self._server is not None:
            self._server.close()
        pending = set(self._connections)
        if pending:
            _, stuck = await asyncio.wait(pending, timeout=_PIPE_DRAIN_S)
            for task in stuck:
                task.cancel()
        self._closing_control = True
        self._staged.set()
        if self._uploader is not None:
            try:
                await asyncio.wait_for(self._uploader, timeout=self._upload_wait_s)
            except Exception as exc:
                # The store must not hold what is reported lost (``checkpoints``, "given up").
                await self._give_up_upload()
                # Said in the outcome (``domain.with_lost_checkpoint``): the job's last
                # uploaded checkpoint must not pass for the newest it made.
                left = [s for s in (self._committing, *self._staged_steps) if s is not None]
                if left:
                    self._lost_checkpoint = domain.LostCheckpoint(
                        max(left),
                        self._upload_error or error_text(exc) or type(exc).__name__,
                        self._upload_wait_s,
                        # The wait ran out with no store error since the last upload
                        # that worked: the upload was just too long for it, a size of the
                        # job's making. Anything else is the platform's.
                        store_failed=bool(self._upload_error) or not isinstance(exc, TimeoutError),
                    )
                log.error(
                    "job %s: checkpoint of step %s left unuploaded after %g s: %s",
                    self.job.job_id,
                    max(left) if left else "?",
                    self._upload_wait_s,
                    self._upload_error or error_text(exc) or type(exc).__name__,
                )
        with contextlib.suppress(OSError):
            self._sandbox.control_socket.unlink()

    async def _give_up_upload(self) -> None:
        """Give up the upload under way in its thread, if any (``checkpoints.Upload``): its
        manifest is then never written, and its object deleted once it has landed. When its
        manifest's upload had begun, it is too late for that: its end is awaited instead
        (one small upload, bounded by the store client's timeouts), and a checkpoint it
        stored is reported saved, not lost."""
        if self._upload is None:
            return
        upload, result = self._upload
        self._upload = None
        if upload.cancel():
            step = self._committing
            result.add_done_callback(lambda done: self._log_given_up(step, done))
            return
        try:
            ref = await result
        except Exception as exc:
            self._upload_error = error_text(exc)
            return
        self._committed(ref)

    def _log_given_up(self, step: int | None, done: asyncio.Future[CheckpointRef]) -> None:
        """Say how an upload given up ended in its thread (the future's error retrieved)."""
        exc = None if done.cancelled() else done.exception()
        if isinstance(exc, checkpoints.UploadCancelled):
            log.info("job %s: upload given up: %s", self.job.job_id, exc)
        elif exc is not None:
            log.warning(
                "job %s: the upload of step %s given up failed: %s", self.job.job_id, step, exc
            )

    def _on_metrics(self, message: MetricsMessage) -> None:
        # Bounded first (metric_limits): no event of the job grows with its keys.
        message = message.model_copy(update={"metrics": self._limits.keys(message.metrics)})
        dropped = sorted(set(message.metrics) - set(domain.publishable_metrics(message.metrics)))
        if dropped:
            self._warn(
                "non-finite metrics",
                "job %s reported non-finite %s at step %d (not publishable: left out of events)",
                ", ".join(f"{k}={message.metrics[k]}" for k in dropped),
                message.step,
            )
        self._last_step = message.step
        # The points published (the registry stores every one) are the series, cut where the
        # series is: a job reporting without end fills no database either.
        now = time.monotonic()
        if self._limits.admit(len(message.metrics), now) and self._record_metrics(
            message.step, message.metrics
        ):
            self._batch_metrics(message)
        self._say_dropped_metrics()
        # The newest value of every metric the job reported, for job.succeeded.
        self._last_metrics.update(message.metrics)
        wait = message.metrics.get("data_wait_fraction")
        if wait is not None and math.isfinite(wait):
            self._data_waits.add(wait)
        ready = self._throttle.offer(message, now)
        if ready is not None:
            self._emit_progress(ready)
            return
        due = self._throttle.next_due()
        if self._flush_timer is None and due is not None:
            self._flush_timer = asyncio.get_running_loop().call_later(
                max(0.0, due - now), self._flush_progress
            )

    def _warn(self, kind: str, message: str, *args: object) -> None:
        """Log a warning about what the job sent (``message``'s first argument is the job
        id): the first ``WARNINGS_PER_KIND`` of ``kind``, the rest only counted."""
        count = self._warnings[kind] = self._warnings.get(kind, 0) + 1
        if count <= WARNINGS_PER_KIND:
            log.warning(message, self.job.job_id, *args)

    def _say_dropped_metrics(self, *, final: bool = False) -> None:
        """Tell the job, in its own log, what ``metric_limits`` dropped (when it is time)."""
        notice = self._limits.notice(time.monotonic(), final=final)
        if notice is not None and self._log_file is not None and not self._log_file.closed:
            self._log_file.say(notice.encode())

    def _record_metrics(self, step: int, metrics: dict[str, float]) -> bool:
        """One line of the job's metric series (shipped with its log); False once the series
        is full (``max_output_bytes``): the report is then kept nowhere."""
        if self._metrics_file is not None and not self._metrics_file.closed:
            record = {"step": step, "time": time.time(), "metrics": metrics}
            return self._metrics_file.write(json.dumps(record).encode() + b"\n")
        return True

    async def _sample_usage(self) -> None:
        assert self._usage is not None
        try:
            while True:
                await asyncio.sleep(self._usage_interval_s)
                sample = await asyncio.to_thread(self._usage.sample, self._gpu_indices)
                if sample:
                    self._utilization.add(sample["gpu_utilization"])
                    self._record_metrics(self._last_step, sample)
                    usage_metrics.record(self, len(self._gpu_indices), sample["gpu_utilization"])
        finally:
            usage_metrics.forget(self)

    def _batch_metrics(self, message: MetricsMessage) -> None:
        points = domain.metric_points(message, datetime.now(UTC))
        now = time.monotonic()
        for seq, batch in self._batcher.add(points, now):
            self._emit_metrics(seq, batch)
        due = self._batcher.next_due()
        if self._batch_timer is None and due is not None:
            self._batch_timer = asyncio.get_running_loop().call_later(
                max(0.0, due - now), self._flush_metrics
            )

    def _flush_metrics(self) -> None:
        self._batch_timer = None
        batch = self._batcher.due(time.monotonic())
        if batch is not None:
            self._emit_metrics(*batch)
        due = self._batcher.next_due()
        if due is not None and not self._ended:
            self._batch_timer = asyncio.get_running_loop().call_later(
                max(0.0, due - time.monotonic()), self._flush_metrics
            )

    def _emit_metrics(self, seq: int, points: list[MetricPoint]) -> None:
        # Routed by node: only this node's runner may publish it (shared.events.trust).
        self._events.emit(
            Envelope.wrap(
                domain.metrics_event(self.job, seq, points),
                source=domain.SOURCE,
                subject=self.job.node_id,
                event_id=domain.metrics_event_id(self.job, seq),
            )
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
        """Queue the staged checkpoint for the uploader; the reader never waits on it, so
        metrics keep flowing during an upload."""
        self._staged_steps.add(message.checkpoint.step)
        if len(self._staged_steps) > MAX_WAITING_CHECKPOINTS:
            # The oldest is forgotten (its staged folder stays, on the job's own disk
            # allowance); the newest, the one uploaded next, never is.
            self._staged_steps.discard(min(self._staged_steps))
        self._staged.set()
        if self._uploader is None:
            self._uploader = asyncio.create_task(self._upload_staged(), name="checkpoints")

    async def _upload_staged(self) -> None:
        """Commit staged checkpoints one at a time. When several wait (uploads slower than
        the job checkpoints), only the newest is uploaded and the others (up to
        ``MAX_WAITING_CHECKPOINTS`` of them) are dropped from staging: an older checkpoint is worth nothing once a newer one is durable, and
        staging must not grow without bound."""
        while True:
            await self._staged.wait()
            self._staged.clear()
            if not self._staged_steps:
                if self._closing_control:
                    return
                continue
            newest, skipped = max(self._staged_steps), set(self._staged_steps)
            self._staged_steps.clear()
            for step in skipped - {newest}:
                await asyncio.to_thread(
                    shutil.rmtree,
                    self._sandbox.checkpoints / checkpoints.staged_folder(step),
                    ignore_errors=True,
                )
            if len(skipped) > 1:
                log.info(
                    "job %s: %d checkpoints waited for upload; only step %d is uploaded",
                    self.job.job_id,
                    len(skipped),
                    newest,
                )
            await self._commit(newest)
            if self._closing_control and not self._staged_steps:
                return

    async def _commit(self, step: int) -> None:
        """Upload one staged checkpoint. A store that fails (down, throttling) is retried
        with back-off until it works or a newer checkpoint is staged (which supersedes this
        one); the end of the job waits for it up to ``checkpoint_upload_wait_s``, then gives
        it up (``_give_up_upload``). A step this attempt saved already is refused, never
        uploaded again: its store folder (``checkpoints.store_folder``: step and attempt)
        holds the checkpoint reported saved, whose object another upload would overwrite
        (no longer the bytes its report names, which resume checks) and one given up at the
        job's end would delete."""
        if any(ref.step == step for ref in self._saved):
            await asyncio.to_thread(
                shutil.rmtree,
                self._sandbox.checkpoints / checkpoints.staged_folder(step),
                ignore_errors=True,
            )
            why = f"step {step} was saved already by this attempt; a saved checkpoint stays"
            if self._refused_checkpoint is None or step > self._refused_checkpoint.step:
                self._refused_checkpoint = domain.RefusedCheckpoint(step, why)
            self._warn("checkpoint refused", "job %s: checkpoint of step %d refused: %s", step, why)
            if self._log_file is not None and not self._log_file.closed:
                # The job's own log: its author reads that, not the runner's.
                self._log_file.say(
                    f"[trainyard: checkpoint of step {step} not uploaded: {why}]\n".encode()
                )
            return
        delay = 1.0
        self._committing = step
        while True:
            upload = checkpoints.Upload()
            result = asyncio.ensure_future(
                asyncio.to_thread(
                    checkpoints.commit_staged,
                    self._sandbox.checkpoints,
                    step,
                    self._checkpoint_store,
                    self.job.attempt,
                    job_id=self.job.job_id,
                    parent=self._events.parent,
                    max_bytes=self._max_checkpoint_bytes,
                    # The runner's own folder of the job (``jobs/<job>/``), on the disk
                    # sized for jobs: never the host's temporary folder (memory, maybe).
                    scratch=self._log_path.parent,
                    upload=upload,
                )
            )
            self._upload = (upload, result)
            try:
                # Shielded: the end's wait, when it runs out, cancels this task, never the
                # upload, which it gives up (``_give_up_upload``) or waits for.
                ref = await asyncio.shield(result)
                self._upload = None
                self._upload_error = ""  # the store works again
                break
            except checkpoints.StagedCheckpointInvalid as exc:
                self._upload = None
                self._committing = None
                # Said in the outcome (``domain.with_refused_checkpoint``) when no newer
                # checkpoint is uploaded: an older one must not pass for the job's last.
                if self._refused_checkpoint is None or step > self._refused_checkpoint.step:
                    self._refused_checkpoint = domain.RefusedCheckpoint(step, str(exc))
                self._warn(
                    "checkpoint refused", "job %s: checkpoint of step %d refused: %s", step, exc
                )
                return
            except Exception as exc:
                self._upload = None
                self._upload_error = error_text(exc)
                if self._staged_steps:
                    self._committing = None
                    log.error(
                        "job %s: checkpoint of step %d not uploaded (%s); a newer one waits",
                        self.job.job_id,
                        step,
                        exc,
                    )
                    return
                log.warning(
                    "job %s: checkpoint of step %d not uploaded yet (%s); retrying in %g s",
                    self.job.job_id,
                    step,
                    exc,
                    delay,
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)
        self._committed(ref)

    def _committed(self, ref: CheckpointRef) -> None:
        """Take ``ref``, the checkpoint of ``_committing`` now in the store, as the job's
        last and say so (``checkpoint.saved``)."""
        self._committing = None
        self._last_checkpoint = ref
        self._saved.append(ref)
        committed = CheckpointMessage(checkpoint=ref)
        self._events.emit(
            _wrap(
                domain.checkpoint_event(self.job, committed, datetime.now(UTC)),
                self.job,
                domain.checkpoint_event_id(self.job, committed),
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
    then mark the allocation finished. An end the ledger cannot store (``OSError``: a full
    disk) is published all the same, so the scheduler is not left waiting for it: the
    ledger then still has the allocation unfinished, and the next runner's report of it
    (``lost_on_restart``) has the same event id, which consumers drop as said already."""
    envelope = _wrap(payload, job, domain.event_id(job.allocation_id, "end"))
    try:
        await asyncio.to_thread(ledger.ending, job, envelope.to_json().decode(), trace_headers)
    except OSError as exc:
        log.error(
            "allocation %s of job %s: its end could not be stored in the ledger (%s); "
            "publishing it all the same",
            job.allocation_id,
            job.job_id,
            exc,
        )
        stored = False
    else:
        stored = True
    events.emit(envelope)
    await events.close()
    if stored:
        await asyncio.to_thread(ledger.finished, job.allocation_id)

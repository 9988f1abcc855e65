"""The node agent: turns this node's allocations into supervised job processes.

Contract:
- ``on_granted`` launches a job at most once per allocation id, across redeliveries and
  runner restarts (the ledger remembers every allocation this node saw). It checks the
  grant and records it in the ledger, then returns: the node's consumer never waits on the
  object store nor on another job, so a revocation (a cancel, a preemption) or a later
  grant is handled at once, whatever a launch waits for. A task of the grant's own does the
  rest: it frees the grant's GPUs (below), takes a slot, fetches the job's code and
  checkpoint from the object store (an unreachable store is waited out in that task, with
  capped back-off; any other failure, this node's full disk included, ends the allocation
  as ``platform_error``), builds its environment (minutes, maybe) and spawns the process,
  so launches of different jobs proceed side by side. Only once the process exists is
  ``job.started`` said (before anything the job reports): a job whose process could not
  be spawned ends with ``job.failed`` and was never said to have started. Launches that
  share a GPU go one after the other, in the order their grants came (a newer grant can
  then fence the older job, below). A revocation during a launch, or the drain, stops it
  at the wait it is in (earlier launches, a fenced job's exit, the object store, the
  install): it ends at once with ``job.preempted`` and the stop's reason (``cancelled``
  too), never having started; the slot and sandbox are freed once the work in a thread it
  no longer waits for returns. So does its deadline: the attempt's ``max_runtime_seconds``
  runs from its grant (``deadline``: its ``granted_at``, within a minute before its
  receipt), its preparation included but for the platform's own waits (for earlier
  launches and fenced jobs on its GPUs, for the object store: its requests and an
  outage's retries, for another launch's build of its environment, the slot's cleanup),
  which move it. A launch whose deadline passes stops at the wait it is
  in, the git or installer command it runs killed, and ends with ``job.failed``
  (``max_runtime``, not restarted, no fault of this node's), the reason naming
  ``max_runtime_seconds`` and the phase that ran out; a job that starts runs only what is
  left of it. A grant whose delivery alone took the whole of its (short)
  ``max_runtime_seconds`` ends at once as ``platform_error`` (``deadline``:
  ``delivered_too_late``), the job having spent none of it. A revocation that comes while
  the process is being
  spawned stops the job as soon as it runs. A runner that dies during a launch reports it
  lost at its next start.
  A background task supervises the process, from its spawn on: one whose process group
  cannot be recorded in the ledger (a full disk) is killed at once and ends with
  ``job.failed`` (``platform_error``), as the next runner could not find it. A launch or
  supervision task that fails is logged at once with the job's id (``background``).
  A grant that cannot run here ends at once with ``job.failed``: ``user_error`` naming the
  field when its spec is at fault (a malformed entrypoint, both or neither of entrypoint and
  command), ``platform_error`` when this node is (GPU indices it lacks, its interpreter
  broken, every slot taken) or when it asks for what this node does not offer (a container
  image). A grant arriving while the runner shuts down raises, so it stays
  unacknowledged and goes to the next runner of this node.
- Every ``job.failed`` of a job that could not start says whether this node itself is at
  fault (``JobFailed.node_fault``, ``sandbox.counts_against_node``): only then does the
  scheduler count it towards the node's cordon. The node's own failures (``NodeFault``: its
  GPUs, disk, sandbox, cgroups, interpreter, its credentials to the store) are, and so is an
  error of this node's own storage or descriptors (``node_faults``: a full disk);
  a ``platform_error`` that follows the job's own input (its git host or server, a
  ``command`` not on the node's ``PATH``, its requirements' install, its bundle's contents)
  and any error the runner did not classify are not: a tenant's jobs cannot cordon a node.
- ``on_revoked`` (same allocation id *and* epoch) stops the job: SIGTERM, then SIGKILL after
  the revocation's grace; the outcome is ``job.preempted`` with the revocation's reason
  (``cancelled`` too). A revocation of an allocation this node never ran ends it with
  ``job.preempted`` so the scheduler is not left waiting, and a later grant for it is ignored.
- ``recover`` (at start, before any grant is accepted) first SIGKILLs whatever job processes
  a previous runner process left (every process of this node's job uids, the recorded
  process groups of unfinished allocations, and every process whose environment holds the
  id of one of them: ``orphans``) and removes their sandboxes, then publishes what
  that runner left unsaid: stored terminal events, and ``job.preempted`` for jobs whose
  process died with it.
- Each job runs in a fresh sandbox (``sandbox``) as a uid of its own slot, in a cgroup of
  its own attempt where the node has cgroups (``cgroups``: its memory limit, CPU quota and,
  on a node with real GPUs, only its own GPUs' device files); a grant whose
  code, environment or process cannot be had ends at once with ``job.failed``
  (``failure_kind`` ``platform_error``, which the scheduler retries), so its GPUs are
  released promptly; one that cannot start because of what its own spec names (a
  repository or commit that cannot be fetched, a bundle that cannot be unpacked,
  requirements the index cannot meet: ``sandbox.JobInputError``) ends as ``user_error``,
  its reason naming the spec field, and is not retried.
- ``drain_on(stop)``: stop accepting, stop every launch still waiting (it ends unrun),
  SIGTERM every job, SIGKILL after the drain timeout, wait for their terminal events
  (``job.preempted``, reason ``runner shutting down``).
- ``heartbeats`` publishes ``runner.heartbeat`` every interval until the drain is done, each
  kept in the event stream only ``heartbeat_ttl_seconds`` (``Nats-TTL``). Each lists every
  allocation the node holds (``running_allocations``): from the moment ``on_granted`` takes
  its grant, while its launch prepares, until its end is reported; the scheduler frees the
  GPUs of an ended allocation a heartbeat does not list. One that fails
  while NATS is away tells the connection's ``Bus.nats_away`` (``shared.outages``): an
  outage is one line when it starts and one when it ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import random
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TypeVar, overload

from opentelemetry import context as otel_context

from trainyard_platform.services.runner import (
    background,
    checkpoints,
    disk_watch,
    domain,
    launch,
    netns,
    publishing,
)
from trainyard_platform.services.runner.cgroups import NodeCgroups, runner_folder
from trainyard_platform.services.runner.config import JOB_SLOTS, Settings
from trainyard_platform.services.runner.deadline import AttemptDeadline
from trainyard_platform.services.runner.domain import JobIdentity, StopRequest
from trainyard_platform.services.runner.environments import (
    EnvironmentBuildError,
    EnvironmentCache,
    EnvironmentLease,
    job_interpreter,
)
from trainyard_platform.services.runner.git_remote import installed_git, unpinned_git
from trainyard_platform.services.runner.gpus import GpuInventory, GpuUsage
from trainyard_platform.services.runner.ledger import Ledger, LedgerEntry, safe_file_name
from trainyard_platform.services.runner.node_faults import node_fault
from trainyard_platform.services.runner.publishing import JobEvents, publish_until_sent
from trainyard_platform.services.runner.sandbox import (
    NodeFault,
    PlatformError,
    ProcessGroupRecord,
    can_switch_users,
    counts_against_node,
    failure_kind,
    job_user,
    kill_leftovers,
    process_start_time,
    remove_leftovers_of,
    remove_sandbox,
)
from trainyard_platform.services.runner.supervisor import JobRun, end_allocation
from trainyard_platform.shared import outages
from trainyard_platform.shared.bus import TTL_HEADER, Bus, NotNow, infrastructure_fault
from trainyard_platform.shared.events import Envelope, Payload, parse_envelope
from trainyard_platform.shared.events.payloads import (
    AllocationGranted,
    AllocationRevoked,
    FailureKind,
    GrantOfInvalidSpec,
    JobStarted,
    RunnerHeartbeat,
)
from trainyard_platform.shared.logs import error_text, job_scope
from trainyard_platform.shared.storage import ObjectStore, open_store
from trainyard_platform.shared.telemetry import extract, inject

log = logging.getLogger(__name__)

LEDGER_RETENTION = timedelta(days=14)


class ShuttingDown(NotNow):
    """A grant that comes while the runner stops: nothing of it is done, and the bus hands
    it back for the runner's next start (``bus.NotNow``), counted as no failure of the
    grant's."""


class NodeAgent:
    """Runs this node's allocations (see the module docstring)."""

    def __init__(
        self,
        settings: Settings,
        bus: Bus,
        store: ObjectStore,
        gpus: GpuInventory,
        stop: asyncio.Event,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.clock = clock
        """The monotonic clock of the attempts' deadlines (``deadline``)."""
        self.gpus = gpus
        self._bus = bus
        self._store = store
        self._stop = stop
        self._ledger = Ledger(settings.work_dir / "ledger" / safe_file_name(settings.node_id))
        interpreter, self._interpreter_problem = None, None
        if can_switch_users():
            try:
                interpreter = job_interpreter(settings.python)
            except EnvironmentBuildError as exc:  # every job will say why it cannot start
                self._interpreter_problem = str(exc)
                log.error("jobs cannot run on this node: %s", exc)
        try:
            max_bytes = settings.environments_max_bytes()
        except OSError as exc:
            max_bytes = None
            log.warning(
                "cached job environments have no bound on their disk: the size of their file "
                "system cannot be read (%s); set TRAINYARD_RUNNER_ENVIRONMENTS_MAX_GIB",
                error_text(exc),
            )
        self._environments = EnvironmentCache(
            settings.environments_root,
            settings.python,
            settings.installer,
            interpreter=interpreter,
            keep=settings.environments_keep,
            max_bytes=max_bytes,
            fetch_allowed=settings.fetch_private_allowed,
            build_max_bytes=int(settings.env_build_max_gib * disk_watch.GIB) or None,
            build_check_s=settings.job_disk_check_seconds,
        )
        self._usage = GpuUsage(gpus)
        self._cgroups: NodeCgroups | None = None
        """The jobs' cgroups (memory and process limits), set up by ``recover``."""
        self._runs: dict[str, JobRun] = {}
        self._slots: dict[str, int] = {}
        self._leases: dict[str, EnvironmentLease] = {}
        """The environment each prepared allocation runs in, held until it ends."""
        self._supervisors: set[asyncio.Task[None]] = set()
        self._launches: dict[str, _Launch] = {}
        """Grants being launched, from their receipt until their job runs or ended unrun
        (its end reported)."""
        self._launch_tasks: set[asyncio.Task[None]] = set()
        self.drained = asyncio.Event()

    @property
    def node_id(self) -> str:
        return self.settings.node_id

    @property
    def ledger(self) -> Ledger:
        """Every allocation this node saw (blocking file I/O: use a thread)."""
        return self._ledger

    def running(self) -> list[JobRun]:
        return list(self._runs.values())

    def running_allocations(self) -> list[str]:
        """What a heartbeat says this node runs: every allocation it holds, from the moment
        it took the grant (a launch still preparing: waiting for its GPUs, fetching code or
        checkpoint, building the environment, spawning) until its end is reported (a job's
        supervision ends once its terminal event is published; a launch ends unrun only
        once its end is). The scheduler frees the GPUs it holds for an ended allocation once
        a heartbeat no longer lists it (``free_unlisted``), so a launch left out would have
        its GPUs given to another job while it may still start there."""
        return sorted({*self._runs, *self._launches})

    # --- start-up ------------------------------------------------------------------------

    async def recover(self) -> None:
        """Kill what the previous runner process of this node left running, then publish
        what it left unsaid."""
        await asyncio.to_thread(self._kill_leftovers)
        pruned = await asyncio.to_thread(self._ledger.prune, LEDGER_RETENTION)
        if pruned:
            log.info("pruned %d old allocations from the ledger", pruned)
        for entry in await asyncio.to_thread(self._ledger.unfinished):
            with job_scope(entry.job_id):
                await self._recover(entry)

    async def _recover(self, entry: LedgerEntry) -> None:
        """Publish what the previous runner process left unsaid of one allocation."""
        parent = extract(entry.trace_headers)
        if entry.terminal_event is None:
            log.warning(
                "allocation %s of job %s was running when the runner stopped; "
                "its process is gone: reporting it preempted",
                entry.allocation_id,
                entry.job_id,
            )
            payload = domain.lost_on_restart(entry.job, datetime.now(UTC))
            events = JobEvents(self._bus, parent, entry.job_id)
            await end_allocation(entry.job, payload, events, self._ledger, entry.trace_headers)
            return
        log.info("publishing the stored end of allocation %s", entry.allocation_id)
        await publish_until_sent(self._bus, parse_envelope(entry.terminal_event.encode()), parent)
        await asyncio.to_thread(self._ledger.finished, entry.allocation_id)

    @property
    def job_uids(self) -> range | None:
        """The uids this node's jobs run as; None where they run as the runner's own user
        (a runner that is not root)."""
        return self.settings.job_uids if can_switch_users() else None

    @property
    def job_network(self) -> str:
        """The network a job on this node alone runs in: ``loopback`` (a namespace of its
        own, ``netns``) or ``host`` (the setting says so, or this runner cannot make one)."""
        isolated = self.job_uids is not None and netns.available()
        return "loopback" if self.settings.job_network == "loopback" and isolated else "host"

    def _kill_leftovers(self) -> None:
        if not can_switch_users():
            log.warning(
                "the runner is not root: jobs run as its own user (no isolation by user); "
                "start it as root to run each job as an unprivileged user of its own"
            )
        unfinished = self._ledger.unfinished()
        groups = [
            ProcessGroupRecord(e.process_group, e.process_started or 0)
            for e in unfinished
            if e.process_group is not None
        ]
        loopback = self.settings.job_network == "loopback"
        if loopback and can_switch_users() and not netns.available():
            log.warning(
                "jobs run in the host's network: this runner cannot give them a network of "
                "their own (a kernel or container that refuses unshare of a network "
                "namespace), so a job reaches every port of the host; "
                "TRAINYARD_RUNNER_JOB_NETWORK=host says this is intended"
            )
        # Learnt here at the start; asked again at each fetch while git said no version.
        unpinned = unpinned_git(installed_git())
        if unpinned is not None:
            log.error("jobs with git code fail on this node while this holds: %s", unpinned)
        uids = self.job_uids
        killed = kill_leftovers(uids, groups, [e.allocation_id for e in unfinished])
        if killed:
            log.warning("killed %d job processes a previous runner left behind", killed)
        if uids is not None:
            removed = remove_leftovers_of(uids)
            if removed:
                log.warning(
                    "removed %d files and IPC objects that earlier jobs left behind", removed
                )
        remove_sandbox(self.settings.sandboxes_dir)
        copies = checkpoints.remove_leftover_copies(self.settings.work_dir / "jobs")
        if copies:
            log.warning("removed %d checkpoint copies a previous runner left behind", copies)
        # After the kill: what an earlier runner's jobs left of their cgroups goes too.
        self._cgroups = NodeCgroups.detect(
            runner_folder(self.settings.node_id, self.settings.job_uids),
            gpu_minors=None if self.gpus.virtual else self.gpus.device_minors,
        )
        # Nothing runs yet, so no environment is in use: keep the most recently used ones.
        cache = self._environments
        log.info(
            "job environments: at most %s cached, %s",
            cache.keep,
            "with no bound on their disk"
            if cache.max_bytes is None
            else f"taking at most {disk_watch.gib(cache.max_bytes)} of disk",
        )
        pruned = cache.prune(cache.keep, cache.max_bytes)
        if pruned:
            log.info("removed %d least recently used job environments", len(pruned))

    # --- allocation.granted ----------------------------------------------------------------

    async def on_granted(self, grant: AllocationGranted) -> None:
        """Accept ``grant``: check it, record it in the ledger and hand its whole launch
        (GPUs to free, its code and checkpoint from the object store, its environment) to
        a task of its own. Nothing here waits on the object store or on another job, so the
        node's consumer goes on to its next grant or revocation at once."""
        received_at = datetime.now(UTC)
        if grant.node_id != self.node_id:
            log.warning("ignoring allocation %s for node %s", grant.allocation_id, grant.node_id)
            return
        if self._stop.is_set():
            raise ShuttingDown("the runner is shutting down; the grant waits for its next start")
        if grant.allocation_id in self._launches:
            log.info(
                "allocation %s is being launched already: duplicate grant ignored",
                grant.allocation_id,
            )
            return
        # In flight from here until its job runs or it ended unrun: a drain waits for it,
        # and heartbeats list it (``running_allocations``), already while it is accepted.
        # The attempt's max_runtime_seconds runs from its grant, preparation included.
        deadline = AttemptDeadline.from_grant(
            grant.granted_at, received_at, grant.spec.max_runtime_seconds, self.clock
        )
        launching = _Launch(grant.epoch, frozenset(grant.gpu_indices), deadline)
        self._launches[grant.allocation_id] = launching
        try:
            accepted = await self._accept(grant)
        except BaseException:
            self._launch_ended(grant.allocation_id)
            raise
        if accepted is None:
            self._launch_ended(grant.allocation_id)
            return
        late = deadline.delivered_too_late()
        if late is not None:
            # Nothing of the job's spent its time: not its max_runtime, but the platform's.
            try:
                await self._failed_to_start(
                    accepted.job,
                    late,
                    accepted.events,
                    accepted.trace_headers,
                    "platform_error",
                    node_fault=False,
                )
            finally:
                self._launch_ended(grant.allocation_id)
            return
        background.start(
            self._launch_job(accepted, launching),
            f"the launch of allocation {grant.allocation_id}",
            grant.job_id,
            self._launch_tasks,
        )

    async def _launched_on(self, gpus: frozenset[int], allocation_id: str) -> None:
        """Return once no launch in flight that came before ``allocation_id``'s wants any of
        ``gpus``. Only earlier ones: launches waiting for each other on a GPU go in the order
        they came, where waiting for any other had two later ones wait for each other for
        good once the first ended."""
        while True:
            earlier = list(itertools.takewhile(lambda a: a != allocation_id, self._launches))
            others = [self._launches[a] for a in earlier if self._launches[a].gpus & gpus]
            if not others:
                return
            await others[0].done.wait()

    def _launch_ended(self, allocation_id: str) -> None:
        launching = self._launches.pop(allocation_id, None)
        if launching is not None:
            launching.done.set()

    async def on_invalid_grant(self, grant: GrantOfInvalidSpec) -> None:
        """End a grant whose spec is no valid ``JobSpec`` as the job's own error:
        ``user_error``, no exit code (it never ran), no fault of this node, the reason naming
        each bad field. Recorded in the ledger first like any grant, so a redelivery is
        answered again, never run."""
        if self._stop.is_set():
            raise ShuttingDown("the runner is shutting down; the grant waits for its next start")
        if grant.allocation_id in self._launches:
            return
        recorded = await self._accept(grant)
        if recorded is None:
            return
        await self._failed_to_start(
            recorded.job,
            f"the job's spec is invalid: {grant.problem}",
            recorded.events,
            recorded.trace_headers,
            "user_error",
            node_fault=False,
        )

    @overload
    async def _accept(self, grant: AllocationGranted) -> _Accepted | None: ...
    @overload
    async def _accept(self, grant: GrantOfInvalidSpec) -> _Recorded | None: ...
    async def _accept(self, grant: AllocationGranted | GrantOfInvalidSpec) -> _Recorded | None:
        """Check ``grant`` and record it in the ledger; None when it is not to run (a
        duplicate, or ended at once: its launch could not be recorded)."""
        if grant.allocation_id in self._runs:
            log.info(
                "allocation %s is running already: duplicate grant ignored", grant.allocation_id
            )
            await publishing.say_again(self._bus, grant.allocation_id)
            return None
        seen = await asyncio.to_thread(self._ledger.get, grant.allocation_id)
        if seen is not None:
            log.info(
                "allocation %s is %s on this node: duplicate grant ignored",
                grant.allocation_id,
                seen.state.value,
            )
            await publishing.say_again(self._bus, grant.allocation_id, _stored(seen))
            return None
        await publishing.note_grant(self._bus, grant.allocation_id)
        job = JobIdentity.from_grant(grant)
        # The consumer span of this grant: every later event of the job is published in it.
        parent = otel_context.get_current()
        trace_headers = inject()
        events = JobEvents(self._bus, parent, job.job_id)
        try:
            # Recorded before the grant is acknowledged: a runner that dies during the rest
            # of the launch leaves its successor an allocation to report lost.
            await asyncio.to_thread(self._ledger.launched, job, trace_headers)
        except Exception as exc:  # this node's disk (full, read-only): no waiting mends it
            fault = node_fault(exc)
            if fault is None:
                log.exception("recording allocation %s failed", job.allocation_id)
            reason = f"could not be prepared on this node: {fault or error_text(exc)}"
            # Its own ledger: whatever failed, it is this node's.
            await self._failed_to_start(
                job, reason, events, trace_headers, failure_kind(exc), node_fault=True
            )
            return None
        if isinstance(grant, GrantOfInvalidSpec):
            return _Recorded(job, events, trace_headers, parent)
        return _Accepted(job, events, trace_headers, parent, grant)

    async def _launch_job(self, accepted: _Accepted, launching: _Launch) -> None:
        """The whole launch of an accepted grant, in a task of its own: wait for earlier
        launches on its GPUs and for the jobs it fences, take a slot, fetch its code and
        checkpoint (an object store away is waited out here), build its environment, spawn
        its process. A revocation or the drain (``_Launch.stop``) ends it unrun at any
        of these waits, and so does its deadline (``deadline``: what it runs in threads
        too, their child processes killed at it). Whatever stops it, the allocation ends."""
        grant, job = accepted.grant, accepted.job
        try:
            with job_scope(job.job_id):
                try:
                    # The preparation's threads (git, the installer) run under the deadline;
                    # the job's supervision, a task started after it, does not.
                    with launching.deadline.applies():
                        prepared = await self._prepare(accepted, launching)
                except _LaunchStopped:
                    await self._end_unrun(accepted, launching)
                    return
                if prepared is None:
                    return
                self._leases[grant.allocation_id] = prepared.environment_lease
                await self._launch(
                    grant,
                    job,
                    prepared,
                    accepted.events,
                    accepted.trace_headers,
                    launching.deadline,
                )
                run = self._runs.get(job.allocation_id)
                if run is not None and launching.revoked is not None:
                    run.request_stop(*launching.revoked)
        except Exception as exc:
            await self._launch_broke(accepted, exc)
        finally:
            self._launch_ended(grant.allocation_id)

    async def _launch_broke(self, accepted: _Accepted, exc: Exception) -> None:
        """End an allocation whose launch raised what none of its steps expected (a defect,
        or a failure with no verdict of its own): a launch that ended without saying so
        left its allocation live for ever, the job RUNNING to the platform and its GPUs
        held, since nothing else ends an allocation whose runner stays up. Said as the
        platform's failure (the job is retried), never the node's fault nor the job's; a
        job already spawned is left to its supervision, which ends it."""
        job = accepted.job
        log.exception("allocation %s: its launch failed unexpectedly", job.allocation_id)
        if job.allocation_id in self._runs:
            return
        await self._failed_to_start(
            job,
            # Its text stays in this node's log: it may name the node's own services.
            f"the runner of node {self.settings.node_id} could not launch the job (an "
            f"internal error, {type(exc).__name__}, in its log); the platform retries it",
            accepted.events,
            accepted.trace_headers,
            "platform_error",
            node_fault=False,
        )

    async def _prepare(self, accepted: _Accepted, launching: _Launch) -> launch.Prepared | None:
        """Everything of a launch before its spawn; None when the allocation ended (unrun,
        here). Raises ``_LaunchStopped`` when ``launching`` was stopped meanwhile."""
        grant, job, events = accepted.grant, accepted.job, accepted.events
        trace_headers = accepted.trace_headers
        # A launch in flight on one of its GPUs goes first: only a job that runs can be
        # fenced (``_gpus_freed``), and two launches must never share a GPU. The platform's
        # queue, not the job's time.
        with launching.deadline.platform():
            await launching.unless_stopped(self._launched_on(launching.gpus, grant.allocation_id))
        if not await self._gpus_freed(grant, launching):
            return None
        problem = launch.cannot_run(grant, self.gpus)
        if problem is None and self._interpreter_problem is not None:
            problem = NodeFault(self._interpreter_problem)
        slot = self._free_slot()
        if problem is not None or slot is None:
            problem = problem or NodeFault(f"this node runs {JOB_SLOTS} jobs already")
            log.error("allocation %s cannot run here: %s", grant.allocation_id, problem)
            payload = domain.failed_to_start(
                job,
                str(problem),
                datetime.now(UTC),
                failure_kind(problem),
                node_fault=counts_against_node(problem),
            )
            await end_allocation(job, payload, events, self._ledger, trace_headers)
            return None
        self._slots[grant.allocation_id] = slot
        with launching.deadline.phase("fetching the job's code"):
            fetched = await self._fetch(accepted, launching, slot)
        if fetched is None:
            return None
        try:
            # Minutes, maybe (an environment installed): a stop does not wait for it.
            with launching.deadline.phase("building the job's environment"):
                return await launching.unless_stopped(
                    asyncio.to_thread(
                        launch.prepare,
                        grant,
                        self.settings,
                        fetched,
                        self.gpus,
                        self._environments,
                        trace_headers,
                    ),
                    runs_on=True,
                )
        except _LaunchStopped:
            raise
        except Exception as exc:  # PlatformError, or anything else: it cannot start
            if not isinstance(exc, PlatformError):
                log.exception("preparing allocation %s failed", job.allocation_id)
            await self._failed_to_start(
                job,
                str(exc),
                events,
                trace_headers,
                failure_kind(exc),
                counts_against_node(exc),
            )
            return None

    async def _fetch(
        self, accepted: _Accepted, launching: _Launch, slot: int
    ) -> launch.Fetched | None:
        """The job's sandbox, code and checkpoint; None when the allocation ended. An object
        store away (``infrastructure_fault``) is waited out here, with capped back-off, for
        as long as it lasts or until the launch is stopped: the job did nothing wrong, and
        only this launch waits (the platform's time, not the job's: ``launch.fetch`` holds
        the deadline in each request to the store, and the back-off is held here). Any
        other failure, this node's full disk included
        (``node_faults``), ends the allocation at once (``platform_error``, which the
        scheduler retries, elsewhere maybe; ``user_error`` for the job's own input)."""
        grant, job = accepted.grant, accepted.job
        delay = _FETCH_RETRY_FIRST_S
        while True:
            if launching.stopping.is_set():
                raise _LaunchStopped
            try:
                fetched = await launching.unless_stopped(
                    asyncio.to_thread(
                        launch.fetch,
                        grant,
                        self.settings,
                        self._store,
                        job_user(self.settings.job_uids.start, slot),
                        self._cgroups,
                        self.gpus.count,
                    ),
                    runs_on=True,
                )
            except _LaunchStopped:
                raise
            except Exception as exc:
                fault = None if isinstance(exc, PlatformError) else node_fault(exc)
                if fault is None and not isinstance(exc, PlatformError):
                    if infrastructure_fault(exc) is not None:
                        if not outages.report(exc):
                            log.warning(
                                "allocation %s waits to be fetched: %s",
                                job.allocation_id,
                                error_text(exc),
                            )
                        await asyncio.to_thread(self._discard_sandbox, job.allocation_id)
                        pause = delay * random.uniform(0.5, 1.0)
                        delay = min(delay * 2, _FETCH_RETRY_MAX_S)
                        with launching.deadline.platform():
                            await launching.unless_stopped(asyncio.sleep(pause))
                        continue
                    log.exception("fetching allocation %s failed", job.allocation_id)
                reason = (
                    str(exc)
                    if isinstance(exc, PlatformError)
                    else f"could not be prepared on this node: {fault or error_text(exc)}"
                )
                await self._failed_to_start(
                    job,
                    reason,
                    accepted.events,
                    accepted.trace_headers,
                    failure_kind(exc),
                    counts_against_node(exc),
                )
                return None
            outages.OBJECT_STORE.answered()
            return fetched

    async def _end_unrun(self, accepted: _Accepted, launching: _Launch) -> None:
        """End an allocation whose launch was stopped before its job ran, said at once:
        ``job.preempted`` with the stop's reason (a cancel's, a preemption's, the drain's),
        or, stopped by its deadline, ``job.failed`` as ``max_runtime`` (the job's own time
        ran out: ``deadline``), no fault of this node's. Its slot and sandbox are freed once
        the work it no longer waits for (a download, an install, in a thread) has
        returned."""
        job = accepted.job
        assert launching.revoked is not None
        request, _grace = launching.revoked
        log.info("allocation %s stopped before its job ran: %s", job.allocation_id, request.reason)
        outcome = (
            domain.Outcome("failed", request.reason, None, "max_runtime")
            if request.kind == "max_runtime"
            else domain.Outcome("preempted", request.reason, None)
        )
        payload = domain.terminal_event(
            job, outcome, domain.JobResults({}, None, ""), datetime.now(UTC)
        )
        try:
            await end_allocation(
                job, payload, accepted.events, self._ledger, accepted.trace_headers
            )
        finally:
            self._launch_ended(job.allocation_id)  # its GPUs: the next grant may have them
            for work in await launching.left_running():
                if isinstance(work, launch.Prepared):
                    work.environment_lease.release()
            await asyncio.to_thread(self._release, job.allocation_id)

    def _discard_sandbox(self, allocation_id: str) -> None:
        """What a fetch that failed left of the sandbox and cgroup (the slot is kept)."""
        remove_sandbox(self.settings.sandboxes_dir / launch.sandbox_name(allocation_id))
        if self._cgroups is not None:
            self._cgroups.remove(launch.sandbox_name(allocation_id))

    async def _gpus_freed(self, grant: AllocationGranted, launching: _Launch) -> bool:
        """Make sure no job of this node still runs on the grant's GPUs. The scheduler
        grants a GPU only once its previous lease ended, so a job still on it is one whose
        allocation ended without it (its node was lost, paused or cut off, or its grant came
        late): the job with the older epoch is stopped as fenced, and the grant waits until its
        process has exited. A grant older than the job on its GPUs ends at once, unrun
        (``job.preempted``, fenced). False when the grant must not run. Raises
        ``_LaunchStopped`` when ``launching`` is stopped while it waits."""
        wanted = set(grant.gpu_indices)
        on_them = [run for run in self._runs.values() if wanted & set(run.gpu_indices)]
        holders = [run for run in on_them if run.job.epoch < grant.epoch]
        if any(run.job.epoch > grant.epoch for run in on_them):
            log.warning(
                "allocation %s (epoch %d) is older than the job on its GPUs: not run",
                grant.allocation_id,
                grant.epoch,
            )
            job = JobIdentity.from_grant(grant)
            outcome = domain.Outcome("preempted", "fenced", None)
            payload = domain.terminal_event(
                job, outcome, domain.JobResults({}, None, ""), datetime.now(UTC)
            )
            parent = otel_context.get_current()
            events = JobEvents(self._bus, parent, job.job_id)
            await end_allocation(job, payload, events, self._ledger, inject())
            return False
        for run in holders:
            log.warning(
                "allocation %s wants GPUs %s that allocation %s (epoch %d) still runs on: "
                "stopping it first",
                grant.allocation_id,
                sorted(wanted & set(run.gpu_indices)),
                run.job.allocation_id,
                run.job.epoch,
            )
            run.request_stop(StopRequest("revoked", "fenced"), self.settings.kill_grace_seconds)
        if holders:
            with launching.deadline.platform():  # the platform's queue, not the job's time
                await launching.unless_stopped(asyncio.gather(*(run.exited() for run in holders)))
        return True

    def _free_slot(self) -> int | None:
        taken = set(self._slots.values())
        return next((i for i in range(JOB_SLOTS) if i not in taken), None)

    def _release(self, allocation_id: str) -> None:
        self._slots.pop(allocation_id, None)
        lease = self._leases.pop(allocation_id, None)
        if lease is not None:
            lease.release()
        remove_sandbox(self.settings.sandboxes_dir / launch.sandbox_name(allocation_id))
        if self._cgroups is not None:
            self._cgroups.remove(launch.sandbox_name(allocation_id))

    async def _failed_to_start(
        self,
        job: JobIdentity,
        reason: str,
        events: JobEvents,
        trace_headers: dict[str, str],
        kind: FailureKind,
        node_fault: bool,
    ) -> None:
        """End an allocation whose job could not start, as ``kind`` (``failure_kind``: the
        job's own input is ``user_error``, anything else ``platform_error``), ``node_fault``
        when this node itself is at fault (``counts_against_node``)."""
        log.error("allocation %s could not start: %s", job.allocation_id, reason)
        payload = domain.failed_to_start(
            job, reason, datetime.now(UTC), kind, node_fault=node_fault
        )
        try:
            await end_allocation(job, payload, events, self._ledger, trace_headers)
        finally:
            await asyncio.to_thread(self._release, job.allocation_id)

    async def _launch(
        self,
        grant: AllocationGranted,
        job: JobIdentity,
        prepared: launch.Prepared,
        events: JobEvents,
        trace_headers: dict[str, str],
        deadline: AttemptDeadline,
    ) -> None:
        log_path = launch.job_log_path(self.settings.work_dir, job.job_id, job.allocation_id)
        run = JobRun(
            job,
            events=events,
            ledger=self._ledger,
            store=self._store,
            checkpoint_store=open_store(
                self._store.uri_for(checkpoints.job_prefix(job.job_id)), self.settings.storage
            ),
            sandbox=prepared.sandbox,
            log_path=log_path,
            trace_headers=trace_headers,
            progress_interval_s=self.settings.progress_interval_seconds,
            metrics_batch_points=self.settings.metrics_batch_points,
            metrics_batch_interval_s=self.settings.metrics_batch_seconds,
            log_tail_lines=self.settings.log_tail_lines,
            log_ship_interval_s=self.settings.log_ship_interval_seconds,
            checkpoints_keep=self.settings.checkpoints_keep,
            resumed_from=prepared.resumed_from,
            gpus=len(grant.gpu_indices),
            usage=self._usage,
            gpu_indices=grant.gpu_indices,
            max_output_bytes=self.settings.max_output_bytes,
            max_processes=self.settings.job_max_processes,
            max_checkpoint_bytes=self.settings.max_checkpoint_bytes,
            checkpoint_upload_wait_s=self.settings.checkpoint_upload_wait_seconds,
            disk_limit_bytes=int(self.settings.job_disk_gib * disk_watch.GIB) or None,
            disk_check_interval_s=self.settings.job_disk_check_seconds,
            metrics_points_per_second=self.settings.metrics_points_per_second,
            metrics_max_keys=self.settings.metrics_max_keys,
        )
        try:
            await run.start(prepared.argv, env=prepared.env, ranks=prepared.ranks)
        except Exception as exc:  # whatever stops the spawn, the allocation must still end
            # The program the job's command names, when that is what could not run; else
            # the spawn itself failed on this node.
            problem = launch.spawn_problem(grant.spec, prepared.argv, exc) or NodeFault(
                f"could not start: {exc}"
            )
            await self._failed_to_start(
                job,
                str(problem),
                events,
                trace_headers,
                failure_kind(problem),
                counts_against_node(problem),
            )
            return
        self._runs[job.allocation_id] = run
        try:
            # Said only now that its process exists (a job whose spawn failed never ran),
            # and queued before anything the job itself reports: nothing ran since the spawn.
            said = _started(grant, prepared)
            events.emit(said)
            await asyncio.to_thread(
                self._ledger.spawned,
                job.allocation_id,
                run.pid,
                process_start_time(run.pid) if run.pid is not None else None,
                said.to_json().decode(),
            )
        except Exception as exc:
            # A process the ledger does not know would outlive this runner unkilled (the
            # next one kills only the groups it recorded): it goes now, as the platform's
            # failure (e.g. a full disk), not the job's.
            log.error(
                "allocation %s of job %s: its process could not be recorded; killing it",
                job.allocation_id,
                job.job_id,
                exc_info=exc,
            )
            run.abandon(f"the runner could not record the job's process: {error_text(exc)}")
        finally:
            # Supervised whatever happened since the spawn, and only once the record is
            # written (its end is written after it): a process is never left running
            # unwatched until the runner restarts.
            background.start(
                self._supervise(run, deadline),
                f"the supervision of allocation {job.allocation_id}",
                job.job_id,
                self._supervisors,
            )

    async def _supervise(self, run: JobRun, deadline: AttemptDeadline) -> None:
        try:
            await run.supervise(deadline, self.settings.kill_grace_seconds)
        except Exception:
            # The terminal event stays in the ledger (or the launch does) for the next start.
            log.exception("supervising allocation %s failed", run.job.allocation_id)
        finally:
            self._runs.pop(run.job.allocation_id, None)
            await asyncio.to_thread(self._release, run.job.allocation_id)

    # --- allocation.revoked ------------------------------------------------------------------

    async def on_revoked(self, revoked: AllocationRevoked) -> None:
        launching = self._launches.get(revoked.allocation_id)
        if launching is not None and launching.epoch == revoked.epoch:
            # Its launch is in flight: stopped at the wait it is in (a download, an install)
            # and ended unrun, or, spawning already, the job is stopped as soon as it runs.
            why = revoked.detail or revoked.reason
            launching.stop(StopRequest("revoked", why), revoked.grace_seconds)
            log.info(
                "allocation %s is revoked while it is launched: its launch stops",
                revoked.allocation_id,
            )
            return
        run = self._runs.get(revoked.allocation_id)
        if run is not None:
            if run.job.epoch != revoked.epoch:
                log.warning(
                    "ignoring revocation of allocation %s at epoch %d: it runs at epoch %d",
                    revoked.allocation_id,
                    revoked.epoch,
                    run.job.epoch,
                )
                return
            # The detail (for which job, by which rule, the work lost) is what the job's
            # owner reads in its history; the bare reason when the scheduler gave none.
            why = revoked.detail or revoked.reason
            run.request_stop(StopRequest("revoked", why), revoked.grace_seconds)
            return
        seen = await asyncio.to_thread(self._ledger.get, revoked.allocation_id)
        if seen is not None:
            log.info("allocation %s already ended here: revocation ignored", revoked.allocation_id)
            await publishing.say_again(self._bus, revoked.allocation_id, _stored(seen))
            return
        log.warning(
            "revocation of allocation %s, which never ran here: ending it", revoked.allocation_id
        )
        job = JobIdentity(
            revoked.job_id, revoked.allocation_id, revoked.node_id, revoked.epoch, attempt=0
        )
        outcome = domain.Outcome("preempted", revoked.detail or revoked.reason, None)
        payload = domain.terminal_event(
            job, outcome, domain.JobResults({}, None, ""), datetime.now(UTC)
        )
        parent = otel_context.get_current()
        await end_allocation(
            job, payload, JobEvents(self._bus, parent, job.job_id), self._ledger, inject()
        )

    # --- heartbeats and shutdown -----------------------------------------------------------

    async def heartbeats(self) -> None:
        """Publish a heartbeat every interval until the drain is done, then a last one."""
        hostname = socket.gethostname()
        while True:
            sent_at = datetime.now(UTC)
            beat = RunnerHeartbeat(
                node_id=self.node_id,
                hostname=hostname,
                gpu_flavor=self.settings.gpu_flavor,
                gpu_count=self.gpus.count,
                gpu_names=list(self.gpus.names),
                running_allocations=self.running_allocations(),
                sent_at=sent_at,
                topology=self.settings.topology,
                address=self.settings.address,
            )
            envelope: Envelope[Payload] = Envelope.wrap(
                beat,
                source=domain.SOURCE,
                subject=self.node_id,
                event_id=domain.event_id(self.node_id, "heartbeat", sent_at.isoformat()),
            )
            try:
                await self._bus.publish(
                    envelope, {TTL_HEADER: f"{self.settings.heartbeat_ttl_seconds}s"}
                )
            except Exception as exc:  # a missed heartbeat is not worth crashing the node for
                if infrastructure_fault(exc) is not None:
                    # One line when NATS goes and one when it answers, not one a beat.
                    self._bus.nats_away.failed(exc)
                else:
                    log.warning("heartbeat not published: %s", error_text(exc))
            else:
                self._bus.nats_away.answered()
            if self.drained.is_set():
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self.drained.wait(), timeout=self.settings.heartbeat_interval_seconds
                )

    async def drain_on(self, stop: asyncio.Event) -> None:
        """When ``stop`` is set: stop every job and wait for their ends (module docstring)."""
        try:
            await stop.wait()
            # Launches still waiting (for the object store, an install, another job) end
            # unrun; one spawning finishes, and its job is stopped below. No new one starts.
            for launching in self._launches.values():
                launching.stop(domain.shutdown_stop(), self.settings.drain_timeout_seconds)
            while self._launches:
                await next(iter(self._launches.values())).done.wait()
            runs = self.running()
            if runs:
                log.info(
                    "draining %d jobs (up to %g s)", len(runs), self.settings.drain_timeout_seconds
                )
            for run in runs:
                # The drain is the node's task, not the job's: its lines about the job (and
                # the SIGKILL timer set here) name it only inside the job's scope.
                with job_scope(run.job.job_id):
                    run.request_stop(domain.shutdown_stop(), self.settings.drain_timeout_seconds)
            if self._supervisors:
                await asyncio.wait(set(self._supervisors))
        finally:
            for task in self._supervisors:
                task.cancel()
            if self._cgroups is not None:
                self._cgroups.close()
            self.drained.set()


_T = TypeVar("_T")

_FETCH_RETRY_FIRST_S = 1.0
_FETCH_RETRY_MAX_S = 30.0
"""The back-off between fetches of a launch while the object store is away."""


_HELD_POLL_S = 1.0
"""How often a launch's wait looks at its deadline while the platform holds it up (the
deadline moves meanwhile, maybe from a thread)."""


class _LaunchStopped(Exception):
    """The launch was stopped (``_Launch.stop``) while it waited: it ends unrun."""


@dataclass
class _Launch:
    """A grant being launched (``NodeAgent._launches``)."""

    epoch: int
    gpus: frozenset[int]
    deadline: AttemptDeadline
    """The attempt's ``max_runtime_seconds``, from its grant (``deadline``)."""
    done: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once its job runs, or it ended unrun."""
    revoked: tuple[StopRequest, float] | None = None
    """The first stop asked during the launch (a revocation, the drain, its deadline) and
    its grace."""
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    """Set with ``revoked``: wakes the wait the launch is in."""
    running_on: set[asyncio.Future[object]] = field(default_factory=set)
    """Work in threads the launch stopped waiting for: its slot is freed once it ends."""

    def stop(self, request: StopRequest, grace_s: float) -> None:
        """Stop the launch: the first request is kept."""
        if self.revoked is None:
            self.revoked = (request, grace_s)
        self.stopping.set()

    async def unless_stopped(self, work: Awaitable[_T], *, runs_on: bool = False) -> _T:
        """``work``'s result, or ``_LaunchStopped`` as soon as the launch is stopped (also
        when it was stopped already), its deadline passed included (``max_runtime``, the
        reason naming the phase: ``AttemptDeadline.ran_out``), also when the work is done.
        Work that cannot be interrupted (``runs_on``: a thread) is then kept in
        ``running_on``, whatever it returns handed to ``left_running``; any other is
        cancelled."""
        task = asyncio.ensure_future(work)
        stopper = asyncio.ensure_future(self.stopping.wait())
        try:
            while True:
                if self.deadline.expired():
                    self.stop(StopRequest("max_runtime", self.deadline.ran_out()), 0.0)
                if task.done() or self.stopping.is_set():
                    break
                await asyncio.wait(
                    {task, stopper},
                    timeout=_HELD_POLL_S if self.deadline.held else self.deadline.remaining(),
                    return_when=asyncio.FIRST_COMPLETED,
                )
        except asyncio.CancelledError:
            if not runs_on:
                task.cancel()
            raise
        finally:
            stopper.cancel()
        if not self.stopping.is_set():
            return task.result()
        # Stopped, even if the work is done too: a launch stopped goes no further.
        if runs_on:
            self.running_on.add(task)  # type: ignore[arg-type]
        elif task.done():
            _ = task.cancelled() or task.exception()  # retrieved: it is of no use now
        else:
            task.cancel()
        raise _LaunchStopped

    async def left_running(self) -> list[object]:
        """Wait for the work in ``running_on``; what it returned (failures left out)."""
        if not self.running_on:
            return []
        await asyncio.wait(self.running_on)
        return [
            work.result()
            for work in self.running_on
            if not work.cancelled() and work.exception() is None
        ]


@dataclass(frozen=True)
class _Recorded:
    """A grant checked and in the ledger."""

    job: JobIdentity
    events: JobEvents
    trace_headers: dict[str, str]
    parent: otel_context.Context


@dataclass(frozen=True)
class _Accepted(_Recorded):
    """A grant checked and in the ledger, its launch to come."""

    grant: AllocationGranted


def _started(grant: AllocationGranted, prepared: launch.Prepared) -> Envelope[Payload]:
    started = JobStarted(
        job_id=grant.job_id,
        allocation_id=grant.allocation_id,
        node_id=grant.node_id,
        attempt=grant.attempt,
        epoch=grant.epoch,
        started_at=datetime.now(UTC),
        code_version=prepared.code_version,
        environment=prepared.environment,
        spec=grant.spec,
        resumed_from=prepared.resumed_from.uri if prepared.resumed_from else None,
    )
    return Envelope.wrap(
        started,
        source=domain.SOURCE,
        subject=grant.job_id,
        event_id=domain.event_id(grant.allocation_id, "started"),
    )


def _stored(entry: LedgerEntry) -> list[publishing.Said]:
    """What the ledger kept of what this node said about an allocation (its start and its
    end, where there are), in its trace."""
    parent = extract(entry.trace_headers)
    return [(parse_envelope(said.encode()), parent) for said in entry.said()]

"""Everything decided before a job process starts: whether it can run here, its sandbox,
code, environment and checkpoint to resume from, its command and its environment.

The job's environment is built from nothing, never from the runner's: no object-store
keys, no bus or database URL, nothing of ``TRAINYARD_*`` but the job's own runtime
variables. It holds:

- ``PATH`` (the job environment's ``bin`` first), ``HOME``, ``TMPDIR``, ``USER``, ``LANG``;
- the variables an operator lets through by name (``job_env_passthrough``, e.g.
  ``LD_LIBRARY_PATH`` or ``NCCL_SOCKET_IFNAME``), never ``TRAINYARD_*`` ones;
- the ``shared.control.JobRuntimeEnv`` variables: job, allocation, attempt, seed,
  hyperparameters, dataset, GPUs, the staging checkpoint folder and the control socket;
- ``CUDA_VISIBLE_DEVICES`` (and ``CUDA_DEVICE_ORDER``) confining it to its GPUs;
- under a CPU quota, unless the operator lets it through, ``OMP_NUM_THREADS``: the quota's
  whole CPUs per process (per GPU here), at least 1, so PyTorch's and OpenMP's thread pools
  fit the quota instead of being throttled by it;
- ``PYTHONUNBUFFERED=1`` and ``PYTHONNOUSERSITE=1``, and ``TRACEPARENT`` with the job's
  trace for code that wants to continue it.

The command: ``python -m <module>`` or ``python <script.py>`` (inside the code), or the
spec's ``command``; under ``torchrun`` when the job has more than one process (several GPUs
here, or a gang of nodes): ``--standalone`` on one node, else a static rendezvous at rank
0's node (``gang[0].address``) on ``rendezvous_port``, with this node's ``--node_rank``.
Under ``torchrun`` each process starts through ``rank_argv``: ``/bin/sh`` points its stdout
and stderr at its local rank's named pipe in the sandbox (``process.RankPipes``), then
execs the program (the same process, pid and signals as without it); the runner prefixes
each of its lines with its global rank (``ranks``).

Two steps, both blocking (run them in a thread), both raising ``PlatformError`` when the job
cannot be started (a ``NodeFault`` when this node itself failed, which alone counts towards
its cordon; a ``JobInputError`` when the job's spec is surely at fault): ``fetch`` first
refuses requirements the runner would never install (``check_requirements``), before it
makes a sandbox or downloads anything, then takes what comes from the object store (the sandbox, with the
attempt's cgroup and its memory limit where the node has cgroups, the code, the checkpoint
to resume from; an unreachable store raises as it is, and the agent's launch waits it
out and fetches again), ``prepare`` the rest (the environment, built in minutes maybe, and the job's
command and variables). The job's disk limit holds from the moment its sandbox exists: each
step runs its work in the sandbox under a ``disk_watch.Watch``, which kills the job's
processes (git, the interpreter's probe) once the sandbox is over the limit, and a sandbox
over it when the step ends fails the job as ``user_error`` (``DiskLimitExceeded``), naming
the limit as the running job's watch does.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from trainyard_platform.services.runner import checkpoints, disk_watch, netns
from trainyard_platform.services.runner.cgroups import (
    JobCgroup,
    NodeCgroups,
    cpu_limit,
    memory_limit,
)
from trainyard_platform.services.runner.config import Settings
from trainyard_platform.services.runner.deadline import platform_time
from trainyard_platform.services.runner.domain import TORCHRUN_MODULE
from trainyard_platform.services.runner.environments import (
    EnvironmentBuildError,
    EnvironmentCache,
    EnvironmentLease,
    InstallError,
    JobEnvironment,
    RequirementsError,
    normalize_requirement,
)
from trainyard_platform.services.runner.git_remote import (
    HostNotFound,
    HostUnresolved,
    PrivateAllowed,
    RemoteRefused,
    Resolver,
    judged_addresses,
)
from trainyard_platform.services.runner.gpus import GpuInventory
from trainyard_platform.services.runner.ledger import safe_file_name
from trainyard_platform.services.runner.node_faults import node_fault
from trainyard_platform.services.runner.provenance import (
    ENTRYPOINT_PATTERN,
    capture_environment,
    code_version,
    packages_digest,
)
from trainyard_platform.services.runner.sandbox import (
    AsJob,
    JobInputError,
    JobUser,
    NodeFault,
    PlatformError,
    Sandbox,
    create_sandbox,
    fetch_code,
    kill_leftovers,
    remove_leftovers_of,
)
from trainyard_platform.services.runner.sandbox import hand_over as hand_over_sandbox
from trainyard_platform.shared.bus import infrastructure_fault
from trainyard_platform.shared.control import JobRuntimeEnv
from trainyard_platform.shared.events.payloads import (
    AllocationGranted,
    CheckpointRef,
    Environment,
    JobSpec,
)
from trainyard_platform.shared.requirements import wheel_host, without_credentials
from trainyard_platform.shared.storage import ObjectStore, open_store

log = logging.getLogger(__name__)

SCRIPT_PATTERN = re.compile(r"^(?!/)(?!.*(^|/)\.\.(/|$))[A-Za-z0-9_./-]+\.py$")
JOB_PATH = "/usr/local/bin:/usr/bin:/bin"
RENDEZVOUS_PORTS = range(29500, 30500)


@dataclass(frozen=True)
class Fetched:
    """What a job has from the object store, in its sandbox."""

    sandbox: Sandbox
    code_id: str | None
    """The code's identity (``sha256:...``, ``git:<commit>``), None when the spec names none."""
    resumed_from: CheckpointRef | None


@dataclass(frozen=True)
class Prepared:
    """A job ready to spawn."""

    sandbox: Sandbox
    argv: list[str]
    env: dict[str, str]
    resumed_from: CheckpointRef | None
    code_version: str
    environment: Environment
    environment_lease: EnvironmentLease
    """Keeps the job's environment from being pruned: release it when the job has ended."""
    ranks: tuple[int, ...] = ()
    """The global ranks of this node's processes by local rank (``ranks``); empty for a job
    of one process."""


def cannot_run(grant: AllocationGranted, gpus: GpuInventory) -> PlatformError | None:
    """Why ``grant`` can never run on this node, or None: a ``JobInputError`` naming the
    spec field when its spec is at fault (it would fail the same way anywhere), a
    ``PlatformError`` when it asks for what this node does not offer (a container image: no
    executor; not held against the node, as the job chose it), a ``NodeFault`` for GPU
    indices the node lacks (its GPUs went away since it said it had them)."""
    spec = grant.spec
    if spec.command:
        if spec.entrypoint:
            return JobInputError("spec.command: the spec names both an entrypoint and a command")
    elif not spec.entrypoint:
        return JobInputError("spec.entrypoint: the spec names neither an entrypoint nor a command")
    elif not (ENTRYPOINT_PATTERN.match(spec.entrypoint) or SCRIPT_PATTERN.match(spec.entrypoint)):
        return JobInputError(
            f"spec.entrypoint: {spec.entrypoint!r} is neither a dotted module nor a .py path"
        )
    if spec.image is not None:
        return PlatformError("this runner has no container executor configured for image jobs")
    invalid = gpus.invalid_indices(grant.gpu_indices)
    return NodeFault(invalid) if invalid is not None else None


def spawn_problem(spec: JobSpec, argv: list[str], exc: BaseException) -> PlatformError | None:
    """What the failed spawn of ``argv`` (``exc``) says of the job's ``spec.command``, when
    the program it runs is the one the command names and that program could not be run:

    - a ``JobInputError`` when it is a file of the job's own code (a relative path with a
      ``/``: ``./train.sh``, ``scripts/run.sh``) that cannot be executed (missing, not
      executable, its ``#!`` interpreter missing): the same code fails so on every node;
    - a ``PlatformError`` naming the field (retried, never held against the node) when it
      is a bare name looked up on the node's ``PATH`` or an absolute path: a node may lack
      what another has, but which program to run is the tenant's choice, and a name no node
      has must not take nodes out of service.

    None otherwise (the spawn itself failed: this node's fault), an entrypoint's interpreter
    included, which is the platform's."""
    program = spec.command[0] if spec.command else None
    if (
        program is None
        or not isinstance(exc, OSError)
        or argv[:1] != [program]
        or exc.filename != program
    ):
        return None
    if program.startswith("/") or "/" not in program:
        where = "an absolute path" if program.startswith("/") else f"looked up on PATH {JOB_PATH}"
        return PlatformError(
            f"spec.command: {program!r} cannot be run on this node: {exc.strerror} ({where}, "
            "after the job environment's bin; a program the node lacks is retried, maybe on "
            "another node)"
        )
    hint = {
        errno.EACCES: " (make it executable, chmod +x, or run it with its interpreter: "
        f'["sh", "{program}"])',
        errno.ENOENT: " (no such file in the job's code, or its #! interpreter does not exist)",
        errno.ENOEXEC: " (not a program: give it a #! line, or run it with its interpreter)",
    }.get(exc.errno or 0, "")
    return JobInputError(f"spec.command: {program!r} cannot be run: {exc.strerror}{hint}")


class RequirementsUnmet(JobInputError):
    """The job cannot start because of its own ``requirements`` (a package or version that
    does not exist, no wheel, a conflict, a provided package at another version than the
    base's): it never ran, but by its own fault, so it fails as ``user_error``."""


def fetch(
    grant: AllocationGranted,
    settings: Settings,
    store: ObjectStore,
    user: JobUser,
    cgroups: NodeCgroups | None = None,
    node_gpus: int = 1,
) -> Fetched:
    """A fresh sandbox for ``grant`` run as ``user``, in a cgroup of its own when the node
    has ``cgroups`` (``job_cgroup``; this node has ``node_gpus`` GPUs), with the job's code
    and the checkpoint its grant says to resume from; ``RequirementsUnmet`` before any of them for a
    requirement the runner refuses (``check_requirements``)."""
    check_requirements(grant.spec.requirements, settings.fetch_private_allowed)
    try:
        # This node's own work, the last job's leftovers removed (as many files as it
        # made): the platform's time, not the job's (``deadline``).
        with platform_time():
            if user.uid is not None:
                # The slot's uid starts clean, however its last job ended (one whose start
                # failed after its interpreter was probed as this uid included).
                uid = range(user.uid, user.uid + 1)
                kill_leftovers(uid, [])
                remove_leftovers_of(uid)
            cgroup = job_cgroup(grant, settings, cgroups, node_gpus)
            box = create_sandbox(
                settings.sandboxes_dir,
                sandbox_name(grant.allocation_id),
                user,
                cgroup,
                own_network(grant, settings, user),
            )
    except PlatformError:
        raise
    except Exception as exc:  # nothing of the job's is used yet: this node's own failure
        if node_fault(exc) is not None:
            raise  # said as the node's disk or files (``node_faults``), which counts too
        raise NodeFault(f"could not make the job's sandbox on this node: {exc}") from exc
    # What the job asked for: its failures say whose fault they are (``sandbox``).
    with within_disk_limit(box, settings):
        code_id = fetch_code(
            grant.spec, store, box, settings.job_max_processes, settings.fetch_private_allowed
        )
        resumed = resume_from(grant, settings, store, box.checkpoints)
    return Fetched(box, code_id, resumed)


class DiskLimitExceeded(JobInputError):
    """The job's sandbox went over its disk limit (``job_disk_gib``, ``disk_watch``) before
    the job started: what its spec named (its code, its checkpoint, its environment's
    interpreter) took more than the job may hold. It fails as ``user_error``, the limit
    named, as a running job over it does."""


@contextlib.contextmanager
def within_disk_limit(box: Sandbox, settings: Settings) -> Iterator[None]:
    """Run the block, a step before the job starts that writes to ``box``, under the job's
    disk limit (``job_disk_gib``; 0: none): the sandbox is measured every
    ``job_disk_check_seconds`` meanwhile (``disk_watch.Watch``) and once more at the end,
    and every process of the job's user is killed once it is over the limit. Raises
    ``DiskLimitExceeded`` then, in place of whatever the block raised (git killed, say)."""
    limit = int(settings.job_disk_gib * disk_watch.GIB)
    if not limit:
        yield
        return
    uid = box.user.uid

    def stop() -> None:
        if uid is not None:
            kill_leftovers(range(uid, uid + 1), [])

    failed: Exception | None = None
    with disk_watch.Watch([box.root], limit, settings.job_disk_check_seconds, stop) as watch:
        try:
            yield
        except Exception as exc:
            failed = exc
    why = watch.over()
    if why is not None:
        raise DiskLimitExceeded(f"before the job started, {why}") from None
    if failed is not None:
        raise failed


def check_requirements(
    requirements: Sequence[str], allowed: PrivateAllowed, resolver: Resolver | None = None
) -> None:
    """``RequirementsUnmet`` (``user_error``) naming the first of ``requirements`` the
    runner would refuse to install, by its place in the spec: one ``shared.requirements``
    refuses (by ``normalize_requirement``: an installer option, a local path, a ``file:``
    URL, a URL that is no wheel's), and a wheel URL whose host is, or resolves to, an
    address that is neither public nor ``allowed`` (``git_remote.judged_addresses``, the
    judgement of a job's git code: the runner downloads it in the host's network, so it
    would ask the node's own services for the tenant, and the error would come back in
    the job's failure reason; the download judges the address again, and connects to the
    one it judged: ``wheels``), or that does not exist (``git_remote.HostNotFound``). A
    wheel host the resolver fails to look up is the platform's (``PlatformError``), as a
    repository's is. Checked before the job's code or checkpoint
    is downloaded, since a grant may come from an old job or another producer than the API,
    which refuses the rest and a URL written with an address that is not public."""
    for index, requirement in enumerate(requirements):
        field = f"spec.requirements[{index}]"
        try:
            normalize_requirement(requirement)
            located = wheel_host(requirement)
        except ValueError as exc:
            raise RequirementsUnmet(
                f"{field}: {exc} (refused before the job's code was downloaded)"
            ) from None
        if located is None:
            continue
        shown = without_credentials(requirement)
        try:
            judged_addresses(*located, allowed, "wheels", resolver)
        except RemoteRefused as exc:
            raise RequirementsUnmet(
                f"{field}: requirement {shown!r}: a URL {exc} (refused before the job's code "
                "was downloaded)"
            ) from None
        except HostNotFound as exc:
            raise RequirementsUnmet(
                f"{field}: requirement {shown!r}: {exc} (refused before the job's code was "
                "downloaded)"
            ) from None
        except HostUnresolved as exc:
            raise PlatformError(
                f"{field}: resolving the host of {shown!r} before installing: {exc}"
            ) from None


def own_network(grant: AllocationGranted, settings: Settings, user: JobUser) -> bool:
    """Whether the job runs in a network of its own, holding only its loopback (``netns``):
    when the node's setting asks for it (``job_network`` ``loopback``), the job runs on this
    node alone (a gang across nodes must reach its other nodes) as a user of its own, and
    this runner can make one (``netns.available``; it said so at its start otherwise)."""
    return (
        settings.job_network == "loopback"
        and len(grant.gang) <= 1
        and user.isolated
        and netns.available()
    )


def resume_from(
    grant: AllocationGranted, settings: Settings, store: ObjectStore, staging: Path
) -> CheckpointRef | None:
    """Stage in ``staging`` exactly the checkpoint the grant names (``grant.resume``,
    ``checkpoints.stage_resume``), its folder marked resumed by the grant's attempt, and
    return it; None when it names none (the job starts from nothing, whatever the store
    holds under its prefix). A ``JobInputError``, raised before the job runs and never held
    against the node: ``CheckpointRefused`` when that checkpoint is not the one the job
    committed (missing, other bytes, another job's), and one naming both sizes when it is
    larger than the job's disk allowance (``job_disk_gib``; 0: none), before its download:
    restored, it would fill the sandbox before the job ran, and no node with that allowance
    could hold it."""
    limit = int(settings.job_disk_gib * disk_watch.GIB) or None
    try:
        # The object store's time is the platform's, not the job's (``deadline``).
        with platform_time():
            return checkpoints.stage_resume(
                open_store(store.uri_for(checkpoints.job_prefix(grant.job_id)), settings.storage),
                grant.resume,
                staging,
                limit,
                job_id=grant.job_id,
                attempt=grant.attempt,
            )
    except checkpoints.ResumeTooLarge as exc:
        raise JobInputError(
            f"checkpoint: the job's checkpoint of step {exc.step}, to resume from, is "
            f"{disk_watch.gib(exc.size_bytes)} ({exc.size_bytes} bytes as committed), over "
            f"its disk limit of {disk_watch.gib(exc.max_bytes)} ({exc.max_bytes} bytes, "
            f"{disk_watch.SETTING}): not downloaded"
        ) from None
    except checkpoints.ResumeRefused as exc:
        raise CheckpointRefused(
            f"checkpoint: the job's checkpoint of step {exc.ref.step} to resume from "
            f"({exc.ref.uri}) was refused: {exc.why}. It is not loaded, and no other "
            "checkpoint is taken in its place; submit the job again to start it afresh"
        ) from None
    except Exception as exc:
        if infrastructure_fault(exc) is not None:
            raise  # the store away: the grant comes again
        # What is left is the store refusing this node (its credentials) or this node's disk.
        raise NodeFault(f"could not fetch the job's checkpoint to resume from: {exc}") from exc


class CheckpointRefused(JobInputError):
    """The checkpoint the grant says to resume from is not what the job committed: it is
    missing from the store or has other bytes (another node overwrote or deleted it), or is
    no checkpoint of the job's own. The job fails before it runs, as ``user_error`` (a new
    attempt would be refused the same way), with this reason in its ``job.failed``: it
    neither loads bytes the job never wrote nor drops its progress unsaid."""


def job_cgroup(
    grant: AllocationGranted, settings: Settings, cgroups: NodeCgroups | None, node_gpus: int
) -> JobCgroup | None:
    """The attempt's cgroup (None when the node has none): memory limited by
    ``cgroups.memory_limit`` (the job's ``memory_gib_per_gpu`` x its GPUs here, else the
    node's default), processes by ``job_max_processes``, CPU by ``cgroups.cpu_limit`` (the
    job's ``cpus_per_gpu`` x its GPUs here, else the node's default), and on a node whose
    GPUs are confined the device files of GPUs other than its own. Its folder is named like the
    sandbox, so the runner removes both by the allocation's id. Raises ``PlatformError``
    when it cannot be made."""
    if cgroups is None:
        return None
    limit = memory_limit(
        grant.spec.memory_gib_per_gpu,
        len(grant.gpu_indices),
        settings.job_memory_gib_per_gpu,
        cgroups.memory_bytes(),
        node_gpus,
    )
    cpu = cpu_limit(
        grant.spec.cpus_per_gpu,
        len(grant.gpu_indices),
        settings.job_cpus_per_gpu,
        cgroups.cpus(),
        node_gpus,
        cgroups.cpu_ceiling(),
    )
    try:
        cgroup = cgroups.create(
            sandbox_name(grant.allocation_id),
            limit,
            settings.job_max_processes,
            cpu,
            grant.gpu_indices,
        )
    except OSError as exc:
        raise NodeFault(f"could not create the job's cgroup: {exc}") from exc
    log.info(
        "job %s: memory limit %s",
        grant.job_id,
        limit.describe()
        if limit is not None
        else "none (TRAINYARD_RUNNER_JOB_MEMORY_GIB_PER_GPU 0)",
    )
    if cgroups.limits_cpu:
        log.info(
            "job %s: CPU limit %s",
            grant.job_id,
            cpu.describe() if cpu is not None else "none (TRAINYARD_RUNNER_JOB_CPUS_PER_GPU 0)",
        )
    return cgroup


def prepare(
    grant: AllocationGranted,
    settings: Settings,
    fetched: Fetched,
    gpus: GpuInventory,
    environments: EnvironmentCache,
    trace_headers: Mapping[str, str],
) -> Prepared:
    """The job's environment (built when not cached), its command and its variables."""
    spec = grant.spec
    try:
        # Held until the job ends (Prepared.environment_lease): the cache is pruned after
        # every build, and an environment in use is never removed. The team's use is
        # recorded: a prune evicts the environments of the team holding the most first.
        lease = environments.acquire(spec.requirements, spec.team)
    except (RequirementsError, ValueError) as exc:  # ValueError: a bad requirement
        raise RequirementsUnmet(
            f"{requirements_field(spec.requirements, exc)}: could not build the job's "
            f"environment: {exc}"
        ) from exc
    except InstallError as exc:  # what the requirements are is the tenant's choice
        raise PlatformError(
            f"{requirements_field(spec.requirements, exc)}: could not install the job's "
            f"requirements: {exc}"
        ) from exc
    except EnvironmentBuildError as exc:
        raise NodeFault(f"could not build the job's environment: {exc}") from exc
    try:
        with within_disk_limit(fetched.sandbox, settings):
            return _prepared(grant, settings, gpus, fetched, lease, trace_headers)
    except BaseException:
        lease.release()
        raise


def requirements_field(requirements: Sequence[str], exc: Exception) -> str:
    """The field a failure to build the environment of ``requirements`` is about:
    ``spec.requirements[i]`` when it names one requirement (a wheel URL that could not be
    downloaded: ``EnvironmentBuildError.requirement``, normalised), else
    ``spec.requirements``."""
    named = exc.requirement if isinstance(exc, EnvironmentBuildError) else None
    if named is not None:
        for index, requirement in enumerate(requirements):
            with contextlib.suppress(ValueError):
                if normalize_requirement(requirement) == named:
                    return f"spec.requirements[{index}]"
    return "spec.requirements"


def _prepared(
    grant: AllocationGranted,
    settings: Settings,
    gpus: GpuInventory,
    fetched: Fetched,
    lease: EnvironmentLease,
    trace_headers: Mapping[str, str],
) -> Prepared:
    box, code_id = fetched.sandbox, fetched.code_id
    spec, user, job_env = grant.spec, box.user, lease.env
    log.info(
        "job %s: environment %s (%d requirements) %s",
        grant.job_id,
        job_env.key[:12],
        len(spec.requirements),
        "cached" if job_env.cached else f"built in {job_env.seconds:.1f} s",
    )
    hand_over_sandbox(box)
    env = job_env_vars(
        grant,
        box,
        job_env,
        passthrough=settings.job_env_passthrough,
        gpus=gpus,
        trace_headers=trace_headers,
    )
    probe_dir = box.code if spec.code is not None else settings.code_dir
    environment = capture_environment(
        python=job_env.python,
        code_dir=probe_dir,
        node_id=settings.node_id,
        gpu_flavor=settings.gpu_flavor,
        gpus=gpus,
        gpu_indices=grant.gpu_indices,
        as_job=AsJob(
            user,
            env,
            max_processes=settings.job_max_processes,
            cgroup=box.cgroup,
            own_network=box.own_network,
        ),
        code_is_jobs=spec.code is not None,
        topology=settings.topology,
    ).model_copy(
        update={
            "packages": job_env.packages,
            "packages_sha256": packages_digest(job_env.packages),
            "environment_key": job_env.key,
            "code_sha256": spec.code.sha256 if spec.code and spec.code.kind == "bundle" else None,
        }
    )
    return Prepared(
        sandbox=box,
        argv=job_argv(
            job_env.python,
            grant,
            rendezvous_port(grant.job_id, grant.attempt),
            box.rank_output,
        ),
        env=env,
        resumed_from=fetched.resumed_from,
        code_version=code_id or code_version(settings.code_dir, spec.entrypoint),
        environment=environment,
        environment_lease=lease,
        ranks=ranks(grant),
    )


def sandbox_name(allocation_id: str) -> str:
    """A short, safe folder name for an allocation's sandbox."""
    return hashlib.sha256(allocation_id.encode()).hexdigest()[:16]


def program(python: str, spec: JobSpec) -> list[str]:
    """What runs, without a launcher: the module, the script, or the command."""
    if spec.command:
        return [*spec.command, *spec.args]
    if SCRIPT_PATTERN.match(spec.entrypoint):
        return [python, spec.entrypoint, *spec.args]
    return [python, "-m", spec.entrypoint, *spec.args]


RANK_OUTPUT_SCRIPT = (
    'f="$1/${LOCAL_RANK-}"; shift; if [ -p "$f" ]; then exec >"$f" 2>&1; fi; exec "$@"'
)
"""Run by ``/bin/sh`` for each process torchrun starts: its output to its local rank's pipe
(torchrun sets ``LOCAL_RANK``), then the program in its place. No pipe there (never, but
for a launcher that sets no ``LOCAL_RANK``): the output stays on the shared pipe."""


def rank_argv(folder: Path, program: Sequence[str]) -> list[str]:
    """``program`` with its output going to its local rank's pipe in ``folder``."""
    return ["/bin/sh", "-c", RANK_OUTPUT_SCRIPT, "trainyard-rank-output", str(folder), *program]


def ranks(grant: AllocationGranted) -> tuple[int, ...]:
    """The global ranks of this node's processes, by local rank (torchrun numbers a node's
    processes from its gang member's ``first_rank``); empty for a job of one process, which
    runs without torchrun."""
    procs = max(1, len(grant.gpu_indices))
    if procs == 1 and len(grant.gang) <= 1:
        return ()
    first = next((m.first_rank for m in grant.gang if m.allocation_id == grant.allocation_id), 0)
    return tuple(range(first, first + procs))


def job_argv(python: str, grant: AllocationGranted, port: int, rank_output: Path) -> list[str]:
    """The job's command line (see the module docstring for when ``torchrun`` is used);
    under torchrun, each process's output goes to its pipe in ``rank_output``."""
    spec = grant.spec
    procs = len(ranks(grant))
    if not procs:
        return program(python, spec)
    launcher = [python, "-m", TORCHRUN_MODULE, f"--nproc_per_node={procs}"]
    if len(grant.gang) <= 1:
        launcher.append("--standalone")
    else:
        rank = next(i for i, m in enumerate(grant.gang) if m.allocation_id == grant.allocation_id)
        launcher += [
            f"--nnodes={len(grant.gang)}",
            f"--node_rank={rank}",
            f"--master_addr={grant.gang[0].address}",
            f"--master_port={port}",
        ]
    # What torchrun itself would run for a module or a script: ``python -u``.
    if spec.command:
        each = [*spec.command]
    elif SCRIPT_PATTERN.match(spec.entrypoint):
        each = [python, "-u", spec.entrypoint]
    else:
        each = [python, "-u", "-m", spec.entrypoint]
    return [*launcher, "--no-python", *rank_argv(rank_output, [*each, *spec.args])]


def rendezvous_port(job_id: str, attempt: int, ports: range = RENDEZVOUS_PORTS) -> int:
    """The port rank 0 listens on, the same on every node of the gang without talking:
    derived from the job and attempt (a restarted gang does not meet its predecessor)."""
    digest = hashlib.sha256(f"{job_id}:{attempt}".encode()).digest()
    return ports[int.from_bytes(digest[:4], "big") % len(ports)]


def job_env_vars(
    grant: AllocationGranted,
    box: Sandbox,
    job_env: JobEnvironment,
    *,
    passthrough: list[str],
    gpus: GpuInventory,
    trace_headers: Mapping[str, str],
    base: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The job's environment (see the module docstring); ``base`` is the runner's."""
    runner_env = os.environ if base is None else base
    path = JOB_PATH if job_env.bin_dir is None else f"{job_env.bin_dir}:{JOB_PATH}"
    env = {
        name: runner_env[name]
        for name in passthrough
        if name in runner_env and not name.startswith("TRAINYARD_")
    }
    env.update(
        {
            "PATH": path,
            "HOME": str(box.home),
            "TMPDIR": str(box.tmp),
            "USER": "trainyard-job",
            "LOGNAME": "trainyard-job",
            "LANG": "C.UTF-8",
            "PYTHONUNBUFFERED": "1",
            "PYTHONNOUSERSITE": "1",
        }
    )
    env.update(
        JobRuntimeEnv(
            job_id=grant.job_id,
            allocation_id=grant.allocation_id,
            attempt=grant.attempt,
            seed=grant.spec.seed,
            hyperparameters=grant.spec.hyperparameters,
            checkpoint_uri=box.checkpoints.as_uri(),
            control_socket=str(box.control_socket),
            dataset=grant.spec.dataset,
            gpu_indices=grant.gpu_indices,
        ).to_env()
    )
    env.update(gpus.job_env(grant.gpu_indices))
    quota = box.cgroup.cpu if box.cgroup is not None else None
    if quota is not None and "OMP_NUM_THREADS" not in env:
        # Each process (one per GPU here, under torchrun) computes on its share of the quota:
        # more threads than that are throttled by the kernel, not sped up.
        share = quota.cpus / max(len(grant.gpu_indices), 1)
        env["OMP_NUM_THREADS"] = str(max(1, int(share)))
    if "traceparent" in trace_headers:
        env["TRACEPARENT"] = trace_headers["traceparent"]  # the W3C environment carrier
    return env


def job_log_path(work_dir: Path, job_id: str, allocation_id: str) -> Path:
    """``<work_dir>/jobs/<job>/<allocation>.log`` (ids made safe as file names)."""
    return work_dir / "jobs" / safe_file_name(job_id) / f"{safe_file_name(allocation_id)}.log"

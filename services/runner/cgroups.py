"""Control groups of job attempts: a memory limit (swap included), a process limit and a
CPU quota the kernel enforces on every process of an attempt, so a job that allocates
without end is killed in its own cgroup instead of the host's OOM killer picking a
neighbour (another team's job, the runner, its ledger), and a job that starts more threads
than it declared CPUs is throttled instead of slowing its neighbours; on a node with real
GPUs, the device files of the GPUs an attempt was not allocated are closed to it.

Where. A root runner gives each attempt a cgroup of its own,
``<own>/trainyard/<node>.<first job uid>/<sandbox name>`` (``runner_folder``), below the
runner's own cgroup in each hierarchy
that carries a controller it uses: nested runners, a systemd unit's or a CI job's cgroup
keep theirs. Each controller is taken where the host mounts it (``find_controllers``, from
``/proc/self/mountinfo`` and ``/proc/self/cgroup``): cgroup v1 (a hierarchy per controller:
``memory.limit_in_bytes``, and ``memory.memsw.limit_in_bytes`` the same so swap adds nothing,
else ``memory.swappiness`` 0; ``pids.max``; ``cpu.cfs_period_us`` and ``cpu.cfs_quota_us``)
or cgroup v2 (``memory.max``, ``memory.swap.max`` 0 where it exists, ``pids.max``,
``cpu.max``). GPU device files: only with the v1 ``devices`` controller (``devices.deny``
``c 195:<minor> rwm`` for each of the node's GPUs the attempt was not allocated, so
``nvidiactl``, ``nvidia-uvm`` and its own GPUs stay open); cgroup v2 would need an eBPF
device program, which the runner does not have. A host with both (v1 memory beside a
cgroup2 mount) uses each controller where it is. On v2 the controllers are enabled for the children of the
runner's cgroup (``cgroup.subtree_control``); a cgroup with processes of its own cannot
have that, so the runner first moves itself into a leaf beside the jobs',
``<own>/trainyard-runner``.

When. Every process run as the job enters the attempt's cgroup before it runs anything
of the job's (``sandbox.job_preexec`` writes ``cgroup.procs`` while still root, then drops
to the job's user): the probe of its interpreter, git fetching its code, the job itself and
whatever they start. The cgroup is removed when the attempt ended (``JobCgroup.remove``,
which kills whatever is still in it first). Left over from a runner that died, the node's
cgroups are removed when the next one starts (``NodeCgroups.detect``).

Not usable (the runner is not root, the host has no memory controller, the cgroup file
system is read-only): ``NodeCgroups.detect`` logs one warning and returns None, and jobs run
without these limits, as the runner's readiness does not depend on them. The cpu controller
alone missing or not writable: one warning, and jobs run with memory and process limits but
no CPU quota. On a node with real GPUs, the devices controller missing (a cgroup v2 host) or
not writable: one warning, and a job that unsets ``CUDA_VISIBLE_DEVICES`` can open the
node's other GPUs.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from trainyard_platform.services.runner.domain import MemoryEvidence

log = logging.getLogger(__name__)

CONTROLLERS = ("memory", "pids", "cpu", "devices")
"""The controllers jobs are limited by (``devices``: cgroup v1 only)."""
OPTIONAL = frozenset({"cpu", "devices"})
"""Controllers jobs go without (one warning) where the host lacks them or they cannot be set
up, the others still used."""
CPU_PERIOD_US = 100_000
"""The period a CPU quota is counted over (the kernel's default, 0.1 s)."""
NVIDIA_MAJOR = 195
"""The char major number of NVIDIA's device files: ``/dev/nvidia<minor>`` is a GPU, 255 is
``nvidiactl`` (``nvidia-uvm`` has a major of its own)."""
RUNNER_LEAF = "trainyard-runner"
"""On cgroup v2, the leaf the runner moves itself into (below its own cgroup)."""
GIB = 1024**3


@dataclass(frozen=True)
class Hierarchy:
    """Where one controller is: the cgroup version and the runner's own cgroup in it."""

    version: Literal[1, 2]
    own: Path


def _unescape(field: str) -> str:
    # mountinfo writes space, tab, newline and backslash as octal escapes.
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def find_controllers(mountinfo: str, proc_cgroup: str) -> dict[str, Hierarchy]:
    """For each of ``CONTROLLERS`` this process can use, where it is: ``mountinfo`` is the
    text of ``/proc/self/mountinfo`` and ``proc_cgroup`` of ``/proc/self/cgroup``. A v1
    hierarchy carries the controllers its mount options name; the v2 one those its
    ``cgroup.controllers`` (in the runner's own cgroup, read from disk) lists. A mount that
    does not reach the process's own cgroup (it shows another part of the tree) is passed
    over."""
    v1_paths: dict[str, str] = {}
    v2_path: str | None = None
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        ident, names, path = parts
        if ident == "0" and names == "":
            v2_path = path
        else:
            for name in names.split(","):
                v1_paths[name] = path
    found: dict[str, Hierarchy] = {}
    v2: list[Path] = []
    for line in mountinfo.splitlines():
        mine, _, theirs = line.partition(" - ")
        fields, rest = mine.split(), theirs.split()
        if len(fields) < 5 or len(rest) < 3:
            continue
        root, point, kind, options = _unescape(fields[3]), _unescape(fields[4]), rest[0], rest[2]
        if kind == "cgroup":
            for name in set(options.split(",")) & set(CONTROLLERS):
                own = _below(Path(point), root, v1_paths.get(name))
                if own is not None and name not in found:
                    found[name] = Hierarchy(1, own)
        elif kind == "cgroup2":
            own = _below(Path(point), root, v2_path)
            if own is not None:
                # A runner that moved itself into its leaf (``NodeCgroups._delegate``) still
                # owns the cgroup above it: a later start does not nest one leaf deeper.
                v2.append(own.parent if own.name == RUNNER_LEAF else own)
    for own in v2[:1]:
        try:
            offered = set((own / "cgroup.controllers").read_text().split())
        except OSError:
            continue
        for name in CONTROLLERS:
            if name in offered and name not in found:
                found[name] = Hierarchy(2, own)
    return found


def _below(point: Path, root: str, path: str | None) -> Path | None:
    """The folder of cgroup ``path`` in a hierarchy whose ``root`` is mounted at ``point``."""
    if path is None:
        return None
    if root == "/":
        return point / path.lstrip("/")
    if path == root or path.startswith(root.rstrip("/") + "/"):
        return point / path[len(root) :].lstrip("/")
    return None


@dataclass(frozen=True)
class MemoryLimit:
    """A job attempt's memory limit and where it comes from, for the message that names it."""

    bytes: int
    source: str
    """e.g. ``spec.memory_gib_per_gpu 2 x 2 GPUs``."""

    def describe(self) -> str:
        return f"{format_gib(self.bytes)} ({self.source})"


def format_gib(size: int) -> str:
    gib = size / GIB
    return f"{gib:g} GiB" if gib == round(gib, 2) else f"{gib:.2f} GiB"


def node_memory_bytes() -> int:
    """The host's physical memory."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def cgroup_memory_limit(memory: Hierarchy) -> int | None:
    """The memory limit the runner's own cgroup is under, its ancestors' included (None:
    none): a runner in a container or a unit with a limit must not share out more than it
    has, or its jobs together would bring the OOM killer onto the runner. v1: the
    ``hierarchical_memory_limit`` of ``memory.stat``; v2: the least ``memory.max`` from its
    own cgroup up to the top that has one."""
    limits: list[int] = []
    if memory.version == 1:
        with contextlib.suppress(OSError):
            for line in (memory.own / "memory.stat").read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "hierarchical_memory_limit" and value.strip().isdigit():
                    limits.append(int(value))
    else:
        folder = memory.own
        while (folder / "memory.max").is_file():
            with contextlib.suppress(OSError):
                value = (folder / "memory.max").read_text().strip()
                if value.isdigit():
                    limits.append(int(value))
            folder = folder.parent
    # v1 writes "no limit" as the largest page-aligned number: anything past the host's.
    return min((n for n in limits if n < node_memory_bytes()), default=None)


def memory_limit(
    declared_gib_per_gpu: int,
    gpus: int,
    node_default_gib_per_gpu: float | None,
    node_bytes: int,
    node_gpus: int,
) -> MemoryLimit | None:
    """The memory limit of an attempt holding ``gpus`` GPUs of this node (None: no limit).

    The job's declared ``memory_gib_per_gpu`` x its GPUs here, when it declares one (> 0);
    else the node's default per GPU x its GPUs: ``node_default_gib_per_gpu`` when set (0:
    no limit), unset the node's memory divided by its GPUs (``node_gpus``, at least 1), so
    a job declaring nothing gets its fair share of the node (``node_bytes``: the memory
    the node's jobs share, ``NodeCgroups.memory_bytes``)."""
    count = max(gpus, 1)
    noun = "GPU" if count == 1 else "GPUs"
    if declared_gib_per_gpu > 0:
        return MemoryLimit(
            declared_gib_per_gpu * count * GIB,
            f"spec.memory_gib_per_gpu {declared_gib_per_gpu} x {count} {noun}",
        )
    if node_default_gib_per_gpu is None:
        per_gpu = node_bytes // max(node_gpus, 1)
        why = "the node's memory divided by its GPUs"
    elif node_default_gib_per_gpu == 0:
        return None
    else:
        per_gpu = int(node_default_gib_per_gpu * GIB)
        why = "the node's TRAINYARD_RUNNER_JOB_MEMORY_GIB_PER_GPU"
    return MemoryLimit(
        per_gpu * count,
        f"spec.memory_gib_per_gpu is 0, so {why}, {format_gib(per_gpu)} x {count} {noun}",
    )


@dataclass(frozen=True)
class CpuLimit:
    """A job attempt's CPU quota (in CPUs: 1.5 is one and a half CPUs' time each period) and
    where it comes from."""

    cpus: float
    source: str
    """e.g. ``spec.cpus_per_gpu 4 x 2 GPUs``."""

    @property
    def quota_us(self) -> int:
        """Microseconds of CPU time per ``CPU_PERIOD_US``; at least the kernel's least, 1 ms.
        Rounded down (a float's last bit aside): capped at a parent's quota of 2/3 CPU,
        66667 would be over it and refused."""
        return max(1000, int(self.cpus * CPU_PERIOD_US + 1e-6))

    def describe(self) -> str:
        return f"{self.cpus:g} CPUs ({self.source})"


def node_cpus() -> int:
    """The CPUs this process may run on (its affinity: a runner pinned to some CPUs shares
    out only those)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def cpu_limit(
    declared_cpus_per_gpu: int,
    gpus: int,
    node_default_cpus_per_gpu: float | None,
    node_cpu_count: float,
    node_gpus: int,
    ceiling: float | None = None,
) -> CpuLimit | None:
    """The CPU quota of an attempt holding ``gpus`` GPUs of this node (None: no limit).

    The job's declared ``cpus_per_gpu`` x its GPUs here, when it declares one (> 0); else
    the node's default per GPU x its GPUs: ``node_default_cpus_per_gpu`` when set (0: no
    limit), unset the node's CPUs (``node_cpu_count``) divided by its GPUs (``node_gpus``,
    at least 1), as ``memory_limit`` shares out memory. Never more than ``ceiling``, the
    CPUs of the runner's own cgroup's quota (``NodeCgroups.cpu_ceiling``): cgroup v1 refuses
    a child a quota over its parent's, so an attempt asking more could not start."""
    limit = _cpu_limit(
        declared_cpus_per_gpu, gpus, node_default_cpus_per_gpu, node_cpu_count, node_gpus
    )
    if limit is None or ceiling is None or limit.cpus <= ceiling:
        return limit
    return CpuLimit(
        ceiling, f"{limit.source}, capped at the {ceiling:g} CPUs of the runner's own cgroup"
    )


def _cpu_limit(
    declared_cpus_per_gpu: int,
    gpus: int,
    node_default_cpus_per_gpu: float | None,
    node_cpu_count: float,
    node_gpus: int,
) -> CpuLimit | None:
    count = max(gpus, 1)
    noun = "GPU" if count == 1 else "GPUs"
    if declared_cpus_per_gpu > 0:
        return CpuLimit(
            float(declared_cpus_per_gpu * count),
            f"spec.cpus_per_gpu {declared_cpus_per_gpu} x {count} {noun}",
        )
    if node_default_cpus_per_gpu is None:
        per_gpu = node_cpu_count / max(node_gpus, 1)
        why = "the node's CPUs divided by its GPUs"
    elif node_default_cpus_per_gpu == 0:
        return None
    else:
        per_gpu = node_default_cpus_per_gpu
        why = "the node's TRAINYARD_RUNNER_JOB_CPUS_PER_GPU"
    return CpuLimit(
        per_gpu * count, f"spec.cpus_per_gpu is 0, so {why}, {per_gpu:g} x {count} {noun}"
    )


def cgroup_cpu_limit(cpu: Hierarchy) -> float | None:
    """The CPUs the runner's own cgroup may use by its quota, its ancestors' included (None:
    no quota): the least ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` (v1) or ``cpu.max``
    (v2) from its own cgroup up to the top that has one."""
    limits: list[float] = []
    folder = cpu.own
    name = "cpu.max" if cpu.version == 2 else "cpu.cfs_quota_us"
    while (folder / name).is_file():
        with contextlib.suppress(OSError, ValueError):
            if cpu.version == 2:
                quota, _, period = (folder / name).read_text().strip().partition(" ")
            else:
                quota = (folder / name).read_text().strip()
                period = (folder / "cpu.cfs_period_us").read_text().strip()
            if quota not in ("max", "-1"):
                limits.append(int(quota) / int(period))
        folder = folder.parent
    return min(limits, default=None)


def gpu_device_denials(node_minors: Sequence[int], allocated: Sequence[int]) -> list[str]:
    """The ``devices.deny`` lines of an attempt allocated GPUs ``allocated`` (indices) of a
    node whose GPUs' device files have minors ``node_minors`` (by index): one per GPU it was
    not allocated. What is not denied (its own GPUs, ``nvidiactl``, ``nvidia-uvm``) stays as
    the runner's own cgroup has it."""
    mine = {node_minors[i] for i in allocated if 0 <= i < len(node_minors)}
    return [f"c {NVIDIA_MAJOR}:{minor} rwm" for minor in node_minors if minor not in mine]


def unnarrowable_gpu_rule(own: Path) -> str | None:
    """The rule of v1 devices cgroup ``own`` (its ``devices.list``) that deny rules of single
    GPUs would not narrow, else None. Allowing every device (``a *:* rwm``, a host's
    default), a cgroup takes deny rules as exceptions; with an allowlist (a container's),
    a deny rule only removes the same allow rule, so ``c 195:* rwm`` would stay whole."""
    try:
        text = (own / "devices.list").read_text()
    except OSError:
        return None
    rules = [line.split() for line in text.splitlines() if len(line.split()) == 3]
    if ["a", "*:*", "rwm"] in rules:
        return None
    for kind, number, access in rules:
        major, _, minor = number.partition(":")
        if kind == "a" or (kind == "c" and (major == "*" or (major == "195" and minor == "*"))):
            return f"{kind} {number} {access}"
    return None


@dataclass(frozen=True)
class JobCgroup:
    """The cgroups of one job attempt (one folder per hierarchy it uses)."""

    folders: tuple[Path, ...]
    memory: Hierarchy | None
    """Where the memory controller is (``memory_folder`` is the attempt's folder in it)."""
    memory_folder: Path | None
    limit: MemoryLimit | None
    cpu: CpuLimit | None = None
    """The attempt's CPU quota, where one is set (None: no quota)."""

    @property
    def procs_files(self) -> tuple[bytes, ...]:
        """The ``cgroup.procs`` files a process writes ``0`` to, to join the attempt."""
        return tuple(os.fsencode(folder / "cgroup.procs") for folder in self.folders)

    def _memory_counters(self, name: str) -> dict[str, int] | None:
        """The ``key value`` lines of the attempt's memory file ``name`` (None: unreadable)."""
        if self.memory_folder is None:
            return None
        try:
            text = (self.memory_folder / name).read_text()
        except OSError:
            return None
        counters: dict[str, int] = {}
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if value.strip().isdigit():
                counters[key] = int(value)
        return counters

    def _count(self, name: str) -> int | None:
        """The number in the attempt's single-value memory file ``name`` (None: none)."""
        if self.memory_folder is None:
            return None
        try:
            text = (self.memory_folder / name).read_text().strip()
        except OSError:
            return None
        return int(text) if text.isdigit() else None

    def _v1_limit_reached(self) -> bool:
        """Whether the attempt's v1 memory (or memory+swap) limit was reached: a charge
        failed there (``failcnt``; a kernel that limits memory+swap too may count none) or
        the peak (``max_usage_in_bytes``) is the limit."""
        for prefix in ("memory.", "memory.memsw."):
            failures = self._count(f"{prefix}failcnt")
            peak = self._count(f"{prefix}max_usage_in_bytes")
            limit = self._count(f"{prefix}limit_in_bytes")
            if failures or (peak is not None and limit is not None and peak >= limit):
                return True
        return False

    def memory_evidence(self) -> MemoryEvidence | None:
        """What the kernel recorded of the attempt's memory, to be read before ``remove``
        (None: there is no memory controller, or its files cannot be read, so nothing to
        confirm an out-of-memory kill by).

        - OOM kills: v2 ``memory.events`` ``oom_kill``, v1 ``memory.oom_control``
          ``oom_kill`` (kernels before 4.13 have no such field); the kernel counts there
          the attempt's processes killed by any OOM killer, its limit's or the host's.
        - Its own limit reached: v2 ``memory.events`` ``oom`` (the limit's OOM killer was
          called), v1 ``_v1_limit_reached`` (a charge failed at the limit, or the peak use
          is the limit, of memory or of memory+swap).

        A kill with the limit reached is the limit's (``limit_kill``, naming the limit); a
        kill without it is the host's (``host_oom_kill``, which ``decide_outcome`` still
        does not blame on the node: the job may have exhausted it). On v1 the limit reached
        is weaker evidence: no v1 file says the limit's OOM killer ran (``oom_control``'s
        ``under_oom`` is only while it runs), and ``failcnt`` also counts the page cache
        reclaimed at the limit, so a host OOM kill after that reads the same; its reason
        says so and makes its advice conditional, where v2's asserts it. A v1 kernel that
        counts no kills gives no evidence (None): a limit reached and reclaimed from tells
        nothing of a kill."""
        if self.memory is None:
            return None
        if self.memory.version == 2:
            events = self._memory_counters("memory.events")
            kills = events.get("oom_kill") if events is not None else None
            reached = events is not None and events.get("oom", 0) > 0
        else:
            control = self._memory_counters("memory.oom_control")
            kills = control.get("oom_kill") if control is not None else None
            reached = self._v1_limit_reached()
        if kills is None:
            return None
        if kills == 0:
            return MemoryEvidence()
        if not reached or self.limit is None:
            return MemoryEvidence(host_oom_kill=True)
        if self.memory.version == 2:
            return MemoryEvidence(
                limit_kill=(
                    f"the job exceeded its memory limit of {self.limit.describe()} and was "
                    "killed by the kernel; declare more memory_gib_per_gpu, or use less memory"
                )
            )
        return MemoryEvidence(
            limit_kill=(
                "the job was killed by the kernel's OOM killer after its memory reached its "
                f"limit of {self.limit.describe()} (page cache counts; this node's cgroup v1 "
                "does not tell the limit's OOM killer from the node's): if it used more than "
                "its limit, declare more memory_gib_per_gpu, or use less memory"
            )
        )

    def remove(self) -> None:
        """Kill whatever is still in the attempt's cgroups, then remove them."""
        for folder in self.folders:
            remove_cgroup(folder)


def remove_cgroup(folder: Path, attempts: int = 50) -> None:
    """SIGKILL the processes in cgroup ``folder`` (and its children), then remove it.
    Killed processes leave their cgroup only once they are reaped, so the removal is tried
    again for a while; a cgroup that stays (a process stuck in the kernel) is logged."""
    if not folder.is_dir():
        return
    for child in [p for p in folder.iterdir() if p.is_dir()]:
        remove_cgroup(child, attempts)
    for attempt in range(attempts):
        with contextlib.suppress(OSError):
            for pid in (folder / "cgroup.procs").read_text().split():
                with contextlib.suppress(OSError):
                    os.kill(int(pid), signal.SIGKILL)
        try:
            folder.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY or attempt == attempts - 1:
                log.warning("cgroup %s could not be removed: %s", folder, exc)
                return
            time.sleep(0.02)


def runner_folder(node_id: str, job_uids: range) -> str:
    """The name of a runner's folder below ``<own>/trainyard``: its node id and the first uid
    of its jobs. A runner's job uids are its host-wide claim (``sandbox.claim_job_uids``), so
    two runners alive on one host never share a folder, even under one node id and one own
    cgroup (two local stacks, each naming its node ``local-node-1``): before, the second to
    start emptied the first's folder (``NodeCgroups.detect`` removes what it finds there),
    killing its running jobs, and the first's end removed the folder under the second's.
    A runner restarted with its settings finds what its predecessor left."""
    return f"{node_id}.{job_uids.start}"


class NodeCgroups:
    """This runner's job cgroups: ``<own>/trainyard/<folder>`` in each hierarchy used
    (``runner_folder`` names it)."""

    def __init__(
        self,
        controllers: dict[str, Hierarchy],
        folder: str,
        gpu_minors: Sequence[int] | None = None,
    ) -> None:
        self._controllers = controllers
        self._folder = folder
        self._gpu_minors = tuple(gpu_minors) if gpu_minors is not None else None
        if self._gpu_minors is None:
            # Virtual GPUs (or none): there are no device files to confine.
            self._controllers.pop("devices", None)

    def memory_bytes(self) -> int:
        """The memory this node's jobs share: the host's, or less when the runner's own
        cgroup is limited (``cgroup_memory_limit``)."""
        host = node_memory_bytes()
        memory = self._controllers.get("memory")
        own = cgroup_memory_limit(memory) if memory is not None else None
        return min(host, own) if own is not None else host

    def node_folder(self, hierarchy: Hierarchy) -> Path:
        return hierarchy.own / "trainyard" / self._folder

    @property
    def hierarchies(self) -> list[Hierarchy]:
        return list(dict.fromkeys(self._controllers.values()))

    @classmethod
    def detect(
        cls,
        folder: str,
        *,
        mountinfo: Path = Path("/proc/self/mountinfo"),
        proc_cgroup: Path = Path("/proc/self/cgroup"),
        as_root: bool | None = None,
        gpu_minors: Sequence[int] | None = None,
    ) -> NodeCgroups | None:
        """This runner's job cgroups in ``<own>/trainyard/<folder>`` (``runner_folder``), set
        up and emptied of what an earlier runner of that folder left; None (with one warning
        saying why and what it means) when they cannot be had.
        ``gpu_minors``: the minor numbers of the node's real GPUs' device files, by index
        (``GpuInventory.device_minors``), whose files each attempt may open only for its own
        GPUs; None (virtual GPUs): no device confinement."""
        root = as_root if as_root is not None else hasattr(os, "geteuid") and os.geteuid() == 0
        problem: str | None = None
        node: NodeCgroups | None = None
        if not root:
            problem = "the runner is not root"
        else:
            try:
                controllers = find_controllers(mountinfo.read_text(), proc_cgroup.read_text())
            except OSError as exc:
                controllers, problem = {}, f"the cgroups of this process are unknown ({exc})"
            if problem is None and "memory" not in controllers:
                problem = "this host offers this process no memory cgroup controller"
            if problem is None:
                # A copy: set-up drops the optional controllers it cannot use.
                node = cls(dict(controllers), folder, gpu_minors)
                try:
                    node._set_up()
                except OSError as exc:
                    problem, node = f"its cgroups cannot be set up ({exc})", None
        if problem is not None:
            log.warning(
                "jobs run without memory and process limits of their own, nor CPU quotas or "
                "GPU device confinement: "
                "%s; a job may then use all of the node's memory (a root runner on a host "
                "with a writable memory cgroup controller limits each job)",
                problem,
            )
            return None
        assert node is not None
        for name in sorted(OPTIONAL - controllers.keys()):
            if name != "devices" or gpu_minors is not None:
                node._without(name, f"this host offers this process no {name} cgroup controller")
        log.info(
            "jobs run in cgroups of their own: %s",
            ", ".join(f"{c} (v{h.version}, {h.own})" for c, h in node._controllers.items()),
        )
        return node

    def _set_up(self) -> None:
        for hierarchy in self.hierarchies:
            try:
                self._set_up_one(hierarchy)
            except OSError as exc:
                carried = [c for c, h in self._controllers.items() if h == hierarchy]
                if not set(carried) <= OPTIONAL:
                    raise
                # A v1 hierarchy of an optional controller alone: jobs go without it.
                for name in carried:
                    del self._controllers[name]
                    self._without(name, f"its cgroups cannot be set up ({exc})")

    def _set_up_one(self, hierarchy: Hierarchy) -> None:
        folder = self.node_folder(hierarchy)
        if hierarchy == self._controllers.get("devices"):
            wildcard = unnarrowable_gpu_rule(hierarchy.own)
            if wildcard is not None:
                raise OSError(
                    errno.EPERM,
                    f"the runner's own devices cgroup allows NVIDIA's devices by a wildcard "
                    f"({wildcard}), which the kernel does not narrow by single deny rules",
                )
        if hierarchy.version == 2:
            self._delegate(hierarchy)
        else:
            folder.mkdir(parents=True, exist_ok=True)
        for left in [p for p in folder.iterdir() if p.is_dir()]:
            remove_cgroup(left)

    @staticmethod
    def _without(name: str, problem: str) -> None:
        """Say once that jobs go without optional controller ``name``, and why."""
        if name == "cpu":
            log.warning(
                "jobs run without a CPU quota: %s; a job may then use every CPU of the node "
                "(its memory and process limits still hold)",
                problem,
            )
        elif name == "devices":
            log.warning(
                "GPU device files are not confined to each job's own GPUs: %s (only the "
                "cgroup v1 devices controller is used; cgroup v2 needs an eBPF device "
                "program, which the runner does not have); a job that unsets "
                "CUDA_VISIBLE_DEVICES can open the node's other GPUs",
                problem,
            )

    def _delegate(self, hierarchy: Hierarchy) -> None:
        """Enable this node's v2 controllers for the cgroups below ``trainyard/<node>``."""
        wanted = " ".join(f"+{c}" for c, h in self._controllers.items() if h == hierarchy)
        try:
            _write(hierarchy.own / "cgroup.subtree_control", wanted)
        except OSError as exc:
            if exc.errno != errno.EBUSY:
                raise
            # Processes in the runner's own cgroup forbid controllers for its children:
            # the runner moves into a leaf of its own (it alone: others keep it busy).
            leaf = hierarchy.own / RUNNER_LEAF
            leaf.mkdir(exist_ok=True)
            _write(leaf / "cgroup.procs", str(os.getpid()))
            try:
                _write(hierarchy.own / "cgroup.subtree_control", wanted)
            except OSError as again:
                if again.errno != errno.EBUSY:
                    raise
                raise OSError(
                    errno.EBUSY,
                    f"{hierarchy.own} holds processes other than the runner, so its "
                    "controllers cannot be given to cgroups below it",
                ) from again
        folder = hierarchy.own
        for part in ("trainyard", self._folder):
            folder = folder / part
            folder.mkdir(exist_ok=True)
            _write(folder / "cgroup.subtree_control", wanted)

    def close(self) -> None:
        """Remove this node's cgroup folders once its jobs have ended (one still holding an
        attempt's stays, for the next runner of the node to empty), and ``trainyard`` when
        no other node's is left in it: a cgroup with children cannot be removed, so what
        made the runner's own cgroup (a container, a CI job) could not remove it after."""
        for hierarchy in self.hierarchies:
            node = self.node_folder(hierarchy)
            for folder in (node, node.parent):
                with contextlib.suppress(OSError):
                    folder.rmdir()

    def remove(self, name: str) -> None:
        """Remove the cgroups of attempt ``name`` (``remove_cgroup``), if there are any."""
        for hierarchy in self.hierarchies:
            remove_cgroup(self.node_folder(hierarchy) / name)

    def cpu_ceiling(self) -> float | None:
        """The CPUs of the runner's own cgroup's quota (``cgroup_cpu_limit``); None where it
        has none or there is no cpu controller."""
        cpu = self._controllers.get("cpu")
        return cgroup_cpu_limit(cpu) if cpu is not None else None

    def cpus(self) -> float:
        """The CPUs this node's jobs share: those the runner may run on (``node_cpus``), or
        fewer when the runner's own cgroup has a quota."""
        ceiling = self.cpu_ceiling()
        return min(node_cpus(), ceiling) if ceiling is not None else node_cpus()

    @property
    def confines_gpus(self) -> bool:
        """Whether attempts are denied the device files of GPUs not theirs."""
        return "devices" in self._controllers

    @property
    def limits_cpu(self) -> bool:
        """Whether attempts get a CPU quota (the cpu controller is used)."""
        return "cpu" in self._controllers

    def create(
        self,
        name: str,
        limit: MemoryLimit | None,
        max_processes: int | None,
        cpu: CpuLimit | None = None,
        gpus: Sequence[int] = (),
    ) -> JobCgroup:
        """The cgroups of one attempt (an old one of the same ``name`` removed first), its
        limits written (``cpu`` only where the cpu controller is used; where GPUs are
        confined, the device files of the node's GPUs other than ``gpus``, its indices,
        denied: ``gpu_device_denials``); raises ``OSError`` when they cannot be made."""
        folders: list[Path] = []
        memory = self._controllers.get("memory")
        pids = self._controllers.get("pids")
        cpus = self._controllers.get("cpu")
        devices = self._controllers.get("devices")
        try:
            for hierarchy in self.hierarchies:
                folder = self.node_folder(hierarchy) / name
                remove_cgroup(folder)
                folder.mkdir()
                folders.append(folder)
                if hierarchy == memory and limit is not None:
                    _limit_memory(folder, hierarchy.version, limit.bytes)
                if hierarchy == pids and max_processes is not None:
                    _write(folder / "pids.max", str(max_processes))
                if hierarchy == cpus and cpu is not None:
                    _limit_cpu(folder, hierarchy.version, cpu.quota_us)
                if hierarchy == devices and self._gpu_minors is not None:
                    for rule in gpu_device_denials(self._gpu_minors, gpus):
                        _write(folder / "devices.deny", rule)
        except BaseException:
            for folder in folders:
                remove_cgroup(folder)
            raise
        memory_folder = self.node_folder(memory) / name if memory is not None else None
        quota = cpu if cpus is not None else None
        return JobCgroup(tuple(folders), memory, memory_folder, limit, quota)


def _limit_memory(folder: Path, version: int, size: int) -> None:
    """``size`` bytes at most, swap not counted beside them (a job cannot swap its way past
    its limit): on v1 memory+swap is limited to the same (or, where the kernel does not
    account swap, the cgroup is told not to swap); on v2 swap is 0."""
    if version == 2:
        _write(folder / "memory.max", str(size))
        if (folder / "memory.swap.max").exists():
            _write(folder / "memory.swap.max", "0")
        return
    _write(folder / "memory.limit_in_bytes", str(size))
    if (folder / "memory.memsw.limit_in_bytes").exists():
        _write(folder / "memory.memsw.limit_in_bytes", str(size))
    else:
        with contextlib.suppress(OSError):
            _write(folder / "memory.swappiness", "0")


def _limit_cpu(folder: Path, version: int, quota_us: int) -> None:
    """``quota_us`` microseconds of CPU time per ``CPU_PERIOD_US`` for all of the cgroup's
    processes together; past it they wait for the next period (throttled, never killed)."""
    if version == 2:
        _write(folder / "cpu.max", f"{quota_us} {CPU_PERIOD_US}")
        return
    # The period first: the kernel checks the quota against the period it has.
    _write(folder / "cpu.cfs_period_us", str(CPU_PERIOD_US))
    _write(folder / "cpu.cfs_quota_us", str(quota_us))


def _write(path: Path, value: str) -> None:
    """Write a cgroup file in one ``write`` (the kernel takes each write as one value).
    ``O_CREAT`` opens the kernel's file as it is (a cgroup file system makes none), and
    lets a plain folder stand in for a cgroup in tests."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)

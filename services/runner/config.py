"""Settings of the runner (environment prefix ``TRAINYARD_RUNNER_``; the CLI overrides some)."""

from __future__ import annotations

import os
import re
import socket
import sys
import zlib
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, model_validator
from pydantic_settings import SettingsConfigDict

from trainyard_platform.services.runner.checkpoints import MAX_CHECKPOINT_BYTES
from trainyard_platform.services.runner.disk_watch import GIB
from trainyard_platform.services.runner.environments import DEFAULT_MAX_SHARE
from trainyard_platform.services.runner.git_remote import PrivateAllowed, allow_entry
from trainyard_platform.shared.events.payloads import MAX_METRIC_POINTS, MAX_NODE_GPUS
from trainyard_platform.shared.settings import GuardedServiceSettings, Port, jetstream_duration
from trainyard_platform.shared.worst_case import KILL_GRACE_SECONDS

NODE_ID_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
JOB_SLOTS = 64
"""Most jobs one node runs at once (one uid each)."""
DERIVED_UID_FIRST = 200_000
DERIVED_UID_RANGES = 1000
"""Ranges of ``JOB_SLOTS`` uids from ``DERIVED_UID_FIRST`` that runners with no
``job_uid_base`` choose among."""


def default_node_id(hostname: str | None = None) -> str:
    """The host name, lower-cased, with anything but ``[a-z0-9-]`` turned into ``-``.

    Node ids are NATS subject tokens (``...granted.<node_id>``), so dots must go.
    """
    name = (hostname if hostname is not None else socket.gethostname()).lower()
    cleaned = re.sub(r"[^a-z0-9-]+", "-", name)[:63].strip("-")
    return cleaned or "node"


def _allowed_entry(value: str) -> str:
    allow_entry(value)  # ValueError saying what an entry may be
    return value


class Settings(GuardedServiceSettings):
    """The node agent: one per GPU machine, no database."""

    model_config = SettingsConfigDict(env_prefix="TRAINYARD_RUNNER_")

    port: Port = 8082
    """Port of the HTTP server (health, readiness, ``GET /v1/node``)."""
    shutdown_grace_seconds: float = Field(default=90.0, ge=0)
    """On SIGTERM, how long the runner's tasks may take in all; must exceed
    ``drain_timeout_seconds`` so the jobs' last events still go out."""
    node_id: str = Field(default_factory=default_node_id, pattern=NODE_ID_PATTERN)
    """This node's id, the routing key of its allocations (default: the sanitised host name)."""
    gpu_flavor: str = Field(default="cpu", pattern=r"^[a-z0-9][a-z0-9-]*$")
    """The GPU flavor this node offers (``h200``, ``a100``, ...; ``cpu`` for development)."""
    topology: str = Field(default="default", pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,99}$")
    """This node's topology domain (NVLink domain, rack, ...), sent in every heartbeat: the
    scheduler keeps the nodes of a multi-node job in one domain when it can."""
    virtual_gpus: int | None = Field(default=None, ge=0, le=MAX_NODE_GPUS)
    """Offer this many virtual GPUs (model ``virtual-cpu``; jobs run on CPU) instead of
    discovering real ones. Unset: discover with NVML, else torch."""
    heartbeat_interval_seconds: float = Field(default=2.0, gt=0)
    """How often ``runner.heartbeat`` is published."""
    heartbeat_ttl_seconds: Annotated[int, AfterValidator(jetstream_duration)] = Field(
        default=600, ge=1
    )
    """How long the event stream keeps a heartbeat (its ``Nats-TTL``): a heartbeat is news
    for seconds, so it is not kept the stream's week (about 300,000 per node). At most what
    JetStream holds (``jetstream_duration``)."""
    work_dir: Path = Path(".trainyard/runner")
    """Local folder for job logs (``jobs/<job>/<allocation>.log``) and the allocation ledger
    (``ledger/<node_id>/``) that survives runner restarts."""
    code_dir: Path = Field(default_factory=Path.cwd)
    """Where the code version of a job that brings no code of its own is read from (its
    module must be installed in the job environment's base layer)."""
    python: str = Field(default_factory=lambda: sys.executable)
    """The base interpreter of job environments: a job without requirements runs with it,
    and a job's cached virtual environment sees its packages (torch, the SDK) beneath its
    own requirements."""
    installer: Literal["uv", "pip"] = "uv"
    """What builds job environments (uv: see BENCHMARKS.md for why)."""
    environments_dir: Path | None = None
    """Cache of job environments by requirement-set hash (default ``<work_dir>/envs``)."""
    environments_keep: int = Field(default=20, ge=1)
    """Cached environments kept; those beyond this (and not in use) are removed at the
    runner's start and after each build, those of the team holding the most of the cache
    first (``EnvironmentCache.prune``)."""
    environments_max_gib: float | None = Field(default=None, ge=0)
    """Disk (GiB) the cached environments take at most, together; environments not in use
    are removed until they fit, at the runner's start and after each build, those of the
    team holding the most bytes of the cache first (``EnvironmentCache.prune``). Unset: a fifth of the size of the file system they are on; 0: no bound."""
    env_build_max_gib: float = Field(default=32.0, ge=0)
    """Disk (GiB) one job environment may take while it is built (the venv, the wheels
    downloaded into it, what the installer unpacks), measured every
    ``job_disk_check_seconds``: a build over it is stopped, removed and fails its job as
    ``user_error`` (``environments``, "A build's own bound"); the requirements are a
    tenant's, and one that unpacks to a huge size would otherwise fill the node's disk.
    The installer's own cache is not measured, where uv unpacks the wheels first
    (``environments``, "A build's own bound"). 0: no bound."""
    job_uid_base: int = Field(default_factory=lambda: 0, ge=0)
    """First uid of this node's job users (a runner started as root runs each job as
    ``job_uid_base + slot``); 0: derived from the node id, in 200000-263999 (the next free
    range when another runner on the host holds that one)."""
    job_network: Literal["loopback", "host"] = "loopback"
    """The network a job on this node alone runs in. ``loopback``: a network namespace of
    its own holding only its loopback (``netns``): it reaches no port of the host or of
    another job (NATS, PostgreSQL, the object store, other jobs' torchrun stores) and nothing
    beyond the node, while its ranks still reach each other on ``127.0.0.1``. ``host``: the
    node's network, as every other process of the host. A gang across nodes, and a runner
    that cannot make a namespace (not root; it says so at its start), use the host's."""
    fetch_allow_private: list[Annotated[str, AfterValidator(_allowed_entry)]] = Field(
        default_factory=list
    )
    """Networks (``10.1.0.0/16``, ``fd00::/8``, one address) and host names
    (``git.internal.example``, exactly that name) this node fetches what a job names from
    although they are not public: its git code (``code.repository``) and its wheel URLs
    (``requirements``: ``name @ https://.../x.whl``, downloaded by the runner itself,
    ``wheels``). git and the runner's downloads run in the host's network, so by default a repository or wheel URL whose host is or resolves to a
    loopback, private, link-local, CGNAT, unique-local or otherwise not globally routable
    address is refused as the job's input before anything is sent (``git_remote``): a
    tenant cannot make the node ask its internal services. Allow here a company's own git
    server or wheel host; everything of the node's network that this covers is then
    reachable by any tenant's repository or wheel URL."""
    job_max_processes: int = Field(default=16384, ge=16)
    """Processes and threads a job's user may have at once (``RLIMIT_NPROC``; only where
    jobs run as users of their own): a fork bomb spends its own budget, not the host's."""
    job_memory_gib_per_gpu: float | None = Field(default=None, ge=0)
    """Memory (GiB) per GPU a job that declares no ``memory_gib_per_gpu`` may use (its cgroup's
    limit: this x its GPUs here, swap not counted beside it); unset: the node's memory
    divided by its GPUs, the job's fair share (the host's memory, or the runner's own
    cgroup's limit when less: ``NodeCgroups.memory_bytes``); 0: no limit. A job that declares
    ``memory_gib_per_gpu`` is limited to what it declares. Only where the runner has cgroups
    (root, a memory controller: ``cgroups``)."""
    job_cpus_per_gpu: float | None = Field(default=None, ge=0)
    """CPUs per GPU a job that declares no ``cpus_per_gpu`` may use (its cgroup's CPU quota:
    this x its GPUs here); unset: the node's CPUs divided by its GPUs
    (``NodeCgroups.cpus``); 0: no limit. A job that declares ``cpus_per_gpu`` is limited to what it declares. Never
    more than the runner's own cgroup's quota (``NodeCgroups.cpu_ceiling``). Only where the runner has
    cgroups with a cpu controller (``cgroups``)."""
    job_env_passthrough: list[str] = Field(
        default_factory=lambda: [
            "LD_LIBRARY_PATH",
            "NCCL_SOCKET_IFNAME",
            "NCCL_IB_DISABLE",
            "NCCL_DEBUG",
            "GLOO_SOCKET_IFNAME",
            "OMP_NUM_THREADS",
        ]
    )
    """Variables of the runner's environment a job may see (never ``TRAINYARD_*``)."""
    address: str = "127.0.0.1"
    """Where other nodes reach this node's job processes (rank 0's rendezvous)."""
    checkpoints_keep: int = Field(default=3, ge=1)
    """Committed checkpoints kept per job; older ones are deleted (the newest never is)."""
    log_ship_interval_seconds: float = Field(default=1.0, gt=0)
    """How often a running job's new output is uploaded to the object store."""
    kill_grace_seconds: float = Field(
        default=float(KILL_GRACE_SECONDS), ge=0, le=KILL_GRACE_SECONDS
    )
    """After SIGTERM for exceeding the max runtime, seconds before SIGKILL. At most
    ``shared.worst_case.KILL_GRACE_SECONDS``: a budget reserves each job's worst case as its
    ``max_runtime_seconds`` and that grace, the longest it holds and is billed its GPUs."""
    drain_timeout_seconds: float = Field(default=60.0, ge=0)
    """On runner shutdown, seconds the jobs get to checkpoint and exit before SIGKILL."""
    progress_interval_seconds: float = Field(default=1.0, ge=0)
    """At most one ``job.progress`` per job per this many seconds (the newest is kept)."""
    metrics_batch_points: int = Field(default=MAX_METRIC_POINTS, ge=1, le=MAX_METRIC_POINTS)
    """Metric points per ``job.metrics`` at most (a fuller batch goes at once)."""
    metrics_batch_seconds: float = Field(default=1.0, ge=0)
    """How long a job's metric point may wait for its batch to fill before it is sent."""
    metrics_points_per_second: float = Field(default=1000.0, gt=0)
    """A job's metric points entering its series (metric log, ``job.metrics``) per second
    on average, in bursts of up to 10 seconds' worth (at least ``metrics_max_keys``: one
    report of every key allowed); a report beyond is left out of the
    series (its values still reach ``job.progress`` and the job's end), said in its log."""
    metrics_max_keys: int = Field(default=1000, ge=1)
    """Distinct metric keys a job may report; values under further keys are dropped
    everywhere, said in its log."""
    max_output_bytes: int = Field(default=2 * 1024**3, ge=1024)
    """Most bytes of a job attempt's output, and of its metric series, kept on this node and
    shipped to the store (each); past it the output ends with a notice and the rest is
    dropped, so a job that writes without end fills neither the disk nor the store."""
    checkpoint_upload_wait_seconds: float = Field(default=900.0, gt=0, allow_inf_nan=False)
    """How long a job's end waits for the checkpoints it staged before it exited to upload
    (the object store away, slow); one left unuploaded is reported, never passed over: a
    job that succeeded then fails as ``platform_error`` and is retried from its latest
    uploaded checkpoint (``domain.with_lost_checkpoint``)."""
    max_checkpoint_bytes: int = Field(default=MAX_CHECKPOINT_BYTES, ge=1)
    """Largest checkpoint object committed, by its apparent size (a sparse file counts with
    its holes); a larger one is refused unread and the job's earlier checkpoints stand (a
    refused final checkpoint fails a job that succeeded: ``domain.with_refused_checkpoint``)."""
    job_disk_gib: float = Field(default=512.0, ge=0)
    """Disk a job may take in its sandbox (its code, home, tmp and checkpoint staging), in
    GiB, measured every ``job_disk_check_seconds`` (``disk_watch``); a job over it is
    stopped (SIGTERM, SIGKILL after ``kill_grace_seconds``) and fails as ``user_error``.
    A checkpoint to resume from that is larger, as committed, fails the job before its
    download (``launch.resume_from``). The default holds two checkpoints of the largest size
    committed; 0: no limit."""
    job_disk_check_seconds: float = Field(default=5.0, gt=0)
    """How often a running job's disk use is measured."""
    log_tail_lines: int = Field(default=40, ge=1)
    """Lines of output carried in ``job.failed``."""

    @property
    def fetch_private_allowed(self) -> PrivateAllowed:
        """``fetch_allow_private``, parsed."""
        return PrivateAllowed.parse(self.fetch_allow_private)

    @property
    def sandboxes_dir(self) -> Path:
        return self.work_dir / "sb"  # short: the control socket's path must fit 108 bytes

    @property
    def environments_root(self) -> Path:
        return self.environments_dir or self.work_dir / "envs"

    def environments_max_bytes(self) -> int | None:
        """The bound of ``environments_max_gib`` in bytes (None: none); unset, a fifth
        (``environments.DEFAULT_MAX_SHARE``) of the size of the file system the cache is
        on, or of the nearest existing folder above it. Raises OSError when that cannot
        be read."""
        if self.environments_max_gib is not None:
            wanted = self.environments_max_gib * GIB
            return max(1, int(wanted)) if wanted else None
        folder = self.environments_root.absolute()
        while not folder.exists() and folder != folder.parent:
            folder = folder.parent
        fs = os.statvfs(folder)
        return int(fs.f_blocks * fs.f_frsize * DEFAULT_MAX_SHARE)

    @property
    def job_uids(self) -> range:
        """The uids this node's jobs run as (one per concurrently running job): the first
        of ``job_uid_choices`` until the runner has claimed a range and set ``job_uid_base``
        to it (``service.serve``)."""
        return self.job_uid_choices[0]

    @property
    def job_uid_choices(self) -> list[range]:
        """The ranges this node's jobs may run as, in the order the runner tries them
        (``sandbox.claim_job_uids``): the one ``job_uid_base`` names alone; unset, all
        ``DERIVED_UID_RANGES`` of 200000-263999, starting with the one the node id hashes
        to, so a runner keeps its range across restarts and two whose ids hash alike both
        start."""
        if self.job_uid_base:
            return [range(self.job_uid_base, self.job_uid_base + JOB_SLOTS)]
        first = zlib.crc32(self.node_id.encode()) % DERIVED_UID_RANGES
        return [
            range(base, base + JOB_SLOTS)
            for i in range(DERIVED_UID_RANGES)
            for base in [DERIVED_UID_FIRST + JOB_SLOTS * ((first + i) % DERIVED_UID_RANGES)]
        ]

    @model_validator(mode="after")
    def _drain_fits_grace(self) -> Settings:
        if self.drain_timeout_seconds >= self.shutdown_grace_seconds:
            raise ValueError(
                "drain_timeout_seconds must be shorter than shutdown_grace_seconds, so the "
                "jobs' final events can be published before the process exits"
            )
        return self

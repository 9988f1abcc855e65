"""What a job ran: its code version and its environment, recorded by default, never by hand.

``code_version`` format (space-separated parts, the first optional)::

    git:<40-hex commit>[+dirty] src:sha256:<64-hex>

- ``git:`` part only when ``code_dir`` is a git work tree: the commit of ``HEAD``
  (``unborn`` before the first commit), ``+dirty`` when ``git status --porcelain`` lists
  anything (uncommitted or untracked files: the commit alone would not reproduce the run).
- ``src:`` part always: the sha256 of the entrypoint module's source file as it was when
  the job started (``pkg/mod.py``, or ``pkg/mod/__main__.py`` for a package), so even a
  dirty tree or a checkout without git pins the file that ran. ``src:unknown`` when the
  module is not a file under ``code_dir`` (e.g. installed into site-packages).

``environment`` asks the job's own interpreter (``settings.python``, which need not be the
runner's) for its Python, torch and torch's CUDA build, without importing torch, and for the
cuDNN and NCCL its torch uses where they are installed wheels (``nvidia-cudnn-*``,
``nvidia-nccl-*``): None where they are not (a CPU build), never guessed. The driver version
is read from the node (``/proc/driver/nvidia/version``, else ``nvidia-smi``) only when the
node has real GPUs; on virtual GPUs it is None. ``code_diff_sha256`` pins the uncommitted
changes of a dirty git work tree (``diff_digest``); the resolved package list and its sha256
are added by the launcher from the job's environment (``packages_digest``).

Everything here blocks (subprocesses, file reads): call it through ``asyncio.to_thread``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import re
import socket
import stat
import subprocess
from collections.abc import Sequence
from pathlib import Path

from trainyard_platform.services.runner.gpus import GpuInventory
from trainyard_platform.services.runner.sandbox import AsJob
from trainyard_platform.shared.bundle_archive import MAX_BUNDLE_MEMBERS, MAX_UNPACKED_BYTES
from trainyard_platform.shared.events.payloads import Environment

log = logging.getLogger(__name__)

ENTRYPOINT_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_GIT_TIMEOUT_S = 20


def entrypoint_source(code_dir: Path, entrypoint: str) -> Path | None:
    """The file ``python -m <entrypoint>`` runs from ``code_dir``, if it is there."""
    if not ENTRYPOINT_PATTERN.match(entrypoint):
        return None
    base = code_dir.joinpath(*entrypoint.split("."))
    for candidate in (base.with_suffix(".py"), base / "__main__.py"):
        if candidate.is_file():
            return candidate
    return None


def source_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as src:
        while chunk := src.read(1024 * 1024):
            digest.update(chunk)
    return digest.hexdigest()


def _git(code_dir: Path, *args: str, as_job: AsJob | None = None) -> str | None:
    raw = _git_raw(code_dir, *args, as_job=as_job)
    return None if raw is None else raw.decode(errors="replace").strip()


def git_version(code_dir: Path) -> str | None:
    """``git:<commit>[+dirty]``, or None when ``code_dir`` is not in a git work tree."""
    if _git(code_dir, "rev-parse", "--is-inside-work-tree") != "true":
        return None
    commit = _git(code_dir, "rev-parse", "--verify", "--quiet", "HEAD") or "unborn"
    status = _git(code_dir, "status", "--porcelain")
    # An unreadable status counts as dirty: claiming a clean tree we could not check
    # would make the record lie.
    dirty = status is None or status != ""
    return f"git:{commit}{'+dirty' if dirty else ''}"


MAX_UNTRACKED_BYTES = MAX_UNPACKED_BYTES
"""The most bytes of untracked files ``diff_digest`` reads (apparent sizes, all together):
as much as a code bundle may hold unpacked."""
MAX_UNTRACKED_FILES = MAX_BUNDLE_MEMBERS
"""The most untracked files ``diff_digest`` opens: as many as a code bundle may hold."""


def diff_digest(code_dir: Path, as_job: AsJob | None = None) -> str | None:
    """sha256 of a dirty work tree's uncommitted changes: ``git diff HEAD --binary`` (staged
    and unstaged) and every untracked, not ignored file (its path and the sha256 of its
    content), in path order. None when ``code_dir`` is not a git work tree, is clean, or git
    cannot say (the ``+dirty`` of ``git_version`` still tells). ``as_job``: git runs with
    the job's privileges (``code_dir`` is the job's: its ``.git/config`` may name programs).

    None too, unread, when the untracked files are more than ``MAX_UNTRACKED_FILES`` or
    their apparent sizes pass ``MAX_UNTRACKED_BYTES`` together: the runner reads them with
    its own privileges and in its own thread, and what lies there is the tenant's (what
    the probe of its environment, or a ``git`` of its own, left): a sparse file of a
    petabyte, one ``truncate`` away, would keep that thread hashing zeros for days and
    the job's start waiting on it."""
    if _git(code_dir, "rev-parse", "--is-inside-work-tree", as_job=as_job) != "true":
        return None
    has_head = _git(code_dir, "rev-parse", "--verify", "--quiet", "HEAD", as_job=as_job) is not None
    diff = _git_raw(code_dir, "diff", "HEAD", "--binary", as_job=as_job) if has_head else b""
    untracked = _git_raw(
        code_dir, "ls-files", "-z", "--others", "--exclude-standard", as_job=as_job
    )
    if diff is None or untracked is None:
        return None
    if not diff and not untracked:
        return None
    names = sorted(n for n in untracked.split(b"\0") if n)
    if len(names) > MAX_UNTRACKED_FILES:
        log.info("untracked files of %s not pinned: more than %d", code_dir, MAX_UNTRACKED_FILES)
        return None
    digest = hashlib.sha256(diff)
    left = MAX_UNTRACKED_BYTES
    for name in names:
        path = code_dir / name.decode("utf-8", "surrogateescape")
        digest.update(b"\0untracked\0" + name + b"\0")
        try:
            content = _confined_digest(code_dir, path, left)
        except _TooLarge:
            log.info(
                "untracked files of %s not pinned: more than %d bytes",
                code_dir,
                MAX_UNTRACKED_BYTES,
            )
            return None
        if content is not None:
            sha256, size = content
            digest.update(sha256.encode())
            left -= size
    return digest.hexdigest()


class _TooLarge(Exception):
    """The untracked files pass ``MAX_UNTRACKED_BYTES`` together."""


def _confined_digest(root: Path, path: Path, max_bytes: int) -> tuple[str, int] | None:
    """sha256 and size of ``path`` when it is a regular file of its own (no hard link) that
    really lies inside ``root``; None for anything else. The names come from git run as the job
    (maybe a ``git`` of the job's own environment), and the runner reads with its own
    privileges: a name out of ``root`` (``..``, absolute, through a link) or a hard link to
    a file the job cannot read would pin, and publish the sha256 of, a file of another
    team or of the host. ``_TooLarge``, unread, when its apparent size is over
    ``max_bytes``; no more than that size is read, whatever happens to the file meanwhile."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        fds = Path("/proc/self/fd")
        real = Path(os.readlink(fds / str(fd))) if fds.is_dir() else path.resolve()
        info = os.fstat(fd)
        if (
            not real.is_relative_to(root.resolve())
            or not stat.S_ISREG(info.st_mode)
            or info.st_nlink != 1
        ):
            return None
        if info.st_size > max_bytes:
            raise _TooLarge
        digest = hashlib.sha256()
        left = info.st_size
        while left > 0 and (chunk := os.read(fd, min(1024 * 1024, left))):
            digest.update(chunk)
            left -= len(chunk)
        return digest.hexdigest(), info.st_size
    except OSError:
        return None
    finally:
        os.close(fd)


def _git_raw(code_dir: Path, *args: str, as_job: AsJob | None = None) -> bytes | None:
    argv = ["git", "-C", str(code_dir), *args]
    try:
        if as_job is not None:
            done = as_job.run(argv, cwd=code_dir, timeout=_GIT_TIMEOUT_S)
        else:
            done = subprocess.run(argv, capture_output=True, timeout=_GIT_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError) as exc:  # a timeout, a failed preexec
        log.info("git %s in %s failed: %s", " ".join(args), code_dir, exc)
        return None
    return done.stdout if done.returncode == 0 else None


def packages_digest(packages: Sequence[str]) -> str:
    """sha256 of a resolved package list (``name==version`` lines, sorted, one per line)."""
    return hashlib.sha256("\n".join(sorted(packages)).encode()).hexdigest()


def driver_version() -> str | None:
    """The NVIDIA driver's version on this node, or None when there is none to ask."""
    try:
        text = Path("/proc/driver/nvidia/version").read_text()
        found = re.search(r"Kernel Module\s+(?:for\s+\S+\s+)?([0-9][0-9.]+)", text)
        if found:
            return found.group(1)
    except OSError:
        pass
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    first = done.stdout.strip().splitlines()[0].strip() if done.stdout.strip() else ""
    return first if done.returncode == 0 and re.fullmatch(r"[0-9][0-9.]*", first) else None


def code_version(code_dir: Path, entrypoint: str) -> str:
    """The code version string of the module docstring."""
    source = entrypoint_source(code_dir, entrypoint)
    src = f"src:sha256:{source_digest(source)}" if source is not None else "src:unknown"
    git = git_version(code_dir)
    return f"{git} {src}" if git else src


# Runs in the job's interpreter: stdlib only, and torch is located, not imported.
_PROBE = r"""
import importlib.metadata as md, importlib.util as iu, json, pathlib, platform, re
def version(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None
cuda = None
spec = iu.find_spec("torch")
if spec is not None and spec.origin:
    try:
        text = (pathlib.Path(spec.origin).parent / "version.py").read_text()
        m = re.search(r"^cuda\s*(?::[^=]*)?=\s*['\"]([^'\"]+)['\"]", text, re.M)
        cuda = m.group(1) if m else None
    except OSError:
        pass
def first(*names):
    return next((v for v in map(version, names) if v is not None), None)
print(json.dumps({
    "python": platform.python_implementation() + " " + platform.python_version(),
    "torch": version("torch"),
    "torch_cuda": cuda,
    "cudnn": first("nvidia-cudnn-cu13", "nvidia-cudnn-cu12", "nvidia-cudnn-cu11"),
    "nccl": first("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11"),
}))
"""


def probe_interpreter(python: str, code_dir: Path, as_job: AsJob) -> dict[str, str | None]:
    """Python and torch versions as the job's interpreter sees them, asked with the job's
    privileges (its environment's ``.pth`` files run at start) and isolated (``-I``: the
    job's code in ``code_dir`` is not on the probe's path, so a ``json.py`` of the job's
    is never imported by it)."""
    try:
        done = as_job.run([python, "-I", "-c", _PROBE], cwd=code_dir, timeout=60)
        if done.returncode != 0:
            raise ValueError(f"exit status {done.returncode}: {done.stderr[-500:]!r}")
        return probe_answer(done.stdout)
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        log.warning("could not probe the job interpreter %s: %s", python, exc)
        return dict.fromkeys(PROBE_FIELDS)


PROBE_FIELDS = ("python", "torch", "torch_cuda", "cudnn", "nccl")
_PROBE_VALUE = re.compile(r"[ -~]{1,200}")
"""A version as the probe says one (``CPython 3.11.4``, ``2.4.0+cu121``): printable ASCII,
at most 200 characters."""


def probe_answer(stdout: bytes) -> dict[str, str | None]:
    """The fields of the probe's answer, each a version (``_PROBE_VALUE``) or None; raises
    ``ValueError`` for anything else. The probe runs the ``.pth`` files of the job's
    environment, which can make it print anything: what it says goes into ``job.started``,
    where a list, a NUL or a terminal escape has no place."""
    found = json.loads(stdout)
    if not isinstance(found, dict):
        raise ValueError(f"the probe's answer is not a JSON object: {stdout[:200]!r}")
    answer: dict[str, str | None] = {}
    for field in PROBE_FIELDS:
        value = found.get(field)
        if value is not None and not (isinstance(value, str) and _PROBE_VALUE.fullmatch(value)):
            raise ValueError(
                f"the probe's {field} is not a version (printable ASCII, at most 200 "
                f"characters): {str(value)[:200]!r}"
            )
        answer[field] = value
    return answer


def capture_environment(
    *,
    python: str,
    code_dir: Path,
    node_id: str,
    gpu_flavor: str,
    gpus: GpuInventory,
    gpu_indices: list[int],
    as_job: AsJob,
    code_is_jobs: bool,
    topology: str | None = None,
) -> Environment:
    """Where the job runs: interpreter, torch, cuDNN, NCCL, OS, host, node and its topology,
    the driver, the job's own GPUs, and the uncommitted changes of the code it runs.
    Whatever runs the job's interpreter, or git in code the job brought
    (``code_is_jobs``), runs with the job's privileges (``as_job``)."""
    probe = probe_interpreter(python, code_dir, as_job)
    cuda = None if gpus.virtual else (probe.get("torch_cuda") or gpus.cuda)
    names = [gpus.names[i] for i in gpu_indices if 0 <= i < gpus.count]
    return Environment(
        python=probe.get("python") or f"unknown ({python})",
        torch=probe.get("torch") or "not installed",
        platform=platform.platform(),
        hostname=socket.gethostname(),
        node_id=node_id,
        gpu_flavor=gpu_flavor,
        gpu_names=names,
        cuda=cuda,
        cudnn=None if gpus.virtual else probe.get("cudnn"),
        nccl=None if gpus.virtual else probe.get("nccl"),
        driver=None if gpus.virtual else driver_version(),
        gpu_count=len(names),
        topology=topology,
        code_diff_sha256=diff_digest(code_dir, as_job if code_is_jobs else None),
    )

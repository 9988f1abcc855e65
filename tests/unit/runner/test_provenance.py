"""Code version and environment capture: recorded by default, honest about dirty trees."""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from trainyard_platform.services.runner.gpus import GpuInventory, virtual_inventory
from trainyard_platform.services.runner.provenance import (
    capture_environment,
    code_version,
    diff_digest,
    entrypoint_source,
    git_version,
    packages_digest,
)
from trainyard_platform.services.runner.sandbox import AsJob, JobUser
from trainyard_platform.shared.bundle_archive import MAX_BUNDLE_MEMBERS, MAX_UNPACKED_BYTES

AS_RUNNER = AsJob(JobUser(None, None), {"PATH": os.environ["PATH"]})
"""Tests run as themselves, with a clean environment like a job's."""

GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "commit.gpgsign=false"]


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def code(tmp_path: Path) -> Path:
    folder = tmp_path / "code"
    (folder / "pkg" / "app").mkdir(parents=True)
    (folder / "train.py").write_text("print('train')\n")
    (folder / "pkg" / "__init__.py").write_text("")
    (folder / "pkg" / "job.py").write_text("print('job')\n")
    (folder / "pkg" / "app" / "__init__.py").write_text("")
    (folder / "pkg" / "app" / "__main__.py").write_text("print('app')\n")
    return folder


def git(folder: Path, *args: str) -> str:
    return subprocess.run(
        [*GIT, "-C", str(folder), *args], check=True, capture_output=True, text=True
    ).stdout.strip()


def test_the_entrypoint_file_is_the_one_python_m_would_run(code: Path) -> None:
    assert entrypoint_source(code, "train") == code / "train.py"
    assert entrypoint_source(code, "pkg.job") == code / "pkg" / "job.py"
    assert entrypoint_source(code, "pkg.app") == code / "pkg" / "app" / "__main__.py"
    assert entrypoint_source(code, "missing") is None
    assert entrypoint_source(code, "../etc/passwd") is None


def test_outside_git_the_version_is_the_source_digest(code: Path) -> None:
    assert code_version(code, "pkg.job") == f"src:sha256:{sha(code / 'pkg' / 'job.py')}"
    assert code_version(code, "not.there") == "src:unknown"


def test_a_clean_checkout_is_named_by_its_commit(code: Path) -> None:
    git(code, "init", "-q")
    git(code, "add", ".")
    git(code, "commit", "-q", "-m", "first")
    commit = git(code, "rev-parse", "HEAD")
    assert code_version(code, "train") == f"git:{commit} src:sha256:{sha(code / 'train.py')}"


def test_uncommitted_or_untracked_changes_mark_the_tree_dirty(code: Path) -> None:
    git(code, "init", "-q")
    git(code, "add", ".")
    git(code, "commit", "-q", "-m", "first")
    commit = git(code, "rev-parse", "HEAD")
    (code / "train.py").write_text("print('changed')\n")
    version = code_version(code, "train")
    assert version == f"git:{commit}+dirty src:sha256:{sha(code / 'train.py')}"
    git(code, "checkout", "-q", "--", "train.py")
    (code / "notes.txt").write_text("untracked\n")
    assert git_version(code) == f"git:{commit}+dirty"


def test_a_repository_without_commits_is_unborn(code: Path) -> None:
    git(code, "init", "-q")
    assert git_version(code) == "git:unborn+dirty"


def test_not_a_git_tree_has_no_git_part(tmp_path: Path) -> None:
    assert git_version(tmp_path) is None


def test_the_environment_is_the_job_interpreters(code: Path) -> None:
    env = capture_environment(
        python=sys.executable,
        code_dir=code,
        node_id="node-a",
        gpu_flavor="cpu",
        gpus=virtual_inventory(4),
        gpu_indices=[2, 3],
        as_job=AS_RUNNER,
        code_is_jobs=True,
    )
    assert re.fullmatch(r"\w+ 3\.\d+\.\d+.*", env.python)
    assert env.torch == importlib.metadata.version("torch")
    assert env.node_id == "node-a" and env.gpu_flavor == "cpu"
    assert env.gpu_names == ["virtual-cpu", "virtual-cpu"]
    assert env.cuda is None  # virtual GPUs: the job does not use CUDA
    assert env.platform and env.hostname


def test_on_real_gpus_the_cuda_version_is_recorded(code: Path) -> None:
    env = capture_environment(
        python=sys.executable,
        code_dir=code,
        node_id="node-a",
        gpu_flavor="h200",
        gpus=GpuInventory(("NVIDIA H200", "NVIDIA H200"), "nvml", "12.4"),
        gpu_indices=[1],
        as_job=AS_RUNNER,
        code_is_jobs=True,
    )
    assert env.gpu_names == ["NVIDIA H200"]
    # torch's own CUDA build when it has one (not this CPU wheel), else the driver's.
    assert env.cuda is not None


def test_an_interpreter_that_does_not_run_is_recorded_as_unknown(code: Path) -> None:
    env = capture_environment(
        python=str(code / "no-such-python"),
        code_dir=code,
        node_id="n",
        gpu_flavor="cpu",
        gpus=virtual_inventory(1),
        gpu_indices=[0],
        as_job=AS_RUNNER,
        code_is_jobs=True,
    )
    assert env.python.startswith("unknown") and env.torch == "not installed"


def test_on_cpu_the_gpu_libraries_are_null_never_invented(code: Path) -> None:
    env = capture_environment(
        python=sys.executable,
        code_dir=code,
        node_id="node-a",
        gpu_flavor="cpu",
        gpus=virtual_inventory(2),
        gpu_indices=[0, 1],
        as_job=AS_RUNNER,
        code_is_jobs=True,
        topology="rack-7",
    )
    assert env.cudnn is None and env.nccl is None and env.driver is None and env.cuda is None
    assert env.gpu_count == 2 and env.topology == "rack-7"
    assert env.code_diff_sha256 is None  # not a git tree


def test_the_uncommitted_changes_are_pinned_by_their_digest(code: Path) -> None:
    git(code, "init", "-q")
    git(code, "add", ".")
    git(code, "commit", "-q", "-m", "first")
    assert diff_digest(code) is None  # clean
    (code / "train.py").write_text("print('changed')\n")
    changed = diff_digest(code)
    assert changed is not None and re.fullmatch(r"[0-9a-f]{64}", changed)
    assert diff_digest(code) == changed  # the same changes, the same digest
    (code / "train.py").write_text("print('changed again')\n")
    assert diff_digest(code) not in (None, changed)
    (code / "train.py").write_text("print('changed')\n")
    (code / "notes.txt").write_text("an untracked file\n")
    with_untracked = diff_digest(code)
    assert with_untracked not in (None, changed)
    (code / "notes.txt").write_text("another content\n")
    assert diff_digest(code) not in (None, changed, with_untracked)


def test_the_package_list_digest_ignores_order() -> None:
    one = packages_digest(["torch==2.4.0", "numpy==2.0.0"])
    assert one == packages_digest(["numpy==2.0.0", "torch==2.4.0"])
    assert one != packages_digest(["numpy==2.0.1", "torch==2.4.0"])
    assert re.fullmatch(r"[0-9a-f]{64}", one)


@pytest.mark.parametrize(
    "answer",
    [
        '["not", "an", "object"]',
        '{"python": 3, "torch": ["2.4"]}',
        '{"python": "CPython 3.11.4\\u0000", "torch": "2.4.0"}',
        '{"python": "CPython 3.11.4", "torch": "2.4.0\\u001b[2J"}',
        '{"python": "CPython \\u202e3.11.4", "torch": "2.4.0"}',
        '{"python": "CPython 3.11.4", "torch": "' + "9" * 1000 + '"}',
    ],
)
def test_an_interpreter_answering_what_no_version_is_is_recorded_as_unknown(
    code: Path, tmp_path: Path, answer: str
) -> None:
    # The probe runs the .pth files of the job's environment (a wheel the tenant chose),
    # which can make it print anything. Before: a list or a number raised out of the
    # launch (the job failed as platform_error, counted against the node), and a NUL or a
    # terminal escape went into job.started, where no database could store it.
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\ncat <<'END'\n{answer}\nEND\n")
    python.chmod(0o755)
    env = capture_environment(
        python=str(python),
        code_dir=code,
        node_id="n",
        gpu_flavor="cpu",
        gpus=virtual_inventory(1),
        gpu_indices=[0],
        as_job=AS_RUNNER,
        code_is_jobs=True,
    )
    assert env.python == f"unknown ({python})" and env.torch == "not installed"


FAKE_GIT = """#!/bin/sh
# What the tenant's own git (a script of its environment's bin, first on the job's PATH)
# may answer: a work tree with untracked files named anywhere.
for arg in "$@"; do
  case "$arg" in
    --is-inside-work-tree) echo true; exit 0 ;;
    HEAD) exit 1 ;;
    ls-files) printf '%s\\0' "../secret.txt" "$OUTSIDE" "link/secret.txt" "hard.txt"; exit 0 ;;
  esac
done
exit 1
"""


def test_untracked_files_are_read_only_inside_the_code(tmp_path: Path, code: Path) -> None:
    """The runner reads the untracked files git (run as the job, maybe the job's own
    ``git``) names to pin their content: a name out of the code folder (``..``, an absolute
    path, a path through a link) or a hard link (another user's file, where the kernel
    lets users link them) is never read, so its content never shows in the digest."""
    secret = tmp_path / "secret.txt"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "git").write_text(FAKE_GIT)
    (bin_dir / "git").chmod(0o755)
    (code / "link").symlink_to(tmp_path)
    secret.write_text("first secret\n")
    os.link(secret, code / "hard.txt")
    as_job = AsJob(
        JobUser(None, None),
        {"PATH": f"{bin_dir}:{os.environ['PATH']}", "OUTSIDE": str(secret)},
    )
    before = diff_digest(code, as_job)
    assert before is not None
    secret.write_text("second secret\n")  # the same inode: the hard link sees it too
    assert diff_digest(code, as_job) == before


def test_untracked_files_past_what_a_bundle_holds_are_not_read(code: Path) -> None:
    """What lies untracked in the job's code is the tenant's (the probe of its environment
    runs its ``.pth`` files there first, and a ``git`` of its own may answer): a sparse file
    of any apparent size is one ``truncate`` away. The runner reads them with its own
    privileges in one of its threads: before, it hashed every byte, so a petabyte of holes
    held that thread, and the job's start, for days. Past what a bundle may hold the
    changes are not pinned (the ``+dirty`` still says the tree is dirty), and nothing is
    read."""
    git(code, "init", "-q")
    git(code, "add", ".")
    git(code, "commit", "-q", "-m", "first")
    (code / "notes.txt").write_text("an untracked file\n")
    assert diff_digest(code) is not None
    with (code / "holes.bin").open("wb") as holes:
        holes.truncate(MAX_UNPACKED_BYTES + 1)
    assert diff_digest(code) is None
    assert git_version(code).endswith("+dirty")


MANY_UNTRACKED_GIT = """#!/bin/sh
# A git of the tenant's own that names more untracked files than a bundle may hold.
for arg in "$@"; do
  case "$arg" in
    --is-inside-work-tree) echo true; exit 0 ;;
    HEAD) exit 1 ;;
    ls-files) seq -f 'f%.0f' 1 "$COUNT" | tr '\\n' '\\0'; exit 0 ;;
  esac
done
exit 1
"""


def test_more_untracked_files_than_a_bundle_holds_are_not_opened(
    tmp_path: Path, code: Path
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "git").write_text(MANY_UNTRACKED_GIT)
    (bin_dir / "git").chmod(0o755)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}"}
    within = str(MAX_BUNDLE_MEMBERS)
    assert diff_digest(code, AsJob(JobUser(None, None), env | {"COUNT": within})) is not None
    past = str(MAX_BUNDLE_MEMBERS + 1)
    assert diff_digest(code, AsJob(JobUser(None, None), env | {"COUNT": past})) is None

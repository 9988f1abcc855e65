"""Which failures to start a job count towards the node's cordon (``JobFailed.node_fault``):
only the node's own (its GPUs, disk, sandbox, runtime, its credentials to the store), never
what follows the job's own input (its git host and server, its command, its requirements,
its bundle's contents), whatever a hostile server or package makes the tools say.

Before: every ``platform_error`` counted, so a tenant's jobs whose git server answered 5xx,
whose host did not resolve, or whose command was not on PATH took the nodes they were placed
on out of service."""

from __future__ import annotations

import errno
import socket
import subprocess
import sys
import tarfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import pytest

from tests.unit.runner.test_launch import GRANT
from tests.unit.runner.test_sandbox import LOOPBACK, checkout_fails, store_bundle
from trainyard_platform.services.runner import domain, git_remote, launch
from trainyard_platform.services.runner.environments import (
    EnvironmentBuildError,
    EnvironmentCache,
    InstallError,
    RequirementsError,
)
from trainyard_platform.services.runner.git_faults import git_fault, git_not_run
from trainyard_platform.services.runner.sandbox import (
    AsJob,
    NodeFault,
    PlatformError,
    counts_against_node,
    failure_kind,
    fetch_bundle,
)
from trainyard_platform.shared.events.payloads import CodeGit
from trainyard_platform.shared.storage import LocalStore

# --- git -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("command", "stderr"),
    [
        ("fetch", "error: RPC failed; HTTP 503 curl 22 The requested URL returned error: 503"),
        ("fetch", "fatal: unable to access 'https://h/x/': Could not resolve host: h"),
        ("fetch", "fatal: unable to access 'https://h/x/': Failed to connect to h port 443"),
        ("fetch", "fatal: unable to access 'https://h/x/': server certificate verification"),
        # A hostile server says whatever it likes on git's stderr.
        ("fetch", "remote: fatal: No space left on device"),
        ("fetch", "remote: error: Read-only file system"),
        ("fetch", "fatal: something new"),
        # The repository's size or contents fill or trouble the disk it is checked out on.
        ("checkout", "error: unable to write file x: No space left on device"),
        ("checkout", "fatal: something new"),
        ("rev-parse", "fatal: something new"),
    ],
)
def test_git_failures_that_follow_the_repository_never_count(command: str, stderr: str) -> None:
    fault = git_fault(command, stderr)
    assert not fault.job_input and not fault.node


def test_git_init_failing_is_the_nodes() -> None:
    # Before anything of the repository is fetched: nothing of the tenant's is involved.
    fault = git_fault("init", "fatal: cannot mkdir .git: No space left on device")
    assert fault.node and not fault.job_input
    assert fault.field == "spec.code.repository"


def test_git_that_runs_out_of_time_fetching_never_counts_but_git_missing_does() -> None:
    assert not git_not_run("fetch", "timed out after 600 s", timed_out=True).node
    assert not git_not_run("checkout", "timed out after 600 s", timed_out=True).node
    assert git_not_run("fetch", "[Errno 2] No such file or directory: 'git'").node
    assert git_not_run("init", "timed out after 600 s", timed_out=True).node


def test_a_server_that_cannot_be_reached_is_retried_but_never_counts(tmp_path: Path) -> None:
    code = CodeGit(repository="https://127.0.0.1:1/team/repo.git", commit="0" * 40)
    error = checkout_fails(tmp_path, code, LOOPBACK)
    assert failure_kind(error) == "platform_error" and not counts_against_node(error)


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        # No such name: the job's input (the same answer on every node).
        (socket.gaierror(socket.EAI_NONAME, "Name or service not known"), "user_error"),
        # The resolver failing just now: retried.
        (
            socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution"),
            "platform_error",
        ),
    ],
)
def test_a_host_that_does_not_resolve_never_counts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: socket.gaierror, kind: str
) -> None:
    def resolve(host: str, port: int) -> list[str]:
        raise error

    monkeypatch.setattr(git_remote, "resolve", resolve)
    code = CodeGit(repository="https://gti.example.invalid/x.git", commit="0" * 40)
    failed = checkout_fails(tmp_path, code)
    assert failure_kind(failed) == kind and not counts_against_node(failed)


def _git_run_failing(monkeypatch: pytest.MonkeyPatch, command: str, error: BaseException) -> None:
    real = AsJob.run

    def run(self: AsJob, argv: list[str], *, cwd: Path, timeout: float) -> Any:
        rest = argv[1:]
        while rest[:1] == ["-c"]:  # git's options before its command
            rest = rest[2:]
        if rest[0] == command:
            raise error
        return real(self, argv, cwd=cwd, timeout=timeout)

    monkeypatch.setattr(AsJob, "run", run)
    # A public address for the name, which nothing is sent to (the fetch fails first).
    monkeypatch.setattr(git_remote, "resolve", lambda host, port: ["140.82.112.3"])


def test_a_fetch_a_slow_server_keeps_past_its_time_never_counts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _git_run_failing(monkeypatch, "fetch", subprocess.TimeoutExpired(["git", "fetch"], 600))
    error = checkout_fails(tmp_path, CodeGit(repository="https://h/x.git", commit="0" * 40))
    assert failure_kind(error) == "platform_error" and not counts_against_node(error)
    assert str(error).startswith("spec.code.repository: git fetch could not run to its end")


def test_git_missing_from_the_node_counts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _git_run_failing(monkeypatch, "init", FileNotFoundError(errno.ENOENT, "No such file", "git"))
    error = checkout_fails(tmp_path, CodeGit(repository="https://h/x.git", commit="0" * 40))
    assert isinstance(error, NodeFault) and counts_against_node(error)


# --- the bundle ------------------------------------------------------------------------


def test_a_bundle_missing_or_other_bytes_in_the_store_never_counts(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    bundle = store_bundle(store, "a", {"train.py": b""})
    with pytest.raises(PlatformError) as missing:
        fetch_bundle(store, "b", bundle, tmp_path / "code")  # another team's: not there
    assert not counts_against_node(missing.value)
    store.put_bytes(f"bundles/a/{bundle.sha256}.tar.gz", b"not the bundle")
    with pytest.raises(PlatformError) as other:
        fetch_bundle(store, "a", bundle, tmp_path / "code")
    assert failure_kind(other.value) == "platform_error" and not counts_against_node(other.value)


@pytest.mark.parametrize(
    ("error", "kind", "counts"),
    [
        (OSError(errno.ENOSPC, "No space left on device"), "platform_error", True),
        (OSError(errno.EROFS, "Read-only file system"), "platform_error", True),
        # A name the file system refuses is the bundle's: the job's own error
        # (test_bundle_paths).
        (OSError(errno.ENAMETOOLONG, "File name too long"), "user_error", False),
        (
            OSError(errno.EILSEQ, "Invalid or incomplete multibyte or wide character"),
            "user_error",
            False,
        ),
    ],
)
def test_unpacking_a_bundle_counts_only_when_the_nodes_disk_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: OSError, kind: str, counts: bool
) -> None:
    store = LocalStore(tmp_path / "store")
    bundle = store_bundle(store, "a", {"train.py": b""})

    def extractall(self: tarfile.TarFile, *args: Any, **kwargs: Any) -> None:
        raise error

    monkeypatch.setattr(tarfile.TarFile, "extractall", extractall)
    with pytest.raises(PlatformError) as raised:
        fetch_bundle(store, "a", bundle, tmp_path / "code")
    assert failure_kind(raised.value) == kind
    assert counts_against_node(raised.value) is counts


# --- the environment -------------------------------------------------------------------


class _Environments:
    def __init__(self, error: Exception) -> None:
        self.error = error

    def acquire(self, requirements: Any, team: Any = None) -> Any:
        raise self.error


@pytest.mark.parametrize(
    ("error", "kind", "counts"),
    [
        (RequirementsError("No solution found when resolving dependencies"), "user_error", False),
        # An index or a download the requirements name failing, or the wheels they pull
        # filling the disk: the tenant chose them.
        (InstallError("uv pip install failed: error sending request for url"), None, False),
        (InstallError("uv pip install timed out after 1800 s"), None, False),
        # The venv could not even be made, or the base interpreter probed: the node's.
        (EnvironmentBuildError("creating the virtual environment could not start"), None, True),
    ],
)
def test_an_environment_that_cannot_be_built_counts_only_for_the_nodes_own_steps(
    error: Exception, kind: str | None, counts: bool
) -> None:
    environments = cast(Any, _Environments(error))
    with pytest.raises(PlatformError) as raised:
        launch.prepare(GRANT, cast(Any, None), cast(Any, None), cast(Any, None), environments, {})
    assert failure_kind(raised.value) == (kind or "platform_error")
    assert counts_against_node(raised.value) is counts
    if not counts:
        assert str(raised.value).startswith("spec.requirements: ")


def test_an_install_that_fails_is_an_install_error_an_installer_missing_is_not(
    tmp_path: Path,
) -> None:
    cache = EnvironmentCache(tmp_path, sys.executable, "pip")
    fails = [sys.executable, "-c", "import sys; print('error sending request'); sys.exit(1)"]
    with pytest.raises(InstallError):
        cache._run(fails, "pip install", installing=True)
    with pytest.raises(InstallError):  # the job's packages' files, compiled
        cache._run(fails, "compiling", failed_as=InstallError)
    with pytest.raises(EnvironmentBuildError) as missing:
        cache._run([str(tmp_path / "no-installer")], "pip install", installing=True)
    assert not isinstance(missing.value, InstallError)


# --- what the runner reports -----------------------------------------------------------


def test_an_unclassified_error_counts_only_when_it_is_the_nodes_disk() -> None:
    assert counts_against_node(OSError(errno.ENOSPC, "No space left on device"))
    assert not counts_against_node(ValueError("a tenant's input no rule knows"))
    assert not counts_against_node(PlatformError("spec.command: 'x' cannot be run"))
    assert counts_against_node(NodeFault("this node runs 8 jobs already"))


def test_the_failed_event_says_whether_the_node_is_at_fault() -> None:
    job = domain.JobIdentity("job-1", "alloc-1", "node-1", 3, attempt=0)
    now = datetime.now(UTC)
    assert domain.failed_to_start(job, "x", now, node_fault=True).node_fault
    assert not domain.failed_to_start(job, "x", now).node_fault

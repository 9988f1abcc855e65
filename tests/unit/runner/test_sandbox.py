"""A job's code: only a bundle that verifies and unpacks safely and within bounds."""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from tests.fixtures.git_servers import Listener, git_daemon, git_error
from trainyard_platform.services.runner import git_remote, sandbox
from trainyard_platform.services.runner.config import Settings as RunnerSettings
from trainyard_platform.services.runner.git_faults import git_fault
from trainyard_platform.services.runner.git_remote import PUBLIC_ONLY, PrivateAllowed
from trainyard_platform.services.runner.sandbox import (
    AsJob,
    JobInputError,
    JobUser,
    NodeFault,
    PlatformError,
    UidsInUse,
    checkout_git,
    claim_job_uids,
    counts_against_node,
    failure_kind,
    fetch_bundle,
    remember_job_uids,
    remembered_first,
    remove_files_of,
    shared_folders,
)
from trainyard_platform.shared.events.payloads import CodeBundle, CodeGit, JobSpec
from trainyard_platform.shared.storage import LocalStore


def store_bundle(store: LocalStore, team: str, files: dict[str, bytes]) -> CodeBundle:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    data = raw.getvalue()
    sha = hashlib.sha256(data).hexdigest()
    store.put_bytes(f"bundles/{team}/{sha}.tar.gz", data)
    return CodeBundle(sha256=sha, size_bytes=len(data))


def test_a_bundle_unpacks_into_the_sandbox(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    bundle = store_bundle(store, "a", {"train.py": b"print(1)\n", "pkg/m.py": b""})
    fetch_bundle(store, "a", bundle, tmp_path / "code")
    assert (tmp_path / "code" / "train.py").read_bytes() == b"print(1)\n"


def test_another_teams_bundle_is_not_found(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    bundle = store_bundle(store, "a", {"train.py": b""})
    with pytest.raises(PlatformError, match=r"^spec\.code\.sha256: .* not in the object store"):
        fetch_bundle(store, "b", bundle, tmp_path / "code")


def test_a_tampered_bundle_is_refused_before_unpacking(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    bundle = store_bundle(store, "a", {"train.py": b""})
    store.put_bytes(f"bundles/a/{bundle.sha256}.tar.gz", b"not the bundle")
    with pytest.raises(PlatformError, match=r"^spec\.code\.sha256: .* failed verification"):
        fetch_bundle(store, "a", bundle, tmp_path / "code")
    assert not (tmp_path / "code").exists()


def test_a_bundle_larger_than_its_spec_says_fails_as_the_jobs_own_unread(
    tmp_path: Path,
) -> None:
    """The spec gives the bundle's size (``code.size_bytes``; the CLI sets it). A bundle
    larger than that was downloaded whole onto the node before anything looked at it. The
    download now stops past the spec's size, and the job fails as its own input naming
    both sizes."""
    store = LocalStore(tmp_path / "store")
    bundle = store_bundle(store, "a", {"train.py": os.urandom(4096)})  # incompressible
    understated = CodeBundle(sha256=bundle.sha256, size_bytes=100)
    with pytest.raises(JobInputError) as refused:
        fetch_bundle(store, "a", understated, tmp_path / "code")
    said = str(refused.value)
    assert said.startswith(f"spec.code.size_bytes: code bundle {bundle.sha256[:12]} is ")
    assert f"is {bundle.size_bytes} bytes in the object store" in said
    assert "more than the 100 bytes the spec gives" in said
    assert failure_kind(refused.value) == "user_error"
    assert not (tmp_path / "code").exists()
    fetch_bundle(store, "a", bundle, tmp_path / "code")  # its own size: unpacked as ever
    assert (tmp_path / "code" / "train.py").stat().st_size == 4096


def test_a_bundle_that_would_unpack_too_large_is_refused(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    bundle = store_bundle(store, "a", {"zeros.bin": b"\0" * 2_000_000})
    assert bundle.size_bytes < 10_000, "zeros compress well: a bomb in miniature"
    with pytest.raises(PlatformError, match="would unpack to 2000000 bytes"):
        fetch_bundle(store, "a", bundle, tmp_path / "code", max_unpacked=1_000_000)
    assert not (tmp_path / "code" / "zeros.bin").exists()


def test_a_member_escaping_the_folder_is_refused(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    bundle = store_bundle(store, "a", {"../escape.py": b"x"})
    with pytest.raises(PlatformError, match="cannot be unpacked"):
        fetch_bundle(store, "a", bundle, tmp_path / "code")
    assert not (tmp_path / "escape.py").exists()


def test_the_runner_refuses_what_the_upload_refuses(tmp_path: Path) -> None:
    """The data filter alone unpacked an absolute name inside the folder (``/abs.py`` as
    ``abs.py``); the runner now checks the upload's rule too (``check_bundle``) and unpacks
    nothing of a bundle it refuses."""
    store = LocalStore(tmp_path / "store")
    bundle = store_bundle(store, "a", {"train.py": b"", "/abs.py": b"x"})
    with pytest.raises(PlatformError, match=r"cannot be unpacked: '/abs\.py' is an absolute path"):
        fetch_bundle(store, "a", bundle, tmp_path / "code")
    assert not (tmp_path / "code" / "abs.py").exists()
    assert not (tmp_path / "code" / "train.py").exists()


def git(cwd: Path, *args: str) -> str:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(cwd), "GIT_CONFIG_NOSYSTEM": "1"}
    done = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


LOOPBACK = PrivateAllowed.parse(["127.0.0.0/8"])
"""What the tests' git servers need a runner to allow (loopback is no public address)."""


def test_code_named_by_git_commit_is_checked_out_at_that_commit(tmp_path: Path) -> None:
    repo = tmp_path / "served" / "repo"
    repo.mkdir(parents=True)
    git(repo, "init", "-q")
    (repo / "train.py").write_text("print('v1')\n")
    git(repo, "add", "train.py")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@e", "commit", "-qm", "v1")
    first = git(repo, "rev-parse", "HEAD")
    (repo / "train.py").write_text("print('v2')\n")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@e", "commit", "-qam", "v2")
    dest = tmp_path / "code"
    dest.mkdir()
    with git_daemon(tmp_path / "served") as port:
        url = f"git://127.0.0.1:{port}/repo"
        checkout_git(
            CodeGit(repository=url, commit=first), dest, RUNNERS, tmp_path, None, None, LOOPBACK
        )
        assert (dest / "train.py").read_text() == "print('v1')\n"
        missing = tmp_path / "other"
        missing.mkdir()
        with pytest.raises(PlatformError, match="git fetch"):
            checkout_git(
                CodeGit(repository=url, commit="0" * 40),
                missing,
                RUNNERS,
                tmp_path,
                None,
                None,
                LOOPBACK,
            )


def test_a_git_daemon_serving_several_hosts_is_asked_for_the_host_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before: git was given the address judged in the URL, so its request said
    # host=127.0.0.1:<port>, and a daemon serving by host name found no repository.
    repo = tmp_path / "served" / "git.example" / "repo"
    repo.mkdir(parents=True)
    git(repo, "init", "-q")
    (repo / "train.py").write_text("print('v1')\n")
    git(repo, "add", "train.py")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@e", "commit", "-qm", "v1")
    commit = git(repo, "rev-parse", "HEAD")
    monkeypatch.setattr(git_remote, "resolve", lambda host, port: ["127.0.0.1"])
    dest = tmp_path / "code"
    dest.mkdir()
    with git_daemon(tmp_path / "served", by_host=True) as port:
        code = CodeGit(repository=f"git://git.example:{port}/repo", commit=commit)
        checkout_git(code, dest, RUNNERS, tmp_path, None, None, LOOPBACK)
    assert (dest / "train.py").read_text() == "print('v1')\n"


@pytest.mark.parametrize("form", ["path", "file://", "file:", "ext::", "http://"])
def test_a_repository_on_the_nodes_own_files_or_by_another_transport_is_never_fetched(
    tmp_path: Path, form: str
) -> None:
    """git fetches a path or a ``file://`` URL by default, from the node's files (the
    runner's code folder, other jobs' repositories, as far as the job's user may read),
    runs the command of ``ext::``, and ``http://`` is not among the transports the API
    takes: each is refused before git runs, whatever networks the operator allows."""
    repo, first = one_commit_repo(tmp_path)
    marker = tmp_path / "ran"
    repository = {
        "path": str(repo),
        "file://": repo.as_uri(),
        "file:": f"file:{repo}",
        "ext::": f"ext::sh -c touch% {marker}",
        "http://": "http://127.0.0.1:1/x.git",
    }[form]
    everything = PrivateAllowed.parse(["0.0.0.0/0", "::/0"])
    dest = tmp_path / "code"
    dest.mkdir()
    with pytest.raises(JobInputError) as raised:
        checkout_git(
            CodeGit(repository=repository, commit=first),
            dest,
            RUNNERS,
            tmp_path,
            None,
            None,
            everything,
        )
    assert str(raised.value).startswith(f"spec.code.repository: {repository!r} is not an https://")
    assert list(dest.iterdir()) == [] and not marker.exists()


RUNNERS = JobUser(None, None)
"""The tests' own user (as a runner that is not root runs jobs)."""


def one_commit_repo(tmp_path: Path) -> tuple[Path, str]:
    repo = tmp_path / "served" / "repo"
    repo.mkdir(parents=True)
    git(repo, "init", "-q")
    (repo / "train.py").write_text("print('v1')\n")
    git(repo, "add", "train.py")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@e", "commit", "-qm", "v1")
    return repo, git(repo, "rev-parse", "HEAD")


def checkout_fails(
    tmp_path: Path, code: CodeGit, allowed: PrivateAllowed = PUBLIC_ONLY
) -> PlatformError:
    dest = tmp_path / "code"
    dest.mkdir()
    with pytest.raises(PlatformError) as raised:
        checkout_git(code, dest, RUNNERS, tmp_path, private_allowed=allowed)
    return raised.value


def test_a_commit_the_repository_lacks_is_the_jobs_input_naming_the_field(
    tmp_path: Path,
) -> None:
    # Before: a PlatformError like any other, so the job failed as platform_error (and
    # would now be retried to fail the same way): the commit is the tenant's input.
    one_commit_repo(tmp_path)
    with git_daemon(tmp_path / "served") as port:
        code = CodeGit(repository=f"git://127.0.0.1:{port}/repo", commit="0" * 40)
        error = checkout_fails(tmp_path, code, LOOPBACK)
    assert isinstance(error, JobInputError) and failure_kind(error) == "user_error"
    assert str(error).startswith("spec.code.commit: the repository has no such commit; git fetch")


def test_a_repository_that_does_not_exist_is_the_jobs_input_naming_the_field(
    tmp_path: Path,
) -> None:
    (tmp_path / "served").mkdir()
    with git_daemon(tmp_path / "served") as port:
        code = CodeGit(repository=f"git://127.0.0.1:{port}/nope", commit="0" * 40)
        error = checkout_fails(tmp_path, code, LOOPBACK)
    assert isinstance(error, JobInputError) and failure_kind(error) == "user_error"
    assert str(error).startswith("spec.code.repository: no git repository there; git fetch")


def test_a_repository_that_looks_like_an_option_is_never_taken_for_one(tmp_path: Path) -> None:
    """The API refuses a repository that is no URL, but a grant may come from another
    producer (an older API, a replay): ``--upload-pack=<command>`` given to git fetch as
    its repository made git run the command, in the host's network (git fetches outside
    the job's own), with the job's code not even fetched. It is a repository name, and
    no repository has it."""
    marker = tmp_path / "ran"
    code = CodeGit(repository=f"--upload-pack=touch {marker};", commit="0" * 40)
    error = checkout_fails(tmp_path, code)
    assert not marker.exists(), "git ran the command a repository named"
    assert isinstance(error, JobInputError) and failure_kind(error) == "user_error"
    assert str(error).startswith("spec.code.repository: ")
    assert "never an option of git" in str(error)


@pytest.mark.parametrize("form", ["ssh://git@127.0.0.1:{port}/x.git", "git@127.0.0.1:x.git"])
def test_a_repository_by_ssh_is_the_jobs_input_and_never_reached(tmp_path: Path, form: str) -> None:
    """The API refuses ssh, but a grant may come from another producer. git fetches as the
    job's uid, without keys (never the host's): an ssh fetch could never succeed, and failed
    as the platform's, retried on node after node. It fails as the job's input, naming the
    field, and nothing is sent to the host."""
    with Listener() as server:
        code = CodeGit(repository=form.format(port=server.port), commit="0" * 40)
        error = checkout_fails(tmp_path, code, LOOPBACK)
        assert server.accepted == 0
    assert isinstance(error, JobInputError) and failure_kind(error) == "user_error"
    assert str(error).startswith("spec.code.repository: ")
    assert "is an ssh repository, which is not supported" in str(error)


@pytest.mark.parametrize(
    ("form", "refused"),
    [
        # git reads a git:// URL's host from an '@[' wherever it stands, its path included:
        # "127.0.0.1:<judged>/x@.localhost", port <other>, a name the tenant's DNS answers.
        ("git://git.example:{judged}/x@[.localhost]:{other}/y.git", "holds '@[' after its host"),
        ("git://git.example:{judged}?@[.localhost]:{other}/y.git", "holds '@[' after its host"),
        # git reads a git:// URL's host up to the first '/': "127.0.0.1:<judged>?.localhost".
        ("git://git.example:{judged}?.localhost/y.git", "has no '/' after its host"),
        ("git://git.example:{judged}#.localhost/y.git", "has no '/' after its host"),
        ("git://git.example:{judged}/x@y/z.git", None),  # an '@' in the path alone
        # git refuses it ("url contains a newline"): the platform's before, retried.
        ("https://git.example:{judged}/y.git%0a", "holds '%0a', an escaped newline"),
        # curl reads the host of an https URL as urlsplit does, whatever follows it.
        ("https://git.example:{judged}/x@[.localhost]:{other}/y.git", None),
        ("https://git.example:{judged}?@127.0.0.1:{other}/y.git", None),
        ("https://git.example:{judged}#@127.0.0.1:{other}/y.git", None),
        ("https://127.0.0.1:{other}@git.example:{judged}/y.git", None),
    ],
)
def test_git_connects_to_the_address_judged_and_nowhere_else(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, form: str, refused: str | None
) -> None:
    """Whatever a repository URL holds after its host, the real git, given what
    ``fetch_plan`` gives it, connects to the address and port judged, or the URL is refused
    before git runs. Before: a git:// URL holding '@[' (which the API took) or a host ended
    by '?' was handed to git with the address judged in place of its host, and git read a
    host of its own from the rest (``unable to look up 127.0.0.1:<port>/x@.localhost (port
    <other>)``): a name ending in a domain the tenant's DNS answers, at a port it chose."""
    monkeypatch.setattr(git_remote, "resolve", lambda host, port: ["127.0.0.1"])
    with Listener(git_error("no such repository")) as judged, Listener() as other:
        repository = form.format(judged=judged.port, other=other.port)
        error = checkout_fails(tmp_path, CodeGit(repository=repository, commit="0" * 40), LOOPBACK)
        assert other.accepted == 0
        if refused is None:
            assert judged.accepted >= 1, str(error)
        else:
            assert judged.accepted == 0
            assert isinstance(error, JobInputError), str(error)
            assert str(error).startswith(f"spec.code.repository: {repository!r} {refused}")


def test_a_repository_that_cannot_be_reached_now_is_the_platforms(tmp_path: Path) -> None:
    # Nothing listens on port 1: a server away is no fault of the job's, and may pass.
    code = CodeGit(repository="https://127.0.0.1:1/team/repo.git", commit="0" * 40)
    error = checkout_fails(tmp_path, code, LOOPBACK)
    assert not isinstance(error, JobInputError) and failure_kind(error) == "platform_error"
    assert "git fetch of https://127.0.0.1:1/team/repo.git failed" in str(error)


@pytest.mark.parametrize(
    ("command", "stderr", "field", "job_input"),
    [
        ("fetch", "fatal: remote error: upload-pack: not our ref 00000", "spec.code.commit", True),
        ("fetch", "fatal: couldn't find remote ref refs/heads/x", "spec.code.commit", True),
        (
            "fetch",
            "remote: Repository not found.\nfatal: repository 'https://h/x/' not found",
            "spec.code.repository",
            True,
        ),
        (
            "fetch",
            "fatal: could not read Username for 'https://h': terminal prompts disabled",
            "spec.code.repository",
            True,
        ),
        ("fetch", "fatal: transport 'ext' not allowed", "spec.code.repository", True),
        # What may pass is the platform's, but names the field all the same.
        (
            "fetch",
            "fatal: unable to access 'https://h/x/': Could not resolve host: h",
            "spec.code.repository",
            False,
        ),
        (
            "fetch",
            "fatal: unable to look up h (port 9418) (Temporary failure in name resolution)",
            "spec.code.repository",
            False,
        ),
        (
            "fetch",
            "fatal: unable to access 'https://h/x/': Failed to connect to h port 443",
            "spec.code.repository",
            False,
        ),
        ("fetch", "error: RPC failed; HTTP 503", "spec.code.repository", False),
        ("fetch", "fatal: something new", "spec.code.repository", False),
        ("init", "fatal: cannot mkdir .git", "spec.code.repository", False),
        (
            "checkout",
            "error: unable to write file x: No space left on device",
            "spec.code.repository",
            False,
        ),
        ("checkout", "fatal: something new", "spec.code.commit", False),
    ],
)
def test_every_git_failure_names_the_field_and_tells_the_jobs_input_from_the_platform(
    command: str, stderr: str, field: str, job_input: bool
) -> None:
    # Before: only the job's own faults named a field; a host that does not resolve said
    # "git fetch of ... failed: ..." and nothing of spec.code.repository.
    fault = git_fault(command, stderr)
    assert (fault.field, fault.job_input) == (field, job_input)
    assert fault.reason("git fetch of r failed: x").startswith(f"{field}: ")


def test_a_host_that_does_not_exist_is_the_jobs_input_naming_the_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before: "its host name did not resolve from this node (mistyped, or this node's DNS
    # failing ...)", platform_error: a mistyped host burnt the platform's retries. The
    # resolver's answer that there is no such name is the same from every node.
    def no_such_name(host: str, port: int) -> list[str]:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(git_remote, "resolve", no_such_name)
    code = CodeGit(repository="https://gti.example.invalid/x.git", commit="0" * 40)
    error = checkout_fails(tmp_path, code)
    assert failure_kind(error) == "user_error"
    assert str(error) == (
        "spec.code.repository: 'https://gti.example.invalid/x.git': the host "
        "gti.example.invalid does not exist in DNS (no such name, or no address for it): "
        "check its spelling"
    )
    assert not counts_against_node(error)


def test_a_host_the_resolver_fails_to_look_up_is_the_platforms_naming_the_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def again(host: str, port: int) -> list[str]:
        raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")

    monkeypatch.setattr(git_remote, "resolve", again)
    code = CodeGit(repository="https://gti.example/x.git", commit="0" * 40)
    error = checkout_fails(tmp_path, code)
    assert failure_kind(error) == "platform_error"
    assert not counts_against_node(error)
    assert str(error) == (
        "spec.code.repository: 'https://gti.example/x.git': the host gti.example could not be "
        "looked up from this node just now (its DNS failed or did not answer in time); retried"
    )


def test_git_older_than_2_37_fetches_nothing_and_is_the_nodes_fault(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before: git older than 2.37 ignored http.curloptResolve without a word and fetched
    # from whatever a second lookup answered.
    def run(self: AsJob, argv: list[str], *, cwd: Path, timeout: float) -> Any:
        raise AssertionError(f"git ran: {argv}")

    monkeypatch.setattr(AsJob, "run", run)
    code = CodeGit(repository="https://140.82.112.3/x.git", commit="0" * 40)
    dest = tmp_path / "code"
    dest.mkdir()
    with pytest.raises(NodeFault) as raised:
        checkout_git(code, dest, RUNNERS, tmp_path, git_version=(2, 36, 6))
    assert failure_kind(raised.value) == "platform_error"
    assert counts_against_node(raised.value)
    assert str(raised.value).startswith(
        "spec.code.repository: not fetched: this node's git is 2.36.6, older than 2.37"
    )
    # The job's own input is still said as the job's on such a node.
    bad = CodeGit(repository="https://127.0.0.1./x.git", commit="0" * 40)
    with pytest.raises(JobInputError):
        checkout_git(bad, dest, RUNNERS, tmp_path, git_version=(2, 36, 6))


def test_git_that_cannot_run_names_the_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def run(self: AsJob, argv: list[str], *, cwd: Path, timeout: float) -> Any:
        raise subprocess.TimeoutExpired(argv, timeout)

    monkeypatch.setattr(AsJob, "run", run)
    monkeypatch.setattr(git_remote, "resolve", lambda host, port: ["140.82.112.3"])
    error = checkout_fails(tmp_path, CodeGit(repository="https://h/x.git", commit="0" * 40))
    assert failure_kind(error) == "platform_error"
    assert str(error).startswith("spec.code.repository: git init could not run to its end")


def test_git_runs_under_the_jobs_process_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before: checkout_git ran git as the job's user but with no RLIMIT_NPROC (AsJob's
    # max_processes None), so git of a hostile repository had the host's process budget.
    seen: list[AsJob] = []
    done = subprocess.CompletedProcess[bytes]([], 0, b"", b"")

    def run(self: AsJob, argv: list[str], *, cwd: Path, timeout: float) -> Any:
        seen.append(self)
        return done

    monkeypatch.setattr(AsJob, "run", run)
    monkeypatch.setattr(git_remote, "resolve", lambda host, port: ["140.82.112.3"])
    box = sandbox.Sandbox(tmp_path, JobUser(None, None))
    spec = JobSpec(
        name="j",
        team="a",
        user="u",
        entrypoint="train.py",
        gpus=1,
        gpu_flavor="cpu",
        seed=1,
        max_runtime_seconds=60,
        code=CodeGit(repository="https://example.invalid/r.git", commit="0" * 40),
    )
    with pytest.raises(PlatformError, match="gave"):  # rev-parse said "", not the commit
        sandbox.fetch_code(spec, LocalStore(tmp_path / "store"), box, max_processes=77)
    assert seen and {job.max_processes for job in seen} == {77}


def test_a_bundle_the_upload_rule_refuses_is_the_jobs_input_naming_the_field(
    tmp_path: Path,
) -> None:
    store = LocalStore(tmp_path / "store")
    bundle = store_bundle(store, "a", {"../escape.py": b"x"})
    with pytest.raises(JobInputError, match=r"^spec\.code\.sha256: code bundle .* cannot be"):
        fetch_bundle(store, "a", bundle, tmp_path / "code")


def test_a_bundle_that_does_not_verify_is_the_platforms(tmp_path: Path) -> None:
    # The upload checked its sha256 (and submission that it exists): other bytes now are
    # the store's doing (a truncated or corrupted object), not the tenant's.
    store = LocalStore(tmp_path / "store")
    bundle = store_bundle(store, "a", {"train.py": b""})
    store.put_bytes(f"bundles/a/{bundle.sha256}.tar.gz", b"not the bundle")
    with pytest.raises(PlatformError) as raised:
        fetch_bundle(store, "a", bundle, tmp_path / "code")
    assert failure_kind(raised.value) == "platform_error"


def test_a_uid_range_is_held_by_one_runner_per_host(tmp_path: Path) -> None:
    """A second claim of the same uids fails with the way out named; another range, or the
    same one after the first runner let go (or died: the kernel drops the lock), is free."""
    uids = range(216_384, 216_448)
    with claim_job_uids([uids], tmp_path) as held:
        assert held == uids
        with (
            pytest.raises(UidsInUse, match="216384-216447") as refused,
            claim_job_uids([uids], tmp_path),
        ):
            pass
        assert "TRAINYARD_RUNNER_JOB_UID_BASE" in str(refused.value)
        with claim_job_uids([range(300_000, 300_064)], tmp_path):
            pass
    with claim_job_uids([uids], tmp_path):
        pass


def test_runners_whose_derived_uids_clash_each_take_the_next_free_range(tmp_path: Path) -> None:
    """CI failed when a runner of one local stack refused to start: its node id and data
    folder hashed to the range another stack's runner held. A derived range is a first
    choice: the runner takes the next free one, and gets its first back once it is free."""
    clashing = RunnerSettings(node_id="chaos-3", admin_token=SecretStr("t")).job_uid_choices
    first, second = clashing[0], clashing[1]
    with claim_job_uids(clashing, tmp_path) as one, claim_job_uids(clashing, tmp_path) as two:
        assert (one, two) == (first, second)
        with pytest.raises(UidsInUse), claim_job_uids(clashing[:2], tmp_path):
            pass
    with claim_job_uids(clashing, tmp_path) as again:
        assert again == first  # a restarted runner keeps its range


def test_two_held_ranges_are_named_when_none_is_free(tmp_path: Path) -> None:
    choices = [range(300_000, 300_064), range(300_064, 300_128)]
    with (
        claim_job_uids(choices[:1], tmp_path),
        claim_job_uids(choices[1:], tmp_path),
        pytest.raises(UidsInUse, match="300000-300127 are held by other runners"),
        claim_job_uids(choices, tmp_path),
    ):
        pass


@pytest.mark.skipif(os.geteuid() != 0, reason="files of other users need root")
def test_only_the_uids_files_go_and_no_link_is_followed(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o1777)
    shared.chmod(0o1777)
    precious = tmp_path / "precious"
    precious.write_text("root's")
    uid, other = 290_001, 290_002

    def owned(path: Path, by: int) -> Path:
        os.lchown(path, by, by)
        return path

    (shared / "left.txt").write_text("a's")
    owned(shared / "left.txt", uid)
    (shared / "link").symlink_to(precious)
    owned(shared / "link", uid)
    (shared / "folder").mkdir()
    (shared / "folder" / "inside").write_text("a's")
    owned(shared / "folder", uid)
    (shared / "others").mkdir(mode=0o777)
    (shared / "others").chmod(0o777)
    owned(shared / "others", other)
    (shared / "others" / "mine").write_text("a's, in another's open folder")
    owned(shared / "others" / "mine", uid)
    (shared / "others" / "theirs").write_text("b's")
    owned(shared / "others" / "theirs", other)
    (shared / "closed").mkdir(mode=0o755)
    (shared / "closed" / "x").write_text("not searched")
    owned(shared / "closed" / "x", uid)

    assert remove_files_of(range(uid, uid + 1), [shared]) == 4
    assert sorted(p.name for p in shared.iterdir()) == ["closed", "others"]
    assert [p.name for p in (shared / "others").iterdir()] == ["theirs"]
    assert precious.read_text() == "root's"
    assert (shared / "closed" / "x").exists()  # a folder the uid cannot write to


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting and files of other users need root")
def test_no_file_is_removed_across_a_mount_below_a_shared_folder(tmp_path: Path) -> None:
    # A world-writable folder may hold a mount of a file system other hosts share (an NFS
    # scratch space): the same job uid runs on every node, so a file of that uid there may
    # be another node's running job's. The walk stays on the shared folder's file system.
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o1777)
    shared.chmod(0o1777)
    mounted = shared / "scratch"
    mounted.mkdir(mode=0o1777)
    uid = 290_003
    mounting = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "mode=1777,size=1m", "tmpfs", str(mounted)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounting.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounting.stderr.strip()}")
    try:
        (shared / "mine").write_text("this node's job's")
        os.lchown(shared / "mine", uid, uid)
        (mounted / "another-nodes").write_text("another node's job's, same uid")
        os.lchown(mounted / "another-nodes", uid, uid)
        assert remove_files_of(range(uid, uid + 1), [shared]) == 1
        assert not (shared / "mine").exists()
        assert (mounted / "another-nodes").exists()
    finally:
        subprocess.run(["umount", str(mounted)], check=False)


def test_folders_on_a_file_system_other_hosts_share_are_not_searched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    top = tmp_path / "root"
    for folder in (
        top / "scratch",
        top / "scratch" / "tmp",
        top / "mnt" / "team space",
        top / "local",
    ):
        folder.mkdir(parents=True)
        folder.chmod(0o1777)
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(
        "22 1 0:21 / / rw,relatime shared:1 - ext4 /dev/vda1 rw\n"
        f"40 22 0:40 / {top}/scratch rw - nfs4 server:/scratch rw,vers=4.2\n"
        f"41 22 0:41 / {top}/mnt/team\\040space rw - fuse.sshfs me@host:/x rw\n"
        f"42 22 0:42 / {top}/local rw - tmpfs tmpfs rw\n"
        f"43 22 0:43 / {top}/overlay rw - fuse.fuse-overlayfs fuse-overlayfs rw\n"
    )
    assert sandbox.network_mounts(mountinfo) == {top / "scratch", top / "mnt" / "team space"}
    read = sandbox.network_mounts
    monkeypatch.setattr(sandbox, "network_mounts", lambda: read(mountinfo))
    # A temporary folder of every host's, below a network mount (/var on NFS: /var/tmp).
    monkeypatch.setattr(sandbox, "SHARED_TEMP_FOLDERS", (top / "scratch" / "tmp",))
    found = [p for p in shared_folders(top, depth=3) if p.is_relative_to(top)]
    assert found == [top / "local"]


def test_a_job_uid_range_holding_an_account_of_the_host_is_refused(tmp_path: Path) -> None:
    # A root runner kills every process of its job uids (kill_user); a range overlapping
    # root's uid (or any account's) would kill that account's processes at every job's end.
    with (
        pytest.raises(UidsInUse, match=r"account 'root'.*TRAINYARD_RUNNER_JOB_UID_BASE"),
        claim_job_uids([range(0, 64)], tmp_path),
    ):
        pass
    assert not list(tmp_path.iterdir())  # refused before any lock was taken


def test_shared_folders_are_found_below_the_top_and_not_searched_twice(tmp_path: Path) -> None:
    top = tmp_path / "root"
    (top / "run" / "lock").mkdir(parents=True)
    (top / "run" / "lock").chmod(0o1777)
    (top / "open" / "inner").mkdir(parents=True)
    (top / "open").chmod(0o1777)
    (top / "open" / "inner").chmod(0o1777)
    (top / "a" / "b" / "c" / "deep").mkdir(parents=True)
    (top / "a" / "b" / "c" / "deep").chmod(0o1777)
    found = [p for p in shared_folders(top, depth=3) if p.is_relative_to(top)]
    # The inner one is searched with "open" (remove_files_of descends into what everyone
    # may write); "deep" lies four levels down.
    assert sorted(found) == [top / "open", top / "run" / "lock"]


@pytest.mark.skipif(
    os.geteuid() != 0 or not Path("/usr/bin/python3").exists(),
    reason="switching users needs root, and an interpreter any user may run",
)
def test_what_runs_as_the_job_has_the_jobs_process_budget(tmp_path: Path) -> None:
    # The probe of a job's interpreter runs the .pth files of its environment: the tenant's
    # code, which must not fork without bound either.
    forking = (
        "import os, time\n"
        "refused = 0\n"
        "for _ in range(30):\n"
        "    try:\n"
        "        if os.fork() == 0:\n"
        "            os.close(1); os.close(2); time.sleep(30); os._exit(0)\n"
        "    except BlockingIOError:\n"
        "        refused += 1\n"
        "print(refused)\n"
    )
    tmp_path.chmod(0o755)
    as_job = AsJob(JobUser(290_003, 290_003), {"PATH": "/usr/bin:/bin"}, max_processes=10)
    result = as_job.run(["/usr/bin/python3", "-c", forking], cwd=tmp_path, timeout=60)
    assert result.returncode == 0, result.stderr
    assert int(result.stdout) >= 20


async def test_the_jobs_process_budget_is_set_in_one_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # RLIMIT_NPROC was set twice, in process._job_preexec for the job's own processes and
    # in AsJob.run for what else runs as the job: two copies of one budget to keep alike.
    from trainyard_platform.services.runner.process import JobProcess

    asked: list[int | None] = []
    real = sandbox.job_preexec

    def recording(max_processes: int | None, *confinement: Any) -> object:
        asked.append(max_processes)
        return real(max_processes, *confinement)

    monkeypatch.setattr(sandbox, "job_preexec", recording)
    user = JobUser(None, None)  # the runner's own user: no budget, but the same path
    AsJob(user, {"PATH": "/usr/bin:/bin"}, max_processes=10).run(["true"], cwd=tmp_path, timeout=30)
    job = await JobProcess.start(["true"], cwd=tmp_path, env={}, user=user, max_processes=10)
    await job.wait()
    job.close()
    assert asked == [None, None]


def test_a_runners_uids_are_acted_as_by_one_helper_not_a_fork_of_the_runner_each(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A fork copies the forking process's memory map: forked from the runner, 64 kills and
    # 64 keyring clears at each start took seconds; one small helper forks them all. One
    # uid (a job's end) is still a child of the runner's: the helper's start costs more.
    calls: list[list[str]] = []
    monkeypatch.setattr(sandbox, "can_switch_users", lambda: True)
    monkeypatch.setattr(sandbox, "leftover_processes", lambda uids, groups, allocations=(): [])
    monkeypatch.setattr(sandbox.subprocess, "run", lambda args, **kwargs: calls.append(list(args)))
    uids = range(291_000, 291_064)
    sandbox.kill_leftovers(uids, [])
    sandbox.clear_keyrings_of(uids)
    assert [call[5] for call in calls] == ["kill", "clear_keyrings"]
    assert all(call[-64:] == [str(uid) for uid in uids] for call in calls)
    sandbox.kill_user(291_000)
    sandbox.clear_keyrings_of(range(291_000, 291_001))
    assert calls[2:] == [["/bin/true"], ["/bin/true"]]


def test_what_runs_as_a_job_uid_for_the_runner_gets_none_of_its_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Once a process of a job's uid has run a program, that uid may read its environment
    # (/proc/<pid>/environ), and the runner's holds its credentials.
    environments: list[object] = []
    monkeypatch.setattr(sandbox, "can_switch_users", lambda: True)
    monkeypatch.setattr(sandbox, "leftover_processes", lambda uids, groups, allocations=(): [])
    monkeypatch.setattr(
        sandbox.subprocess, "run", lambda args, **kwargs: environments.append(kwargs.get("env"))
    )
    sandbox.kill_leftovers(range(291_000, 291_064), [])
    sandbox.kill_user(291_000)
    sandbox.clear_keyrings_of(range(291_000, 291_001))
    assert environments == [{}, {}, {}]


def test_the_helper_runs_the_one_copy_of_the_logic_in_an_empty_isolated_interpreter() -> None:
    # Before: the kill and keyring logic was written twice, once as functions of this
    # module and once as a string (_AS_EACH) the helper interpreter ran, with the keyctl
    # numbers passed on its command line. Now the helper runs as_uid itself, which
    # imports nothing of the platform: it works without site and with no environment.
    import inspect

    from trainyard_platform.services.runner import as_uid

    def helper(*argv: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            [sys.executable, "-I", "-S", "-c", as_uid.HELPER, *argv],
            env={},
            capture_output=True,
            timeout=60,
            check=False,
        )

    assert helper("kill").returncode == 0  # no uid: nothing to do
    unknown = helper("nothing-such")
    assert unknown.returncode != 0 and b"KeyError" in unknown.stderr
    assert "os.kill(-1" not in inspect.getsource(sandbox)
    assert set(as_uid.ACTIONS) == {"kill", "clear_keyrings"}


_KEYS = """
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
ADD_KEY, KEYCTL, KEYCTL_SEARCH, USER_KEYRING = 248, 250, 10, -4
if sys.argv[1] == "add":
    print(libc.syscall(ADD_KEY, b"user", b"left-behind", b"s3cr3t", 6, USER_KEYRING))
else:  # in the uid's user keyring itself, whatever session keyring this process inherited
    found = libc.syscall(KEYCTL, KEYCTL_SEARCH, USER_KEYRING, b"user", b"left-behind", 0)
    print("kept" if found > 0 else "nothing")
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")
@pytest.mark.skipif(os.uname().machine != "x86_64", reason="x86-64 syscall numbers")
def test_the_helper_clears_the_keyrings_of_each_uid(tmp_path: Path) -> None:
    # Several uids (a runner's start) go through the helper interpreter, which now runs
    # as_uid's clear_my_keyrings: the same code a job's end runs in the runner's child.
    from trainyard_platform.services.runner.environments import (
        EnvironmentBuildError,
        job_interpreter,
    )

    try:
        python = job_interpreter(sys.executable)  # one the uids may run
    except EnvironmentBuildError as exc:
        pytest.skip(str(exc))

    def as_uid_run(uid: int, arg: str) -> str:
        done = subprocess.run(
            [python, "-I", "-S", "-c", _KEYS, arg],
            user=uid,
            group=uid,
            extra_groups=[],
            env={},
            cwd="/",
            capture_output=True,
            timeout=60,
            check=True,
        )
        return done.stdout.decode().strip()

    uids = range(291_200, 291_202)
    # A process of each uid held meanwhile: a kernel may free a uid's user keyring along
    # with its last process, which would empty it whatever the helper does.
    holders = [
        subprocess.Popen(["sleep", "600"], user=uid, group=uid, extra_groups=[], cwd="/")
        for uid in uids
    ]
    try:
        for uid in uids:
            assert int(as_uid_run(uid, "add")) > 0
            assert as_uid_run(uid, "find") == "kept"
        sandbox.clear_keyrings_of(uids)
        assert [as_uid_run(uid, "find") for uid in uids] == ["nothing", "nothing"]
    finally:
        for holder in holders:
            holder.kill()
            holder.wait()


@pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")
def test_every_process_of_each_uid_is_killed_and_no_other(tmp_path: Path) -> None:
    def sleeper(uid: int) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            ["sleep", "600"], user=uid, group=uid, extra_groups=[], cwd="/", start_new_session=True
        )

    inside = [sleeper(291_100), sleeper(291_101), sleeper(291_101)]
    outside = sleeper(291_102)
    try:
        sandbox.kill_users(range(291_100, 291_102))
        assert [p.wait(timeout=10) for p in inside] == [-9, -9, -9]
        assert outside.poll() is None
        sandbox.kill_user(291_102)  # one uid: the runner's own child sends the kill
        assert outside.wait(timeout=10) == -9
    finally:
        for p in [*inside, outside]:
            p.kill()
            p.wait()


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_what_runs_as_the_job_cannot_fill_the_runners_memory_with_its_output(
    tmp_path: Path, stream: str
) -> None:
    # The probe of a job's interpreter runs its environment's .pth files (a wheel the tenant
    # chose), and git prints what the tenant's server sends: before, the runner kept every
    # byte of it (subprocess.run's capture), for up to the probe's 60 s.
    redirect = ">&2" if stream == "stderr" else ""
    over = sandbox.MAX_AS_JOB_OUTPUT_BYTES * 2
    as_job = AsJob(JobUser(None, None), {"PATH": "/usr/bin:/bin"})
    with pytest.raises(
        sandbox.OutputTooLarge,
        match=f"more than {sandbox.MAX_AS_JOB_OUTPUT_BYTES} bytes on {stream}",
    ):
        as_job.run(
            ["/bin/sh", "-c", f"head -c {over} /dev/zero {redirect}"], cwd=tmp_path, timeout=60
        )


def test_output_within_the_bound_is_all_there(tmp_path: Path) -> None:
    as_job = AsJob(JobUser(None, None), {"PATH": "/usr/bin:/bin"})
    done = as_job.run(
        ["/bin/sh", "-c", "printf out; printf err >&2; exit 3"], cwd=tmp_path, timeout=60
    )
    assert (done.returncode, done.stdout, done.stderr) == (3, b"out", b"err")
    with pytest.raises(subprocess.TimeoutExpired):
        as_job.run(["/bin/sh", "-c", "sleep 30"], cwd=tmp_path, timeout=0.5)


def test_git_printing_past_the_bound_is_the_jobs_input_naming_the_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def run(self: AsJob, argv: list[str], *, cwd: Path, timeout: float) -> Any:
        raise sandbox.OutputTooLarge("git printed more than 16 bytes on stderr")

    monkeypatch.setattr(AsJob, "run", run)
    monkeypatch.setattr(git_remote, "resolve", lambda host, port: ["140.82.112.3"])
    code = CodeGit(repository="https://git.example.com/noisy.git", commit="a" * 40)
    (tmp_path / "code").mkdir()
    with pytest.raises(JobInputError, match=r"^spec\.code\.repository: .*more than 16 bytes"):
        checkout_git(code, tmp_path / "code", JobUser(None, None), tmp_path)


def test_a_restarted_runner_takes_back_the_range_its_jobs_ran_as(tmp_path: Path) -> None:
    """A runner that took its second choice (the first held), killed, then restarted once
    its first was free, took the first: its jobs' processes, under the second, were left for
    nobody to kill. The range held last is tried first; an operator's range stays alone."""
    record = tmp_path / "job-uids"
    choices = RunnerSettings(node_id="chaos-3", admin_token=SecretStr("t")).job_uid_choices
    assert remembered_first(choices, record) == choices  # nothing recorded yet
    locks = tmp_path / "locks"
    with claim_job_uids(choices, locks), claim_job_uids(choices, locks) as second:
        remember_job_uids(record, second)
    ordered = remembered_first(choices, record)
    assert ordered[0] == choices[1] and sorted(ordered, key=lambda r: r.start) == sorted(
        choices, key=lambda r: r.start
    )
    with claim_job_uids(ordered, locks) as again:
        assert again == choices[1]
    record.write_text("not a number")
    assert remembered_first(choices, record) == choices
    assert remembered_first(choices[:1], tmp_path / "none") == choices[:1]


@pytest.fixture
def setuid_id() -> Iterator[Path]:
    """A copy of ``id`` that is setuid root, where a job's user reaches it (as in /tmp)."""
    folder = Path(tempfile.mkdtemp(prefix="trainyard-test-"))
    try:
        folder.chmod(0o711)
        program = folder / "id"
        shutil.copyfile("/usr/bin/id", program)
        program.chmod(0o4755)
        yield program
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.skipif(
    os.geteuid() != 0 or not sys.platform.startswith("linux") or not Path("/usr/bin/id").exists(),
    reason="switching users needs root; no_new_privs is Linux's",
)
async def test_a_setuid_program_gives_the_job_no_privilege(setuid_id: Path) -> None:
    """A setuid-root program (``fusermount``, ``pkexec``, a copy a job left in ``/tmp``)
    ran with root's effective uid when the job started it: what runs as the job has
    ``no_new_privs``, as the container executor's ``no-new-privileges``, so it stays the
    job's."""
    from trainyard_platform.services.runner.process import JobProcess

    user = JobUser(291_200, 291_200)
    done = AsJob(user, {"PATH": "/usr/bin:/bin"}).run(
        [str(setuid_id), "-u"], cwd=Path("/"), timeout=30
    )
    assert done.stdout.decode().strip() == "291200"
    job = await JobProcess.start([str(setuid_id), "-u"], cwd=Path("/"), env={}, user=user)
    said = [block async for block in job.output()]
    await job.wait()
    job.close()
    assert said == [b"291200\n"]


IN_A_TERMINAL = """
import asyncio, os, pty, sys
from pathlib import Path
from trainyard_platform.services.runner.process import JobProcess
from trainyard_platform.services.runner.sandbox import AsJob, JobUser

OPEN_TTY = [sys.executable, "-c", "open('/dev/tty', 'rb')"]

async def job() -> int:
    process = await JobProcess.start(OPEN_TTY, cwd=Path("/"), env={})
    async for _ in process.output():
        pass
    process.close()
    return await process.wait()

pid, _ = pty.fork()  # the child's controlling terminal is the pty, as a shell's is
if pid == 0:
    try:
        as_job = AsJob(JobUser(None, None), {}).run(OPEN_TTY, cwd=Path("/"), timeout=60)
        os._exit(as_job.returncode * 10 + asyncio.run(job()))
    except BaseException:
        os._exit(99)
print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
"""


def test_what_runs_as_the_job_has_no_controlling_terminal() -> None:
    """A runner started from a shell has that shell's terminal as its controlling terminal:
    a job in the runner's session could open ``/dev/tty``, read what the operator types or
    push input into a root shell (``TIOCSTI``). What runs as the job leads a session of
    its own, without a terminal."""
    root = Path(__file__).resolve().parents[3]
    done = subprocess.run(
        [sys.executable, "-c", IN_A_TERMINAL],
        cwd=root,
        env={**os.environ, "PYTHONPATH": f"{root}:{root / 'client'}"},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    # Each open failed (exit status 1): the probe's as the tens, the job's as the units.
    assert done.stdout.strip() == "11", done.stderr


@pytest.mark.parametrize(
    "form",
    ["https://{host}:{port}/x.git", "git://{host}:{port}/x.git"],
)
def test_git_connects_to_the_address_judged_never_to_a_lookup_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, form: str
) -> None:
    """Between the runner's lookup and git's own, a name may come to resolve elsewhere (DNS
    rebinding: public when judged, 127.0.0.1 when git connects). git is given the address
    judged: here a name no DNS knows reaches the address the runner's lookup said."""
    looked_up: list[str] = []

    def resolve(host: str, port: int) -> list[str]:
        looked_up.append(host)
        return ["127.0.0.1"]

    monkeypatch.setattr(git_remote, "resolve", resolve)
    with Listener() as server:
        repository = form.format(host="pinned.example.invalid", port=server.port)
        error = checkout_fails(tmp_path, CodeGit(repository=repository, commit="0" * 40), LOOPBACK)
        assert looked_up == ["pinned.example.invalid"]
        assert server.accepted >= 1, str(error)
    assert "did not resolve" not in str(error)


def test_git_connects_to_the_address_written_whatever_user_is_written_before_it(
    tmp_path: Path,
) -> None:
    """git takes a git:// host apart itself: of ``git://localhost@127.0.0.1:<port>/`` it
    looked up ``localhost@127.0.0.1`` as a name, one the runner never judged. It is given
    the address judged instead."""
    with Listener() as server:
        repository = f"git://localhost@127.0.0.1:{server.port}/x.git"
        error = checkout_fails(tmp_path, CodeGit(repository=repository, commit="0" * 40), LOOPBACK)
        assert server.accepted >= 1, str(error)
    assert "look up" not in str(error)

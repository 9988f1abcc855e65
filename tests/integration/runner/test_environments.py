"""Job environments built for real: venvs from the test interpreter's environment (the base
layer), requirements installed from PyPI (small pure-Python wheels the project does not
depend on), one build per requirement set across threads and processes."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any, Literal

import pytest

from tests.fixtures.git_servers import Listener
from tests.fixtures.wheel_server import Answer, Wheels, wheel_servers
from trainyard_platform.services.runner import disk_watch
from trainyard_platform.services.runner.environments import (
    BUILD_MAX_SETTING,
    MARKER,
    STORE,
    EnvironmentBuildError,
    EnvironmentCache,
    InstallError,
    JobEnvironment,
    RequirementsError,
    job_interpreter,
)
from trainyard_platform.services.runner.git_remote import PrivateAllowed

pytestmark = pytest.mark.integration
__all__ = ["wheel_servers"]  # the fixture, used by name
LOOPBACK = PrivateAllowed.parse(["127.0.0.0/8"])

REPO = Path(__file__).resolve().parents[3]
BASE = sys.executable
OLD_SIX = "six==1.16.0"  # the base has another six (pytest's dependency tree)
TABULATE = "tabulate==0.9.0"  # not in the base at all


def run_in(env: JobEnvironment, code: str) -> str:
    done = subprocess.run(
        [env.python, "-c", code], capture_output=True, text=True, check=False, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def forbid_installing(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the installer ran")

    monkeypatch.setattr(EnvironmentCache, "_create_venv", refuse)
    monkeypatch.setattr(EnvironmentCache, "_install", refuse)


def test_requirements_override_the_base_which_stays_visible(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert version("six") != "1.16.0"
    cache = EnvironmentCache(tmp_path / "envs", BASE, "uv")
    env = cache.resolve([OLD_SIX, TABULATE])

    assert not env.cached
    assert env.bin_dir == tmp_path / "envs" / env.key / "bin"
    assert env.python == str(env.bin_dir / "python")
    assert {OLD_SIX, TABULATE, f"pydantic=={version('pydantic')}"} <= set(env.packages)
    assert "trainyard==0.1.0" in env.packages
    out = run_in(
        env,
        "import six, tabulate, pydantic, trainyard.sdk, sys;"
        "print(six.__version__, tabulate.__file__.startswith(sys.prefix),"
        " pydantic.VERSION, pydantic.__file__.startswith(sys.prefix))",
    )
    assert out.split() == ["1.16.0", "True", version("pydantic"), "False"]

    # Same set, spelled and ordered differently, from another cache object: no install.
    forbid_installing(monkeypatch)
    again = EnvironmentCache(tmp_path / "envs", BASE, "uv").resolve(
        ["Tabulate == 0.9.0", "SIX==1.16.0", TABULATE]
    )
    assert again.cached
    assert (again.key, again.python, again.packages) == (env.key, env.python, env.packages)
    assert again.seconds < 1


def test_no_requirements_is_the_base_interpreter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = EnvironmentCache(tmp_path / "envs", BASE)
    env = cache.resolve([])
    assert (env.python, env.bin_dir, env.cached) == (BASE, None, True)
    assert f"pydantic=={version('pydantic')}" in env.packages
    assert env.key == cache.key([]) and len(env.key) == 64
    assert not (tmp_path / "envs").exists()

    def no_subprocess(*args: Any, **kwargs: Any) -> str:
        raise AssertionError("probed the base again")

    monkeypatch.setattr(cache, "_run", no_subprocess)
    assert cache.resolve([]).packages == env.packages  # memoised


def test_the_key_depends_on_the_set_and_the_installer(tmp_path: Path) -> None:
    uv = EnvironmentCache(tmp_path, BASE, "uv")
    pip = EnvironmentCache(tmp_path, BASE, "pip")
    assert uv.key(["a==1", "b>=2,<3"]) == uv.key(["B <3, >=2", "A==1", "a==1"])
    assert uv.key(["a==1"]) != uv.key(["a==2"]) != uv.key([])
    assert uv.key(["a==1"]) != pip.key(["a==1"])
    with pytest.raises(ValueError, match="not a pip option"):
        uv.key(["--index-url=https://elsewhere"])


def test_concurrent_resolves_build_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    builds: list[str] = []
    real_build = EnvironmentCache._build

    def slow_build(self: EnvironmentCache, *args: Any) -> None:
        builds.append(threading.current_thread().name)
        time.sleep(0.3)  # widen the window for the other resolve
        real_build(self, *args)

    monkeypatch.setattr(EnvironmentCache, "_build", slow_build)
    results: list[JobEnvironment] = []
    errors: list[BaseException] = []

    def resolve() -> None:
        try:  # one cache object per thread, as two runner processes would have
            results.append(EnvironmentCache(tmp_path / "envs", BASE).resolve([TABULATE]))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=resolve) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors
    assert len(builds) == 1
    assert sorted(r.cached for r in results) == [False, True]
    assert results[0].python == results[1].python
    assert len(list((tmp_path / "envs" / STORE).iterdir())) == 1


def test_another_process_waits_for_the_build(tmp_path: Path) -> None:
    root = tmp_path / "envs"
    script = (
        "import json, sys; from pathlib import Path;"
        "from services.runner.environments import EnvironmentCache;"
        f"e = EnvironmentCache(Path({str(root)!r}), {BASE!r}).resolve([{TABULATE!r}]);"
        "print(json.dumps([e.cached, e.python]))"
    )
    other = subprocess.Popen(
        [BASE, "-c", script], cwd=REPO, stdout=subprocess.PIPE, text=True, env=os.environ.copy()
    )
    mine = EnvironmentCache(root, BASE).resolve([TABULATE])
    out, _ = other.communicate(timeout=120)
    assert other.returncode == 0
    cached, python = json.loads(out)
    assert python == mine.python
    assert sorted([cached, mine.cached]) == [False, True]


def test_a_failed_install_says_why_and_leaves_nothing(tmp_path: Path) -> None:
    cache = EnvironmentCache(tmp_path / "envs", BASE)
    missing = "trainyard-no-such-package-xyz==1.0"
    with pytest.raises(EnvironmentBuildError) as caught:
        cache.resolve([missing])
    message = str(caught.value)
    assert message.startswith(
        f"uv pip install failed (exit status 1) on the requirement {missing!r}; it said:\n"
    )
    assert "trainyard-no-such-package-xyz" in message
    assert "not found" in message
    assert len(message.splitlines()) <= 9  # the last 8 relevant lines
    assert str(tmp_path) not in message and "/.store/" not in message  # the runner's paths
    assert not cache.path(cache.key([missing])).exists()
    assert list((tmp_path / "envs" / STORE).iterdir()) == []


@pytest.mark.parametrize("installer", ["uv", "pip"])
@pytest.mark.parametrize(
    ("requirement", "says"),
    [
        ("trainyard-no-such-package-xyz==1.0", "trainyard-no-such-package-xyz"),
        ("six==99", "six"),  # no such version
        ("pyyaml==3.13", "pyyaml"),  # only a source distribution: no wheel
    ],
)
def test_requirements_that_cannot_be_met_are_the_jobs_fault(
    tmp_path: Path, installer: Literal["uv", "pip"], requirement: str, says: str
) -> None:
    cache = EnvironmentCache(tmp_path / "envs", BASE, installer)
    with pytest.raises(RequirementsError) as caught:
        cache.resolve([requirement])
    assert says in str(caught.value).lower()


@pytest.mark.parametrize("installer", ["uv", "pip"])
def test_an_unreachable_index_is_the_platforms_fault(
    tmp_path: Path, installer: Literal["uv", "pip"]
) -> None:
    index = "http://127.0.0.1:9/simple"  # nothing listens on the discard port
    settings = {"UV_INDEX_URL": index, "UV_NO_CACHE": "1"} | {
        "PIP_INDEX_URL": index, "PIP_RETRIES": "1", "PIP_NO_CACHE_DIR": "1"
    }  # fmt: skip
    cache = EnvironmentCache(tmp_path / "envs", BASE, installer, installer_env=settings)
    with pytest.raises(EnvironmentBuildError) as caught:
        cache.resolve([TABULATE])
    assert not isinstance(caught.value, RequirementsError), str(caught.value)
    # The install failed: what follows the job's requirements, never held against the node.
    assert isinstance(caught.value, InstallError), str(caught.value)


def test_a_crash_mid_build_leaves_nothing_that_looks_ready(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "envs"
    cache = EnvironmentCache(root, BASE)
    key = cache.key([TABULATE])

    def killed(*args: Any) -> None:
        # as if the runner died here: the venv exists, unpublished and without a marker
        (root / STORE / f"{key}.dead").mkdir(parents=True)
        raise KeyboardInterrupt

    monkeypatch.setattr(EnvironmentCache, "_install", killed)
    with pytest.raises(KeyboardInterrupt):
        cache.resolve([TABULATE])
    assert not cache.path(key).exists()
    monkeypatch.undo()

    env = cache.resolve([TABULATE])  # builds afresh
    assert not env.cached and (cache.path(key) / MARKER).is_file()
    assert cache.prune(keep=10) == []
    assert [p.name for p in (root / STORE).iterdir()] == [
        Path(env.python).parents[1].resolve().name
    ]


# An installer unpacking a wheel far larger than its download (a zip bomb): chunks of
# random bytes (zeros might be stored compressed, taking no blocks) into the environment,
# until it is killed or has written 256 MiB; then it says the disk is full, and marks that
# it ran to the end.
BOMB = """
import os, sys, time
with open(os.path.join(sys.argv[1], "bomb.bin"), "wb") as out:
    for _ in range(1024):
        out.write(os.urandom(256 * 1024))
        out.flush()
        time.sleep(0.005)
open(sys.argv[2], "w").close()
print("error: failed to write bomb.bin: No space left on device (os error 28)")
sys.exit(2)
"""


def test_a_build_over_its_bound_is_stopped_as_the_jobs_fault_and_flushes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "envs"
    bound = 8 * 1024 * 1024
    cache = EnvironmentCache(root, BASE, build_max_bytes=bound, build_check_s=0.01)
    ran_to_the_end = tmp_path / "ran to the end"
    real_install = EnvironmentCache._install

    def install(self: EnvironmentCache, target: Path, purelib: Path, *args: Any) -> Any:
        if "bomb" not in args[0]:
            return real_install(self, target, purelib, *args)
        argv = [sys.executable, "-c", BOMB, str(purelib), str(ran_to_the_end)]
        self._run(argv, "uv pip install", installing=True, requirements=args[0])
        return {}

    monkeypatch.setattr(EnvironmentCache, "_install", install)
    other = cache.resolve([TABULATE], team="another team")  # cached, no job in it
    other_target = Path(other.python).parents[1].resolve()

    with pytest.raises(RequirementsError) as raised:
        cache.resolve(["bomb"], team="tenant")

    message = str(raised.value)
    assert f"over {disk_watch.gib(bound)} of disk" in message
    assert BUILD_MAX_SETTING in message
    assert "No space left" not in message
    assert not ran_to_the_end.exists()  # the installer was killed, not waited for
    assert not cache.path(cache.key(["bomb"])).exists()  # never published...
    assert [p.resolve() for p in (root / STORE).iterdir()] == [other_target]  # ...nor left
    # Its out of disk was the build's own doing: the other team's environment stays.
    assert cache.path(other.key).resolve() == other_target
    assert (other_target / MARKER).is_file()


# An installer that starts a process in a session of its own (out of its process group,
# so not killed with it) which holds the output pipe open, says its pid, and hangs.
ESCAPES = """
import subprocess, sys, time
left = subprocess.Popen(
    [sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True
)
print(f"left running: {left.pid}", flush=True)
time.sleep(600)
"""


def test_a_command_timed_out_is_not_waited_for_past_what_left_its_group(
    tmp_path: Path,
) -> None:
    cache = EnvironmentCache(tmp_path / "envs", BASE, timeout=1.0)
    argv = [sys.executable, "-c", ESCAPES]
    with pytest.raises(EnvironmentBuildError) as raised:
        cache._run(argv, "creating the virtual environment")
    message = str(raised.value)
    left = int(message.split("left running: ")[1].split()[0])
    os.kill(left, signal.SIGKILL)
    assert message.startswith("creating the virtual environment timed out after 1 s")


def test_everything_is_readable_by_other_users(tmp_path: Path) -> None:
    root = tmp_path / "envs"
    old = os.umask(0o077)  # a strict runner umask must not leak into the environments
    try:
        env = EnvironmentCache(root, BASE).resolve([TABULATE])
    finally:
        os.umask(old)
    target = Path(env.python).parents[1].resolve()
    assert stat.S_IMODE(root.stat().st_mode) == 0o711  # passed through, never listed
    for dirpath, _dirnames, filenames in os.walk(target):
        assert stat.S_IMODE(os.stat(dirpath).st_mode) == 0o755, dirpath
        for name in filenames:
            st = os.lstat(os.path.join(dirpath, name))
            if stat.S_ISREG(st.st_mode):
                assert st.st_mode & 0o044 == 0o044, name
                if st.st_mode & 0o100:
                    assert st.st_mode & 0o011 == 0o011, name
    assert os.access(target / "bin" / "tabulate", os.X_OK)


def test_pip_as_the_installer(tmp_path: Path) -> None:
    env = EnvironmentCache(tmp_path / "envs", BASE, "pip").resolve([OLD_SIX])
    assert not env.cached
    assert OLD_SIX in env.packages
    assert run_in(env, "import six, pydantic; print(six.__version__)") == "1.16.0"


def test_prune_keeps_the_recent_and_those_in_use(tmp_path: Path) -> None:
    cache = EnvironmentCache(tmp_path / "envs", BASE)
    lease = cache.acquire([TABULATE])  # oldest, but in use
    for n, requirements in enumerate([[OLD_SIX], [OLD_SIX, TABULATE]]):
        env = cache.resolve(requirements)
        os.utime(cache.path(env.key) / ".last-used", (time.time() + n + 1,) * 2)
    old_six = cache.key([OLD_SIX])
    newest = cache.key([OLD_SIX, TABULATE])

    assert cache.prune(keep=1) == [old_six]
    assert not cache.path(old_six).exists()
    assert cache.path(lease.env.key).exists() and cache.path(newest).exists()
    assert run_in(lease.env, "import tabulate; print('ok')") == "ok"

    lease.release()
    assert cache.prune(keep=1) == [lease.env.key]
    left = sorted(p.name for p in (tmp_path / "envs").iterdir() if not p.name.endswith(".lock"))
    assert left == sorted([STORE, newest])
    again = cache.resolve([TABULATE])  # pruned: built again
    assert not again.cached


@pytest.mark.parametrize("installer", ["uv", "pip"])
def test_provided_packages_always_come_from_the_base(
    tmp_path: Path, installer: Literal["uv", "pip"]
) -> None:
    # python-dateutil depends on six; with six "provided" (as torch is by default) it must
    # not be installed into the venv, so the base's six is the one the job imports.
    cache = EnvironmentCache(tmp_path / "envs", BASE, installer, provided=["six"])
    env = cache.resolve(["python-dateutil==2.9.0.post0"])
    assert "python-dateutil==2.9.0.post0" in env.packages
    assert f"six=={version('six')}" in env.packages
    assert run_in(env, "import six, sys; print(six.__file__.startswith(sys.prefix))") == "False"

    # Named at a version the base does not have: the job cannot get another six.
    with pytest.raises(RequirementsError) as caught:
        cache.resolve(["python-dateutil==2.9.0.post0", OLD_SIX])
    assert f"the platform provides six {version('six')}" in str(caught.value)


def _site_packages(env: JobEnvironment) -> Path:
    assert env.bin_dir is not None
    (found,) = env.bin_dir.parent.glob("lib/python3*/site-packages")
    return found


def _imported_from_the_base(env: JobEnvironment, module: str) -> bool:
    code = f"import importlib.util as u, sys; print(u.find_spec({module!r}).origin)"
    origin = run_in(env, code)
    return not origin.startswith(str(env.bin_dir.parent if env.bin_dir else "?"))


@pytest.mark.parametrize("installer", ["uv", "pip"])
def test_a_requirement_on_torch_that_the_base_satisfies_is_met_by_the_base(
    tmp_path: Path, installer: Literal["uv", "pip"]
) -> None:
    cache = EnvironmentCache(tmp_path / "envs", BASE, installer)
    for requirements in (["torch"], ["torch>=1", "torch", TABULATE]):
        env = cache.resolve(requirements)
        assert f"torch=={version('torch')}" in env.packages
        assert not list(_site_packages(env).glob("torch*"))
        assert _imported_from_the_base(env, "torch")
    assert TABULATE in env.packages


@pytest.mark.parametrize("installer", ["uv", "pip"])
def test_a_requirement_on_another_torch_says_what_to_write_instead(
    tmp_path: Path, installer: Literal["uv", "pip"]
) -> None:
    cache = EnvironmentCache(tmp_path / "envs", BASE, installer)
    for requirement in ("torch==1.0.0", "torch @ https://example.com/torch-1.0-py3-none-any.whl"):
        with pytest.raises(RequirementsError) as caught:
            cache.resolve([TABULATE, requirement])
        message = str(caught.value)
        assert message.startswith(f"requirement {requirement!r} cannot be met")
        assert f"the platform provides torch {version('torch')}" in message
        assert f"write 'torch' (or 'torch=={version('torch')}')" in message
    assert list((tmp_path / "envs" / STORE).iterdir()) == []


def test_a_requirement_on_torch_with_extras_says_to_list_them(tmp_path: Path) -> None:
    # torch[opt-einsum]>=2 was met by the base's torch and its extra left out without a
    # word: the job failed later, at an import of what the extra adds.
    cache = EnvironmentCache(tmp_path / "envs", BASE, "uv")
    with pytest.raises(RequirementsError) as caught:
        cache.resolve([TABULATE, "torch[opt-einsum]>=1"])
    message = str(caught.value)
    assert "without extras" in message and "['opt-einsum']" in message
    assert list((tmp_path / "envs" / STORE).iterdir()) == []


@pytest.mark.parametrize("installer", ["uv", "pip"])
def test_dependants_of_torch_resolve_against_the_bases_torch(
    tmp_path: Path, installer: Literal["uv", "pip"]
) -> None:
    """A dependency that needs another torch than the base's is a conflict the job is
    told about; one the base's torch satisfies installs without a second torch."""
    links = tmp_path / "links"
    links.mkdir()
    _wheel(links, "needs_torch", "", requires=("torch>=1",))
    _wheel(links, "needs_old_torch", "", requires=("torch==1.0.0",))
    offline = {"UV_FIND_LINKS": str(links), "UV_NO_INDEX": "1"} | {
        "PIP_FIND_LINKS": str(links), "PIP_NO_INDEX": "1"
    }  # fmt: skip
    cache = EnvironmentCache(tmp_path / "envs", BASE, installer, installer_env=offline)

    env = cache.resolve(["needs-torch"])
    assert "needs-torch==1.0" in env.packages
    assert f"torch=={version('torch')}" in env.packages
    assert not list(_site_packages(env).glob("torch*"))

    with pytest.raises(RequirementsError) as caught:
        cache.resolve(["needs-old-torch"])
    message = str(caught.value)
    assert "torch==1.0.0" in message
    assert f"the platform provides torch {version('torch')}" in message


@pytest.mark.parametrize("installer", ["uv", "pip"])
def test_a_wheel_cannot_put_its_own_interpreter_where_the_runner_runs_it(
    tmp_path: Path, installer: Literal["uv", "pip"]
) -> None:
    """pip installs a wheel's ``<name>.data/data/bin/python`` over the environment's
    interpreter, and the build then compiled the packages' bytecode with that
    ``bin/python``, as the runner: any wheel of the index (or any https wheel URL) ran its
    program as root on the node. Nothing of the venv runs in the build after the install,
    and an environment whose interpreter a package replaced is refused as the job's own
    requirements' fault (uv refuses the wheel itself)."""
    links = tmp_path / "links"
    links.mkdir()
    marker = tmp_path / "ran-as-the-runner"
    fake = f'#!/bin/sh\ntouch {marker}\nexec {BASE} "$@"\n'
    _wheel(links, "own_python", "", data={"own_python-1.0.data/data/bin/python": fake})
    offline = {"UV_FIND_LINKS": str(links), "UV_NO_INDEX": "1"} | {
        "PIP_FIND_LINKS": str(links), "PIP_NO_INDEX": "1"
    }  # fmt: skip
    cache = EnvironmentCache(tmp_path / "envs", BASE, installer, installer_env=offline)
    with pytest.raises(InstallError) as caught:
        cache.resolve(["own-python"])
    assert not marker.exists(), "a wheel's program ran as the runner"
    if installer == "pip":
        assert isinstance(caught.value, RequirementsError)
        assert "installs a bin/python of its own" in str(caught.value)
    assert list((tmp_path / "envs" / STORE).iterdir()) == []


def _wheel(
    folder: Path,
    name: str,
    pth: str,
    requires: tuple[str, ...] = (),
    data: dict[str, str] | None = None,
) -> Path:
    """A wheel of one module and a ``.pth`` file (none when ``pth`` is empty): site runs a
    ``.pth`` line that starts with ``import`` in every interpreter that starts in the
    environment. ``requires``: its ``Requires-Dist``; ``data``: more files by their path
    in the wheel (executable ones under ``bin/``)."""
    import base64
    import hashlib
    import zipfile

    depends = "".join(f"Requires-Dist: {r}\n" for r in requires)
    files = {
        f"{name}/__init__.py": "",
        **({f"{name}.pth": pth} if pth else {}),
        f"{name}-1.0.dist-info/METADATA": (
            f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n{depends}"
        ),
        f"{name}-1.0.dist-info/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
        **(data or {}),
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{path},sha256={digest.decode()},{len(text.encode())}")
    record.append(f"{name}-1.0.dist-info/RECORD,,")
    files[f"{name}-1.0.dist-info/RECORD"] = "\n".join(record) + "\n"
    wheel = folder / f"{name}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, text in files.items():
            info = zipfile.ZipInfo(path)
            info.external_attr = (0o100755 if "/bin/" in path else 0o100644) << 16
            archive.writestr(info, text)
    return wheel


def _sdist(folder: Path, name: str, setup: str) -> Path:
    import tarfile

    source = folder / f"{name}-1.0"
    source.mkdir()
    (source / "setup.py").write_text(setup)
    (source / "PKG-INFO").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    archive = folder / f"{name}-1.0.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(source, arcname=source.name)
    return archive


def _marking(markers: Path) -> str:
    """Code that leaves a file in ``markers`` naming who ran it and what it could read."""
    return (
        "import os; open(os.path.join("
        f"{str(markers)!r}, f'{{os.getpid()}}-uid{{os.getuid()}}'), 'w')"
        ".write(' '.join(sorted(os.environ)))\n"
    )


@pytest.mark.parametrize("installer", ["uv", "pip"])
def test_building_an_environment_runs_no_code_of_its_packages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, installer: Literal["uv", "pip"]
) -> None:
    """Requirements are a tenant's choice: a wheel's ``.pth`` runs in every interpreter
    started in the environment, so nothing the build starts there may process it (the job
    does, as its own user); a source distribution's ``setup.py`` is code too, so none is
    built."""
    monkeypatch.setenv("TRAINYARD_STORAGE_SECRET_KEY", "not-for-installers")
    markers = tmp_path / "markers"
    markers.mkdir()
    # The wheel comes from a folder the operator names (a job's file: URL is refused).
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _wheel(wheels, "pthmarker", _marking(markers))
    monkeypatch.setenv("UV_FIND_LINKS", str(wheels))
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    offline = {"UV_NO_INDEX": "1", "PIP_NO_INDEX": "1"}
    cache = EnvironmentCache(tmp_path / "envs", BASE, installer, installer_env=offline)
    env = cache.resolve(["pthmarker==1.0"])
    assert "pthmarker==1.0" in env.packages
    assert os.listdir(markers) == [], "a package's .pth ran while its environment was built"

    index = tmp_path / "index"
    index.mkdir()
    _sdist(index, "trainyard-test-setupmarker", _marking(markers))
    with pytest.raises(ValueError, match="must name a wheel"):
        cache.resolve(["trainyard-test-setupmarker @ https://example.org/setupmarker-1.0.tar.gz"])
    # The same source distribution found by the installer itself (an index that has no
    # wheel of a package): refused too.
    monkeypatch.setenv("UV_FIND_LINKS", str(index))
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))
    with pytest.raises(EnvironmentBuildError):
        cache.resolve(["trainyard-test-setupmarker==1.0"])
    assert os.listdir(markers) == [], "a source distribution's setup.py ran"
    # The job itself runs the .pth, as whoever runs it: that is its business.
    run_in(env, "pass")
    assert len(os.listdir(markers)) == 1


@pytest.mark.skipif(os.geteuid() != 0, reason="another user needs root to become")
def test_other_users_run_an_environment_but_cannot_list_the_cache(tmp_path: Path) -> None:
    """Environments are shared by every team that asks for the same set, so a job must be
    able to run one it is given, but not find the others: their markers and ``direct_url``
    records name other teams' requirements (a private wheel's URL, a token in its query)."""
    reachable = Path(tempfile.mkdtemp(prefix="trainyard-test-"))  # pytest's is root's alone
    reachable.chmod(0o711)
    try:
        _run_as_another_user(reachable / "envs")
    finally:
        shutil.rmtree(reachable)


def _run_as_another_user(root: Path) -> None:
    env = EnvironmentCache(root, BASE, interpreter=job_interpreter(BASE)).resolve([TABULATE])
    probe = (
        "import os, sys\n"
        "for folder in sys.argv[1:]:\n"
        "    try:\n"
        "        print(folder, 'LISTED', len(os.listdir(folder)))\n"
        "    except PermissionError:\n"
        "        print(folder, 'refused')\n"
        "import tabulate; print('ran')\n"
    )
    done = subprocess.run(
        [env.python, "-c", probe, str(root), str(root / STORE)],
        user=290_005,
        group=290_005,
        extra_groups=[],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:3] == [
        f"{root} refused",
        f"{root / STORE} refused",
        "ran",
    ], done.stdout


def test_the_cache_keeps_its_size_while_the_runner_runs(tmp_path: Path) -> None:
    """Every distinct requirement set a tenant names is a new environment: the cache holds
    ``keep`` of them (besides those in use) after each build, not only at the runner's
    start, so no stream of jobs fills the node's disk between restarts."""
    cache = EnvironmentCache(tmp_path / "envs", BASE, keep=1)
    first = cache.resolve([OLD_SIX])
    in_use = cache.acquire([OLD_SIX, TABULATE])
    second = cache.resolve([TABULATE])
    assert not cache.path(first.key).exists()
    assert cache.path(second.key).exists() and cache.path(in_use.env.key).exists()
    in_use.release()


def _offline(installer: Literal["uv", "pip"]) -> dict[str, str]:
    """Settings that keep the installer off any index: a wheel URL's file is all it has."""
    return {"UV_NO_INDEX": "1", "UV_NO_CACHE": "1"} | {
        "PIP_NO_INDEX": "1", "PIP_NO_CACHE_DIR": "1"
    }  # fmt: skip


@pytest.mark.parametrize("installer", ["uv", "pip"])
def test_a_wheel_url_is_downloaded_by_the_runner_and_installed_from_its_file(
    tmp_path: Path, wheel_servers: Wheels, installer: Literal["uv", "pip"]
) -> None:
    """The runner downloads a job's wheel URL itself (pinned to the address it judged, no
    redirect) and the installer gets the file, with no index to fall back on."""
    wheel = _wheel(tmp_path, "servedpkg", "")
    server = wheel_servers.serve({f"/w/{wheel.name}": Answer(body=wheel.read_bytes())})
    url = f"https://127.0.0.1:{server.port}/w/{wheel.name}"
    cache = EnvironmentCache(
        tmp_path / "envs", BASE, installer, installer_env=_offline(installer),
        fetch_allowed=LOOPBACK,
    )  # fmt: skip
    env = cache.resolve([f"servedpkg @ {url}"])
    assert "servedpkg==1.0" in env.packages
    assert run_in(env, "import servedpkg; print(servedpkg.__name__)") == "servedpkg"
    assert server.accepted == 1 and server.hosts == [f"127.0.0.1:{server.port}"]
    marker = json.loads((cache.path(env.key) / MARKER).read_text())
    assert list(marker["wheels"]) == [url]
    assert not (cache.path(env.key) / ".trainyard-wheels").exists()
    # The key is the URL's, as before: the same URL again is the cached environment.
    assert cache.resolve([f"servedpkg @ {url}"]).cached and server.accepted == 1


def test_a_redirect_of_a_wheel_url_is_not_followed(tmp_path: Path, wheel_servers: Wheels) -> None:
    """A public server redirecting the installer to ``169.254.169.254`` or the node's own
    services was followed: the redirect's target was never judged. Now the runner fetches,
    and a 3xx fails the requirement as its own, the target never asked."""
    with Listener() as elsewhere:
        target = f"http://127.0.0.1:{elsewhere.port}/latest/meta-data/x-1.0-py3-none-any.whl"
        server = wheel_servers.serve(
            {"/x-1.0-py3-none-any.whl": Answer(302, headers={"Location": target})}
        )
        requirement = f"x @ https://127.0.0.1:{server.port}/x-1.0-py3-none-any.whl"
        cache = EnvironmentCache(
            tmp_path / "envs", BASE, "uv", installer_env=_offline("uv"), fetch_allowed=LOOPBACK
        )
        with pytest.raises(RequirementsError) as caught:
            cache.resolve([requirement])
        assert caught.value.requirement == requirement
        assert "answered 302" in str(caught.value), str(caught.value)
        assert "redirects are not followed" in str(caught.value)
        assert server.accepted == 1
        assert elsewhere.accepted == 0, "the redirect was followed"


def test_a_wheel_over_the_bound_is_refused(tmp_path: Path, wheel_servers: Wheels) -> None:
    body = b"x" * 4096
    server = wheel_servers.serve(
        {
            "/big-1.0-py3-none-any.whl": Answer(body=body),
            # No length announced: refused while reading.
            "/quiet-1.0-py3-none-any.whl": Answer(body=body, length=False),
        }
    )
    cache = EnvironmentCache(
        tmp_path / "envs", BASE, "uv", installer_env=_offline("uv"), fetch_allowed=LOOPBACK,
        max_wheel_bytes=1000,
    )  # fmt: skip
    for name in ("big", "quiet"):
        with pytest.raises(RequirementsError, match="larger than 1000 bytes"):
            cache.resolve([f"{name} @ https://127.0.0.1:{server.port}/{name}-1.0-py3-none-any.whl"])
    assert list((tmp_path / "envs" / STORE).iterdir()) == []


def test_a_wheel_server_failing_is_the_platforms_fault(
    tmp_path: Path, wheel_servers: Wheels
) -> None:
    """As an unreachable index: a 5xx or a connection refused is retried, never held
    against the job or the node."""
    server = wheel_servers.serve({"/x-1.0-py3-none-any.whl": Answer(503, b"busy")})
    cache = EnvironmentCache(
        tmp_path / "envs", BASE, "uv", installer_env=_offline("uv"), fetch_allowed=LOOPBACK
    )
    with Listener() as closed:
        closed.close()
        for port in (server.port, closed.port):
            requirement = f"x @ https://127.0.0.1:{port}/x-1.0-py3-none-any.whl"
            with pytest.raises(InstallError) as caught:
                cache.resolve([requirement])
            assert not isinstance(caught.value, RequirementsError), str(caught.value)
            assert caught.value.requirement == requirement


@pytest.mark.parametrize(
    ("installer", "scheme"),
    [("uv", "https"), ("uv", "http"), ("uv", "git+https"), ("pip", "https"), ("pip", "http")],
)
def test_a_wheel_url_whose_wheel_depends_on_a_url_is_refused_before_installing(
    tmp_path: Path, wheel_servers: Wheels, installer: Literal["uv", "pip"], scheme: str
) -> None:
    """The installers fetch a direct reference in the ``Requires-Dist`` of a wheel they
    install from a file themselves, unjudged (the SSRF the runner's download closed, one
    step on): a wheel URL's wheel that names one is refused, the URL never asked."""
    with Listener() as elsewhere:
        target = f"{scheme}://127.0.0.1:{elsewhere.port}/latest/dep-1.0-py3-none-any.whl"
        wheel = _wheel(tmp_path, "leaning", "", requires=(f"dep @ {target}",))
        server = wheel_servers.serve({f"/{wheel.name}": Answer(body=wheel.read_bytes())})
        requirement = f"leaning @ https://127.0.0.1:{server.port}/{wheel.name}"
        cache = EnvironmentCache(
            tmp_path / "envs", BASE, installer, installer_env=_offline(installer),
            fetch_allowed=LOOPBACK,
        )  # fmt: skip
        with pytest.raises(RequirementsError) as caught:
            cache.resolve([requirement])
        assert elsewhere.accepted == 0, "the installer fetched the dependency's URL"
        assert caught.value.requirement == requirement
        assert "direct reference" in str(caught.value), str(caught.value)
        assert str(elsewhere.port) not in str(caught.value)


def test_the_wheel_urls_of_an_environment_share_one_bound(
    tmp_path: Path, wheel_servers: Wheels
) -> None:
    """``max_wheel_bytes`` bounds all the wheels of an environment together, as they wait
    on the disk to be installed: a hundred requirements of 4 GiB each would have filled it
    (and then flushed every team's environments from the cache to make room)."""
    one, two = _wheel(tmp_path, "first", ""), _wheel(tmp_path, "second", "")
    sizes = [one.stat().st_size, two.stat().st_size]
    server = wheel_servers.serve({f"/{w.name}": Answer(body=w.read_bytes()) for w in (one, two)})
    requirements = [
        f"{w.name.split('-')[0]} @ https://127.0.0.1:{server.port}/{w.name}" for w in (one, two)
    ]
    cache = EnvironmentCache(
        tmp_path / "envs", BASE, "uv", installer_env=_offline("uv"), fetch_allowed=LOOPBACK,
        max_wheel_bytes=max(sizes) + 10,
    )  # fmt: skip
    with pytest.raises(RequirementsError) as caught:
        cache.resolve(requirements)
    assert f"wheels are larger than {max(sizes) + 10} bytes together" in str(caught.value)
    assert caught.value.requirement == requirements[1]
    assert list((tmp_path / "envs" / STORE).iterdir()) == []
    # Each fits alone.
    for requirement in requirements:
        assert requirement.split(" ")[0] + "==1.0" in cache.resolve([requirement]).packages


def test_a_wheel_url_with_a_marker_is_downloaded_where_the_marker_holds(
    tmp_path: Path, wheel_servers: Wheels
) -> None:
    """The normal form once wrote ``x.whl; marker``, which PEP 508 reads as the URL
    ``x.whl;`` and a marker where none may be: the runner could not read it to download,
    and the job failed as its requirement's fault. A marker that does not hold here asks
    nothing."""
    wheel = _wheel(tmp_path, "marked", "")
    server = wheel_servers.serve({f"/{wheel.name}": Answer(body=wheel.read_bytes())})
    url = f"https://127.0.0.1:{server.port}/{wheel.name}"
    cache = EnvironmentCache(
        tmp_path / "envs", BASE, "uv", installer_env=_offline("uv"), fetch_allowed=LOOPBACK
    )
    held = cache.resolve([f"marked @ {url} ; python_version >= '3'"])
    assert "marked==1.0" in held.packages and server.accepted == 1
    skipped = cache.resolve([f"marked @ {url} ; python_version < '3'"])
    assert "marked==1.0" not in skipped.packages and server.accepted == 1

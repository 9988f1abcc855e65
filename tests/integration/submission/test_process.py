"""The service as a real process (``python -m trainyard_platform.services.submission``), used through
``TrainyardClient`` and the ``trainyard`` CLI."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import httpx
import pytest

from tests.integration.submission.conftest import SPEC
from tests.unit.submission import factories as ev
from trainyard.client import TrainyardClient, TrainyardError
from trainyard_platform.deploy.local.ports import free_port
from trainyard_platform.deploy.local.processes import ManagedProcess
from trainyard_platform.services.submission import identity
from trainyard_platform.shared.bus import Bus
from trainyard_platform.shared.events import Envelope, Payload, nats_subject, parse_envelope
from trainyard_platform.shared.events.payloads import AllocationGranted, JobSubmitted
from trainyard_platform.shared.events.trust import owner
from trainyard_platform.shared.settings import NatsSettings

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]


def _env(database_url: str, nats_url: str, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "TRAINYARD_DATABASE_URL": database_url,
        "TRAINYARD_NATS_URL": nats_url,
        **extra,
    }


def _bootstrap(
    env: dict[str, str], team: str, user: str, *options: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "trainyard_platform.services.submission",
            "bootstrap-admin",
            "--team",
            team,
            "--user",
            user,
            *options,
        ],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _cli(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainyard.cli", *argv],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_bootstrap_admin_prints_only_the_token_and_refuses_twice(database_url: str) -> None:
    env = _env(database_url, "nats://127.0.0.1:1")
    first = _bootstrap(env, "ml", "alice")
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith("ty_")
    assert first.stdout.strip().count("\n") == 0
    again = _bootstrap(env, "ml", "alice")
    assert again.returncode == 1
    assert again.stdout == ""
    assert "already exists" in again.stderr
    other_team = _bootstrap(env, "vision", "alice")
    assert other_team.returncode == 0
    invalid = _bootstrap(env, "no spaces allowed", "bob")
    assert invalid.returncode != 0 and invalid.stdout == ""


def test_bootstrap_admin_refuses_a_case_twin_in_one_line(database_url: str) -> None:
    """A user or team differing only by case from an existing one (docs/security.md): exit 1,
    one line naming the field and the name that exists, no traceback, nothing stored."""
    env = _env(database_url, "nats://127.0.0.1:1")
    assert _bootstrap(env, "ml", "alice").returncode == 0
    for team, user, line in [
        ("ml", "Alice", "name: a user named 'alice' exists in team ml"),
        ("ML", "bob", "team: a team named 'ml' exists"),
    ]:
        twin = _bootstrap(env, team, user)
        assert (twin.returncode, twin.stdout) == (1, ""), twin.stderr
        assert twin.stderr == (
            f"bootstrap-admin: {line}; names differ from it only by case; nothing changed\n"
        )


def test_bootstrap_admin_reissues_a_token_only_to_the_same_enabled_user(
    database_url: str,
) -> None:
    """``--reissue``: a second token for an existing admin, the first still valid, recorded
    in the audit log; never for a user of another role, nor a disabled one."""
    env = _env(database_url, "nats://127.0.0.1:1")
    first = _bootstrap(env, "nlp", "ada", "--reissue")  # no such user yet: created
    assert first.returncode == 0, first.stderr
    second = _bootstrap(env, "nlp", "ada", "--reissue")
    assert second.returncode == 0, second.stderr
    assert second.stdout.startswith("ty_") and second.stdout != first.stdout
    other_role = _bootstrap(env, "nlp", "ada", "--role", "operator", "--reissue")
    assert other_role.returncode == 1 and other_role.stdout == ""
    assert "has role admin, not operator" in other_role.stderr

    async def check() -> None:
        pool = await asyncpg.create_pool(
            database_url, min_size=1, max_size=1, server_settings={"search_path": "submission"}
        )
        try:
            for token in (first.stdout.strip(), second.stdout.strip()):
                caller = await identity.authenticate(pool, token)
                assert caller is not None and (caller.team, caller.user) == ("nlp", "ada")
            actions = await pool.fetch(
                "SELECT action FROM audit_log WHERE target = 'nlp/ada' ORDER BY id"
            )
            assert [row["action"] for row in actions] == ["create user", "reissue token"]
            await pool.execute("UPDATE users SET disabled_at = now() WHERE name = 'ada'")
        finally:
            await pool.close()

    asyncio.run(check())
    disabled = _bootstrap(env, "nlp", "ada", "--reissue")
    assert disabled.returncode == 1 and disabled.stdout == ""
    assert "is disabled" in disabled.stderr


@pytest.fixture
def served(database_url: str, nats_settings: NatsSettings, tmp_path: Path) -> Iterator[str]:
    """The service running as its own process; yields its base URL."""
    port = free_port()
    env = _env(
        database_url,
        nats_settings.url,
        TRAINYARD_SUBMISSION_PORT=str(port),
        TRAINYARD_STORAGE_URI=(tmp_path / "objects").as_uri(),
    )
    process = ManagedProcess(
        "submission",
        [sys.executable, "-m", "trainyard_platform.services.submission"],
        env=env,
        log_path=tmp_path / "submission.log",
        cwd=ROOT,
    )
    process.start()
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        try:
            return httpx.get(f"{url}/readyz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        process.wait_until(ready, timeout_s=60, what="ready")
        yield url
        assert process.stop(grace_s=30) == 0, process.log_tail()
        assert "Traceback" not in process.log_tail(400)
    finally:
        process.kill()


async def test_served_process_end_to_end_through_client_and_cli(
    served: str, database_url: str, nats_settings: NatsSettings, tmp_path: Path
) -> None:
    env = _env(database_url, nats_settings.url)
    token = (await asyncio.to_thread(_bootstrap, env, "ml", "alice")).stdout.strip()
    api = TrainyardClient(served, token)
    health = await asyncio.to_thread(httpx.get, f"{served}/healthz")
    assert health.json()["status"] == "ok"

    with pytest.raises(TrainyardError) as caught:
        await asyncio.to_thread(api.submit, {**SPEC, "gpus": -2})
    assert (caught.value.status, caught.value.errors[0]["field"]) == (422, "gpus")
    with pytest.raises(TrainyardError) as caught:
        await asyncio.to_thread(TrainyardClient(served, "ty_wrong").list_jobs)
    assert caught.value.status == 401

    job = await asyncio.to_thread(api.submit, SPEC)
    job_id = job["id"]
    async with Bus.connect(nats_settings, "test-feeder") as bus:
        sub = await bus.jetstream.pull_subscribe(nats_subject(JobSubmitted), stream="TRAINYARD")
        (msg,) = await sub.fetch(1, timeout=15)
        submitted = parse_envelope(msg.data)
        assert isinstance(submitted.data, JobSubmitted) and submitted.data.job_id == job_id
        assert msg.headers is not None and "traceparent" in msg.headers  # from the request

        seen: list[str] = []
        waiting = asyncio.create_task(
            asyncio.to_thread(api.wait, job_id, 60, lambda v: seen.append(v["status"]), 0.05)
        )
        for payload in (
            ev.pending(job_id),
            ev.granted(job_id, attempt=0),  # the first attempt, as the scheduler numbers it
            ev.started(job_id, attempt=0),
            ev.progress(job_id, 100, loss=0.2),
            ev.checkpoint(job_id, 100),
            ev.succeeded(job_id, accuracy=0.98),
            ev.model_registered(job_id),
            ev.cost(job_id),
        ):
            await bus.publish(_envelope(payload))
            await asyncio.sleep(0.02)
        final = await waiting
    assert final["status"] == "SUCCEEDED"
    assert final["model"]["version"] == 1 and final["cost"]["final"] is True
    assert seen[0] in ("QUEUED", "PENDING", "SCHEDULED") and seen[-1] == "SUCCEEDED"

    cli_env = {**env, "TRAINYARD_URL": served, "TRAINYARD_TOKEN": token}
    status = await asyncio.to_thread(_cli, cli_env, "status", job_id)
    assert status.returncode == 0, status.stderr
    assert "SUCCEEDED (attempt 1 on node-1, GPUs 0,1)" in status.stdout
    assert "digits-cnn v1" in status.stdout
    listing = await asyncio.to_thread(_cli, cli_env, "list")
    assert job_id[:8] in listing.stdout  # the table's short id
    assert job_id in [j["id"] for j in json.loads(_cli(cli_env, "ls", "--json").stdout)]
    workdir = tmp_path / "code"
    workdir.mkdir()
    (workdir / "train.py").write_text("print('training')\n")
    (workdir / "out.log").write_text("ignored\n")
    (workdir / ".gitignore").write_text("*.log\n")
    spec_file = workdir / "job.json"
    versioned = {"apiVersion": "trainyard.dev/v1", "kind": "Job", **SPEC}
    spec_file.write_text(json.dumps({**versioned, "gpu_flavor": "tpu"}, indent=1))
    refused = await asyncio.to_thread(_cli, cli_env, "submit", str(spec_file))
    assert refused.returncode == 1
    # The API's refusal, on the file's line, said once and before any code is uploaded.
    (error_line,) = refused.stderr.strip().splitlines()
    assert error_line.startswith(f"trainyard: error: {spec_file}:11:16: gpu_flavor: unknown flavor")
    assert "Traceback" not in refused.stderr
    spec_file.write_text(json.dumps(versioned))
    checked = await asyncio.to_thread(_cli, cli_env, "submit", str(spec_file), "--dry-run")
    assert checked.returncode == 0, checked.stderr
    assert "(uploaded)" in checked.stderr  # a dry run uploads the code as a submission does
    submitted_by_cli = await asyncio.to_thread(_cli, cli_env, "submit", str(spec_file))
    assert submitted_by_cli.returncode == 0, submitted_by_cli.stderr
    assert "(already stored)" in submitted_by_cli.stderr  # the same code: nothing uploaded again
    new_id = submitted_by_cli.stdout.split()[2]
    code = (await asyncio.to_thread(api.get_job, new_id))["spec"]["code"]
    assert code["kind"] == "bundle"
    stored = tmp_path / "objects" / "bundles" / "ml" / f"{code['sha256']}.tar.gz"
    assert stored.stat().st_size == code["size_bytes"]
    with tarfile.open(stored) as tar:
        assert sorted(tar.getnames()) == [".gitignore", "job.json", "train.py"]
    cancelled = await asyncio.to_thread(_cli, cli_env, "cancel", new_id)
    assert cancelled.returncode == 0, cancelled.stderr
    # Still waiting (no scheduler here): said to be cancelled before it starts.
    assert cancelled.stdout.startswith(f"job {new_id} is cancelled before it starts (it was ")


def _envelope(payload: Payload) -> Envelope[Payload]:
    key = payload.node_id if isinstance(payload, AllocationGranted) else payload.job_id  # type: ignore[attr-defined]
    return Envelope.wrap(payload, source=owner(payload), subject=key)

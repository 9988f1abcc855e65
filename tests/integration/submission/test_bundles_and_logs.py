"""Code bundles (HEAD/PUT /v1/bundles/{sha256}, jobs that name one) and job logs
(GET /v1/jobs/{id}/logs) against real PostgreSQL and NATS and a local object store."""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import tarfile
import tracemalloc
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.fixtures.refusals import refused_before_entering
from tests.integration.submission.conftest import SPEC, Submission
from tests.unit.submission import factories as ev
from trainyard_platform.services.submission.api import AppDeps, create_app
from trainyard_platform.services.submission.config import Settings

pytestmark = pytest.mark.integration


def tar_gz(*members: tuple[str, bytes]) -> bytes:
    """A bundle of ``(name, content)`` files, as a runner unpacks them."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return raw.getvalue()


BUNDLE = tar_gz(("train.py", b"print(1)\n"), ("noise.bin", os.urandom(64)))
SHA = hashlib.sha256(BUNDLE).hexdigest()


def _code(sha: str = SHA, size: int = len(BUNDLE)) -> dict[str, Any]:
    return {"kind": "bundle", "sha256": sha, "size_bytes": size}


async def _put(submission: Submission, data: bytes, sha: str, token: str | None = None) -> Any:
    return await submission.client.put(
        f"/v1/bundles/{sha}", content=data, headers=submission.auth(token)
    )


async def _head(submission: Submission, sha: str, token: str | None = None) -> int:
    response = await submission.client.head(f"/v1/bundles/{sha}", headers=submission.auth(token))
    return response.status_code


# --- bundles ---------------------------------------------------------------------------------


async def test_bundle_routes_need_a_token(submission: Submission) -> None:
    for method in ("HEAD", "PUT"):
        response = await submission.client.request(method, f"/v1/bundles/{SHA}", content=BUNDLE)
        assert response.status_code == 401, method
    response = await submission.client.get("/v1/jobs/x/logs")
    assert response.status_code == 401
    assert submission.store.list("bundles/") == []


async def test_upload_once_then_already_stored(submission: Submission) -> None:
    assert await _head(submission, SHA) == 404
    first = await _put(submission, BUNDLE, SHA)
    assert first.status_code == 201, first.text
    assert first.json() == {"sha256": SHA, "size_bytes": len(BUNDLE), "team": "ml", "created": True}
    assert submission.store.get_bytes(f"bundles/ml/{SHA}.tar.gz") == BUNDLE
    assert await _head(submission, SHA) == 200
    again = await _put(submission, BUNDLE, SHA)  # idempotent
    assert again.status_code == 200 and again.json()["created"] is False
    assert submission.store.list("bundles/") == [f"bundles/ml/{SHA}.tar.gz"]


async def test_body_must_hash_to_the_path(submission: Submission) -> None:
    wrong = hashlib.sha256(b"something else").hexdigest()
    response = await _put(submission, BUNDLE, wrong)
    assert response.status_code == 422
    (error,) = response.json()["errors"]
    assert error["field"] == "body" and SHA in error["message"] and wrong in error["message"]
    assert submission.store.list("bundles/") == []


# Named ids: the bundle (and so SHA) differs from run to run, and a test's id must not, or
# parallel workers (pytest-xdist) collect different tests.
@pytest.mark.parametrize(
    "sha",
    ["abc", SHA.upper(), SHA + "0", "..%2F..%2Fetc"],
    ids=["short", "upper-case", "one-too-long", "a-path"],
)
async def test_malformed_sha256_is_422(submission: Submission, sha: str) -> None:
    response = await _put(submission, BUNDLE, sha)
    assert response.status_code in (404, 422)
    if response.status_code == 422:
        assert response.json()["errors"][0]["field"] == "sha256"
    assert await _head(submission, sha) in (404, 422)
    assert submission.store.list("bundles/") == []


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"\x1f\x8b pretend this is a tar.gz", "not a gzip-compressed tar archive"),
        (tar_gz(("/etc/cron.d/job", b"x")), "'/etc/cron.d/job' is an absolute path"),
        (tar_gz(("../../escape.py", b"x")), "'../../escape.py' has a '..' part"),
        (tar_gz(("a", b"x"), ("a", b"y")), "'a' is in it twice"),
    ],
)
async def test_a_bundle_a_runner_would_refuse_is_refused_at_upload(
    submission: Submission, data: bytes, reason: str
) -> None:
    """Every rule of ``shared.bundle_archive`` (bombs included: its unit test) applies."""
    response = await _put(submission, data, hashlib.sha256(data).hexdigest())
    assert response.status_code == 422, response.text
    [error] = response.json()["errors"]
    assert error["field"] == "body" and reason in error["message"], error
    assert submission.store.list("bundles/") == []


async def test_bundle_over_the_limit_is_413(submission: Submission, settings: Settings) -> None:
    small = settings.model_copy(update={"bundle_max_bytes": 100})
    app = create_app(small, AppDeps(pool=submission.pool, store=submission.store))
    transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
    big = os.urandom(101)
    sha = hashlib.sha256(big).hexdigest()
    async with httpx.AsyncClient(transport=transport, base_url="http://s") as client:
        response = await client.put(f"/v1/bundles/{sha}", content=big, headers=submission.auth())
        assert response.status_code == 413
        assert "at most 100 bytes" in response.json()["detail"]
        assert ".trainyardignore" in response.json()["detail"]

        async def chunks() -> Any:  # no Content-Length: counted as it streams
            yield big[:60]
            yield big[60:]

        response = await client.put(
            f"/v1/bundles/{sha}", content=chunks(), headers=submission.auth()
        )
        assert response.status_code == 413
    assert submission.store.list("bundles/") == []


async def test_an_upload_is_never_held_whole_in_the_services_memory(
    submission: Submission,
) -> None:
    # Before: the body was read into memory (a bytearray, then a copy): up to 200 MiB per
    # upload at the default 100 MiB limit, so a member's burst of 50 uploads at once
    # (its write bucket's) needed 10 GiB of the front door every team submits through.
    size = 24 * 1024 * 1024
    payload = os.urandom(size)  # random: the bundle is as large as what it holds
    data = tar_gz(("weights.bin", payload))
    sha = hashlib.sha256(data).hexdigest()

    async def chunks() -> Any:
        for start in range(0, len(data), 64 * 1024):
            yield data[start : start + 64 * 1024]

    tracemalloc.start()
    try:
        response = await submission.client.put(
            f"/v1/bundles/{sha}", content=chunks(), headers=submission.auth()
        )
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert response.status_code == 201, response.text
    assert peak < size // 4, f"{peak} bytes at most while {size} came in"
    assert submission.store.get_bytes(f"bundles/ml/{sha}.tar.gz") == data


async def test_job_naming_a_bundle_needs_it_uploaded_by_its_own_team(
    submission: Submission,
) -> None:
    spec = {**SPEC, "code": _code()}
    refused = await submission.client.post("/v1/jobs", json=spec, headers=submission.auth())
    assert refused.status_code == 422
    assert refused.json()["errors"] == [
        {"field": "code.sha256", "message": "no bundle with this sha256 was uploaded for team ml"}
    ]
    assert (await _put(submission, BUNDLE, SHA)).status_code == 201
    view = await submission.submit(spec)
    assert view["spec"]["code"] == _code()
    assert view["spec"]["entrypoint"] == SPEC["entrypoint"] and view["spec"]["command"] == []

    # Another team can neither see the bundle nor run it, however it learnt the hash.
    other = submission.other_team_token
    assert await _head(submission, SHA, other) == 404
    response = await submission.client.post("/v1/jobs", json=spec, headers=submission.auth(other))
    assert response.status_code == 422
    assert response.json()["errors"][0]["message"].endswith("for team vision")
    # Uploading it is its own copy, under its own team.
    assert (await _put(submission, BUNDLE, SHA, other)).status_code == 201
    assert submission.store.list("bundles/") == [
        f"bundles/ml/{SHA}.tar.gz",
        f"bundles/vision/{SHA}.tar.gz",
    ]


async def _stored(submission: Submission) -> tuple[int, int]:
    """Jobs, and ``job.submitted`` events waiting for the bus or sent to it."""
    jobs = await submission.pool.fetchval("SELECT count(*) FROM jobs")
    events = await submission.pool.fetchval(
        "SELECT count(*) FROM outbox WHERE subject LIKE '%submitted%'"
    )
    return int(jobs), int(events)


async def test_a_job_whose_bundle_size_is_not_the_stored_ones_is_refused_at_submission(
    submission: Submission,
) -> None:
    """``code.size_bytes`` was never compared with the bundle the team uploaded: the job
    was admitted, waited in the queue, took GPUs, and only then did its runner refuse a
    bundle larger than the spec said. Now the submission answers 422 naming the field and
    both sizes, on every path (a submission, a dry run, a remembered member's submission,
    which is one statement), and stores nothing; the right size is admitted."""
    response = await submission.client.post(
        "/v1/admin/users", json={"name": "carol", "role": "member"}, headers=submission.auth()
    )
    assert response.status_code == 201, response.text
    member = response.json()["token"]
    assert (await _put(submission, BUNDLE, SHA)).status_code == 201
    right = {**SPEC, "code": _code()}
    # The member's token is checked once and remembered: its next submissions go the
    # remembered caller's way.
    first = await submission.client.post("/v1/jobs", json=right, headers=submission.auth(member))
    assert first.status_code == 201, first.text
    before = await _stored(submission)
    for size in (len(BUNDLE) - 1, len(BUNDLE) + 1, 1):
        wrong = {**SPEC, "code": _code(size=size)}
        expected = {
            "field": "code.size_bytes",
            "message": f"the bundle with this sha256 is {len(BUNDLE)} bytes, not the {size} "
            "bytes given: give the size of the file uploaded",
        }
        for token in (None, member):
            for path in ("/v1/jobs", "/v1/jobs?dry_run=true"):
                refused = await submission.client.post(
                    path, json=wrong, headers=submission.auth(token)
                )
                assert refused.status_code == 422, (path, refused.text)
                assert refused.json()["errors"] == [expected]
    assert await _stored(submission) == before

    checked = await submission.client.post(
        "/v1/jobs?dry_run=true", json=right, headers=submission.auth()
    )
    assert checked.status_code == 200, checked.text
    view = await submission.submit(right)
    assert view["spec"]["code"] == _code()
    again = await submission.client.post("/v1/jobs", json=right, headers=submission.auth(member))
    assert again.status_code == 201, again.text
    assert await _stored(submission) == (before[0] + 2, before[1] + 2)


async def test_command_requirements_image_and_git_reach_the_spec(submission: Submission) -> None:
    spec = {k: v for k, v in SPEC.items() if k != "entrypoint"}
    spec |= {
        "command": ["bash", "run.sh", "--fast"],
        "requirements": ["numpy>=1.26", 'tomli; python_version < "3.11"'],
        "image": "ghcr.io/acme/train:1.0",
        "code": {"kind": "git", "repository": "https://github.com/a/b.git", "commit": "f" * 40},
    }
    view = await submission.submit(spec)
    for field in ("command", "requirements", "image", "code"):
        assert view["spec"][field] == spec[field]
    assert view["spec"]["entrypoint"] == ""
    bad = {**spec, "requirements": ["--index-url http://evil"]}
    response = await submission.client.post("/v1/jobs", json=bad, headers=submission.auth())
    assert response.status_code == 422
    assert response.json()["errors"][0]["field"] == "requirements[0]"


# --- logs ------------------------------------------------------------------------------------


def _chunk(submission: Submission, job_id: str, stream: str, seq: int, data: bytes) -> None:
    submission.store.put_bytes(f"logs/{job_id}/{stream}/chunk-{seq:08d}.log", data)


def _end(submission: Submission, job_id: str, stream: str) -> None:
    submission.store.put_bytes(f"logs/{job_id}/{stream}/end", b"")


async def _logs(
    submission: Submission, job_id: str, after: str | None = None, **params: Any
) -> dict[str, Any]:
    query = {**params, **({"after": after} if after is not None else {})}
    response = await submission.client.get(
        f"/v1/jobs/{job_id}/logs", params=query, headers=submission.auth()
    )
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def test_logs_page_by_cursor_until_the_job_and_its_streams_end(
    submission: Submission,
) -> None:
    job_id = (await submission.submit())["id"]
    queued = await _logs(submission, job_id)  # no stream, and none is coming yet
    assert queued == {"chunks": [], "cursor": "", "streams_complete": True, "job_terminal": False}

    await submission.publish(ev.granted(job_id))
    await submission.publish(ev.started(job_id))
    await submission.wait_for(job_id, lambda v: v["status"] == "RUNNING")
    assert (await _logs(submission, job_id))["streams_complete"] is False  # output is due
    _chunk(submission, job_id, "a0001-node-1", 0, b"epoch 1\n")
    _chunk(submission, job_id, "a0001-node-1", 1, b"caf\xc3")  # a character cut in two
    _chunk(submission, job_id, "a0001-node-2", 0, b"rank 1\n")
    first = await _logs(submission, job_id, limit=2)
    assert [(c["stream"], c["seq"], c["text"]) for c in first["chunks"]] == [
        ("a0001-node-1", 0, "epoch 1\n"),
        ("a0001-node-1", 1, "caf\ufffd"),
    ]
    assert first["streams_complete"] is False and first["job_terminal"] is False

    # node-1 writes on while node-2's first chunk is still unread: nothing is skipped.
    _chunk(submission, job_id, "a0001-node-1", 2, b"epoch 2\n")
    second = await _logs(submission, job_id, first["cursor"])
    assert [(c["stream"], c["seq"]) for c in second["chunks"]] == [
        ("a0001-node-1", 2),
        ("a0001-node-2", 0),
    ]
    assert await _logs(submission, job_id, second["cursor"]) == {
        **second,
        "chunks": [],
    }

    _end(submission, job_id, "a0001-node-1")
    _end(submission, job_id, "a0001-node-2")
    await submission.publish(ev.succeeded(job_id))
    await submission.wait_for(job_id, lambda v: v["status"] == "SUCCEEDED")
    last = await _logs(submission, job_id, second["cursor"])
    assert last["chunks"] == []
    assert last["streams_complete"] is True and last["job_terminal"] is True
    from_start = await _logs(submission, job_id)
    assert len(from_start["chunks"]) == 4 and from_start["streams_complete"] is True


async def test_a_page_stops_at_the_byte_budget(submission: Submission, settings: Settings) -> None:
    job_id = (await submission.submit())["id"]
    for seq in range(3):
        _chunk(submission, job_id, "a0001-node-1", seq, b"x" * 60)
    small = settings.model_copy(update={"log_page_max_bytes": 100})
    app = create_app(small, AppDeps(pool=submission.pool, store=submission.store))
    transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=transport, base_url="http://s") as client:
        seqs: list[int] = []
        cursor = ""
        for _ in range(4):
            response = await client.get(
                f"/v1/jobs/{job_id}/logs", params={"after": cursor}, headers=submission.auth()
            )
            page = response.json()
            assert len(page["chunks"]) <= 1  # 60 + 60 > 100, yet never an empty page
            seqs += [c["seq"] for c in page["chunks"]]
            cursor = page["cursor"]
    assert seqs == [0, 1, 2]


async def test_logs_are_team_scoped_and_check_their_input(submission: Submission) -> None:
    job_id = (await submission.submit())["id"]
    _chunk(submission, job_id, "a0001-node-1", 0, b"secret\n")
    other = await submission.client.get(
        f"/v1/jobs/{job_id}/logs", headers=submission.auth(submission.other_team_token)
    )
    assert other.status_code == 404 and "secret" not in other.text
    missing = await submission.client.get("/v1/jobs/nope/logs", headers=submission.auth())
    assert missing.status_code == 404
    for params, field in (({"after": "garbage!"}, "after"), ({"limit": 0}, "limit")):
        response = await submission.client.get(
            f"/v1/jobs/{job_id}/logs", params=params, headers=submission.auth()
        )
        assert response.status_code == 422
        assert response.json()["errors"][0]["field"] == field


async def test_a_log_cursor_of_another_job_is_refused(submission: Submission) -> None:
    """A log cursor (per-stream positions) carried no job: one job's, given to another job
    whose streams have the same names, was read as its position and skipped its output."""
    first, second = (await submission.submit())["id"], (await submission.submit())["id"]
    for job_id in (first, second):
        for seq in range(2):
            _chunk(submission, job_id, "a0001-node-1", seq, b"line\n")
    cursor = (await _logs(submission, first, limit=1))["cursor"]
    refused = await submission.client.get(
        f"/v1/jobs/{second}/logs", params={"after": cursor}, headers=submission.auth()
    )
    assert refused.status_code == 422, refused.text
    assert refused.json()["errors"] == [
        {"field": "after", "message": "a cursor of another list, not of GET /v1/jobs/{id}/logs"}
    ]
    assert [c["seq"] for c in (await _logs(submission, first, cursor))["chunks"]] == [1]


async def test_a_job_that_never_started_has_complete_empty_logs(submission: Submission) -> None:
    job_id = (await submission.submit())["id"]
    await submission.publish(ev.cancelled(job_id))
    await submission.wait_for(job_id, lambda v: v["terminal"])
    page = await _logs(submission, job_id)
    assert page["chunks"] == [] and page["streams_complete"] and page["job_terminal"]


def _slow_bodies() -> tuple[asyncio.Event, asyncio.Queue[int], Callable[[bytes], Any]]:
    """Upload bodies (``slow(data)``) that send their first 10 bytes, put an item in the
    queue and send the rest once the event is set."""
    release = asyncio.Event()
    started = asyncio.Queue[int]()

    def slow(data: bytes) -> Any:
        async def chunks() -> Any:
            yield data[:10]
            started.put_nowait(1)
            await release.wait()
            yield data[10:]

        return chunks()

    return release, started, slow


def _third_was_read() -> str:
    return "a third upload of one team was read while two were under way"


async def test_a_team_has_at_most_its_share_of_uploads_under_way(
    submission: Submission, settings: Settings
) -> None:
    """Each upload under way takes up to the bundle limit of the service's disk (it is
    spooled there). Before, a team had as many at once as its write bursts allow (hundreds
    of 100 MiB each, every team's front door's disk); now ``bundle_uploads_per_team`` (an
    upload past them: 429 with ``Retry-After``, nothing read), and another team's go on."""
    limited = settings.model_copy(update={"bundle_uploads_per_team": 2})
    app = create_app(limited, AppDeps(pool=submission.pool, store=submission.store))
    transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
    release, started, slow = _slow_bodies()

    async with httpx.AsyncClient(transport=transport, base_url="http://s") as client:

        async def put(data: bytes, token: str | None = None, slowly: bool = True) -> Any:
            sha = hashlib.sha256(data).hexdigest()
            content = slow(data) if slowly else data
            return await client.put(
                f"/v1/bundles/{sha}", content=content, headers=submission.auth(token)
            )

        bundles = [tar_gz(("train.py", f"print({i})\n".encode())) for i in range(5)]
        under_way = [asyncio.create_task(put(b)) for b in bundles[:2]]
        for _ in range(2):
            await asyncio.wait_for(started.get(), 30)
        refused = await refused_before_entering(put(bundles[2]), started, _third_was_read)
        assert int(refused.headers["retry-after"]) >= 1
        assert "team ml" in refused.json()["detail"], refused.text
        other = await put(bundles[3], submission.other_team_token, slowly=False)
        assert other.status_code == 201, other.text
        release.set()
        for task in under_way:
            assert (await task).status_code == 201
        again = await put(bundles[4], slowly=False)
        assert again.status_code == 201, again.text


async def test_a_teams_share_of_uploads_holds_across_replicas(
    submission: Submission, settings: Settings
) -> None:
    """Before, each replica counted a team's uploads in its own memory: with two replicas a
    team had twice its share of uploads under way. Now the places are held in the
    service's database (``shared.slots``), so a third is refused whichever replica it
    reaches, and given back, they are free on either."""
    limited = settings.model_copy(update={"bundle_uploads_per_team": 2})
    release, started, slow = _slow_bodies()

    def replica() -> httpx.AsyncClient:
        app = create_app(limited, AppDeps(pool=submission.pool, store=submission.store))
        transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
        return httpx.AsyncClient(transport=transport, base_url="http://s")

    async with replica() as first, replica() as second:

        async def put(client: httpx.AsyncClient, data: bytes, slowly: bool = True) -> Any:
            sha = hashlib.sha256(data).hexdigest()
            content = slow(data) if slowly else data
            return await client.put(
                f"/v1/bundles/{sha}", content=content, headers=submission.auth()
            )

        bundles = [tar_gz(("train.py", f"print('r{i}')\n".encode())) for i in range(6)]
        under_way = [
            asyncio.create_task(put(client, b))
            for client, b in zip((first, second), bundles[:2], strict=True)
        ]
        for _ in range(2):
            await asyncio.wait_for(started.get(), 30)
        for client, bundle in zip((first, second), bundles[2:4], strict=True):
            refused = await refused_before_entering(put(client, bundle), started, _third_was_read)
            assert "BUNDLE_UPLOADS_PER_TEAM" in refused.json()["detail"], refused.text
        release.set()
        for task in under_way:
            assert (await task).status_code == 201
        for client, bundle in zip((first, second), bundles[4:], strict=True):
            again = await put(client, bundle, slowly=False)
            assert again.status_code == 201, again.text

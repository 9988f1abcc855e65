"""Downloads of a model version through presigned URLs on a real S3 endpoint (moto's server).

moto (5.2.5) serves a presigned GET without checking its signature or its expiry: it served
another key under a URL signed for one, and a URL past its expiry, when tried. So what S3
and MinIO enforce — the signature covers the method, bucket, key and expiry; a URL past
``X-Amz-Date + X-Amz-Expires`` is refused — is checked here by ``s3_refuses``, which
recomputes the AWS Signature Version 4 of the URL from the secret key the way S3 does,
independently of the minio client that signed it. The bytes come from the real endpoint.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
from datetime import UTC, datetime, timedelta
from urllib.parse import parse_qsl, quote, urlsplit, urlunsplit

import asyncpg
import httpx
import pytest

from tests.integration.registry.modelkit import (
    ML,
    VISION,
    VISION_VIEWER,
    app_as,
    job_with_checkpoints,
    register,
)
from trainyard_platform.deploy.local.s3 import S3Server
from trainyard_platform.shared.storage import ObjectStore

pytestmark = pytest.mark.integration


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode(), hashlib.sha256).digest()


def s3_refuses(url: str, secret_key: str, now: datetime) -> str | None:
    """Why S3 would refuse a presigned GET of ``url`` at ``now`` (None: it would serve it)."""
    parts = urlsplit(url)
    params = dict(parse_qsl(parts.query, keep_blank_values=True))
    signature = params.pop("X-Amz-Signature")
    issued = datetime.strptime(params["X-Amz-Date"], "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
    if now > issued + timedelta(seconds=int(params["X-Amz-Expires"])):
        return "Request has expired"
    _, day, region, service, terminal = params["X-Amz-Credential"].split("/")
    query = "&".join(
        f"{quote(k, safe='-_.~')}={quote(v, safe='-_.~')}" for k, v in sorted(params.items())
    )
    canonical = "\n".join(
        ["GET", parts.path, query, f"host:{parts.netloc}", "", "host", "UNSIGNED-PAYLOAD"]
    )
    to_sign = "\n".join(
        [
            "AWS4-HMAC-SHA256",
            params["X-Amz-Date"],
            f"{day}/{region}/{service}/{terminal}",
            hashlib.sha256(canonical.encode()).hexdigest(),
        ]
    )
    key = _hmac(f"AWS4{secret_key}".encode(), day)
    for part in (region, service, terminal):
        key = _hmac(key, part)
    expected = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, signature):
        return "SignatureDoesNotMatch"
    return None


async def test_a_presigned_url_opens_its_one_object_until_it_expires(
    pool: asyncpg.Pool, store: ObjectStore, s3_server: S3Server
) -> None:
    job = await job_with_checkpoints(pool, store, [4, 8])
    async with app_as(pool, store, VISION) as client:
        for checkpoint in job.checkpoints:
            made = await register(client, "vision", "digits", job, checkpoint_uri=checkpoint.uri)
            assert made.status_code == 201
    # Any reader of the team may download; the URL lives one second here (default 300).
    async with app_as(pool, store, VISION_VIEWER, download_url_seconds=1) as client:
        answer = await client.get("/v1/models/vision/digits/versions/1/download")
        other = await client.get("/v1/models/vision/digits/versions/2/download")
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert (body["needs_token"], body["expires_in_s"]) == (False, 1)
    assert (body["sha256"], body["size_bytes"]) == (
        job.checkpoints[0].sha256,
        job.checkpoints[0].size_bytes,
    )
    url = body["url"]
    secret = S3Server.secret_key

    async with httpx.AsyncClient() as http:
        fetched = await http.get(url)
    assert fetched.status_code == 200
    assert hashlib.sha256(fetched.content).hexdigest() == job.checkpoints[0].sha256
    # Checked at the moment it was signed: how long this test took so far must not matter.
    issued = datetime.strptime(
        dict(parse_qsl(urlsplit(url).query))["X-Amz-Date"], "%Y%m%dT%H%M%SZ"
    ).replace(tzinfo=UTC)
    assert s3_refuses(url, secret, issued) is None

    # The signature covers the key: the same URL with another object's key is refused,
    # even the key of another version of the same model.
    other_path = urlsplit(other.json()["url"]).path
    swapped = urlunsplit(urlsplit(url)._replace(path=other_path))
    assert s3_refuses(swapped, secret, issued) == "SignatureDoesNotMatch"
    job_path = urlsplit(url).path.split("/registry/")[0] + "/" + job.key(8)
    to_job = urlunsplit(urlsplit(url)._replace(path=job_path))
    assert s3_refuses(to_job, secret, issued) == "SignatureDoesNotMatch"

    # Past its expiry (wait, then check): refused.
    while datetime.now(UTC) <= issued + timedelta(seconds=1):
        await asyncio.sleep(0.25)
    assert s3_refuses(url, secret, datetime.now(UTC)) == "Request has expired"


async def test_only_readers_of_the_team_get_a_url(pool: asyncpg.Pool, store: ObjectStore) -> None:
    job = await job_with_checkpoints(pool, store, [2])
    async with app_as(pool, store, VISION) as client:
        assert (await register(client, "vision", "digits", job)).status_code == 201
    async with app_as(pool, store, ML) as client:
        # Another team: 404, exactly like a model that does not exist.
        for path in ("download", "content"):
            hidden = await client.get(f"/v1/models/vision/digits/versions/1/{path}")
            missing = await client.get(f"/v1/models/vision/nothing/versions/1/{path}")
            assert hidden.status_code == missing.status_code == 404
            assert "url" not in hidden.text
    async with app_as(pool, store, VISION) as client:
        assert (await client.get("/v1/models/vision/digits/versions/2/download")).status_code == 404

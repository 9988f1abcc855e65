"""No name a caller gives makes the registry touch an object outside its own prefix.

Every route that takes a team, model, alias or tag is called with ``..``, encoded slashes,
absolute paths, backslashes, NUL bytes and very long names. A name that reaches a handler is
a 422 naming its field; one whose encoded slash splits the path reaches no route at all
(404). Nothing is ever a success, and afterwards the bucket holds exactly what it held: the
job's checkpoints and the one version registered before the attack.
"""

from __future__ import annotations

import asyncpg
import pytest

from tests.integration.registry.modelkit import OPERATOR, app_as, job_with_checkpoints, register
from trainyard_platform.shared.storage import ObjectStore

pytestmark = pytest.mark.integration

HOSTILE = {
    "%2E%2E": "..",
    "%2E": ".",
    ".hidden": ".hidden",
    "a%2Fb": "encoded slash",
    "%2E%2E%2F%2E%2E%2Fjobs": "encoded ../../jobs",
    "%2Fetc%2Fpasswd": "absolute path",
    "a%5C..%5Cb": "backslashes",
    "a%00b": "NUL byte",
    "x" * 300: "very long",
    "%252E%252E": "double-encoded ..",
}

HOSTILE_TAGS = ["..", ".", "a/b", "../../jobs", "/etc/passwd", "a\\..\\b", "a\x00b", "x" * 300]


@pytest.mark.parametrize("bad", list(HOSTILE), ids=list(HOSTILE.values()))
async def test_hostile_names_are_refused_and_touch_no_object(
    pool: asyncpg.Pool, store: ObjectStore, bad: str
) -> None:
    job = await job_with_checkpoints(pool, store, [1])
    async with app_as(pool, store, OPERATOR) as client:
        assert (await register(client, "vision", "digits", job)).status_code == 201
        before = store.list("")
        calls = [
            ("team", "GET", f"/v1/models?team={bad}", None),
            ("after", "GET", f"/v1/models?after={bad}/digits", None),
            ("team", "GET", f"/v1/models/{bad}/digits", None),
            ("team", "GET", f"/v1/models/{bad}/digits/versions", None),
            ("name", "GET", f"/v1/models/vision/{bad}/versions/1", None),
            ("team", "POST", f"/v1/models/{bad}/digits/versions", {"job_id": job.id}),
            ("name", "POST", f"/v1/models/vision/{bad}/versions", {"job_id": job.id}),
            ("name", "GET", f"/v1/models/vision/{bad}/versions/1/download", None),
            ("name", "GET", f"/v1/models/vision/{bad}/versions/1/content", None),
            ("name", "DELETE", f"/v1/models/vision/{bad}/versions/1", None),
            ("name", "GET", f"/v1/models/vision/{bad}/aliases", None),
            ("alias", "PUT", f"/v1/models/vision/digits/aliases/{bad}", {"version": 1}),
            ("alias", "DELETE", f"/v1/models/vision/digits/aliases/{bad}", None),
            ("alias", "GET", f"/v1/models/vision/digits/versions/by-alias/{bad}", None),
            ("alias", "GET", f"/v1/models/vision/digits/aliases/{bad}/moves", None),
        ]
        for field, method, path, body in calls:
            answer = await client.request(method, path, json=body)
            where = f"{method} {path}: {answer.status_code} {answer.text[:200]}"
            if answer.status_code == 422:
                assert field in [e["field"] for e in answer.json()["errors"]], where
            else:
                # Only an encoded slash may change which route is asked: then none answers.
                assert answer.status_code == 404 and "%2F" in bad, where
        # The same names, decoded, as tags of a registration.
        for tag in HOSTILE_TAGS:
            tagged = await register(client, "vision", "digits", job, tags=["fine", tag])
            assert tagged.status_code == 422, f"{tag!r}: {tagged.text}"
            assert tagged.json()["errors"][0]["field"] == "tags[1]"
    assert store.list("") == before
    assert all(key.startswith(("jobs/", "registry/vision/digits/")) for key in before)

"""``grantee_view.shown``: the owner and operators see an answer as it is; a team it was
granted to sees every ``OWNER_ONLY`` field null, in nested answers and lists too, and the
artifact URI of a version without the registry's own copy (the owner's checkpoint) null."""

from __future__ import annotations

from datetime import UTC, datetime

from trainyard_platform.services.registry.grantee_view import shown
from trainyard_platform.services.registry.schemas import Artifact, VersionList, VersionSummary

CHECKPOINT = "s3://b/jobs/j-1/checkpoints/step-00000010/checkpoint.pt"


def version(*, owned: bool) -> VersionSummary:
    uri = "s3://b/registry/ml/m/v/checkpoint.pt" if owned else CHECKPOINT
    return VersionSummary(
        id="v",
        team="ml",
        model="m",
        version=1,
        job_id="j-1",
        artifact=Artifact(
            uri=uri, manifest_uri="s3://b/jobs/j-1/m.json", step=10, size_bytes=4, sha256="a"
        ),
        metrics={"acc": 0.9},
        registered_at=datetime(2026, 12, 1, tzinfo=UTC),
        owned=owned,
    )


def test_the_owner_and_operators_see_it_all() -> None:
    page = VersionList(team="ml", model="m", versions=[version(owned=False)])
    assert shown(page, "ml", "ml") == page
    assert shown(page, "ml", None) == page


def test_a_grantee_sees_the_model_without_the_owner_work() -> None:
    page = VersionList(team="ml", model="m", versions=[version(owned=True), version(owned=False)])
    copy, legacy = shown(page, "ml", "vision").versions
    assert copy.job_id is None and copy.artifact.manifest_uri is None
    assert copy.artifact.uri == "s3://b/registry/ml/m/v/checkpoint.pt"
    assert (copy.artifact.sha256, copy.artifact.size_bytes, copy.metrics) == ("a", 4, {"acc": 0.9})
    assert legacy.artifact.uri is None and legacy.job_id is None
    assert CHECKPOINT not in shown(page, "ml", "vision").model_dump_json()

"""A job naming a code bundle is admitted only when its ``code.size_bytes`` is the stored
bundle's size (``commands.bundle_problem``): a runner downloads no more than the spec's
size and fails a job whose bundle is larger, which it did only after the job had waited
in the queue and taken its GPUs. The stored size comes with the existence check, in one
look at the object (``Objects.bundle_size``)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from trainyard_platform.services.submission.commands import bundle_problem
from trainyard_platform.services.submission.objects import Objects, bundle_key
from trainyard_platform.services.submission.schemas import BundleCode
from trainyard_platform.shared.storage import LocalStore

SHA = hashlib.sha256(b"bundle").hexdigest()


def code(size_bytes: int) -> BundleCode:
    return BundleCode(kind="bundle", sha256=SHA, size_bytes=size_bytes)


def test_the_stored_size_admits_the_bundle() -> None:
    assert bundle_problem("ml", code(2048), 2048) is None


def test_another_size_is_refused_naming_the_field_and_both_sizes() -> None:
    for declared in (1024, 4096, 0):
        problem = bundle_problem("ml", code(declared), 2048)
        assert problem is not None
        assert problem.field == "code.size_bytes"
        assert problem.message == (
            f"the bundle with this sha256 is 2048 bytes, not the {declared} bytes given: "
            "give the size of the file uploaded"
        )


def test_a_bundle_the_team_has_not_uploaded_is_refused_on_its_sha256() -> None:
    problem = bundle_problem("ml", code(2048), None)
    assert problem is not None
    assert (problem.field, problem.message) == (
        "code.sha256",
        "no bundle with this sha256 was uploaded for team ml",
    )


async def test_bundle_size_is_the_teams_stored_bundles(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    store.put_bytes(bundle_key("ml", SHA), b"x" * 300)
    objects = Objects(store)
    assert await objects.bundle_size("ml", SHA) == 300
    assert await objects.bundle_size("vision", SHA) is None  # another team's is not its own
    assert await objects.bundle_size("ml", "0" * 64) is None

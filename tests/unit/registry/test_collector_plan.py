"""What the storage collector may delete: retention per job, references, foreign keys."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from trainyard_platform.services.registry.collector_plan import (
    Recorded,
    References,
    checkpoint_folder,
    deletion_order,
    due,
    plan,
)

T0 = datetime(2026, 12, 1, tzinfo=UTC)


def folder(job: str, step: int) -> str:
    return f"jobs/{job}/checkpoints/step-{step:08d}-a0000/"


def objects(job: str, step: int) -> list[str]:
    return [folder(job, step) + "checkpoint.pt", folder(job, step) + "manifest.json"]


def recorded(job: str, step: int, saved_s: int = 0) -> Recorded:
    return Recorded(job, folder(job, step) + "checkpoint.pt", step, T0 + timedelta(seconds=saved_s))


def test_each_job_keeps_its_newest_checkpoints_and_loses_the_rest() -> None:
    keys = [k for step in (1, 2, 3, 4) for k in objects("a", step)] + objects("b", 1)
    refs = References(recorded=[recorded("a", s) for s in (1, 2, 3, 4)] + [recorded("b", 1)])
    assert plan(keys, refs, keep=2) == {
        **{k: "beyond retention" for k in objects("a", 1) + objects("a", 2)},
    }


def test_the_newest_is_by_step_then_by_time_saved() -> None:
    keys = [*objects("a", 5), folder("a", 5).replace("a0000", "a0001") + "checkpoint.pt"]
    again = Recorded("a", keys[2], 5, T0 + timedelta(seconds=9))
    refs = References(recorded=[recorded("a", 5), again])
    assert plan(keys, refs, keep=1) == {k: "beyond retention" for k in objects("a", 5)}


def test_protected_checkpoints_stay_whatever_their_age() -> None:
    keys = [k for step in (1, 2, 3) for k in objects("a", step)]
    refs = References(
        recorded=[recorded("a", s) for s in (1, 2, 3)],
        protected={folder("a", 1) + "checkpoint.pt"},  # e.g. a lineage parent
    )
    assert plan(keys, refs, keep=1) == {k: "beyond retention" for k in objects("a", 2)}


def test_unrecorded_checkpoints_and_unowned_registry_keys_are_unreferenced() -> None:
    live = "registry/vision/digits/1111/checkpoint.pt"
    orphan = "registry/vision/digits/2222/checkpoint.pt"
    keys = [*objects("c", 7), live, orphan]
    assert plan(keys, References(protected={live}), keep=3) == {
        **{k: "unreferenced" for k in objects("c", 7)},
        orphan: "unreferenced",
    }


@pytest.mark.parametrize(
    "key",
    [
        "jobs/a/logs/chunk-00000001",
        "jobs/a/checkpoints",
        "jobs/a/checkpoints/loose-file",
        "bundles/vision/abc",
        "registryx/thing",
    ],
)
def test_keys_of_other_kinds_are_never_candidates(key: str) -> None:
    assert plan([key], References(), keep=1) == {}


def test_keep_is_at_least_one() -> None:
    with pytest.raises(ValueError, match="at least"):
        plan([], References(), keep=0)


def test_manifests_go_first_and_only_marks_older_than_the_cutoff_are_due() -> None:
    keys = objects("a", 1)
    assert deletion_order(keys) == [keys[1], keys[0]]
    assert checkpoint_folder(keys[0]) == folder("a", 1)
    seen = {keys[0]: T0, keys[1]: T0 + timedelta(hours=2)}
    deletable = dict.fromkeys(keys, "unreferenced")
    assert due(deletable, seen, T0 + timedelta(hours=1)) == [keys[0]]
    assert due(deletable, {}, T0 + timedelta(hours=9)) == []


def test_a_running_jobs_marked_folders_stay_beyond_its_retention() -> None:
    """The runner's retention marks: a folder a newer attempt resumes from (its start not
    heard yet), and one a success registers from (its success not heard yet), stay while
    the job runs, however old; once it has ended, the marks count for nothing."""
    resumed, success = folder("a", 1) + "resumed-a0003", folder("a", 2) + "succeeded-a0001"
    keys = [k for step in (1, 2, 3, 4) for k in objects("a", step)] + [resumed, success]
    refs = References(recorded=[recorded("a", s) for s in (1, 2, 3, 4)], running={"a"})
    assert plan(keys, refs, keep=2) == {}

    ended = References(recorded=refs.recorded)
    assert plan(keys, ended, keep=2) == {
        **{k: "beyond retention" for k in objects("a", 1) + objects("a", 2)},
        resumed: "beyond retention",
        success: "beyond retention",
    }


def test_a_mark_keeps_only_its_own_folder_of_its_own_running_job() -> None:
    """A mark anyone could write keeps no other folder, and counts only for a job the
    registry's records say is running: a forged one keeps its folder no longer than that."""
    forged = folder("b", 1) + "succeeded-a0000"  # job b ended (or never started here)
    keys = [*objects("a", 1), *objects("a", 2), *objects("b", 1), forged]
    keys.append(folder("a", 1) + "succeeded-a0000x")  # not a mark's name
    refs = References(recorded=[recorded("a", 1), recorded("a", 2)], running={"a"})
    assert plan(keys, refs, keep=1) == {
        **{k: "beyond retention" for k in objects("a", 1)},
        folder("a", 1) + "succeeded-a0000x": "beyond retention",
        **{k: "unreferenced" for k in [*objects("b", 1), forged]},
    }

"""Rows to the policy's snapshot and its decisions back to pending notes (no database)."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Any

from trainyard_platform.services.scheduler.convert import (
    PendingNote,
    SnapshotRows,
    build_snapshot,
    from_epoch,
    implicit_queue,
    normalise_reason,
    note_changed,
    pending_notes,
    stopping_holder,
    to_epoch,
)
from trainyard_platform.services.scheduler.domain import Allocation, AllocationStatus
from trainyard_platform.services.scheduler.policy.engine import schedule
from trainyard_platform.services.scheduler.policy.model import Decisions, Explanation, PolicyConfig
from trainyard_platform.services.scheduler.scheduling import gang_members

NOW = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
HALF_LIFE = 3600.0
CLASSES = [
    {"name": "low", "value": 0, "preemptible": True, "min_runtime_seconds": 0.0},
    {"name": "normal", "value": 100, "preemptible": True, "min_runtime_seconds": 60.0},
    {"name": "high", "value": 1000, "preemptible": False, "min_runtime_seconds": 0.0},
]


def node(node_id: str, gpus: int = 4, flavor: str = "a100", topology: str = "r1") -> dict[str, Any]:
    return {"node_id": node_id, "gpu_flavor": flavor, "gpu_count": gpus, "topology": topology}


def queue(
    name: str, team: str, cohort: str | None = None, implicit: bool = False
) -> dict[str, Any]:
    return {"name": name, "team": team, "cohort": cohort, "weight": 1.0, "implicit": implicit}


def waiting(
    job_id: str, queue_name: str, gpus: int = 1, seq: int = 1, **more: Any
) -> dict[str, Any]:
    row: dict[str, Any] = {
        "job_id": job_id,
        "queue": queue_name,
        "gpu_flavor": "a100",
        "gpus": gpus,
        "priority_class": "normal",
        "submitted_at": NOW - timedelta(minutes=5),
        "max_runtime_seconds": 3600,
        "seq": seq,
        "pending_reason": None,
        "pending_position": None,
        "pending_blocking": None,
        "pending_suggestion": None,
        "pending_estimated_start": None,
    }
    return {**row, **more}


def member(job_id: str, node_id: str, indices: list[int], **more: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "allocation_id": f"{job_id}-{node_id}",
        "epoch": 1,
        "job_id": job_id,
        "queue": "qa",
        "gpu_flavor": "a100",
        "gpus": 0,
        "priority_class": "low",
        "submitted_at": NOW - timedelta(hours=2),
        "seq": 7,
        "max_runtime_seconds": 7200,
        "job_status": "RUNNING",
        "job_updated_at": NOW - timedelta(minutes=1),
        "node_id": node_id,
        "gpu_indices": indices,
        "granted_at": NOW - timedelta(minutes=30),
        "last_checkpoint_at": None,
        "notice_at": None,
        "borrowed": False,
        "preemptions": 0,
    }
    return {**row, **more}


def rows(**parts: Any) -> SnapshotRows:
    base: dict[str, Any] = {
        "nodes": [node("n1"), node("n2")],
        "leases": [],
        "running": [],
        "queues": [
            queue("qa", "team-a", "c1"),
            queue(implicit_queue("team-z"), "team-z", implicit=True),
        ],
        "quotas": [
            {
                "queue": "qa",
                "flavor": "a100",
                "nominal": 4,
                "borrowing_limit": 2,
                "lending_limit": None,
            }
        ],
        "classes": CLASSES,
        "usage": [],
        "pending": [],
    }
    base.update(parts)
    return SnapshotRows(**base)


def test_nodes_carry_their_leases_and_topology() -> None:
    built = build_snapshot(
        rows(leases=[{"node_id": "n1", "gpu_index": 2, "job_id": "j9"}]), NOW, HALF_LIFE
    )
    n1 = next(n for n in built.snapshot.nodes if n.node_id == "n1")
    assert (n1.flavor, n1.gpu_count, n1.topology, dict(n1.used)) == ("a100", 4, "r1", {2: "j9"})
    assert built.snapshot.now == NOW.timestamp()


def test_a_gpu_still_stopping_is_not_free_and_its_holder_is_said_to_be_freeing_it() -> None:
    stopping = {"node_id": "n1", "stopping": True, "job_id": "old", "team": "team-z"}
    built = build_snapshot(
        rows(
            nodes=[node("n1", gpus=2)],
            leases=[{**stopping, "gpu_index": 0}, {**stopping, "gpu_index": 1}],
            pending=[waiting("new", "qa", gpus=2)],
        ),
        NOW,
        HALF_LIFE,
    )
    (n1,) = built.snapshot.nodes
    holder = stopping_holder("old")
    assert (dict(n1.used), dict(n1.teams)) == ({0: holder, 1: holder}, {"old": "team-z"})
    decisions = schedule(built.snapshot, PolicyConfig())
    assert decisions.placements == ()
    (explained,) = decisions.explanations.values()
    # Read by team-a, which the old job is not of: named by its team, as any holder is.
    assert "no a100 GPU is free; they are held by a team-z job (stopping: its GPUs are being " in (
        explained.reason
    )
    assert explained.blocking == "team-z"


def test_queues_get_their_quotas_and_an_implicit_queue_gets_more_than_the_cluster() -> None:
    built = build_snapshot(rows(), NOW, HALF_LIFE)
    by_name = {q.name: q for q in built.snapshot.queues}
    qa = by_name["qa"]
    assert (qa.team, qa.cohort, dict(qa.nominal), dict(qa.borrowing_limit)) == (
        "team-a",
        "c1",
        {"a100": 4},
        {"a100": 2},
    )
    assert dict(qa.lending_limit) == {}
    implicit = by_name["default:team-z"]
    # Two nodes of 4: the quota never binds before the GPUs run out.
    assert (implicit.cohort, dict(implicit.nominal)) == (None, {"a100": 16})


def test_a_gang_becomes_one_running_job() -> None:
    saved = NOW - timedelta(minutes=2)
    built = build_snapshot(
        rows(
            running=[
                member("g", "n1", [0, 1, 2, 3], last_checkpoint_at=saved, preemptions=2),
                member(
                    "g", "n2", [0, 1, 2, 3], granted_at=NOW - timedelta(minutes=31), preemptions=2
                ),
            ]
        ),
        NOW,
        HALF_LIFE,
    )
    (job,) = built.snapshot.running
    assert job.gpus == 8
    assert dict(job.placement) == {"n1": (0, 1, 2, 3), "n2": (0, 1, 2, 3)}
    assert job.started_at == to_epoch(NOW - timedelta(minutes=31))
    assert job.last_checkpoint_at == to_epoch(saved)
    assert job.notice_at is None
    assert job.preemptions == 2  # earlier attempts that ended by preemption
    assert (job.declared_runtime_s, job.priority) == (7200.0, "low")
    # Its place in its queue's order once re-queued (submit time and sequence are kept).
    assert (job.submitted_at, job.seq) == (to_epoch(NOW - timedelta(hours=2)), 7)
    assert [m["node_id"] for m in built.running["g"]] == ["n1", "n2"]


def test_a_job_being_cancelled_or_under_notice_is_leaving() -> None:
    notice = NOW - timedelta(seconds=10)
    built = build_snapshot(
        rows(
            running=[
                member("c", "n1", [0], job_status="CANCELLING"),
                member("p", "n2", [0], notice_at=notice),
            ]
        ),
        NOW,
        HALF_LIFE,
    )
    leaving = {r.job_id: r.notice_at for r in built.snapshot.running}
    assert leaving == {"c": to_epoch(NOW - timedelta(minutes=1)), "p": to_epoch(notice)}


def test_usage_decays_to_now() -> None:
    usage = [{"team": "team-a", "gpu_seconds": 1000.0, "as_of": NOW - timedelta(hours=2)}]
    built = build_snapshot(rows(usage=usage), NOW, HALF_LIFE)
    assert math.isclose(built.snapshot.usage["team-a"], 250.0)


def test_unknown_priority_is_held_back_and_explained_last_in_its_queue() -> None:
    pending = [
        waiting("j1", "qa", gpus=8, seq=1),
        waiting("odd", "qa", seq=2, priority_class="urgent"),
        waiting("j3", "qa", gpus=8, seq=3),
    ]
    built = build_snapshot(rows(pending=pending), NOW, HALF_LIFE)
    assert [j.job_id for j in built.snapshot.pending] == ["j1", "j3"]
    assert [r["job_id"] for r in built.held_back] == ["odd"]
    decisions = schedule(built.snapshot, PolicyConfig())
    notes = pending_notes(decisions, built)
    assert set(notes) == {"j1", "j3", "odd"}
    odd = notes["odd"]
    assert odd.position == 3
    assert odd.reason == "unknown priority class urgent; defined classes: high, low, normal"
    assert odd.blocking == "priority class urgent"
    assert odd.suggestion is not None and "ask an operator to define urgent" in odd.suggestion


def test_a_job_backing_off_is_held_back_until_eligible_and_says_so() -> None:
    eligible = NOW + timedelta(seconds=65)
    # Its first attempt (index 0) failed; the requeue made index 1 the next.
    restarting = waiting(
        "again", "qa", seq=1, eligible_at=eligible, attempt=1, restarts=1, max_restarts=3
    )
    pending = [restarting, waiting("j2", "qa", gpus=8, seq=2)]
    built = build_snapshot(rows(pending=pending), NOW, HALF_LIFE)
    assert [j.job_id for j in built.snapshot.pending] == ["j2"]  # the policy never sees it
    assert [r["job_id"] for r in built.backing_off] == ["again"]
    notes = pending_notes(schedule(built.snapshot, PolicyConfig()), built)
    note = notes["again"]
    assert note == PendingNote(
        reason="restarting after a failure (attempt 2, restart 1 of 3); eligible at 12:01:05 UTC",
        position=2,
        blocking="restart back-off",
        estimated_start=eligible,
    )
    # The same note a minute on: not news (no duration in it to drift).
    again = pending_notes(schedule(built.snapshot, PolicyConfig()), built)["again"]
    assert not note_changed(note, again, NOW + timedelta(minutes=1))

    # Once eligible (or without a back-off) it is an ordinary waiting job again.
    later = build_snapshot(rows(pending=pending), eligible, HALF_LIFE)
    assert [j.job_id for j in later.snapshot.pending] == ["again", "j2"]
    assert later.backing_off == ()
    assert schedule(later.snapshot, PolicyConfig()).placements[0].job_id == "again"


def test_node_addresses_are_kept_for_rendezvous() -> None:
    built = build_snapshot(
        rows(nodes=[{**node("n1"), "address": "10.0.0.1"}, node("n2")]), NOW, HALF_LIFE
    )
    assert built.addresses == {"n1": "10.0.0.1", "n2": "127.0.0.1"}


def test_decisions_on_a_built_snapshot_place_and_explain() -> None:
    pending = [waiting("small", "qa", gpus=2, seq=1), waiting("big", "qa", gpus=8, seq=2)]
    built = build_snapshot(rows(pending=pending), NOW, HALF_LIFE)
    decisions = schedule(built.snapshot, PolicyConfig())
    assert [p.job_id for p in decisions.placements] == ["small"]
    notes = pending_notes(decisions, built)
    big = notes["big"]
    assert big.position == 1
    # Alone in its cohort, qa has nothing to borrow: 4 is all it can ever hold.
    assert big.reason.startswith("needs 8 a100 GPUs but queue qa can never hold more than 4")
    assert big.suggestion == "ask for at most 4 GPUs"
    event = big.to_event("big")
    assert (event.job_id, event.position, event.blocking, event.suggestion) == (
        "big",
        1,
        big.blocking,
        "ask for at most 4 GPUs",
    )


def test_explanation_times_become_datetimes() -> None:
    at = NOW + timedelta(minutes=12)
    note = PendingNote.from_explanation(Explanation(2, "r", "j1", None, to_epoch(at)))
    assert (note.estimated_start, note.blocking) == (at, "j1")
    assert PendingNote.from_explanation(Explanation(1, "r", "", None, None)).blocking is None
    assert from_epoch(math.inf) is None and from_epoch(None) is None
    assert from_epoch(1e300) is None
    assert from_epoch(to_epoch(NOW)) == NOW


def test_a_note_is_news_only_when_something_real_changed() -> None:
    old = PendingNote(
        "held by j1; expected start in ~12 min", 2, "j1", None, NOW + timedelta(minutes=12)
    )
    later = NOW + timedelta(minutes=1)
    same_but_later = PendingNote(
        "held by j1; expected start in ~11 min", 2, "j1", None, NOW + timedelta(minutes=12)
    )
    assert not note_changed(old, same_but_later, later)
    assert note_changed(None, old, NOW)
    assert note_changed(old, PendingNote(old.reason, 1, "j1", None, old.estimated_start), NOW)
    assert note_changed(old, PendingNote(old.reason, 2, "j2", None, old.estimated_start), NOW)
    assert note_changed(
        old, PendingNote(old.reason, 2, "j1", "ask for 1 GPU", old.estimated_start), NOW
    )
    assert note_changed(
        old, PendingNote("held by j1 and j2", 2, "j1", None, old.estimated_start), NOW
    )
    assert note_changed(old, PendingNote(old.reason, 2, "j1", None, None), NOW)
    drift = PendingNote(old.reason, 2, "j1", None, NOW + timedelta(minutes=12, seconds=50))
    assert not note_changed(old, drift, NOW)
    moved = PendingNote(old.reason, 2, "j1", None, NOW + timedelta(minutes=20))
    assert note_changed(old, moved, NOW)


def test_durations_are_taken_out_of_reasons() -> None:
    assert normalise_reason("reclaim expected in ~12 min; waited ~3.5 h, ~45 s, ~2.0 d") == (
        "reclaim expected in ~…; waited ~…, ~…, ~…"
    )


def test_pending_notes_of_no_decisions_is_empty() -> None:
    assert pending_notes(Decisions(), build_snapshot(rows(), NOW, HALF_LIFE)) == {}


def test_a_gang_lists_its_members_in_rank_order() -> None:
    def allocation(node_id: str, gpus: int) -> Allocation:
        return Allocation(
            allocation_id=f"a-{node_id}",
            job_id="g",
            node_id=node_id,
            epoch=1,
            attempt=0,
            gpu_indices=tuple(range(gpus)),
            status=AllocationStatus.GRANTED,
            granted_at=NOW,
        )

    gang = [allocation("n1", 4), allocation("n2", 4), allocation("n3", 4)]
    members = gang_members(gang, {"n1": "10.0.0.1", "n2": "10.0.0.2"})
    assert [(m.node_id, m.allocation_id, m.address, m.gpus, m.first_rank) for m in members] == [
        ("n1", "a-n1", "10.0.0.1", 4, 0),
        ("n2", "a-n2", "10.0.0.2", 4, 4),
        ("n3", "a-n3", "127.0.0.1", 4, 8),  # no address known: the heartbeat's default
    ]
    assert gang_members(gang[:1], {"n1": "10.0.0.1"}) == []  # one node: no rendezvous list

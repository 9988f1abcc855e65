"""Converters between the scheduler's rows and the policy's types (pure: no I/O).

Contract:
- ``build_snapshot(rows, now, half_life_s, ageing_s)`` turns what the repository loaded into the
  policy's ``Snapshot`` (times as epoch seconds). Rules the service adds around the policy:
  an *implicit* queue (``default:<team>``, made for a team no operator gave a queue) gets no
  cohort and a nominal quota of twice the ready GPUs of every flavor -- more than it can
  ever use -- so a fresh install schedules everything; a cordoned node (``cordon``) is left
  out of the policy's nodes, its GPUs still counted in that quota, its running jobs kept
  in ``running``; a job whose priority class does not exist is held back from the
  policy (it waits, and ``unknown_priority_note`` says why), and so is a job backing off
  after a failure until its ``eligible_at`` (``restart_note`` says so), and a job whose
  team's or project's budget holds it (``budget_holds``: spent this UTC month under a policy
  that holds queued jobs; ``budget_note`` says which budget, and until when), or cannot take
  its worst case beside what is spent and reserved (``budget_holds.fit``, in the order the
  jobs would start: ``fairshare.queue_key`` of their class and submission, without the size
  term, so every ``ageing_s`` of waiting lifts a job one class; the note says what it needs; a job no ready node
  can hold, its flavor's ready uncordoned GPUs fewer than it asks, reserves nothing; one
  that does not fit and was submitted ``ageing_s`` or more ago keeps its room from the jobs
  after it, whose notes say so); a
  waiting job that submission lowered to the class a spent budget under ``deprioritize`` gives its team's
  (or project's) new jobs is told so first (``lowered_note``; ``budget_holds.lowering``); a
  job being cancelled, or under a preemption notice, is *leaving* (never chosen as a victim
  again); a GPU still leased to an ended allocation while its runner stops the job
  (``leases``) is no free GPU, its holder named as stopping (``stopping_holder``: a waiting
  job's reason says its GPUs are being freed; ``Node.teams`` gives the holder's team, so
  another team's reader sees it by its team only, as any holder); usage is decayed to ``now`` with the
  policy's ``decay_usage``.
- ``pending_notes(decisions, built, now)`` gives every waiting job its ``PendingNote``
  (reason, position, blocking, suggestion, estimated start as a datetime) and
  ``note_changed`` says whether a note is news compared with the last one published: the
  durations inside a reason ("~12 min") and small drifts of the estimate are not.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from trainyard_platform.services.scheduler.budget_holds import (
    Holds,
    Reserves,
    Unfit,
    budget_note_parts,
    fit,
    hold_of,
    holding,
    lowered_by,
    lowered_part,
    lowering,
    reservation_note_parts,
    reserving,
)
from trainyard_platform.services.scheduler.policy.fairshare import (
    class_levels,
    decay_usage,
    queue_key,
)
from trainyard_platform.services.scheduler.policy.model import (
    Decisions,
    Explanation,
    Node,
    PendingJob,
    PolicyConfig,
    PriorityClass,
    Queue,
    RunningJob,
    Snapshot,
)
from trainyard_platform.shared.events.payloads import JobPending

Row = Mapping[str, Any]

IMPLICIT_PREFIX = "default:"
"""Name prefix of the queue made for a team on its first submission."""
DEFAULT_AGEING_S = PolicyConfig().ageing_s
"""The policy's default ``ageing_s``: how long a job that does not fit its budget waits
before the jobs after it reserve behind it (``budget_holds.fit``)."""
_DURATION = re.compile(r"~\d+(?:\.\d+)? (?:s|min|h|d)\b")
_LATEST = datetime.max.replace(tzinfo=UTC).timestamp()


def implicit_queue(team: str) -> str:
    return f"{IMPLICIT_PREFIX}{team}"


def to_epoch(at: datetime) -> float:
    return at.timestamp()


def from_epoch(seconds: float | None) -> datetime | None:
    """The policy's clock back to a datetime; None for no (or an unrepresentable) time."""
    if seconds is None or not math.isfinite(seconds) or seconds >= _LATEST:
        return None
    return datetime.fromtimestamp(max(seconds, 0.0), UTC)


@dataclass(frozen=True)
class SnapshotRows:
    """What ``repository.load_snapshot_rows`` reads, one list per query."""

    nodes: Sequence[Row]
    """Ready nodes: node_id, gpu_flavor, gpu_count, topology, cordoned (and address)."""
    leases: Sequence[Row]
    """Live leases on ready nodes: node_id, gpu_index, job_id (and stopping: the lease
    outlives its ended allocation while the runner stops the job, ``leases``; team: that
    job's team, for a stopping one)."""
    running: Sequence[Row]
    """Live allocations with their job: allocation_id, epoch, job_id, queue, gpu_flavor, gpus,
    priority_class, submitted_at, seq,
    max_runtime_seconds, job_status, job_updated_at, node_id, gpu_indices, granted_at,
    started_at (None until the runner says the job started), last_checkpoint_at, notice_at, borrowed, preemptions (the job's earlier attempts that
    ended by preemption), team, project, cpus_per_gpu, memory_gib_per_gpu."""
    queues: Sequence[Row]
    """name, team, cohort, weight, implicit."""
    quotas: Sequence[Row]
    """queue, flavor, nominal, borrowing_limit, lending_limit."""
    classes: Sequence[Row]
    """name, value, preemptible, min_runtime_seconds."""
    usage: Sequence[Row]
    """team, gpu_seconds, as_of."""
    pending: Sequence[Row]
    """Queued jobs: job_id, queue, gpu_flavor, gpus, priority_class, submitted_at,
    max_runtime_seconds, seq, the last published pending_* columns (and eligible_at,
    attempt, restarts, max_restarts, platform_retries, team, project, lowered_from,
    cpus_per_gpu, memory_gib_per_gpu)."""
    budgets: Sequence[Row] = ()
    """Budget states that may hold jobs (``budget_holds.load``): not deleted, exhausted or
    with billing's rates (it reserves)."""


@dataclass(frozen=True)
class BudgetFit:
    """How a pass weighs the queued jobs of budgets that reserve (``budget_holds.fit``),
    with what it read: ``unfit(candidates)`` is that step of ``build_snapshot``, for any
    candidates (the arrival fast path runs it again for one team's, ``fast_path``)."""

    at: datetime
    """The pass's clock (``now``: which jobs have waited ``ageing_s``)."""
    ageing_s: float
    ready_gpus: Mapping[str, int]
    """Per flavor, the ready uncordoned GPUs (filled only when a budget reserves)."""
    levels: Mapping[str, int]
    """Per priority class name, its level (``fairshare.class_levels``)."""
    running: Mapping[str, Sequence[Row]]
    reserves: Reserves

    def unfit(self, candidates: Iterable[Row]) -> dict[str, Unfit]:
        """The ``candidates`` (known class, eligible, not held) that wait for a budget, by
        id: those a ready node can hold, in the order they would start (the comment in
        ``build_snapshot``), through ``fit``."""
        ageing = max(self.ageing_s, 1e-9)  # as the policy's pass divides by it
        levels, ready = self.levels, self.ready_gpus
        return fit(
            sorted(
                (c for c in candidates if c["gpus"] <= ready.get(c["gpu_flavor"], 0)),
                key=lambda r: queue_key(
                    to_epoch(r["submitted_at"]),
                    levels[r["priority_class"]],
                    r["seq"],
                    r["job_id"],
                    ageing,
                ),
            ),
            self.running,
            self.reserves,
            self.at,
            self.ageing_s,
        )


@dataclass(frozen=True)
class Built:
    """A snapshot and what the service keeps beside it for applying the decisions."""

    snapshot: Snapshot
    candidates: tuple[Row, ...] = ()
    """Queued jobs of a known class, eligible and held by no spent budget: those a budget
    that reserves weighs (``fitting``)."""
    fitting: BudgetFit | None = None
    """The reservation step of the pass, to run again for arrivals (``fast_path``)."""
    held_back: tuple[Row, ...] = ()
    """Queued jobs kept from the policy: their priority class does not exist."""
    backing_off: tuple[Row, ...] = ()
    """Queued jobs kept from the policy: restarted after a failure, not yet eligible."""
    budget_held: tuple[Row, ...] = ()
    """Queued jobs kept from the policy: their team's or project's budget holds them."""
    holds: Holds = field(default_factory=dict)
    """The budgets that hold jobs now (``budget_holds.holding``), by (team, project)."""
    lowers: Holds = field(default_factory=dict)
    """The budgets whose new jobs run at priority low now (``budget_holds.lowering``)."""
    reserves: Reserves = field(default_factory=dict)
    """The budgets that reserve the worst case of their jobs now (``budget_holds.reserving``)."""
    unfit: Mapping[str, Unfit] = field(default_factory=dict)
    """Queued jobs of ``budget_held`` whose reservation a budget cannot take, by id."""
    addresses: Mapping[str, str] = field(default_factory=dict)
    """Ready node id -> its address (the last heartbeat's), for gang rendezvous."""
    pending: Mapping[str, Row] = field(default_factory=dict)
    """Every queued job's row, by id."""
    running: Mapping[str, Sequence[Row]] = field(default_factory=dict)
    """Every job holding GPUs: its live allocation rows (one per node of its gang)."""
    class_names: tuple[str, ...] = ()


def build_snapshot(
    rows: SnapshotRows, now: datetime, half_life_s: float, ageing_s: float = DEFAULT_AGEING_S
) -> Built:
    """The policy's view of the cluster at ``now`` (see the module docstring)."""
    nodes, totals = _nodes(rows.nodes, rows.leases)
    classes = tuple(
        PriorityClass(c["name"], c["value"], c["preemptible"], float(c["min_runtime_seconds"]))
        for c in rows.classes
    )
    known = {c.name for c in classes}
    queues = queues_from_rows(rows.queues, rows.quotas, totals)
    pending: list[PendingJob] = []
    held: list[Row] = []
    backing_off: list[Row] = []
    budget_held: list[Row] = []
    holds = holding(rows.budgets, now)
    candidates: list[Row] = []
    for j in rows.pending:
        if holds and hold_of(j.get("team", ""), j.get("project"), holds) is not None:
            budget_held.append(j)  # before a back-off: the hold is what lasts
            continue
        eligible_at = j.get("eligible_at")
        if eligible_at is not None and eligible_at > now:
            backing_off.append(j)
            continue
        if j["priority_class"] not in known:
            held.append(j)
            continue
        candidates.append(j)
    by_job: dict[str, list[Row]] = {}
    for a in rows.running:
        by_job.setdefault(a["job_id"], []).append(a)
    # A budget that reserves takes the worst case of its jobs in the order they would
    # start: the policy's ``queue_key`` by class and arrival, where every ``ageing_s`` of
    # waiting counts as one class level, so a job of a higher class submitted later goes
    # first only until the earlier one has waited as many ageings as it is levels below;
    # not by declared size: a large job's worst case is what its aged room protects (below).
    # One that does not fit waits for it (``budget_holds.fit``).
    # A job no ready node can hold (its flavor's ready, uncordoned GPUs fewer than it asks)
    # cannot start in this pass: it reserves nothing, so it keeps no later job of its budget
    # waiting for as long as those nodes are away. A job that does not fit and has waited
    # the policy's ageing keeps its room from the jobs after it, so it is not starved by a
    # stream of smaller ones (``fit``).
    reserves = reserving(rows.budgets, now)
    ready_gpus: dict[str, int] = {}
    if reserves:
        for n in rows.nodes:
            if not n.get("cordoned"):
                flavor = n["gpu_flavor"]
                ready_gpus[flavor] = ready_gpus.get(flavor, 0) + n["gpu_count"]
    levels = class_levels(classes)
    fitting = BudgetFit(
        now, ageing_s, ready_gpus, {c.name: levels[c.value] for c in classes}, by_job, reserves
    )
    unfit = fitting.unfit(candidates) if reserves else {}
    for j in candidates:
        if j["job_id"] in unfit:
            budget_held.append(j)
        else:
            pending.append(pending_job(j))
    usage: dict[str, float] = {}
    for u in rows.usage:
        elapsed = (now - u["as_of"]).total_seconds()
        usage.update(decay_usage({u["team"]: u["gpu_seconds"]}, elapsed, half_life_s))
    snapshot = Snapshot(
        now=to_epoch(now),
        nodes=nodes,
        queues=queues,
        priority_classes=classes,
        pending=tuple(pending),
        running=tuple(_running(members) for members in by_job.values()),
        usage=usage,
    )
    return Built(
        snapshot=snapshot,
        candidates=tuple(candidates),
        fitting=fitting,
        held_back=tuple(held),
        backing_off=tuple(backing_off),
        budget_held=tuple(budget_held),
        holds=holds,
        lowers=lowering(rows.budgets, now),
        reserves=reserves,
        unfit=unfit,
        addresses={n["node_id"]: n.get("address") or "127.0.0.1" for n in rows.nodes},
        pending={j["job_id"]: j for j in rows.pending},
        running=by_job,
        class_names=tuple(sorted(known)),
    )


def pending_job(row: Row) -> PendingJob:
    """A queued job's row as the policy's ``PendingJob``."""
    return PendingJob(
        job_id=row["job_id"],
        queue=row["queue"],
        flavor=row["gpu_flavor"],
        gpus=row["gpus"],
        priority=row["priority_class"],
        submitted_at=to_epoch(row["submitted_at"]),
        declared_runtime_s=float(row["max_runtime_seconds"]),
        seq=row["seq"],
    )


def stopping_holder(job_id: str) -> str:
    """How a waiting job's reason names the holder of a GPU still leased to an allocation
    that ended while its runner stops it (``leases``): the old job's id first, as a holder's
    is (the reason's ``blocking`` takes it)."""
    return f"{job_id} (stopping: its GPUs are being freed)"


def _nodes(
    node_rows: Sequence[Row], lease_rows: Sequence[Row]
) -> tuple[tuple[Node, ...], dict[str, int]]:
    used: dict[str, dict[int, str]] = {}
    teams: dict[str, dict[str, str]] = {}
    for lease in lease_rows:
        holder = lease["job_id"]
        if lease.get("stopping"):  # not free: the ended job may still run on it
            teams.setdefault(lease["node_id"], {})[holder] = lease["team"]
            holder = stopping_holder(holder)
        used.setdefault(lease["node_id"], {})[lease["gpu_index"]] = holder
    totals: dict[str, int] = {}
    nodes = []
    for n in node_rows:
        # A cordoned node's GPUs still count for the size of the cluster (an implicit
        # queue's quota, which its running jobs use), but it is no node to place on.
        totals[n["gpu_flavor"]] = totals.get(n["gpu_flavor"], 0) + n["gpu_count"]
        if n.get("cordoned"):
            continue
        nodes.append(
            Node(
                n["node_id"],
                n["gpu_flavor"],
                n["gpu_count"],
                n["topology"],
                used.get(n["node_id"], {}),
                teams.get(n["node_id"], {}),
            )
        )
    return tuple(nodes), totals


def queues_from_rows(
    queue_rows: Sequence[Row], quota_rows: Sequence[Row], totals: Mapping[str, int]
) -> tuple[Queue, ...]:
    """The policy's queues; ``totals`` (flavor -> ready GPUs) sizes an implicit queue's quota."""
    quotas: dict[str, list[Row]] = {}
    for q in quota_rows:
        quotas.setdefault(q["queue"], []).append(q)
    queues = []
    for q in queue_rows:
        if q["implicit"]:
            # No operator set this team up: it may use every ready GPU of every flavor. Twice
            # the cluster, so the quota never binds before the GPUs run out (the reason then
            # names the jobs holding them, not a quota nobody set), while fair share still
            # compares teams by the fraction of the cluster they use.
            nominal = {flavor: 2 * gpus for flavor, gpus in totals.items()}
            queues.append(Queue(q["name"], q["team"], None, nominal, {}, {}, q["weight"]))
            continue
        own = quotas.get(q["name"], [])
        queues.append(
            Queue(
                name=q["name"],
                team=q["team"],
                cohort=q["cohort"],
                nominal={r["flavor"]: r["nominal"] for r in own},
                borrowing_limit={
                    r["flavor"]: r["borrowing_limit"]
                    for r in own
                    if r["borrowing_limit"] is not None
                },
                lending_limit={
                    r["flavor"]: r["lending_limit"] for r in own if r["lending_limit"] is not None
                },
                weight=float(q["weight"]),
            )
        )
    return tuple(queues)


def _running(members: Sequence[Row]) -> RunningJob:
    """One job holding GPUs, from its live allocations (one per node)."""
    first = members[0]
    checkpoints = [m["last_checkpoint_at"] for m in members if m["last_checkpoint_at"]]
    notices = [m["notice_at"] for m in members if m["notice_at"]]
    if first["job_status"] == "CANCELLING":
        notices.append(first["job_updated_at"])  # it is leaving: never a victim again
    return RunningJob(
        job_id=first["job_id"],
        queue=first["queue"],
        flavor=first["gpu_flavor"],
        gpus=sum(len(m["gpu_indices"]) for m in members),
        priority=first["priority_class"],
        started_at=to_epoch(min(m["granted_at"] for m in members)),
        declared_runtime_s=float(first["max_runtime_seconds"]),
        placement={m["node_id"]: tuple(sorted(m["gpu_indices"])) for m in members},
        last_checkpoint_at=to_epoch(max(checkpoints)) if checkpoints else None,
        borrowed=any(m["borrowed"] for m in members),
        notice_at=to_epoch(min(notices)) if notices else None,
        preemptions=first["preemptions"],
        # Kept when it is re-queued: the policy orders it against the job preempting it.
        submitted_at=to_epoch(first["submitted_at"]),
        seq=first["seq"],
    )


# --- decisions back ----------------------------------------------------------------------


@dataclass(frozen=True)
class PendingNote:
    """What a waiting job is told (the fields of ``JobPending``)."""

    reason: str
    position: int
    blocking: str | None = None
    suggestion: str | None = None
    estimated_start: datetime | None = None

    @classmethod
    def from_row(cls, row: Row) -> PendingNote | None:
        """The note last published for a queued job, or None if none was."""
        if row["pending_reason"] is None:
            return None
        return cls(
            row["pending_reason"],
            row["pending_position"],
            row["pending_blocking"],
            row["pending_suggestion"],
            row["pending_estimated_start"],
        )

    @classmethod
    def from_explanation(cls, explanation: Explanation) -> PendingNote:
        return cls(
            explanation.reason,
            explanation.position,
            explanation.blocking or None,
            explanation.suggestion,
            from_epoch(explanation.estimated_start),
        )

    def to_event(self, job_id: str) -> JobPending:
        return JobPending(
            job_id=job_id,
            reason=self.reason,
            position=self.position,
            estimated_start=self.estimated_start,
            blocking=self.blocking,
            suggestion=self.suggestion,
        )


def unknown_priority_note(priority: str, classes: Sequence[str], position: int) -> PendingNote:
    """The note of a job whose priority class does not exist (it waits until it does)."""
    defined = ", ".join(classes) or "none"
    return PendingNote(
        reason=f"unknown priority class {priority}; defined classes: {defined}",
        position=position,
        blocking=f"priority class {priority}",
        suggestion=(
            f"resubmit with one of: {defined}, or ask an operator to define {priority}"
            if classes
            else f"ask an operator to define priority class {priority}"
        ),
    )


def restart_note(row: Row, position: int) -> PendingNote:
    """The note of a job backing off after a failure: which attempt comes next (its index,
    already the next one's, + 1: people count from 1), the restarts used of ``max_restarts``,
    the platform retries used (when any), and when it may be placed (``estimated_start``)."""
    eligible_at: datetime = row["eligible_at"]
    # Platform retries, where any were used: a back-off the job's code did not cause.
    retries = row.get("platform_retries") or 0
    platform = f", platform retries {retries}" if retries else ""
    return PendingNote(
        reason=(
            f"restarting after a failure (attempt {row['attempt'] + 1}, restart "
            f"{row['restarts']} of {row['max_restarts']}{platform}); eligible at "
            f"{eligible_at.astimezone(UTC):%H:%M:%S} UTC"
        ),
        position=position,
        blocking="restart back-off",
        estimated_start=eligible_at,
    )


def budget_note(hold: Row, position: int, now: datetime) -> PendingNote:
    """The note of a job that a spent budget (``hold``) holds: which budget, what is spent,
    and that it waits until the budget is raised or the UTC month ends
    (``estimated_start``: the first instant of the next month)."""
    reason, blocking, suggestion, until = budget_note_parts(hold, now)
    return PendingNote(reason, position, blocking, suggestion, until)


def lowered_note(note: PendingNote, row: Row, lowers: Holds, now: datetime) -> PendingNote:
    """``note`` of the waiting job ``row``, starting with ``budget_holds.lowered_part`` while
    a spent budget lowers its team's (or project's) new jobs and submission lowered it to
    the class they get (``row["lowered_from"]``); otherwise ``note`` unchanged (the
    decisions are the policy's either way)."""
    budget = lowered_by(
        row.get("team", ""),
        row.get("project"),
        row["priority_class"],
        row.get("lowered_from"),
        lowers,
    )
    if budget is None:
        return note
    # First: a reason ends with its estimate, which ``shared.waits`` rewrites when read.
    return replace(note, reason=f"{lowered_part(budget, now)}; {note.reason}")


def pending_notes(decisions: Decisions, built: Built) -> dict[str, PendingNote]:
    """A note for every waiting job: the policy's explanations, then the jobs held back (an
    unknown priority class, a restart back-off, a spent budget) last in their queues, by
    submit time. A job submission lowered to the class a spent budget gives its team's new
    jobs says so first (``lowered_note``), unless a budget holds it."""
    notes = {
        job_id: PendingNote.from_explanation(e) for job_id, e in decisions.explanations.items()
    }
    behind: dict[str, int] = {}
    for job_id in notes:
        queue = built.pending[job_id]["queue"] if job_id in built.pending else ""
        behind[queue] = behind.get(queue, 0) + 1
    backing_off = {row["job_id"] for row in built.backing_off}
    by_budget = {row["job_id"] for row in built.budget_held}
    held = sorted(
        [*built.held_back, *built.backing_off, *built.budget_held],
        key=lambda r: (r["submitted_at"], r["seq"]),
    )
    now = from_epoch(built.snapshot.now) or datetime.now(UTC)
    for row in held:
        behind[row["queue"]] = behind.get(row["queue"], 0) + 1
        position = behind[row["queue"]]
        hold = None
        if row["job_id"] in by_budget:
            hold = hold_of(row["team"], row["project"], built.holds)
        if hold is not None:
            notes[row["job_id"]] = budget_note(hold, position, now)
        elif row["job_id"] in built.unfit:
            reason, blocking, suggestion, until = reservation_note_parts(
                built.unfit[row["job_id"]], now
            )
            notes[row["job_id"]] = PendingNote(reason, position, blocking, suggestion, until)
        elif row["job_id"] in backing_off:
            notes[row["job_id"]] = restart_note(row, position)
        else:
            notes[row["job_id"]] = unknown_priority_note(
                row["priority_class"], built.class_names, position
            )
    if built.lowers:
        for job_id in notes.keys() - by_budget:
            if job_id in built.pending:
                notes[job_id] = lowered_note(
                    notes[job_id], built.pending[job_id], built.lowers, now
                )
    return notes


def normalise_reason(reason: str) -> str:
    """A reason without its relative durations, which change with every pass."""
    return _DURATION.sub("~…", reason)


def note_changed(old: PendingNote | None, new: PendingNote, now: datetime) -> bool:
    """Whether ``new`` is news compared with ``old`` (the last note published): another
    position, holder, suggestion or reason (durations aside), or an estimated start that
    appeared, vanished or moved by more than a minute and a tenth of the wait."""
    if old is None:
        return True
    if (old.position, old.blocking, old.suggestion) != (new.position, new.blocking, new.suggestion):
        return True
    if normalise_reason(old.reason) != normalise_reason(new.reason):
        return True
    if (old.estimated_start is None) != (new.estimated_start is None):
        return True
    if old.estimated_start is None or new.estimated_start is None:
        return False
    wait = max(0.0, (old.estimated_start - now).total_seconds())
    moved = abs((new.estimated_start - old.estimated_start).total_seconds())
    return moved > max(60.0, 0.1 * wait)

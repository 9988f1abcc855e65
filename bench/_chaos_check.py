"""The chaos suite's invariants, checked from the platform's stores by code of its own.

Nothing here imports a service: the checks read PostgreSQL with plain SQL (the schemas
``submission``, ``scheduler``, ``registry``, ``billing``), the JetStream streams with nats-py
as an admin user, and the object store's files, and compare them with what the load
generator was told (``Accepted``: every job id a ``POST /v1/jobs`` answered 201 for, or 200
for the same Idempotency-Key).

``check(...)`` returns a ``Report``: one ``Finding`` per invariant (a count that must be 0,
and up to ``EXAMPLES`` examples), plus facts for the results table. The invariants:

- ``lost``: an accepted job the submission or the scheduler does not know;
- ``duplicated``: a job of the suite's teams nobody was told about (a retried POST that made a
  second job), or one with more than one model version. A job whose node was declared lost
  and that finished there all the same while its next attempt ran too has two succeeded
  allocations: real work, kept and billed (``facts["succeeded_twice"]``), not a duplicate;
- ``not_terminal``: an accepted job that has not ended in the submission's or the
  scheduler's view (``legitimately_queued`` lets a caller allow QUEUED ones, e.g. a job that
  asks for more GPUs than exist);
- ``double_allocations``: two leases of one GPU whose lifetimes (grant to release) overlap,
  over the whole history, and two allocations whose runs (``job.started`` to the terminal
  event in the stream) overlapped on one GPU after the scheduler had released the first;
- ``checkpoints``: a succeeded job that saved a checkpoint and asked for a model
  (``register_model``) without a model version, a model
  version whose artifact is missing, does not match its manifest or sha256, or does not
  load with ``torch.load(weights_only=True)``;
- ``billing_difference``: GPU-seconds billed minus GPUs x (release - grant) of every ended
  allocation, exactly (absolute sum; allocations unbilled or billed without an allocation
  count too);
- ``views_disagreeing``: jobs whose final status, allocations, costs or model differ
  between the submission's view and the scheduler's, billing's or the registry's;
- ``outbox_stuck``: outbox rows not published (or parked) in any schema;
- ``stream_missing``: an accepted job whose ``job.submitted`` or final event is not in the
  event stream;
- ``dead_letters_unexpected`` / ``poison_not_dead_lettered``: a dead letter that is not one
  of the messages the suite made poisonous, or has no reason; a poison message with no dead
  letter.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import asyncpg
import nats
from nats.js import api
from nats.js.errors import NotFoundError

EXAMPLES = 5
TERMINAL = frozenset({"SUCCEEDED", "FAILED", "CANCELLED"})
SCHEMAS = ("submission", "scheduler", "registry", "billing")
STREAM = "TRAINYARD"
DEADLETTER_STREAM = "TRAINYARD_DEADLETTER"
REASON_HEADER = "Trainyard-Dead-Letter-Reason"
ORIGINAL_MSG_ID_HEADER = "Trainyard-Original-Msg-Id"
SUBMITTED = "trainyard.job.submitted.v1"
FINAL_TYPES = {
    "trainyard.job.succeeded.v1": "SUCCEEDED",
    "trainyard.job.failed.v1": "FAILED",
    "trainyard.job.cancelled.v1": "CANCELLED",
}
STARTED = "trainyard.job.started.v1"
RUN_ENDS = frozenset(
    {"trainyard.job.succeeded.v1", "trainyard.job.failed.v1", "trainyard.job.preempted.v1"}
)
RUNNER = "trainyard/runner"


@dataclass
class Accepted:
    """What the load generator was told: job id -> (team, kind)."""

    jobs: dict[str, tuple[str, str]] = field(default_factory=dict)
    teams: set[str] = field(default_factory=set)
    saves_checkpoint: set[str] = field(default_factory=set)


@dataclass
class Finding:
    name: str
    count: int = 0
    examples: list[str] = field(default_factory=list)

    def add(self, example: str, count: int = 1) -> None:
        self.count += count
        if len(self.examples) < EXAMPLES:
            self.examples.append(example)


@dataclass
class Report:
    findings: dict[str, Finding]
    facts: dict[str, Any]

    @property
    def failed(self) -> dict[str, Finding]:
        return {name: f for name, f in self.findings.items() if f.count}

    def summary(self) -> str:
        lines = [f"{name}: {f.count}" for name, f in self.findings.items()]
        for name, f in self.failed.items():
            lines += [f"  {name} e.g. {example}" for example in f.examples]
        return "\n".join(lines)


async def check(
    database_url: str,
    nats_url: str,
    objects_dir: Path,
    accepted: Accepted,
    poison_ids: Iterable[str] = (),
    *,
    poison_kept: Iterable[str] | None = None,
    legitimately_queued: Iterable[str] = (),
    load_checkpoints: bool = True,
) -> Report:
    """Every invariant of the module docstring, from the stores as they are now.
    ``poison_ids`` may be dead letters; ``poison_kept`` (default: all of them) must be: a
    poison message published before the JetStream store was lost is gone with it."""
    findings = {
        name: Finding(name)
        for name in (
            "lost",
            "duplicated",
            "not_terminal",
            "double_allocations",
            "checkpoints",
            "billing_difference",
            "views_disagreeing",
            "outbox_stuck",
            "stream_missing",
            "dead_letters_unexpected",
            "poison_not_dead_lettered",
        )
    }
    facts: dict[str, Any] = {}
    conn = await asyncpg.connect(database_url)
    try:
        db = await _read_database(conn, accepted)
    finally:
        await conn.close()
    stream = await _read_streams(nats_url)
    _jobs(db, accepted, set(legitimately_queued), findings, facts)
    _leases(db, findings)
    _runs_on_gpus(db, stream, findings)
    _billing(db, findings, facts)
    _views(db, accepted, findings)
    await asyncio.to_thread(_models, db, accepted, objects_dir, load_checkpoints, findings)
    for schema, count in db["outbox_stuck"].items():
        if count:
            findings["outbox_stuck"].add(f"{schema}: {count} rows unpublished", count)
    _stream(stream, accepted, findings, facts)
    allowed = set(poison_ids)
    kept = allowed if poison_kept is None else set(poison_kept)
    _dead_letters(stream, allowed, kept, findings, facts)
    return Report(findings, facts)


# --- reading -----------------------------------------------------------------------------


async def _read_database(conn: asyncpg.Connection, accepted: Accepted) -> dict[str, Any]:
    db: dict[str, Any] = {}
    db["sub_jobs"] = {
        r["id"]: dict(r)
        for r in await conn.fetch(
            "SELECT j.id, j.status, j.failure, t.name AS team, "
            "coalesce((j.spec->>'register_model')::boolean, false) AS register_model "
            "FROM submission.jobs j "
            "JOIN submission.teams t ON t.id = j.team_id WHERE t.name = ANY($1::text[])",
            sorted(accepted.teams),
        )
    }
    db["sub_allocations"] = _group(
        await conn.fetch("SELECT job_id, allocation_id FROM submission.job_allocations"),
        "job_id",
        "allocation_id",
    )
    db["sub_costs"] = {
        r["allocation_id"]: dict(r)
        for r in await conn.fetch(
            "SELECT allocation_id, job_id, gpu_seconds FROM submission.job_costs"
        )
    }
    db["sub_models"] = _group(
        await conn.fetch("SELECT job_id, model_version_id FROM submission.job_models"),
        "job_id",
        "model_version_id",
    )
    db["sched_jobs"] = {
        r["job_id"]: dict(r)
        for r in await conn.fetch("SELECT job_id, status, attempt, restarts FROM scheduler.jobs")
    }
    db["allocations"] = {
        str(r["allocation_id"]): dict(r)
        for r in await conn.fetch(
            "SELECT allocation_id, job_id, node_id, gpu_indices, granted_at, released_at, "
            "outcome, epoch FROM scheduler.allocations"
        )
    }
    db["lease_overlaps"] = [
        dict(r)
        for r in await conn.fetch(
            "SELECT a.node_id, a.gpu_index, a.allocation_id AS first, "
            "       b.allocation_id AS second "
            "FROM scheduler.gpu_leases a "
            "JOIN scheduler.allocations aa ON aa.allocation_id = a.allocation_id "
            "JOIN scheduler.gpu_leases b ON b.node_id = a.node_id "
            "     AND b.gpu_index = a.gpu_index AND b.allocation_id > a.allocation_id "
            "JOIN scheduler.allocations bb ON bb.allocation_id = b.allocation_id "
            "WHERE tstzrange(aa.granted_at, coalesce(a.released_at, 'infinity')) "
            "   && tstzrange(bb.granted_at, coalesce(b.released_at, 'infinity'))"
        )
    ]
    db["leases"] = await conn.fetchval("SELECT count(*) FROM scheduler.gpu_leases")
    db["ledger"] = {
        r["allocation_id"]: dict(r)
        for r in await conn.fetch(
            "SELECT allocation_id, job_id, gpus, started_at, ended_at, gpu_seconds "
            "FROM billing.usage_ledger"
        )
    }
    db["runs"] = _group(
        await conn.fetch("SELECT job_id, allocation_id FROM registry.runs"),
        "job_id",
        "allocation_id",
    )
    db["reg_checkpoints"] = _group(
        await conn.fetch("SELECT job_id, uri FROM registry.checkpoints"), "job_id", "uri"
    )
    db["versions"] = defaultdict(list)
    for r in await conn.fetch(
        "SELECT id, job_id, artifact_uri, artifact_manifest_uri, artifact_sha256, "
        "artifact_size_bytes FROM registry.model_versions"
    ):
        db["versions"][r["job_id"]].append(dict(r))
    db["outbox_stuck"] = {
        schema: await conn.fetchval(
            f"SELECT count(*) FROM {schema}.outbox "  # schema names are ours, not input
            "WHERE published_at IS NULL OR parked_at IS NOT NULL"
        )
        for schema in SCHEMAS
    }
    return db


@dataclass
class _Streams:
    events: list[tuple[str, str, str, dict[str, Any]]]  # (type, source, subject, data)
    dead_letters: list[tuple[dict[str, str], bytes]]


async def _read_streams(nats_url: str) -> _Streams:
    nc = await nats.connect(nats_url, max_reconnect_attempts=5)
    try:
        js = nc.jetstream()
        events = [
            (env["type"], env.get("source", ""), env.get("subject", ""), env.get("data") or {})
            for _, data in await _read_all(js, STREAM)
            if (env := _envelope(data)) is not None
        ]
        dead = [(headers, data) for headers, data in await _read_all(js, DEADLETTER_STREAM)]
    finally:
        await nc.close()
    return _Streams(events, dead)


async def _read_all(js: Any, stream: str) -> list[tuple[dict[str, str], bytes]]:
    """Every message of ``stream`` through an ephemeral pull, oldest first (none while the
    stream does not exist: lost, and not made again yet)."""
    try:
        info = await js.stream_info(stream)
    except NotFoundError:
        return []
    last = info.state.last_seq
    if info.state.messages == 0:
        return []
    sub = await js.pull_subscribe(
        "",
        durable=None,
        stream=stream,
        config=api.ConsumerConfig(
            ack_policy=api.AckPolicy.NONE,
            deliver_policy=api.DeliverPolicy.ALL,
            inactive_threshold=60.0,
        ),
    )
    out: list[tuple[dict[str, str], bytes]] = []
    try:
        while True:
            try:
                batch = await sub.fetch(500, timeout=2.0)
            except (TimeoutError, nats.errors.TimeoutError):
                break
            for msg in batch:
                out.append((dict(msg.headers or {}), msg.data))
            if batch and batch[-1].metadata.sequence.stream >= last:
                break
    finally:
        await sub.unsubscribe()
    return out


def _envelope(data: bytes) -> dict[str, Any] | None:
    try:
        env = json.loads(data)
    except ValueError:
        return None
    return env if isinstance(env, dict) and "type" in env else None


def _group(rows: Iterable[Mapping[str, Any]], key: str, value: str) -> dict[str, set[str]]:
    grouped: dict[str, set[str]] = defaultdict(set)
    for row in rows:
        grouped[str(row[key])].add(str(row[value]))
    return grouped


# --- the invariants ------------------------------------------------------------------------


def _jobs(
    db: dict[str, Any],
    accepted: Accepted,
    queued_ok: set[str],
    findings: dict[str, Finding],
    facts: dict[str, Any],
) -> None:
    sub, sched = db["sub_jobs"], db["sched_jobs"]
    statuses: Counter[str] = Counter()
    for job_id in accepted.jobs:
        if job_id not in sub:
            findings["lost"].add(f"{job_id}: not in submission.jobs")
            continue
        if job_id not in sched and not _refused(sub[job_id]):
            findings["lost"].add(f"{job_id}: the scheduler never heard of it")
            continue
        status = sub[job_id]["status"]
        statuses[status] += 1
        if job_id in queued_ok and status in ("QUEUED", "PENDING"):
            continue
        sched_status = sched.get(job_id, {}).get("status", "FAILED")
        if status not in TERMINAL or sched_status not in TERMINAL:
            findings["not_terminal"].add(f"{job_id}: submission {status}, scheduler {sched_status}")
    for job_id, row in sub.items():
        if job_id not in accepted.jobs:
            findings["duplicated"].add(f"{job_id} ({row['team']}): a job nobody was told of")
    succeeded: Counter[str] = Counter(
        a["job_id"] for a in db["allocations"].values() if a["outcome"] == "succeeded"
    )
    facts["succeeded_twice"] = sum(
        1 for job_id, count in succeeded.items() if count > 1 and job_id in accepted.jobs
    )
    for job_id, versions in db["versions"].items():
        if len(versions) > 1:
            findings["duplicated"].add(f"{job_id}: {len(versions)} model versions")
    facts["statuses"] = dict(sorted(statuses.items()))
    facts["terminal"] = sum(n for s, n in statuses.items() if s in TERMINAL)
    facts["allocations"] = len(db["allocations"])
    facts["leases"] = db["leases"]


def _refused(job: Mapping[str, Any]) -> bool:
    failure = job.get("failure")
    if isinstance(failure, str):
        failure = json.loads(failure)
    return job["status"] == "FAILED" and bool(failure) and failure.get("failure_kind") == "rejected"


def _leases(db: dict[str, Any], findings: dict[str, Finding]) -> None:
    for overlap in db["lease_overlaps"]:
        findings["double_allocations"].add(
            f"GPU {overlap['node_id']}/{overlap['gpu_index']}: leases of allocations "
            f"{overlap['first']} and {overlap['second']} overlap"
        )


def _runs_on_gpus(db: dict[str, Any], stream: _Streams, findings: dict[str, Finding]) -> None:
    """Runs as the runners reported them: a run that started on a GPU after the scheduler
    released an earlier allocation of that GPU, while that earlier run had not ended yet,
    is a GPU held twice in fact (a paused node that came back, a partitioned runner)."""
    started: dict[str, datetime] = {}
    ended: dict[str, datetime] = {}
    for kind, source, _, data in stream.events:
        allocation = data.get("allocation_id")
        if not allocation or source != RUNNER:  # the scheduler's word is not the run's end
            continue
        if kind == STARTED and "started_at" in data:
            started.setdefault(allocation, datetime.fromisoformat(data["started_at"]))
        elif kind in RUN_ENDS and data.get("finished_at"):
            ended.setdefault(allocation, datetime.fromisoformat(data["finished_at"]))
    by_gpu: dict[tuple[str, int], list[tuple[datetime, datetime, str]]] = defaultdict(list)
    for allocation_id, start in started.items():
        row = db["allocations"].get(allocation_id)
        if row is None or allocation_id not in ended:
            continue
        for gpu in row["gpu_indices"]:
            by_gpu[(row["node_id"], gpu)].append((start, ended[allocation_id], allocation_id))
    for (node, gpu), runs in by_gpu.items():
        runs.sort()
        latest_end, latest = runs[0][1], runs[0][2]
        for start, end, allocation_id in runs[1:]:
            if start < latest_end:
                findings["double_allocations"].add(
                    f"GPU {node}/{gpu}: the run of {allocation_id} started at "
                    f"{start.isoformat()} while the run of {latest} went on until "
                    f"{latest_end.isoformat()}"
                )
            if end > latest_end:
                latest_end, latest = end, allocation_id


def _billing(db: dict[str, Any], findings: dict[str, Finding], facts: dict[str, Any]) -> None:
    ledger: dict[str, dict[str, Any]] = db["ledger"]
    difference = Decimal(0)
    billed_total = Decimal(0)
    expected_total = Decimal(0)
    mismatched = 0
    for allocation_id, row in db["allocations"].items():
        if row["released_at"] is None:
            continue
        expected = len(row["gpu_indices"]) * _seconds(row["granted_at"], row["released_at"])
        expected_total += expected
        billed = ledger.get(allocation_id)
        if billed is None:
            difference += expected
            mismatched += 1
            findings["billing_difference"].add(f"{allocation_id}: ended, never billed")
            continue
        billed_total += billed["gpu_seconds"]
        if billed["gpu_seconds"] != expected:
            difference += abs(billed["gpu_seconds"] - expected)
            mismatched += 1
            findings["billing_difference"].add(
                f"{allocation_id}: billed {billed['gpu_seconds']}, lease {expected}"
            )
    for allocation_id, billed in ledger.items():
        if db["allocations"].get(allocation_id, {}).get("released_at") is None:
            difference += billed["gpu_seconds"]
            mismatched += 1
            billed_total += billed["gpu_seconds"]
            findings["billing_difference"].add(f"{allocation_id}: billed, no ended allocation")
    findings["billing_difference"].count = mismatched
    facts["billing_difference_gpu_seconds"] = str(difference)
    facts["billed_gpu_seconds"] = str(billed_total)
    facts["leased_gpu_seconds"] = str(expected_total)


def _seconds(start: datetime, end: datetime) -> Decimal:
    delta = end - start
    return Decimal(delta.days * 86_400 + delta.seconds) + Decimal(delta.microseconds).scaleb(-6)


def _views(db: dict[str, Any], accepted: Accepted, findings: dict[str, Finding]) -> None:
    by_job: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for allocation_id, row in db["allocations"].items():
        by_job[row["job_id"]].append({**row, "allocation_id": allocation_id})
    costs_by_job: dict[str, set[str]] = defaultdict(set)
    for allocation_id, row in db["sub_costs"].items():
        costs_by_job[row["job_id"]].add(allocation_id)
    for job_id in accepted.jobs:
        sub = db["sub_jobs"].get(job_id)
        sched = db["sched_jobs"].get(job_id)
        if sub is None or (sched is None and not _refused(sub)):
            continue  # counted as lost
        problems = []
        if sched is not None and sub["status"] != sched["status"]:
            problems.append(f"status: submission {sub['status']}, scheduler {sched['status']}")
        allocations = {a["allocation_id"] for a in by_job.get(job_id, [])}
        if db["sub_allocations"].get(job_id, set()) != allocations:
            problems.append(
                f"allocations: submission {len(db['sub_allocations'].get(job_id, ()))}, "
                f"scheduler {len(allocations)}"
            )
        released = {a["allocation_id"] for a in by_job.get(job_id, []) if a["released_at"]}
        billed = {a for a, row in db["ledger"].items() if row["job_id"] == job_id}
        if costs_by_job.get(job_id, set()) != billed or billed != released:
            problems.append(
                f"costs: submission {len(costs_by_job.get(job_id, ()))}, billing "
                f"{len(billed)}, released allocations {len(released)}"
            )
        for allocation_id in billed & costs_by_job.get(job_id, set()):
            shown = db["sub_costs"][allocation_id]["gpu_seconds"]
            if abs(Decimal(str(shown)) - db["ledger"][allocation_id]["gpu_seconds"]) > Decimal(
                "0.000001"
            ):
                problems.append(f"cost of {allocation_id}: submission {shown}, billing other")
        versions = {str(v["id"]) for v in db["versions"].get(job_id, [])}
        if db["sub_models"].get(job_id, set()) != versions:
            problems.append(
                f"model: submission {sorted(db['sub_models'].get(job_id, ()))}, registry "
                f"{sorted(versions)}"
            )
        if versions and sub["status"] != "SUCCEEDED":
            problems.append(f"model registered for a {sub['status']} job")
        if problems:
            findings["views_disagreeing"].add(f"{job_id}: {'; '.join(problems)}")


def _models(
    db: dict[str, Any],
    accepted: Accepted,
    objects_dir: Path,
    load: bool,
    findings: dict[str, Finding],
) -> None:
    for job_id in accepted.jobs:
        sub = db["sub_jobs"].get(job_id)
        if sub is None or sub["status"] != "SUCCEEDED":
            continue
        saved = bool(db["reg_checkpoints"].get(job_id)) or job_id in accepted.saves_checkpoint
        versions = db["versions"].get(job_id, [])
        if saved and sub["register_model"] and not versions:
            findings["checkpoints"].add(f"{job_id}: succeeded with a checkpoint, no model")
            continue
        for version in versions:
            problem = _artifact_problem(version, objects_dir, load)
            if problem:
                findings["checkpoints"].add(f"{job_id}: {problem}")


def _artifact_problem(version: Mapping[str, Any], objects_dir: Path, load: bool) -> str | None:
    artifact = _path(version["artifact_uri"], objects_dir)
    manifest_path = _path(version["artifact_manifest_uri"], objects_dir)
    if artifact is None or not artifact.is_file():
        return f"artifact {version['artifact_uri']} is missing"
    if manifest_path is None or not manifest_path.is_file():
        return f"manifest {version['artifact_manifest_uri']} is missing"
    data = artifact.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    manifest = json.loads(manifest_path.read_text())
    if digest != version["artifact_sha256"] or digest != manifest.get("sha256"):
        return f"artifact sha256 {digest} is not the registered or manifest one"
    if len(data) != version["artifact_size_bytes"] or len(data) != manifest.get("size_bytes"):
        return "artifact size differs from its manifest"
    if load:
        import io

        import torch

        try:
            torch.load(io.BytesIO(data), weights_only=True)
        except Exception as exc:
            return f"artifact does not load: {exc}"
    return None


def _path(uri: str, objects_dir: Path) -> Path | None:
    parsed = urlparse(uri)
    if parsed.scheme != "file":
        return None
    path = Path(unquote(parsed.path))
    return path if path.is_relative_to(objects_dir.resolve()) else None


def _stream(
    stream: _Streams, accepted: Accepted, findings: dict[str, Finding], facts: dict[str, Any]
) -> None:
    submitted: set[str] = set()
    final: set[str] = set()
    for kind, _, subject, data in stream.events:
        if kind == SUBMITTED:
            submitted.add(data.get("job_id", subject))
        elif kind in FINAL_TYPES:
            final.add(data.get("job_id", subject))
    for job_id in accepted.jobs:
        if job_id not in submitted:
            findings["stream_missing"].add(f"{job_id}: no job.submitted in the stream")
    facts["stream_events"] = len(stream.events)
    facts["stream_final_events"] = len(final & set(accepted.jobs))


def _dead_letters(
    stream: _Streams,
    poison: set[str],
    kept: set[str],
    findings: dict[str, Finding],
    facts: dict[str, Any],
) -> None:
    seen: set[str] = set()
    reasons: Counter[str] = Counter()
    for headers, _ in stream.dead_letters:
        original = headers.get(ORIGINAL_MSG_ID_HEADER, "")
        reason = headers.get(REASON_HEADER, "")
        reasons[reason.split(" ", 1)[0].rstrip(":")] += 1
        if original not in poison or not reason:
            findings["dead_letters_unexpected"].add(f"{original or '?'}: {reason or 'no reason'}")
        else:
            seen.add(original)
    for missing in sorted(kept - seen):
        findings["poison_not_dead_lettered"].add(missing)
    facts["dead_letters"] = len(stream.dead_letters)
    facts["dead_letter_kinds"] = dict(reasons)

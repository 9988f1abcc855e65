"""An answer with a value of another type than its route answers, at any depth (a number
that is a string, an object where a list belongs, null where a string belongs), ends every
command that shows an answer with one line naming where in the answer the value is, and exit
1 (the API answered: docs/cli.md, "Exit codes"), never a traceback or "unexpected
TypeError".

Each command runs against an HTTP server on loopback that answers what the services answer
(their schemas' fields), once as it is (the command succeeds), then once for each value of
each answer the command read, that value replaced by one of another type.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from trainyard import cli, cli_sweep

T0 = "2026-12-01T10:00:00+00:00"
T1 = "2026-12-01T11:00:00+00:00"
SPEC = {
    "name": "a",
    "gpus": 2,
    "gpu_flavor": "h100",
    "entrypoint": "train.py",
    "command": None,
    "args": ["--lr", "0.1"],
    "project": "p",
    "priority": "normal",
    "experiment": "e",
    "labels": {"k": "v"},
    "code": {"kind": "bundle", "sha256": "ab" * 32, "size_bytes": 2048},
}
JOB = {
    "id": "j-1",
    "name": "a",
    "team": "ml",
    "user": "ann",
    "spec": SPEC,
    "status": "SUCCEEDED",
    "terminal": True,
    "history": [{"status": "QUEUED", "at": T0, "reason": None}, {"status": "SUCCEEDED", "at": T1}],
    "pending": {
        "reason": "no GPU free",
        "position": 2,
        "estimated_start": T1,
        "blocking": "j-0",
        "suggestion": "ask for 1 GPU",
    },
    "node": "node-1",
    "gpu_indices": [0, 1],
    "attempt": 0,
    "submitted_at": T0,
    "started_at": T0,
    "finished_at": T1,
    "updated_at": T1,
    "cancel_requested": False,
    "failure": {"reason": "exit 1", "exit_code": 1, "log_tail": "boom\n", "failure_kind": None},
    "failed_attempts": 1,
    "step": 10,
    "metrics": {"loss": 0.5, "acc": None},
    "checkpoints": [{"step": 10, "uri": "s3://b/c", "size_bytes": 100, "saved_at": T1}],
    "model": {"name": "m", "version": 1, "artifact_uri": "s3://b/m", "metrics": {}, "lineage": {}},
    "cost": {
        "gpu_seconds": 7200.0,
        "cost": 4.5,
        "currency": "EUR",
        "price_per_gpu_hour": 2.25,
        "final": True,
    },
    "trace_id": None,
}
ROW = {
    **{k: JOB[k] for k in ("id", "name", "team", "user", "status", "terminal", "node", "step")},
    **{k: JOB[k] for k in ("submitted_at", "started_at", "finished_at", "attempt")},
    "gpu_flavor": "h100",
    "gpus": 2,
    "cost": 4.5,
    "currency": "EUR",
    "project": "p",
    "experiment": "e",
    "reason": "exit 1",
}
ARTIFACT = {"uri": "s3://b/m", "manifest_uri": None, "step": 10, "size_bytes": 5, "sha256": "cd"}
VERSION_ROW = {
    "id": "v-1",
    "team": "ml",
    "model": "m",
    "version": 1,
    "job_id": "j-1",
    "artifact": ARTIFACT,
    "metrics": {"loss": 0.5},
    "registered_at": T0,
    "owned": True,
}
VERSION = {
    **VERSION_ROW,
    "allocation_id": None,
    "lineage": None,
    "origin": "job",
    "source_uri": None,
    "tags": ["best"],
    "description": "first",
    "created_by": "ann",
    "aliases": ["prod"],
    "cost": {
        "by_currency": [
            {"currency": "EUR", "total": "4.50", "own_job": "4.50", "upstream": "0.00"}
        ],
        "complete": True,
        "jobs": [
            {
                "relation": "own",
                "job_id": "j-1",
                "name": "a",
                "status": "SUCCEEDED",
                "costs": {"EUR": "4.50"},
                "allocations": 1,
            }
        ],
        "hidden_jobs": 0,
    },
}
MODEL = {
    "team": "ml",
    "name": "m",
    "project": "p",
    "latest_version": 1,
    "versions": 1,
    "aliases": {"prod": 1},
    "created_at": T0,
}
DATASET_VERSION = {
    "team": "ml",
    "name": "d",
    "version": 1,
    "reference": "ml/d:1",
    "uri": "s3://b/d",
    "size_bytes": 10,
    "sha256": "ef" * 32,
    "data_schema": {"x": "float"},
    "feature_version": "f1",
    "producing_job_id": "j-1",
    "created_at": T0,
    "created_by": "ann",
}
EXPERIMENT = {
    "id": 1,
    "team": "ml",
    "project": "p",
    "name": "e",
    "created_at": T0,
    "runs": 1,
    "running": 0,
    "last_started_at": T0,
}
RUN = {
    "job_id": "j-1",
    "name": "a",
    "user": "ann",
    "status": "failed",
    "started_at": T0,
    "ended_at": T1,
    "duration_seconds": 3600.0,
    "hyperparameters": {"lr": 0.1},
    "labels": {"k": "v"},
    "tags": ["x"],
    "note": "",
    "metrics": {"loss": {"final": 0.5, "best": 0.4, "goal": "min"}},
}
CURVE = {
    "job_id": "j-1",
    "key": "loss",
    "total": 2,
    "downsampled": False,
    "points": [{"step": 1, "time": T0, "value": 1.0}, {"step": 2, "time": T1, "value": 0.5}],
}
LINES = {
    "gpu_cost": "4.50",
    "cpu_seconds": "0",
    "cpu_cost": "0",
    "unpriced_cpu_seconds": "0",
    "memory_gib_seconds": "0",
    "memory_cost": "0",
    "unpriced_memory_gib_seconds": "0",
}
TOTAL = {**LINES, "currency": "EUR", "gpu_seconds": "7200", "cost": "4.50"}
DIMS = {"team": "ml", "project": None, "user": "ann", "queue": None, "flavor": None, "job": None}
FIGURE = {
    "figure": "queueing",
    "currency": "EUR",
    "gpu_seconds": "3600",
    "cost": "2.25",
    "unpriced_gpu_seconds": "0",
    "seconds": "600",
    "count": 1,
}
LETTER = {
    "sequence": 7,
    "consumer": "registry",
    "dead_lettered_at": T0,
    "event_id": "e-1",
    "event_type": "job.finished",
    "event_subject": "jobs.finished",
    "original_subject": "jobs.finished",
    "original_sequence": 3,
    "deliveries": 5,
    "reason": "bad event",
    "body": "{}",
    "body_encoding": "utf-8",
}
NODE_JOB = {"id": "job:j-1", "kind": "job", "job_id": "j-1", "name": "a", "status": "SUCCEEDED"}
GRANT = {"team": "ml", "name": "m", "grantee_team": "cv", "granted": True, "changed": True}
TOKEN = {
    "id": 4,
    "name": "cli",
    "user": "ann",
    "team": "ml",
    "created_at": T0,
    "expires_at": None,
    "token": "ty_new",
}
CORDON = {"reason": "replacing a fan", "by": "ops", "since": T0, "until": None}
NODES = [
    {
        "node_id": "gpu-07",
        "hostname": "gpu-07.local",
        "gpu_flavor": "h100",
        "topology": "nvlink",
        "status": "READY",
        "gpu_count": 2,
        "free_gpus": [],
        "used_gpus": {"0": "j-1"},
        "last_heartbeat": T1,
        "cordon": CORDON,
    }
]
ADMIN = {
    "flavors": {
        "name": "h200",
        "description": "H200",
        "nodes": 1,
        "ready_nodes": 1,
        "gpus": 8,
        "ready_gpus": 8,
    },
    "cohorts": {
        "name": "research",
        "description": "",
        "queues": ["ml-prod"],
        "created_at": T0,
        "updated_at": T1,
    },
    "queues": {
        "name": "ml-prod",
        "team": "ml",
        "cohort": "research",
        "weight": 1.5,
        "implicit": False,
        "quotas": {"h200": {"nominal": 8, "borrowing_limit": 4, "lending_limit": 2}},
    },
    "priority-classes": {
        "name": "urgent",
        "value": 100,
        "preemptible": False,
        "min_runtime_seconds": 60.0,
        "description": "pages",
    },
}
PRICE = {
    "flavor": "h200",
    "effective_from": T0,
    "price_per_gpu_hour": "2.75",
    "price_per_cpu_hour": "0.05",
    "price_per_memory_gib_hour": "0.01",
    "currency": "EUR",
    "set_by": "ops",
    "in_force": True,
}
BUDGET = {
    "team": "ml",
    "project": None,
    "amount": "1000.000000",
    "currency": "EUR",
    "thresholds": [50, 100],
    "policy": "refuse",
    "on_exhausted": "stop",
    "month": "2026-12",
    "spent": "812.5",
    "remaining": "187.5",
    "percent_spent": "81.25",
    "exhausted": False,
    "runs_out_at": T1,
    "forecast": "at this rate the budget runs out on 2026-12-19",
    "updated_by": "ann",
    "updated_at": T0,
}
ANSWERS: list[tuple[str, str, Any]] = [
    # (method, path pattern: [^/]+ for one segment, the answer)
    ("GET", "/v1/jobs", [ROW]),
    ("POST", "/v1/jobs", JOB),
    ("POST", "/v1/jobs/[^/]+/reproduce", JOB),
    (
        "POST",
        "/v1/costs/estimate",
        {
            "estimated_cost": "2.25",
            "worst_case_cost": "9.00",
            "currency": "EUR",
            "gpus": 1,
            "gpu_flavor": "cpu",
            "max_runtime_seconds": 3600,
        },
    ),
    ("POST", "/v1/models/[^/]+/[^/]+/versions", VERSION),
    (
        "DELETE",
        "/v1/models/[^/]+/[^/]+/versions/[0-9]+",
        {
            "team": "ml",
            "model": "m",
            "version": 1,
            "objects": 2,
            "bytes": 10,
        },
    ),
    (
        "DELETE",
        "/v1/models/[^/]+/[^/]+/aliases/[^/]+",
        {
            "team": "ml",
            "model": "m",
            "alias": "prod",
            "version": None,
            "previous": 1,
        },
    ),
    ("PUT", "/v1/models/[^/]+/[^/]+/grants/[^/]+", GRANT),
    ("POST", "/v1/datasets/[^/]+/[^/]+/versions", DATASET_VERSION),
    ("PUT", "/v1/datasets/[^/]+/[^/]+/grants/[^/]+", GRANT),
    ("POST", "/v1/tokens", TOKEN),
    ("POST", "/v1/tokens/rotate", TOKEN),
    ("POST", "/v1/admin/users", {"user": "bob", "team": "ml", "role": "member", "token": "ty_b"}),
    (
        "PATCH",
        "/v1/admin/users/[^/]+",
        {
            "name": "bob",
            "team": "ml",
            "role": "admin",
            "created_at": T0,
            "disabled_at": None,
        },
    ),
    (
        "POST",
        "/v1/deadletters/[^/]+/redrive",
        {
            "sequence": 7,
            "subject": "jobs.finished",
            "event_id": "e-1",
        },
    ),
    ("DELETE", "/v1/deadletters/[^/]+", {"sequence": 7}),
    ("GET", "/v1/jobs/[^/]+", JOB),
    ("POST", "/v1/jobs/[^/]+/cancel", JOB),
    ("GET", "/v1/jobs/[^/]+/logs", None),  # see ``_logs``
    ("GET", "/v1/queue", {"nodes": NODES, "allocations": [], "queues": [], "cohorts": []}),
    ("POST", "/v1/admin/nodes/[^/]+/cordon", {"node_id": "gpu-07", "cordon": CORDON}),
    ("POST", "/v1/admin/nodes/[^/]+/uncordon", {"node_id": "gpu-07", "cordon": None}),
    ("DELETE", "/v1/admin/nodes/[^/]+", {}),  # 204 in the scheduler
    *[("GET", f"/v1/admin/{kind}", [view]) for kind, view in ADMIN.items()],
    *[
        (verb, f"/v1/admin/{kind}/[^/]+", view)
        for kind, view in ADMIN.items()
        for verb in ("GET", "PUT")
    ],
    *[("DELETE", f"/v1/admin/{kind}/[^/]+", {}) for kind in ADMIN],  # 204 in the services
    ("GET", "/v1/prices", [PRICE]),
    ("PUT", "/v1/prices/[^/]+", PRICE),
    ("GET", "/v1/budgets", [BUDGET]),
    *[(verb, "/v1/budgets/[^/]+(/[^/]+)?", BUDGET) for verb in ("GET", "PUT")],
    ("DELETE", "/v1/budgets/[^/]+(/[^/]+)?", {}),  # 204 in billing
    (
        "GET",
        "/v1/me",
        {
            "user": "ann",
            "team": "ml",
            "role": "member",
            "token_id": 3,
            "token_name": "cli",
            "expires_at": None,
        },
    ),
    (
        "GET",
        "/v1/tokens",
        [
            {
                "id": 3,
                "name": "cli",
                "user": "ann",
                "team": "ml",
                "created_at": T0,
                "expires_at": T1,
                "revoked_at": None,
            }
        ],
    ),
    (
        "GET",
        "/v1/admin/users",
        [{"name": "ann", "team": "ml", "role": "member", "created_at": T0, "disabled_at": None}],
    ),
    (
        "GET",
        "/v1/audit",
        [{"id": 1, "at": T0, "actor": "ann", "action": "token.create", "target": "token 3"}],
    ),
    (
        "GET",
        "/v1/deadletters",
        {
            "consumer": "registry",
            "total": 1,
            "dead_letters": [LETTER],
            "next_after": None,
        },
    ),
    ("GET", "/v1/deadletters/[^/]+", LETTER),
    ("GET", "/v1/models", {"models": [MODEL], "next": None}),
    ("GET", "/v1/models/[^/]+/[^/]+", {**MODEL, "grants": ["cv"]}),
    (
        "GET",
        "/v1/models/[^/]+/[^/]+/versions",
        {
            "team": "ml",
            "model": "m",
            "versions": [VERSION_ROW],
            "next": None,
        },
    ),
    ("GET", "/v1/models/[^/]+/[^/]+/versions/[0-9]+", VERSION),
    ("GET", "/v1/models/[^/]+/[^/]+/versions/by-alias/[^/]+", VERSION),
    (
        "GET",
        "/v1/models/[^/]+/[^/]+/aliases/[^/]+/moves",
        {
            "team": "ml",
            "model": "m",
            "alias": "prod",
            "next": None,
            "moves": [
                {"alias": "prod", "from_version": None, "to_version": 1, "actor": "ann", "at": T0}
            ],
        },
    ),
    (
        "PUT",
        "/v1/models/[^/]+/[^/]+/aliases/[^/]+",
        {
            "team": "ml",
            "model": "m",
            "alias": "prod",
            "version": 1,
            "previous": None,
        },
    ),
    (
        "GET",
        "/v1/datasets",
        {
            "datasets": [{"team": "ml", "name": "d", "latest_version": 1, "created_at": T0}],
            "next": None,
        },
    ),
    (
        "GET",
        "/v1/datasets/[^/]+/[^/]+",
        {
            "team": "ml",
            "name": "d",
            "latest_version": 1,
            "created_at": T0,
            "versions": [DATASET_VERSION],
            "grants": ["cv"],
            "next": None,
        },
    ),
    ("GET", "/v1/datasets/[^/]+/[^/]+/versions/[0-9]+", DATASET_VERSION),
    (
        "GET",
        "/v1/lineage/models/[^/]+/[^/]+/versions/[0-9]+/upstream",
        {
            "root": "model_version:ml/m:1",
            "direction": "upstream",
            "nodes": [
                {
                    "id": "model_version:ml/m:1",
                    "kind": "model_version",
                    "team": "ml",
                    "name": "m",
                    "version": 1,
                    "deleted": False,
                },
                NODE_JOB,
            ],
            "edges": [{"from": "job:j-1", "to": "model_version:ml/m:1", "relation": "produced"}],
            "hidden": 0,
            "truncated": False,
        },
    ),
    (
        "GET",
        "/v1/jobs/[^/]+/metrics",
        {
            "job_id": "j-1",
            "metrics": [
                {
                    "key": "loss",
                    "goal": "min",
                    "count": 2,
                    "first_step": 1,
                    "last_step": 2,
                    "last_time": T1,
                    "last": 0.5,
                    "min": 0.5,
                    "max": 1.0,
                    "best": 0.5,
                    "best_step": 2,
                }
            ],
        },
    ),
    ("GET", "/v1/jobs/[^/]+/metrics/.+", CURVE),
    ("GET", "/v1/experiments", {"experiments": [EXPERIMENT], "next": None}),
    ("GET", "/v1/experiments/[0-9]+", {"experiment": EXPERIMENT, "runs": [RUN], "next": None}),
    (
        "GET",
        "/v1/experiments/[0-9]+/compare",
        {
            "experiment": EXPERIMENT,
            "runs": [RUN],
            "differing_parameters": {"lr": {"j-1": 0.1}},
            "final": {"loss": {"j-1": 0.5}},
            "curves": {"loss": {"j-1": CURVE}},
        },
    ),
    (
        "GET",
        "/v1/jobs/[^/]+/reproduction",
        {
            "job_id": "j-2",
            "original_job_id": "j-1",
            "verdict": "reproduced",
            "differences": [{"field": "seed", "original": 1, "reproduction": 2}],
            "relative_tolerance": 0.01,
            "metrics": {
                "loss": {
                    "original": 0.5,
                    "reproduction": 0.5,
                    "relative_difference": 0.0,
                    "compared": True,
                }
            },
            "weights": {
                "compared": True,
                "equal": True,
                "original_sha256": "aa",
                "reproduction_sha256": "aa",
            },
        },
    ),
    ("PUT", "/v1/jobs/[^/]+/tags/[^/]+", {"job_id": "j-1", "tags": ["x"], "note": ""}),
    ("PUT", "/v1/jobs/[^/]+/note", {"job_id": "j-1", "tags": [], "note": "n"}),
    (
        "GET",
        "/v1/jobs/[^/]+/cost",
        {
            "job_id": "j-1",
            "team": "ml",
            "project": "p",
            "user": "ann",
            "totals": [TOTAL],
            "allocations": [
                {
                    **TOTAL,
                    "allocation_id": "al-1",
                    "attempt": 0,
                    "epoch": 1,
                    "node_id": "node-1",
                    "gpu_flavor": "h100",
                    "gpus": 2,
                    "cpus": 4,
                    "memory_gib": 8,
                    "started_at": T0,
                    "ended_at": T1,
                    "outcome": "FAILED",
                    "price_per_gpu_hour": "2.25",
                    "entries": 1,
                    "prices": [],
                }
            ],
        },
    ),
    (
        "GET",
        "/v1/costs",
        {
            "start": T0,
            "end": T1,
            "granularity": "day",
            "group_by": ["user"],
            "filters": {},
            "rows": [{**TOTAL, **DIMS, "bucket": T0}],
            "totals": [TOTAL],
            "truncated": False,
        },
    ),
    (
        "GET",
        "/v1/waste",
        {
            "start": T0,
            "end": T1,
            "group_by": ["team"],
            "filters": {},
            "idle_threshold_percent": "5",
            "rows": [{**FIGURE, **DIMS}],
            "totals": [FIGURE],
            "unallocated": [{**FIGURE, **DIMS}],
            "unattributed": [
                {
                    "currency": "EUR",
                    "gpu_seconds": "0",
                    "cost": "0",
                    "ledger_gpu_seconds": "7200",
                    "ledger_cost": "4.50",
                }
            ],
            "success": [
                {
                    "day": T0,
                    "team": "ml",
                    "queue": None,
                    "ended": 2,
                    "succeeded": 1,
                    "failed": 1,
                    "cancelled": 0,
                    "success_rate": "0.5",
                }
            ],
            "truncated": False,
        },
    ),
]
COMMANDS = [
    ["submit", "job.yaml", "--no-code"],
    ["submit", "job.yaml", "--no-code", "--dry-run"],
    ["sweep", "job.yaml", "--no-code", "--grid", "lr=1", "--metric", "loss"],
    ["sweep", "job.yaml", "--no-code", "--grid", "lr=1", "--metric", "loss", "--median-stop", "1"],
    ["rerun", "j-1"],
    ["rerun", "--reproduce", "j-1"],
    ["login", "{url}", "--token", "ty_a"],
    ["wait", "j-1"],
    ["attach", "j-1"],
    ["ls"],
    ["get", "j-1"],
    ["describe", "j-1"],
    ["cancel", "j-1"],
    ["logs", "j-1"],
    ["queue"],
    ["metrics", "j-1"],
    ["metrics", "j-1", "loss"],
    ["experiments"],
    ["experiments", "e"],
    ["compare", "1"],
    ["tag", "j-1", "x"],
    ["note", "j-1", "n"],
    ["reproduction", "j-1"],
    ["models", "m"],
    ["model", "ls"],
    ["model", "show", "ml/m"],
    ["model", "show", "ml/m:1"],
    ["model", "show", "ml/m@prod"],
    ["model", "alias", "set", "ml/m", "prod", "1"],
    ["model", "alias", "history", "ml/m", "prod"],
    ["dataset", "ls"],
    ["dataset", "show", "ml/d"],
    ["dataset", "show", "ml/d:1"],
    ["lineage", "up", "ml/m:1"],
    ["cost"],
    ["cost", "j-1"],
    ["waste"],
    ["whoami"],
    ["tokens"],
    ["user", "list"],
    ["audit"],
    ["deadletters", "list"],
    ["deadletters", "show", "7"],
    ["deadletters", "redrive", "7"],
    ["deadletters", "discard", "7"],
    ["model", "register", "ml/m", "--job", "j-1"],
    ["model", "rm", "ml/m", "1"],
    ["model", "alias", "rm", "ml/m", "prod"],
    ["model", "grant", "ml/m", "cv"],
    ["dataset", "register", "ml/d", "--uri", "s3://b/d", "--sha256", "ef" * 32, "--size", "10"],
    ["dataset", "grant", "ml/d", "cv"],
    ["token", "create"],
    ["token", "rotate"],
    ["user", "add", "bob"],
    ["user", "role", "bob", "admin"],
    ["nodes", "ls"],
    ["nodes", "cordon", "gpu-07", "--reason", "replacing a fan"],
    ["nodes", "uncordon", "gpu-07"],
    ["nodes", "retire", "gpu-07"],
    *[
        ["admin", kind, action, *name]
        for kind in ADMIN
        for action, name in (("ls", []), ("show", ["x"]))
    ],
    ["admin", "flavors", "set", "h200", "--description", "H200"],
    ["admin", "cohorts", "set", "research"],
    [
        "admin",
        "queues",
        "set",
        "ml-prod",
        "--team",
        "ml",
        "--quota",
        "h200=8",
        "--borrow",
        "h200=4",
    ],
    ["admin", "priority-classes", "set", "urgent", "--value", "100", "--no-preemptible"],
    *[["admin", kind, "rm", "x"] for kind in ADMIN],
    ["admin", "prices", "ls"],
    ["admin", "prices", "set", "h200", "--gpu-hour", "2.75"],
    ["budget", "ls"],
    ["budget", "show", "ml", "--project", "vision"],
    ["budget", "set", "ml", "--amount", "5"],
    ["budget", "rm", "ml"],
]

READS_NOTHING = [
    ["deadletters", "discard", "7"],
    ["nodes", "retire", "gpu-07"],
    *[["admin", kind, "rm", "x"] for kind in ADMIN],
    ["budget", "rm", "ml"],
]
"""Commands that show no value of their answer (``discarded 7``)."""


def _logs(after: str) -> dict[str, Any]:
    """One chunk from the start, then nothing more: the job has ended."""
    chunks = [] if after else [{"stream": "stdout", "seq": 1, "text": "hello\n"}]
    return {"chunks": chunks, "cursor": "c1", "streams_complete": True, "job_terminal": True}


def route_of(method: str, path: str) -> int | None:
    """The index of the first of ``ANSWERS`` that answers ``method path``."""
    return next(
        (
            i
            for i, (m, pattern, _) in enumerate(ANSWERS)
            if m == method and re.fullmatch(pattern, path)
        ),
        None,
    )


class Api:
    """Every service's API in one loopback HTTP server: each request answered by the first
    of ``ANSWERS`` whose method and path match, with ``changed`` (a route and a path into
    its answer) replaced by ``value``. ``asked`` holds the routes asked for."""

    def __init__(self) -> None:
        self.changed: tuple[int, tuple[str | int, ...], Any] | None = None
        self.asked: list[int] = []
        self.raw: bytes | None = None
        """When set, the body of every answer, as it is."""
        api = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                url = urlsplit(self.path)
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                index = route_of(self.command, url.path)
                if index is None:
                    self._send(404, {"detail": "no such route here", "errors": []})
                    return
                answer = ANSWERS[index][2]
                if answer is None:
                    answer = _logs(parse_qs(url.query).get("after", [""])[0])
                api.asked.append(index)
                if api.raw is not None:
                    self._send(200, api.raw)
                    return
                if api.changed is not None and api.changed[0] == index:
                    answer = replaced(answer, api.changed[1], api.changed[2])
                self._send(200, answer)

            def _send(self, status: int, body: Any) -> None:
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _answer

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"


@pytest.fixture(scope="module")
def api() -> Iterator[Api]:
    served = Api()
    thread = threading.Thread(target=served.server.serve_forever, daemon=True)
    thread.start()
    yield served
    served.server.shutdown()
    served.server.server_close()


def replaced(value: Any, path: tuple[str | int, ...], new: Any) -> Any:
    """A copy of ``value`` with the value at ``path`` replaced by ``new``."""
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(value, list):
        return [replaced(v, rest, new) if i == head else v for i, v in enumerate(value)]
    return {k: replaced(v, rest, new) if k == head else v for k, v in value.items()}


def leaves(value: Any, path: tuple[str | int, ...] = ()) -> Iterator[tuple[str | int, ...]]:
    """The path of every value inside ``value`` (objects and lists included), depth first."""
    if isinstance(value, dict | list):
        items = enumerate(value) if isinstance(value, list) else value.items()
        for key, inner in items:
            yield (*path, key)
            yield from leaves(inner, (*path, key))


def wrong(value: Any) -> Any:
    """A value of another type than ``value``'s."""
    if isinstance(value, bool):
        return "yes"
    if isinstance(value, int | float):
        return "abc"
    if isinstance(value, str):
        return 5
    if value is None:
        return {"a": 1}
    return "x" if isinstance(value, list) else ["x"]


def written(path: tuple[str | int, ...]) -> str:
    """``path`` as the CLI names it: ``rows[3].cost``, ``final.loss["j-1"]``."""
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        elif not part.isidentifier():
            text += f"[{json.dumps(part)}]"
        else:
            text += f".{part}" if text else part
    return text


def run(api: Api, argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    api.asked.clear()
    code = cli.main([api.url if a == "{url}" else a for a in argv])
    captured = capsys.readouterr()
    # ``logs`` names the stream it prints from on stderr (``==> stdout <==``): not an error.
    err = "".join(line for line in captured.err.splitlines(True) if not line.startswith("==> "))
    return code, captured.out, err


def errors_in(err: str) -> list[str]:
    """The error lines of stderr (beside notes: ``submit``'s estimate, ``logs``'s streams)."""
    return [line for line in err.splitlines() if line.startswith("trainyard: error:")]


@pytest.fixture
def environment(api: Api, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "job.yaml").write_text("name: a\ngpus: 1\ngpu_flavor: cpu\nentrypoint: t.py\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TRAINYARD_CONFIG", str(tmp_path / "config.json"))
    for name in ("URL", "REGISTRY_URL", "BILLING_URL", "SCHEDULER_URL"):
        monkeypatch.setenv(f"TRAINYARD_{name}", api.url)
    monkeypatch.setenv("TRAINYARD_TOKEN", "ty_a")
    monkeypatch.setattr(cli_sweep, "POLL_SECONDS", 0.0)  # a sweep's looks: no waiting here


@pytest.mark.usefixtures("environment")
@pytest.mark.parametrize("argv", COMMANDS, ids=[" ".join(a) for a in COMMANDS])
def test_a_value_of_another_type_at_any_depth_is_one_line_naming_where(
    argv: list[str], api: Api, capsys: pytest.CaptureFixture[str]
) -> None:
    api.changed = None
    code, out, err = run(api, argv, capsys)
    assert (code, errors_in(err)) == (0, []), err  # the answers as the services give them
    asked = sorted(set(api.asked))
    assert asked, "the command asked for nothing"
    refused = 0
    for index in asked:
        method, _, answer = ANSWERS[index]
        answer = answer if answer is not None else _logs("")
        for path in leaves(answer):
            old = answer
            for part in path:
                old = old[part]
            api.changed = (index, path, wrong(old))
            code, out, err = run(api, argv, capsys)
            case = f"{' '.join(argv)} with {written(path)} = {wrong(old)!r}: exit {code}, {err!r}"
            assert "Traceback" not in out + err and "unexpected" not in err.replace(
                "unexpected answer to", ""
            ), case
            if code == 0:  # a value the command does not read (or a note's, as an estimate's)
                assert errors_in(err) == [], case
                continue
            refused += 1
            errors = errors_in(err)
            assert code == 1 and len(errors) == 1, case
            said = rf"trainyard: error: (.+: )?unexpected answer to {method} /v1/\S+: "
            assert re.match(said + re.escape(written(path)) + ": expected ", errors[0]), case
    assert refused or argv in READS_NOTHING, "no value of another type was refused"


@pytest.mark.usefixtures("environment")
def test_a_key_that_is_no_plain_name_is_quoted_in_the_one_line(
    api: Api, capsys: pytest.CaptureFixture[str]
) -> None:
    """A key the server chose (a metric's) that holds a line break or a slash is named as a
    JSON string, so the error stays one line and says where the key ends."""
    job = route_of("GET", "/v1/jobs/j-1")
    assert job is not None
    api.changed = (job, ("metrics",), {"val/loss\nnext": [1]})
    code, _, err = run(api, ["describe", "j-1"], capsys)
    api.changed = None
    assert code == 1 and len(err.splitlines()) == 1, err
    assert err.rstrip().endswith(
        'metrics["val/loss\\nnext"]: expected a number, a string, a boolean or null, got a list'
    ), err


DEEP = b"[" * 100_000 + b"]" * 100_000
"""JSON nested deeper than Python's parser can follow (it raised RecursionError)."""


@pytest.mark.usefixtures("environment")
@pytest.mark.parametrize("argv", COMMANDS, ids=[" ".join(a) for a in COMMANDS])
def test_an_answer_nested_too_deeply_is_one_line(
    argv: list[str], api: Api, capsys: pytest.CaptureFixture[str]
) -> None:
    """An answer nested deeper than the JSON parser follows ended every command with
    "unexpected RecursionError: maximum recursion depth exceeded"; it is a malformed answer
    like any other now."""
    api.raw = DEEP
    try:
        code, out, err = run(api, argv, capsys)
    finally:
        api.raw = None
    lines = errors_in(err)
    assert code == 1 and len(lines) == 1, err
    assert re.match(r"trainyard: error: (.+: )?unexpected answer to \w+ /v1/\S+: ", lines[0]), err
    assert "nested too deeply" in lines[0] and "Traceback" not in out + err, err

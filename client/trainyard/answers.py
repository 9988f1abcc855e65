"""The shapes of the answers the CLI shows, checked once, as each answer arrives.

Contract: ``answer_problem(method, path, body)`` says where in ``body`` (a successful answer to
``method path``, parsed JSON) a value has another type than the route answers, as
``rows[3].cost: expected a number, got "abc"``, or None. The client raises it as a
``MalformedAnswer`` before any caller reads the answer, so no renderer meets a value of a
type it does not expect at any depth (a server of another version, a proxy rewriting it, a
bug), and every command says the same one line where it would have crashed.

What a shape checks, and what not:
- The type of every value the shape names, at any depth, where the answer has it. A key
  the answer lacks is not checked here: reading it raises ``MalformedAnswer`` already
  (``client.Answer``), and a caller that uses ``get`` does without it.
- Keys the shape does not name are let through, whatever they hold, so a newer server may
  add fields. An answer of a route no shape names is let through too.
- A top-level answer of the wrong kind (a list where an object belongs) is the client's
  own check (``client._object``), with its own words.

The shapes follow the services' answer schemas (their pydantic models), for the fields the
CLI reads; amounts billing and the registry send as decimal strings are ``DECIMAL``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any


@dataclass(frozen=True)
class Kind:
    """A type of JSON value: what it is called in words, and which values are of it."""

    name: str
    accepts: Callable[[Any], bool]


@dataclass(frozen=True)
class Opt:
    """``shape``, or null."""

    shape: Shape


@dataclass(frozen=True)
class Each:
    """An object whose keys are any strings, every value of ``shape``."""

    shape: Shape


Shape = Kind | Opt | Each | dict[str, "Shape"] | list["Shape"]
"""A kind, an optional shape, an object of named keys (``dict``), an object of any keys
(``Each``), or a list whose every item has the one shape it holds (``[shape]``)."""


def _is_decimal(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int | float):
        return True
    if not isinstance(value, str):
        return False
    try:
        Decimal(value)
    except InvalidOperation:
        return False
    return True


STR = Kind("a string", lambda v: isinstance(v, str))
INT = Kind("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool))
NUMBER = Kind("a number", lambda v: isinstance(v, int | float) and not isinstance(v, bool))
BOOL = Kind("a boolean", lambda v: isinstance(v, bool))
DECIMAL = Kind("a number", _is_decimal)
"""A number, or a decimal string (``"12.5000"``): how billing and the registry send money."""
SCALAR = Kind("a number, a string, a boolean or null", lambda v: not isinstance(v, dict | list))
"""A metric's value or a parameter's: shown as it is."""
OBJECT = Kind("an object", lambda v: isinstance(v, dict))
"""An object of any content (a dataset's schema: shown as JSON)."""
TIME = STR
"""An ISO 8601 time: the CLI shows any string it cannot parse as it is."""


def problem(shape: Shape, body: Any, at: str = "") -> str | None:
    """Where ``body`` has a value of another type than ``shape`` says, and what it is (the
    first such value, depth first), or None."""
    if isinstance(shape, Opt):
        return None if body is None else problem(shape.shape, body, at)
    if isinstance(shape, Kind):
        return None if shape.accepts(body) else _wrong(at, shape.name, body)
    if isinstance(shape, list):
        if not isinstance(body, list):
            return _wrong(at, "a list", body)
        for index, item in enumerate(body):
            found = problem(shape[0], item, f"{at}[{index}]")
            if found:
                return found
        return None
    if not isinstance(body, dict):
        return _wrong(at, "an object", body)
    named = shape.items() if isinstance(shape, dict) else ((k, shape.shape) for k in body)
    for key, inner in named:
        if key in body:
            found = problem(inner, body[key], _key_path(at, key))
            if found:
                return found
    return None


def _key_path(at: str, key: str) -> str:
    """The path of ``key`` in the object at ``at``: ``rows[3].cost``; a key that is no plain
    name (a metric's ``val/loss``, or one holding a line break) as ``metrics["val/loss"]``,
    so the path stays one line and says where the key ends."""
    if key.isidentifier() and key.isascii():
        return f"{at}.{key}" if at else key
    return f"{at}[{json.dumps(key)}]"


def _wrong(at: str, expected: str, got: Any) -> str:
    return f"{at or 'the answer'}: expected {expected}, got {_shown(got)}"


def _shown(value: Any) -> str:
    """A value as JSON, short: an object or a list by its kind, a long string cut."""
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + '..."'


# --- the shapes -------------------------------------------------------------------------

_CODE: Shape = {"kind": STR, "sha256": STR, "size_bytes": INT, "repository": STR, "commit": STR}
_SPEC: Shape = {
    "gpus": INT,
    "gpu_flavor": STR,
    "args": Opt([STR]),
    "command": Opt([STR]),
    "project": Opt(STR),
    "priority": Opt(STR),
    "experiment": Opt(STR),
    "labels": Opt(Each(STR)),
    "code": Opt(_CODE),
}
_PENDING: Shape = {
    "reason": Opt(STR),
    "position": Opt(INT),
    "estimated_start": Opt(TIME),
    "blocking": Opt(STR),
    "suggestion": Opt(STR),
}
JOB: Shape = {
    "id": STR,
    "name": STR,
    "team": STR,
    "user": STR,
    "status": STR,
    "terminal": BOOL,
    "spec": _SPEC,
    "history": [{"status": STR, "at": TIME, "reason": Opt(STR)}],
    "pending": Opt(_PENDING),
    "node": Opt(STR),
    "gpu_indices": [INT],
    "attempt": Opt(INT),
    "submitted_at": TIME,
    "started_at": Opt(TIME),
    "finished_at": Opt(TIME),
    "cancel_requested": BOOL,
    "failure": Opt(
        {"reason": STR, "exit_code": Opt(INT), "log_tail": Opt(STR), "failure_kind": Opt(STR)}
    ),
    "step": Opt(INT),
    "metrics": Each(Opt(SCALAR)),
    "checkpoints": [{"step": INT, "uri": STR, "size_bytes": INT}],
    "model": Opt({"name": STR, "version": INT, "artifact_uri": STR}),
    "cost": {
        "gpu_seconds": NUMBER,
        "cost": NUMBER,
        "currency": Opt(STR),
        "price_per_gpu_hour": Opt(NUMBER),
        "final": BOOL,
    },
    "trace_id": Opt(STR),
}
JOB_ROWS: Shape = [
    {
        "id": STR,
        "name": STR,
        "user": STR,
        "status": STR,
        "reason": Opt(STR),
        "gpus": INT,
        "gpu_flavor": STR,
        "submitted_at": TIME,
        "started_at": Opt(TIME),
        "finished_at": Opt(TIME),
        "cost": NUMBER,
        "currency": Opt(STR),
    }
]
LOGS: Shape = {
    "chunks": [{"stream": STR, "seq": INT, "text": STR}],
    "cursor": STR,
    "streams_complete": BOOL,
    "job_terminal": BOOL,
}
ME: Shape = {
    "user": STR,
    "team": STR,
    "role": STR,
    "token_id": INT,
    "token_name": STR,
    "expires_at": Opt(TIME),
}
TOKENS: Shape = [
    {"id": INT, "name": STR, "user": STR, "expires_at": Opt(TIME), "revoked_at": Opt(TIME)}
]
TOKEN_CREATED: Shape = {"id": INT, "token": Opt(STR)}
"""``POST /v1/tokens`` and ``/v1/tokens/rotate``: ``token`` is null in the answer to a
creation's retry under the ``Idempotency-Key`` that made it (its secret is not kept), and
to a rotation's whose new token was revoked or expired since."""
USERS: Shape = [{"name": STR, "role": STR, "disabled_at": Opt(TIME)}]
USER: Shape = {"role": STR, "token": STR}
AUDIT: Shape = [{"id": INT, "at": TIME, "actor": STR, "action": STR, "target": STR}]
_LETTER: dict[str, Shape] = {
    "sequence": INT,
    "consumer": STR,
    "dead_lettered_at": Opt(TIME),
    "event_id": Opt(STR),
    "event_type": Opt(STR),
    "event_subject": Opt(STR),
    "original_subject": Opt(STR),
    "original_sequence": Opt(INT),
    "deliveries": Opt(INT),
    "reason": STR,
    "body_encoding": Opt(STR),
}
DEAD_LETTERS: Shape = {
    "consumer": STR,
    "total": INT,
    "dead_letters": [_LETTER],
    "next_after": Opt(INT),
}
_ARTIFACT: Shape = {"uri": Opt(STR), "step": INT, "size_bytes": INT, "sha256": Opt(STR)}
_VERSION_ROW: dict[str, Shape] = {
    "team": STR,
    "model": STR,
    "version": INT,
    "job_id": Opt(STR),
    "artifact": _ARTIFACT,
    "metrics": Each(Opt(SCALAR)),
    "registered_at": TIME,
}
_MODEL_COST: Shape = {
    "by_currency": [{"total": DECIMAL, "currency": STR, "own_job": DECIMAL, "upstream": DECIMAL}],
    "complete": BOOL,
    "jobs": [
        {
            "relation": STR,
            "job_id": STR,
            "name": Opt(STR),
            "status": Opt(STR),
            "costs": Opt(Each(DECIMAL)),
            "allocations": INT,
        }
    ],
    "hidden_jobs": INT,
}
VERSION: Shape = {
    **_VERSION_ROW,
    "created_by": Opt(STR),
    "origin": STR,
    "aliases": [STR],
    "tags": [STR],
    "source_uri": Opt(STR),
    "description": Opt(STR),
    "cost": Opt(_MODEL_COST),
}
VERSIONS: Shape = {"versions": [_VERSION_ROW], "next": Opt(STR)}
_MODEL: dict[str, Shape] = {
    "team": STR,
    "name": STR,
    "project": Opt(STR),
    "latest_version": INT,
    "versions": INT,
    "aliases": Each(INT),
    "created_at": TIME,
}
MODELS: Shape = {"models": [_MODEL], "next": Opt(STR)}
MODEL: Shape = {**_MODEL, "grants": Opt([STR])}
ALIAS_CHANGE: Shape = {"version": Opt(INT), "previous": Opt(INT)}
ALIAS_MOVES: Shape = {
    "moves": [{"at": TIME, "from_version": Opt(INT), "to_version": Opt(INT), "actor": Opt(STR)}],
    "next": Opt(STR),
}
FREED: Shape = {"objects": INT, "bytes": INT}
GRANT: Shape = {"granted": BOOL, "changed": BOOL}
DOWNLOAD: Shape = {"url": STR, "needs_token": BOOL, "size_bytes": INT, "sha256": STR}
_DATASET_VERSION: dict[str, Shape] = {
    "reference": STR,
    "version": INT,
    "uri": STR,
    "size_bytes": INT,
    "sha256": STR,
    "feature_version": Opt(STR),
    "producing_job_id": Opt(STR),
    "data_schema": Opt(OBJECT),
    "created_at": TIME,
    "created_by": Opt(STR),
}
DATASETS: Shape = {
    "datasets": [{"team": STR, "name": STR, "latest_version": INT, "created_at": TIME}],
    "next": Opt(STR),
}
DATASET: Shape = {
    "team": STR,
    "name": STR,
    "latest_version": INT,
    "versions": [_DATASET_VERSION],
    "grants": Opt([STR]),
    "next": Opt(STR),
}
_NODE: Shape = {
    "id": STR,
    "kind": Opt(STR),
    "job_id": Opt(STR),
    "name": Opt(STR),
    "status": Opt(STR),
    "team": Opt(STR),
    "version": Opt(INT),
    "deleted": Opt(BOOL),
    "uri": Opt(STR),
}
LINEAGE: Shape = {
    "root": STR,
    "direction": Opt(STR),
    "nodes": [_NODE],
    "edges": [{"from": STR, "to": STR, "relation": STR}],
    "hidden": Opt(INT),
    "truncated": Opt(BOOL),
}
_METRIC_VALUE = Opt(SCALAR)
"""A metric's value: a number, or a string for what JSON has no number for (NaN)."""
METRICS: Shape = {
    "metrics": [
        {
            "key": STR,
            "count": INT,
            "first_step": INT,
            "last_step": INT,
            "last": _METRIC_VALUE,
            "best": _METRIC_VALUE,
            "best_step": Opt(INT),
            "min": _METRIC_VALUE,
            "max": _METRIC_VALUE,
        }
    ]
}
_CURVE: Shape = {
    "total": INT,
    "downsampled": BOOL,
    "points": [{"step": INT, "value": _METRIC_VALUE}],
}
_EXPERIMENT: Shape = {
    "id": INT,
    "project": STR,
    "name": STR,
    "runs": INT,
    "running": INT,
    "last_started_at": Opt(TIME),
}
EXPERIMENTS: Shape = {"experiments": [_EXPERIMENT], "next": Opt(STR)}
_RUN: Shape = {
    "job_id": STR,
    "name": STR,
    "user": STR,
    "status": STR,
    "started_at": TIME,
    "ended_at": Opt(TIME),
    "tags": [STR],
    "note": STR,
    "metrics": Each({"final": _METRIC_VALUE, "best": _METRIC_VALUE}),
}
RUNS: Shape = {"experiment": _EXPERIMENT, "runs": [_RUN], "next": Opt(STR)}
COMPARISON: Shape = {
    "experiment": _EXPERIMENT,
    "runs": [_RUN],
    "differing_parameters": Each(Each(_METRIC_VALUE)),
    "final": Each(Each(_METRIC_VALUE)),
    "curves": Each(Each(_CURVE)),
}
ANNOTATIONS: Shape = {"tags": [STR], "note": STR}
REPRODUCTION: Shape = {
    "job_id": STR,
    "original_job_id": STR,
    "verdict": Opt(STR),
    "differences": Opt([{"field": STR}]),
    "metrics": Opt(Each({"compared": Opt(BOOL)})),
    "weights": Opt(
        {
            "compared": Opt(BOOL),
            "equal": Opt(BOOL),
            "original_sha256": Opt(STR),
            "reproduction_sha256": Opt(STR),
        }
    ),
}
_LINES: dict[str, Shape] = {
    field: Opt(DECIMAL)
    for field in (
        "gpu_cost",
        "cpu_seconds",
        "cpu_cost",
        "unpriced_cpu_seconds",
        "memory_gib_seconds",
        "memory_cost",
        "unpriced_memory_gib_seconds",
    )
}
_DIMENSIONS: dict[str, Shape] = {
    d: Opt(STR) for d in ("team", "project", "user", "queue", "flavor", "job")
}
_TOTAL: dict[str, Shape] = {**_LINES, "currency": STR, "gpu_seconds": DECIMAL, "cost": DECIMAL}
COSTS: Shape = {
    "start": TIME,
    "end": TIME,
    "granularity": Opt(STR),
    "group_by": [STR],
    "filters": Opt(Each(STR)),
    "rows": [{**_TOTAL, **_DIMENSIONS, "bucket": Opt(TIME)}],
    "totals": [_TOTAL],
    "truncated": BOOL,
}
JOB_COST: Shape = {
    "job_id": STR,
    "team": STR,
    "project": Opt(STR),
    "user": STR,
    "allocations": [
        {
            **_TOTAL,
            "attempt": Opt(INT),
            "node_id": STR,
            "gpu_flavor": STR,
            "gpus": INT,
            "cpus": Opt(INT),
            "memory_gib": Opt(INT),
            "started_at": TIME,
            "ended_at": TIME,
            "outcome": STR,
            "price_per_gpu_hour": DECIMAL,
        }
    ],
    "totals": [_TOTAL],
}
_FIGURE: dict[str, Shape] = {
    "figure": STR,
    "currency": STR,
    "gpu_seconds": DECIMAL,
    "cost": DECIMAL,
    "unpriced_gpu_seconds": DECIMAL,
    "seconds": DECIMAL,
}
WASTE: Shape = {
    "start": TIME,
    "end": TIME,
    "group_by": [STR],
    "filters": Opt(Each(STR)),
    "idle_threshold_percent": DECIMAL,
    "rows": [{**_FIGURE, **_DIMENSIONS}],
    "totals": [_FIGURE],
    "unallocated": [{**_FIGURE, **_DIMENSIONS}],
    "unattributed": [
        {"currency": STR, "gpu_seconds": DECIMAL, "cost": DECIMAL, "ledger_cost": DECIMAL}
    ],
    "success": [
        {
            "day": TIME,
            "team": Opt(STR),
            "queue": Opt(STR),
            "ended": INT,
            "succeeded": INT,
            "failed": INT,
            "cancelled": INT,
            "success_rate": DECIMAL,
        }
    ],
    "truncated": BOOL,
}
ESTIMATE: Shape = {
    "estimated_cost": DECIMAL,
    "worst_case_cost": DECIMAL,
    "currency": STR,
    "gpus": INT,
    "gpu_flavor": STR,
    "max_runtime_seconds": INT,
}

WAITING: Shape = {
    "job_id": STR,
    "gpu_flavor": STR,
    "gpus": INT,
    "priority": STR,
    "attempt": INT,
    "position": Opt(INT),
    "reason": Opt(STR),
    "blocking": Opt(STR),
    "suggestion": Opt(STR),
    "estimated_start": Opt(TIME),
    "submitted_at": TIME,
    "eligible_at": Opt(TIME),
}
"""A waiting job as the scheduler shows it (``PendingJobView``): ``queue --all-teams``."""
_CORDON: Shape = Opt({"reason": STR, "by": STR, "since": TIME, "until": Opt(TIME)})
QUEUE: Shape = {
    "nodes": [
        {
            "node_id": STR,
            "gpu_flavor": STR,
            "status": STR,
            "gpu_count": INT,
            "free_gpus": [INT],
            "used_gpus": Each(STR),
            "last_heartbeat": TIME,
            "cordon": _CORDON,
            "retired_at": Opt(TIME),
        }
    ],
    "queues": [{"name": STR, "team": STR, "waiting": INT, "pending": [WAITING]}],
}
"""The scheduler's ``GET /v1/queue``, the parts ``nodes ls`` and ``queue --all-teams``
show."""
NODE_CORDON: Shape = {"node_id": STR, "cordon": _CORDON}
FLAVOR: Shape = {
    "name": STR,
    "description": STR,
    "nodes": INT,
    "ready_nodes": INT,
    "gpus": INT,
    "ready_gpus": INT,
}
COHORT: Shape = {
    "name": STR,
    "description": STR,
    "queues": [STR],
    "created_at": TIME,
    "updated_at": TIME,
}
QUEUE_CONFIG: Shape = {
    "name": STR,
    "team": STR,
    "cohort": Opt(STR),
    "weight": NUMBER,
    "implicit": BOOL,
    "quotas": Each({"nominal": INT, "borrowing_limit": Opt(INT), "lending_limit": Opt(INT)}),
}
PRIORITY_CLASS: Shape = {
    "name": STR,
    "value": INT,
    "preemptible": BOOL,
    "min_runtime_seconds": NUMBER,
    "description": STR,
}
"""The scheduler's admin views (``admin_schemas``): ``trainyard admin KIND``."""
PRICE: Shape = {
    "flavor": STR,
    "effective_from": TIME,
    "price_per_gpu_hour": Opt(DECIMAL),
    "price_per_cpu_hour": Opt(DECIMAL),
    "price_per_memory_gib_hour": Opt(DECIMAL),
    "currency": STR,
    "set_by": STR,
    "in_force": BOOL,
}
"""A row of billing's price book: ``trainyard admin prices``."""
BUDGET: Shape = {
    "team": STR,
    "project": Opt(STR),
    "amount": DECIMAL,
    "currency": STR,
    "thresholds": [INT],
    "policy": STR,
    "on_exhausted": STR,
    "month": STR,
    "spent": DECIMAL,
    "remaining": DECIMAL,
    "percent_spent": DECIMAL,
    "exhausted": BOOL,
    "runs_out_at": Opt(TIME),
    "forecast": STR,
    "updated_by": STR,
    "updated_at": TIME,
}
"""A budget as billing shows it (``governance_schemas.BudgetView``): ``trainyard budget``."""
_ADMIN = {
    "flavors": FLAVOR,
    "cohorts": COHORT,
    "queues": QUEUE_CONFIG,
    "priority-classes": PRIORITY_CLASS,
}

_MODEL_PATH = "/v1/models/*/*"
_BUDGET_PATHS = ("/v1/budgets/*", "/v1/budgets/*/*")
_VERSION_PATH = f"{_MODEL_PATH}/versions/*"
ROUTES: dict[tuple[str, str], Shape] = {
    ("GET", "/v1/jobs"): JOB_ROWS,
    ("POST", "/v1/jobs"): JOB,
    ("GET", "/v1/jobs/*"): JOB,
    ("POST", "/v1/jobs/*/cancel"): JOB,
    ("POST", "/v1/jobs/*/reproduce"): JOB,
    ("GET", "/v1/jobs/*/logs"): LOGS,
    ("GET", "/v1/me"): ME,
    ("GET", "/v1/tokens"): TOKENS,
    ("POST", "/v1/tokens"): TOKEN_CREATED,
    ("POST", "/v1/tokens/rotate"): TOKEN_CREATED,
    ("GET", "/v1/admin/users"): USERS,
    ("POST", "/v1/admin/users"): USER,
    ("PATCH", "/v1/admin/users/*"): USER,
    ("GET", "/v1/audit"): AUDIT,
    ("GET", "/v1/deadletters"): DEAD_LETTERS,
    ("GET", "/v1/deadletters/*"): _LETTER,
    ("POST", "/v1/deadletters/*/redrive"): {"subject": STR, "event_id": Opt(STR)},
    ("GET", "/v1/models"): MODELS,
    ("GET", _MODEL_PATH): MODEL,
    ("GET", f"{_MODEL_PATH}/versions"): VERSIONS,
    ("POST", f"{_MODEL_PATH}/versions"): VERSION,
    ("GET", _VERSION_PATH): VERSION,
    ("GET", f"{_MODEL_PATH}/versions/by-alias/*"): VERSION,
    ("DELETE", _VERSION_PATH): FREED,
    ("GET", f"{_VERSION_PATH}/download"): DOWNLOAD,
    ("GET", f"{_MODEL_PATH}/versions/by-alias/*/download"): DOWNLOAD,
    ("PUT", f"{_MODEL_PATH}/aliases/*"): ALIAS_CHANGE,
    ("DELETE", f"{_MODEL_PATH}/aliases/*"): ALIAS_CHANGE,
    ("GET", f"{_MODEL_PATH}/aliases/*/moves"): ALIAS_MOVES,
    ("PUT", f"{_MODEL_PATH}/grants/*"): GRANT,
    ("DELETE", f"{_MODEL_PATH}/grants/*"): GRANT,
    ("GET", "/v1/datasets"): DATASETS,
    ("GET", "/v1/datasets/*/*"): DATASET,
    ("GET", "/v1/datasets/*/*/versions/*"): _DATASET_VERSION,
    ("POST", "/v1/datasets/*/*/versions"): _DATASET_VERSION,
    ("PUT", "/v1/datasets/*/*/grants/*"): GRANT,
    ("DELETE", "/v1/datasets/*/*/grants/*"): GRANT,
    ("GET", "/v1/lineage/*/*/*/versions/*/*"): LINEAGE,
    ("GET", "/v1/jobs/*/metrics"): METRICS,
    ("GET", "/v1/jobs/*/reproduction"): REPRODUCTION,
    ("PUT", "/v1/jobs/*/tags/*"): ANNOTATIONS,
    ("DELETE", "/v1/jobs/*/tags/*"): ANNOTATIONS,
    ("PUT", "/v1/jobs/*/note"): ANNOTATIONS,
    ("GET", "/v1/experiments"): EXPERIMENTS,
    ("GET", "/v1/experiments/*"): RUNS,
    ("GET", "/v1/experiments/*/compare"): COMPARISON,
    ("GET", "/v1/jobs/*/cost"): JOB_COST,
    ("GET", "/v1/costs"): COSTS,
    ("POST", "/v1/costs/estimate"): ESTIMATE,
    ("GET", "/v1/waste"): WASTE,
    ("GET", "/v1/queue"): QUEUE,
    ("GET", "/v1/queue/*/pending"): [WAITING],
    ("POST", "/v1/admin/nodes/*/cordon"): NODE_CORDON,
    ("POST", "/v1/admin/nodes/*/uncordon"): NODE_CORDON,
    **{("GET", f"/v1/admin/{kind}"): [view] for kind, view in _ADMIN.items()},
    **{
        (verb, f"/v1/admin/{kind}/*"): view
        for kind, view in _ADMIN.items()
        for verb in ("GET", "PUT")
    },
    ("GET", "/v1/prices"): [PRICE],
    ("PUT", "/v1/prices/*"): PRICE,
    ("GET", "/v1/budgets"): [BUDGET],
    **{(verb, path): BUDGET for verb in ("GET", "PUT") for path in _BUDGET_PATHS},
}
"""Each route the CLI shows the answer of (``*``: one path segment), and its shape. A
metric's curve (``/v1/jobs/{id}/metrics/{key...}``, whose key may hold slashes) is matched
apart (``shape_of``)."""


def shape_of(method: str, path: str) -> Shape | None:
    """The shape of the answer to ``method path`` (``path`` as sent: each segment quoted),
    or None for a route the CLI does not show."""
    parts = path.strip("/").split("/")
    if method == "GET" and len(parts) > 4 and parts[:2] == ["v1", "jobs"] and parts[3] == "metrics":
        return _CURVE
    for (verb, pattern), shape in ROUTES.items():
        wanted = pattern.strip("/").split("/")
        if (
            verb == method
            and len(wanted) == len(parts)
            and all(w in ("*", p) for w, p in zip(wanted, parts, strict=True))
        ):
            return shape
    return None


def answer_problem(method: str, path: str, body: Any) -> str | None:
    """Where ``body``, the answer to ``method path``, has a value of a type its route does
    not answer (``problem``), or None (also for a route without a shape)."""
    shape = shape_of(method, path)
    if shape is None:
        return None
    top_wrong = isinstance(shape, dict) != isinstance(body, dict)
    return None if top_wrong else problem(shape, body)

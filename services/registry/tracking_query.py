"""The tracking API's query parameters and row conversions, without a server: ``sort``
(``final:<key>`` or ``best:<key>``; by default the metric's better end first), ``filter``
(``final:<key>`` or ``best:<key>``, then ``<``, ``<=``, ``>`` or ``>=``, then a number),
comma-separated names, tags, and which hyperparameters differ across runs. A bad parameter
raises ``RequestInvalid`` naming it (422)."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from trainyard_platform.services.registry import metrics
from trainyard_platform.services.registry import tracking_repository as repo
from trainyard_platform.services.registry.tracking_repository import RunFilter, RunOrder
from trainyard_platform.services.registry.tracking_schemas import Run, RunMetric
from trainyard_platform.shared.http_errors import RequestInvalid

_SORT = re.compile(r"(final|best):(.{1,200})")
_FILTER = re.compile(r"(final|best):(.{1,200}?)(<=|>=|<|>)(.+)")
_TAG = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}")


def parse_sort(sort: str | None, order: str | None) -> RunOrder | None:
    if sort is None:
        return None
    found = _SORT.fullmatch(sort)
    if found is None:
        raise RequestInvalid.one("sort", "must be final:<metric key> or best:<metric key>")
    field, key = found.group(1), found.group(2)
    descending = metrics.metric_goal(key) == "max" if order is None else order == "desc"
    return RunOrder("final" if field == "final" else "best", key, descending)


def parse_filter(text: str | None) -> RunFilter | None:
    if text is None:
        return None
    found = _FILTER.fullmatch(text)
    value = _number(found.group(4)) if found else None
    if found is None or value is None:
        raise RequestInvalid.one(
            "filter", "must be final:<key> or best:<key>, then <, <=, > or >=, then a number"
        )
    field, key, op = found.group(1), found.group(2), found.group(3)
    ops: dict[str, repo.Comparison] = {"<": "<", "<=": "<=", ">": ">", ">=": ">="}
    return RunFilter("final" if field == "final" else "best", key, ops[op], value)


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def comma_names(text: str | None, field: str, most: int) -> list[str] | None:
    if text is None:
        return None
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names or len(names) > most or any(len(n) > 200 for n in names):
        raise RequestInvalid.one(field, f"must be 1 to {most} comma-separated names")
    return list(dict.fromkeys(names))


def check_tag(tag: str) -> None:
    if not _TAG.fullmatch(tag):
        raise RequestInvalid.one(
            "tag",
            "must be 1 to 64 letters, digits, '_', '.', ':' or '-', not starting with one "
            "of the last four",
        )


def to_run(row: Any, by_job: dict[str, dict[str, RunMetric]], now: datetime) -> Run:
    spec = row["spec"]
    end = row["ended_at"] or now
    return Run(
        job_id=row["job_id"],
        name=row["name"],
        user=row["user_name"],
        status=row["status"],
        started_at=row["started_at"],
        ended_at=row["ended_at"],
        duration_seconds=max(0.0, (end - row["started_at"]).total_seconds()),
        hyperparameters=spec.get("hyperparameters", {}),
        labels=spec.get("labels", {}),
        tags=list(row["tags"]),
        note=row["note"],
        metrics=by_job.get(row["job_id"], {}),
    )


def differing(runs: list[Run]) -> dict[str, dict[str, Any]]:
    """Hyperparameter -> job id -> value, for the hyperparameters not equal in every run."""
    names = sorted({name for r in runs for name in r.hyperparameters})
    out: dict[str, dict[str, Any]] = {}
    for name in names:
        values = {r.job_id: r.hyperparameters.get(name) for r in runs}
        if len({repr(v) for v in values.values()}) > 1:
            out[name] = values
    return out

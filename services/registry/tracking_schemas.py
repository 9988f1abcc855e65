"""HTTP schemas of the registry's tracking API (never published as events), and converters.

Every metric value is a ``JsonFloat``: a JSON number, or one of the strings ``"NaN"``,
``"Infinity"``, ``"-Infinity"`` for the values JSON cannot write (``metrics.json_float``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from trainyard_platform.services.registry.metrics import Goal, JsonFloat, Point, Summary, json_float
from trainyard_platform.services.registry.metrics import json_float_or_none as maybe

Value = Annotated[
    JsonFloat,
    Field(description='a number, or "NaN", "Infinity" or "-Infinity"'),
]


class _Schema(BaseModel):
    model_config = ConfigDict(frozen=True)


class MetricSummary(_Schema):
    """One metric of one job: how many points, its last and best value, its range."""

    key: str
    goal: Goal = Field(description="which way is better: min (loss-like) or max")
    count: int
    first_step: int
    last_step: int
    last_time: datetime
    last: Value = Field(description="the value reported last (the final value)")
    min: Value | None = Field(description="the least value that is not NaN")
    max: Value | None = Field(description="the greatest value that is not NaN")
    best: Value | None = Field(description="min or max by the goal")
    best_step: int | None

    @classmethod
    def from_domain(cls, key: str, s: Summary) -> MetricSummary:
        return cls(
            key=key,
            goal=s.goal,
            count=s.count,
            first_step=s.first_step,
            last_step=s.last_step,
            last_time=s.last_time,
            last=json_float(s.last_value),
            min=maybe(s.min_value),
            max=maybe(s.max_value),
            best=maybe(s.best_value),
            best_step=s.best_step,
        )


class JobMetricList(_Schema):
    job_id: str
    metrics: list[MetricSummary]


class MetricPointRead(_Schema):
    step: int
    time: datetime
    value: Value

    @classmethod
    def from_domain(cls, p: Point) -> MetricPointRead:
        return cls(step=p.step, time=p.at, value=json_float(p.value))


class MetricCurve(_Schema):
    """The points of one metric of one job in a range of steps, in step order."""

    job_id: str
    key: str
    total: int = Field(description="points in the asked range")
    downsampled: bool = Field(
        description="true when only each bucket's first, last, min, max (and first NaN) "
        "points are here (about max_points in all)"
    )
    points: list[MetricPointRead]


class Experiment(_Schema):
    id: int
    team: str
    project: str
    name: str
    created_at: datetime
    runs: int
    running: int
    last_started_at: datetime | None


class ExperimentList(_Schema):
    experiments: list[Experiment]
    next: str | None = None
    """Pass as ``after`` for the next page; None when this page is the last."""


class RunMetric(_Schema):
    final: Value
    best: Value | None
    goal: Goal


class Run(_Schema):
    """One job of an experiment. Cost is billing's (``GET /v1/costs`` on submission)."""

    job_id: str
    name: str
    user: str
    status: str = Field(description="running, succeeded, failed or cancelled")
    started_at: datetime
    ended_at: datetime | None
    duration_seconds: float = Field(description="from its first start to its end (or now)")
    hyperparameters: dict[str, Any]
    labels: dict[str, str]
    tags: list[str]
    note: str
    metrics: dict[str, RunMetric]


class ExperimentRuns(_Schema):
    experiment: Experiment
    runs: list[Run]
    next: str | None = None
    """Pass as ``after`` (same sort, order and filter) for the next page of runs; None when
    this page is the last."""


class Comparison(_Schema):
    """Runs of one experiment side by side."""

    experiment: Experiment
    runs: list[Run]
    differing_parameters: dict[str, dict[str, Any]] = Field(
        description="hyperparameter -> job id -> value, for those not equal in every run "
        "(a run without it: null)"
    )
    final: dict[str, dict[str, Value | None]] = Field(
        description="metric key -> job id -> its final value (null: not reported)"
    )
    curves: dict[str, dict[str, MetricCurve]] = Field(
        description="metric key -> job id -> its downsampled curve"
    )


class NoteBody(_Schema):
    """``PUT /v1/jobs/{id}/note``: an unknown field is refused, as in every body."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    note: str = Field(max_length=10_000, description="replaces the run's note ('' clears it)")


class RunAnnotations(_Schema):
    job_id: str
    tags: list[str]
    note: str

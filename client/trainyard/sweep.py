"""A hyper-parameter sweep, as pure logic: its search space, the trials it expands to, the
sweep's identity, and the ranking of finished trials (``trainyard sweep`` runs them,
``trainyard.cli_sweep``).

A search space is a set of hyper-parameters, each with a list of values (a grid) or a range
to draw from (uniform, or uniform on a log scale). Without a trial count the trials are the
grid's every combination, in the order the options were given (the last varying fastest);
with one, each trial draws every parameter independently from a generator seeded by the
sweep (a grid parameter's values are its choices), so the same command always expands to the
same trials.

With a median stopping rule (``median_stop``), a running trial whose best value of the
metric so far is worse than the median of the best values the finished trials had reached
by the same step is stopped early, from a given step on and once three trials have
finished (the rule of Google Vizier's "median automated stopping", on best values).

A sweep's id is a digest of the job spec it starts from (its code included) and of its
trials: the same command over the same code names the same sweep, and each trial is
submitted under the idempotency key ``sweep-<id>-<trial>``, so running a sweep again after an
interruption submits only the trials not yet submitted and follows the rest.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

MEDIAN_STOP_TRIALS = 3
"""How many finished trials the median stopping rule needs before it stops any."""

MAX_TRIALS = 1000
"""The most trials one sweep submits (a grid larger than this is refused, not cut)."""

SWEEP_LABEL = "sweep"
TRIAL_LABEL = "sweep-trial"

Goal = Literal["max", "min"]


class SpaceError(ValueError):
    """A search space that cannot be swept; the message names the option and the reason."""


@dataclass(frozen=True)
class Grid:
    """Each of ``values``, in order (a random sweep picks one at random)."""

    values: tuple[Any, ...]

    def draw(self, rng: random.Random) -> Any:
        return rng.choice(self.values)


@dataclass(frozen=True)
class Uniform:
    """A number drawn uniformly from ``[low, high]``, or uniformly in its logarithm when
    ``log``; kept to 6 significant digits, so a trial's value reads as it is used."""

    low: float
    high: float
    log: bool = False

    def draw(self, rng: random.Random) -> float:
        if self.log:
            value = math.exp(rng.uniform(math.log(self.low), math.log(self.high)))
        else:
            value = rng.uniform(self.low, self.high)
        return min(max(float(f"{value:.6g}"), self.low), self.high)


Dimension = Grid | Uniform


@dataclass(frozen=True)
class Space:
    """The parameters swept, in the order given."""

    dimensions: Mapping[str, Dimension]

    def trials(self, count: int | None, seed: int) -> list[dict[str, Any]]:
        """The hyper-parameters of each trial: every grid combination (``count`` None), or
        ``count`` draws from a generator seeded with ``seed``."""
        if not self.dimensions:
            raise SpaceError("nothing to sweep: give --grid, --uniform or --log-uniform")
        names = list(self.dimensions)
        if count is None:
            ranges = [d for d in self.dimensions.values() if not isinstance(d, Grid)]
            if ranges:
                raise SpaceError(
                    "--uniform and --log-uniform need --random N (how many trials to draw)"
                )
            size = math.prod(len(d.values) for d in self.dimensions.values() if isinstance(d, Grid))
            if size > MAX_TRIALS:
                raise SpaceError(f"the grid has {size} combinations; at most {MAX_TRIALS}")
            grids = [d.values for d in self.dimensions.values() if isinstance(d, Grid)]
            return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*grids)]
        if not 1 <= count <= MAX_TRIALS:
            raise SpaceError(f"--random: {count} trials; give 1 to {MAX_TRIALS}")
        rng = random.Random(seed)
        return [{n: self.dimensions[n].draw(rng) for n in names} for _ in range(count)]


def space(
    grids: Iterable[tuple[str, Sequence[Any]]],
    uniforms: Iterable[tuple[str, float, float]],
    log_uniforms: Iterable[tuple[str, float, float]],
    fixed: Iterable[str] = (),
) -> Space:
    """The search space of the options; ``fixed``: parameters the command sets to one value
    (``--set``), which cannot also be swept."""
    dimensions: dict[str, Dimension] = {}
    taken = set(fixed)

    def add(option: str, name: str, dimension: Dimension) -> None:
        if name in taken:
            why = "is also set by --set" if name not in dimensions else "is given twice"
            raise SpaceError(f"{option} {name}: {why}")
        taken.add(name)
        dimensions[name] = dimension

    for name, values in grids:
        if not values:
            raise SpaceError(f"--grid {name}: no values")
        add("--grid", name, Grid(tuple(values)))
    for option, ranges, log in (
        ("--uniform", uniforms, False),
        ("--log-uniform", log_uniforms, True),
    ):
        for name, low, high in ranges:
            if not (math.isfinite(low) and math.isfinite(high)) or not low < high:
                raise SpaceError(f"{option} {name}: need finite LOW < HIGH, got {low}:{high}")
            if log and low <= 0:
                raise SpaceError(f"{option} {name}: LOW must be above 0 on a log scale")
            add(option, name, Uniform(low, high, log))
    return Space(dimensions)


def sweep_id(spec: Mapping[str, Any], trials: Sequence[Mapping[str, Any]]) -> str:
    """12 hex digits naming the sweep of ``trials`` over ``spec`` (its code included)."""
    body = json.dumps({"spec": spec, "trials": trials}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(body.encode()).hexdigest()[:12]


def trial_spec(
    spec: Mapping[str, Any], params: Mapping[str, Any], sweep: str, index: int, experiment: str
) -> dict[str, Any]:
    """The job spec of trial ``index`` (1-based): ``spec`` with ``params`` among its
    hyper-parameters, in ``experiment``, labelled with the sweep and the trial."""
    trial = dict(spec)
    trial["hyperparameters"] = {**(spec.get("hyperparameters") or {}), **params}
    trial["experiment"] = experiment
    trial["labels"] = {**(spec.get("labels") or {}), SWEEP_LABEL: sweep, TRIAL_LABEL: str(index)}
    return trial


def idempotency_key(sweep: str, index: int) -> str:
    return f"sweep-{sweep}-{index}"


def metric_of(view: Mapping[str, Any], metric: str) -> float | None:
    """The last value of ``metric`` the job reported, when it is a finite number."""
    value = (view.get("metrics") or {}).get(metric)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def ranked(
    trials: Sequence[tuple[int, Mapping[str, Any]]], metric: str | None, goal: Goal
) -> list[tuple[int, Mapping[str, Any]]]:
    """``(index, job view)`` of the trials, best first by ``metric`` (succeeded trials with
    the metric, then the rest in trial order); in trial order when no metric is named."""
    if metric is None:
        return sorted(trials, key=lambda t: t[0])
    sign = -1.0 if goal == "max" else 1.0

    def key(trial: tuple[int, Mapping[str, Any]]) -> tuple[int, float, int]:
        index, view = trial
        value = metric_of(view, metric)
        if value is None or view.get("status") != "SUCCEEDED":
            return (1, 0.0, index)
        return (0, sign * value, index)

    return sorted(trials, key=key)


Curve = Sequence[tuple[int, float]]
"""A metric's points as ``(step, value)`` in step order, finite values only."""


def curve_of(points: Iterable[Mapping[str, Any]]) -> list[tuple[int, float]]:
    """The finite points of a registry ``MetricCurve``'s ``points`` (``NaN`` and the like, a
    string there, left out)."""
    curve = []
    for point in points:
        step, value = point.get("step"), point.get("value")
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if isinstance(step, int) and math.isfinite(value):
            curve.append((step, float(value)))
    return curve


def best_until(curve: Curve, step: int, goal: Goal) -> float | None:
    """The best value of ``curve`` at steps up to ``step`` (None: no point there yet)."""
    values = [v for s, v in curve if s <= step]
    if not values:
        return None
    return max(values) if goal == "max" else min(values)


def median_stop(
    running: Curve, finished: Sequence[Curve], goal: Goal, start_step: int
) -> str | None:
    """Why a running trial with ``running`` so far should stop (None: it goes on): from
    ``start_step`` on, its best value is strictly worse than the median of the best values
    each finished trial had by the same step, among at least ``MEDIAN_STOP_TRIALS``
    finished trials that had reported by then."""
    if not running or running[-1][0] < start_step:
        return None
    step = running[-1][0]
    mine = best_until(running, step, goal)
    theirs = sorted(b for c in finished if (b := best_until(c, step, goal)) is not None)
    if mine is None or len(theirs) < MEDIAN_STOP_TRIALS:
        return None
    middle = len(theirs) // 2
    median = theirs[middle] if len(theirs) % 2 else (theirs[middle - 1] + theirs[middle]) / 2
    worse = mine < median if goal == "max" else mine > median
    if not worse:
        return None
    return (
        f"best {mine:.6g} by step {step}, worse than the median {median:.6g} of "
        f"{len(theirs)} finished trials by then"
    )

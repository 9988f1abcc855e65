"""A sweep's search space, trials, identity and ranking (``trainyard.sweep``)."""

from __future__ import annotations

import math

import pytest

from trainyard.sweep import (
    MAX_TRIALS,
    SpaceError,
    Uniform,
    best_until,
    curve_of,
    idempotency_key,
    median_stop,
    metric_of,
    ranked,
    space,
    sweep_id,
    trial_spec,
)


def test_a_grid_is_every_combination_the_last_option_varying_fastest() -> None:
    grid = space([("lr", [0.1, 0.01]), ("bs", [32, 64, 128])], [], [])
    assert grid.trials(None, 0) == [
        {"lr": 0.1, "bs": 32},
        {"lr": 0.1, "bs": 64},
        {"lr": 0.1, "bs": 128},
        {"lr": 0.01, "bs": 32},
        {"lr": 0.01, "bs": 64},
        {"lr": 0.01, "bs": 128},
    ]


def test_a_grid_larger_than_the_limit_is_refused_not_cut() -> None:
    values = list(range(40))
    with pytest.raises(SpaceError, match=f"1600 combinations; at most {MAX_TRIALS}"):
        space([("a", values), ("b", values)], [], []).trials(None, 0)


def test_ranges_need_a_trial_count() -> None:
    with pytest.raises(SpaceError, match="need --random N"):
        space([], [("lr", 0.0, 1.0)], []).trials(None, 0)


def test_nothing_to_sweep_is_refused() -> None:
    with pytest.raises(SpaceError, match="nothing to sweep"):
        space([], [], []).trials(None, 0)


@pytest.mark.parametrize("count", [0, -1, MAX_TRIALS + 1])
def test_a_trial_count_out_of_range_is_refused(count: int) -> None:
    with pytest.raises(SpaceError, match="--random"):
        space([("a", [1])], [], []).trials(count, 0)


def test_random_trials_are_drawn_within_their_ranges_and_repeat_with_the_seed() -> None:
    searched = space([("opt", ["adam", "sgd"])], [("dropout", 0.1, 0.5)], [("lr", 1e-5, 1e-1)])
    trials = searched.trials(200, seed=7)
    assert trials == searched.trials(200, seed=7)
    assert trials != searched.trials(200, seed=8)
    assert {t["opt"] for t in trials} == {"adam", "sgd"}
    assert all(0.1 <= t["dropout"] <= 0.5 for t in trials)
    assert all(1e-5 <= t["lr"] <= 1e-1 for t in trials)
    # On a log scale about as many draws fall in each decade.
    decades = [math.floor(math.log10(t["lr"])) for t in trials]
    assert all(decades.count(d) > 20 for d in (-5, -4, -3, -2))


def test_a_drawn_value_reads_as_it_is_used() -> None:
    value = Uniform(0.0, 1.0).draw(__import__("random").Random(1))
    assert value == float(f"{value:.6g}")


@pytest.mark.parametrize(
    ("grids", "uniforms", "logs", "fixed", "message"),
    [
        ([("lr", [1])], [("lr", 0.0, 1.0)], [], [], "--uniform lr: is given twice"),
        ([("lr", [1])], [], [], ["lr"], "--grid lr: is also set by --set"),
        ([], [("lr", 1.0, 1.0)], [], [], "--uniform lr: need finite LOW < HIGH"),
        ([], [("lr", 0.0, math.inf)], [], [], "--uniform lr: need finite LOW < HIGH"),
        ([], [], [("lr", 0.0, 1.0)], [], "--log-uniform lr: LOW must be above 0"),
        ([("lr", [])], [], [], [], "--grid lr: no values"),
    ],
)
def test_a_space_that_cannot_be_swept_names_the_option_and_why(
    grids: list, uniforms: list, logs: list, fixed: list[str], message: str
) -> None:
    with pytest.raises(SpaceError, match=message):
        space(grids, uniforms, logs, fixed)


def test_the_sweep_id_names_the_spec_its_code_and_its_trials() -> None:
    spec = {"name": "digits", "code": {"kind": "bundle", "sha256": "a" * 64}}
    trials = [{"lr": 0.1}, {"lr": 0.01}]
    ident = sweep_id(spec, trials)
    assert len(ident) == 12 and ident == sweep_id(dict(reversed(spec.items())), trials)
    other_code = {**spec, "code": {"kind": "bundle", "sha256": "b" * 64}}
    assert sweep_id(other_code, trials) != ident
    assert sweep_id(spec, trials[:1]) != ident
    assert idempotency_key(ident, 2) == f"sweep-{ident}-2"


def test_a_trial_spec_keeps_the_spec_and_adds_its_values_and_labels() -> None:
    spec = {"name": "digits", "hyperparameters": {"lr": 1, "epochs": 2}, "labels": {"a": "b"}}
    trial = trial_spec(spec, {"lr": 0.5}, "abc", 3, "digits-sweep")
    assert trial["hyperparameters"] == {"lr": 0.5, "epochs": 2}
    assert trial["labels"] == {"a": "b", "sweep": "abc", "sweep-trial": "3"}
    assert trial["experiment"] == "digits-sweep" and trial["name"] == "digits"
    assert spec["hyperparameters"] == {"lr": 1, "epochs": 2}  # the base spec is not changed


def view(status: str, **metrics: object) -> dict[str, object]:
    return {"status": status, "metrics": metrics}


@pytest.mark.parametrize("bad", [math.nan, math.inf, True, "0.9", None])
def test_a_metric_that_is_no_finite_number_is_none(bad: object) -> None:
    assert metric_of(view("SUCCEEDED", acc=bad), "acc") is None
    assert metric_of({"status": "SUCCEEDED", "metrics": None}, "acc") is None


def test_trials_rank_best_first_and_those_without_a_result_last() -> None:
    trials = [
        (1, view("SUCCEEDED", acc=0.8)),
        (2, view("FAILED", acc=0.99)),  # a failed run's metric is no result
        (3, view("SUCCEEDED", acc=0.9)),
        (4, view("SUCCEEDED")),
        (5, view("SUCCEEDED", acc=0.7)),
    ]
    assert [i for i, _ in ranked(trials, "acc", "max")] == [3, 1, 5, 2, 4]
    assert [i for i, _ in ranked(trials, "acc", "min")] == [5, 1, 3, 2, 4]
    assert [i for i, _ in ranked(list(reversed(trials)), None, "max")] == [1, 2, 3, 4, 5]


def test_a_curve_keeps_finite_numbers_only() -> None:
    points = [
        {"step": 1, "value": 0.5},
        {"step": 2, "value": "NaN"},
        {"step": 3, "value": True},
        {"step": "4", "value": 0.1},
        {"step": 5, "value": 2},
    ]
    assert curve_of(points) == [(1, 0.5), (5, 2.0)]
    assert best_until([(1, 0.5), (5, 2.0)], 4, "max") == 0.5
    assert best_until([(1, 0.5), (5, 2.0)], 0, "min") is None


FINISHED = [[(1, 0.2), (5, 0.8)], [(1, 0.3), (5, 0.9)], [(2, 0.1), (5, 0.7)]]


def test_the_median_rule_compares_best_values_by_the_same_step() -> None:
    # By step 2 the finished trials' best values were 0.2, 0.3, 0.1: median 0.2.
    assert median_stop([(1, 0.1), (2, 0.15)], FINISHED, "max", 2) == (
        "best 0.15 by step 2, worse than the median 0.2 of 3 finished trials by then"
    )
    assert median_stop([(1, 0.1), (2, 0.2)], FINISHED, "max", 2) is None  # equal: goes on
    assert median_stop([(1, 0.1), (2, 0.15)], FINISHED, "max", 3) is None  # before STEP
    # Minimising, the same values: 0.15 is better than the median 0.2.
    assert median_stop([(1, 0.1), (2, 0.15)], FINISHED, "min", 2) is None
    assert median_stop([(2, 0.25)], FINISHED, "min", 1) is not None


def test_the_median_rule_waits_for_three_finished_trials_that_had_reported() -> None:
    assert median_stop([(1, 0.0)], FINISHED[:2], "max", 1) is None
    # At step 1 only two of the three had reported.
    assert median_stop([(1, 0.0)], FINISHED, "max", 1) is None
    four = [*FINISHED, [(1, 0.4)]]
    assert "median 0.3 of 3" in (median_stop([(1, 0.0)], four, "max", 1) or "")
    assert "median 0.75 of 4" in (median_stop([(5, 0.0)], four, "max", 1) or "")

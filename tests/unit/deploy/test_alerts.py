"""The alert rules and dashboards in deploy/ parse, and use only series some service exports
(``shared.metrics.CATALOGUE``) or Prometheus makes itself (``up``)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from trainyard_platform.shared.metrics import CATALOGUE, exported_series

ROOT = Path(__file__).resolve().parents[3]
RULES = ROOT / "deploy" / "prometheus" / "alerts.yml"
DASHBOARDS = sorted((ROOT / "deploy" / "grafana" / "dashboards").glob("*.json"))
PROMETHEUS_OWN = frozenset({"up"})
# A metric name in PromQL: an identifier not followed by "(" (a function) and not a label
# name inside {...} or by (...) (those are removed first), nor a keyword.
_KEYWORDS = frozenset(
    {
        "sum",
        "max",
        "min",
        "avg",
        "count",
        "rate",
        "increase",
        "by",
        "without",
        "on",
        "and",
        "or",
        "unless",
        "le",
        "histogram_quantile",
        "ignoring",
        "group_left",
        "group_right",
    }
)


def metric_names(expr: str) -> set[str]:
    """The series names ``expr`` selects."""
    stripped = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    stripped = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", stripped)  # groupings
    stripped = re.sub(r"\[[^\]]*\]", "", stripped)  # ranges
    names = set(re.findall(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\b(?!\s*\()", stripped))
    return {n for n in names if n not in _KEYWORDS and not re.fullmatch(r"\d.*", n)}


def rules() -> Iterator[dict[str, Any]]:
    document = yaml.safe_load(RULES.read_text())
    for group in document["groups"]:
        yield from group["rules"]


def dashboard_exprs(path: Path) -> Iterator[str]:
    def walk(panels: list[dict[str, Any]]) -> Iterator[str]:
        for panel in panels:
            for target in panel.get("targets", []):
                yield target["expr"]
            yield from walk(panel.get("panels", []))

    yield from walk(json.loads(path.read_text())["panels"])


def test_metric_names_are_read_from_promql() -> None:
    expr = (
        "histogram_quantile(0.95, sum by (le, route) (rate(trainyard_http_server_duration_"
        'seconds_bucket{job="x"}[5m]))) > 0 and on () up{platform="trainyard"} == 0'
    )
    assert metric_names(expr) == {"trainyard_http_server_duration_seconds_bucket", "up"}


def test_the_rules_parse_and_each_says_what_and_how_bad() -> None:
    listed = list(rules())
    assert len(listed) >= 8
    names = [r["alert"] for r in listed]
    assert len(names) == len(set(names))
    for rule in listed:
        assert rule["expr"].strip() and metric_names(rule["expr"]), rule["alert"]
        assert rule["labels"]["severity"] in {"warning", "critical"}, rule["alert"]
        assert rule["annotations"]["summary"], rule["alert"]
        assert re.fullmatch(r"\d+[smh]", rule.get("for", "0s")), rule["alert"]


def test_the_issue_s_alerts_are_there() -> None:
    used = set().union(*(metric_names(r["expr"]) for r in rules()))
    for needed in (
        "trainyard_scheduler_gpus",  # idle GPUs while jobs wait, GPUs lost
        "trainyard_scheduler_nodes",  # a node lost
        "trainyard_deadletters_waiting",  # dead letters present
        "trainyard_outbox_lag_seconds",  # outbox lag
        "trainyard_consumer_lag",  # consumer lag
        "trainyard_billing_budget_exhausted",  # budget exhausted
    ):
        assert needed in used, needed


def test_every_series_the_rules_use_is_exported() -> None:
    known = exported_series() | PROMETHEUS_OWN
    for rule in rules():
        unknown = metric_names(rule["expr"]) - known
        assert not unknown, f"{rule['alert']}: no service exports {sorted(unknown)}"


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_every_series_a_dashboard_uses_is_exported(path: Path) -> None:
    known = exported_series() | PROMETHEUS_OWN
    exprs = list(dashboard_exprs(path))
    assert exprs
    for expr in exprs:
        unknown = metric_names(expr) - known
        assert not unknown, f"{path.name}: {expr}: no service exports {sorted(unknown)}"


def test_the_platform_dashboard_shows_every_catalogued_metric() -> None:
    used = set().union(*(metric_names(e) for e in dashboard_exprs(DASHBOARDS[-1])))
    shown = {spec.name for spec in CATALOGUE.values() if used & spec.series}
    assert DASHBOARDS[-1].name == "trainyard.json"
    missing = set(CATALOGUE) - shown
    assert not missing, sorted(missing)


def test_prometheus_loads_the_rules() -> None:
    config = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    assert config["rule_files"] == ["/etc/prometheus/alerts.yml"]
    compose = yaml.safe_load((ROOT / "deploy" / "compose.yaml").read_text())
    mounts = compose["services"]["prometheus"]["volumes"]
    assert "./prometheus/alerts.yml:/etc/prometheus/alerts.yml:ro" in mounts


def test_every_trainyard_command_an_alert_names_exists() -> None:
    """An alert's annotations tell the operator paged what to run: each ``trainyard X``
    there must be a command of the CLI (``trainyard budgets`` was named, and there is none)."""
    import argparse

    from trainyard.cli import _parser

    [commands] = [a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction)]
    named = 0
    for rule in rules():
        for text in rule.get("annotations", {}).values():
            for command in re.findall(r"\btrainyard ([a-z][a-z-]*)", text):
                named += 1
                assert command in commands.choices, (rule["alert"], command)
    assert named >= 2


def test_every_alert_says_what_to_do_with_operators_commands() -> None:
    """Each rule has a ``description``: what the operator paged looks at or runs. A
    ``trainyard X`` it names is an operators' command (its help says ``operators:``): the
    idle-GPUs alert sent them to ``trainyard queue``, which lists the caller's own team's
    waiting jobs only, not the cluster's."""
    import argparse

    from trainyard.cli import _parser

    [commands] = [a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction)]
    helps = {a.dest: a.help or "" for a in commands._choices_actions}
    for rule in rules():
        description = rule.get("annotations", {}).get("description", "")
        assert description.strip(), f"{rule['alert']} says nothing an operator can act on"
        for text in rule.get("annotations", {}).values():
            for command in re.findall(r"(?<!-n )\btrainyard ([a-z][a-z-]*)", text):  # not kubectl's
                assert helps[command].startswith("operators"), (rule["alert"], command)


def test_operations_md_lists_every_series_with_its_labels() -> None:
    """docs/operations.md's metrics table ("Metrics") names each series of the catalogue
    (a histogram by its base name) with the catalogue's labels, and no other series."""
    doc = (ROOT / "docs" / "operations.md").read_text()
    table = doc[doc.index("| series (Prometheus) |") :]
    table = table[: table.index("\n\n")]
    specs = {
        re.sub(r"_(bucket|count|sum)$", "", series): spec
        for spec in CATALOGUE.values()
        for series in spec.series
    }
    documented: dict[str, set[str]] = {}
    for row in table.splitlines()[2:]:
        cells = row.split("|")
        labels = set(re.findall(r"`(\w+)`", re.sub(r"\([^)]*\)", "", cells[2])))
        for name in re.findall(r"`(trainyard_\w+)`", cells[1]):
            documented[name] = labels
    assert sorted(documented) == sorted(specs)
    for name, labels in documented.items():
        assert labels == set(specs[name].labels), name


TARGET_LABELS = frozenset({"job", "instance", "platform"})
"""Labels Prometheus puts on every scraped series (``platform``: deploy/prometheus/
prometheus.yml's static label), so a rule may select or group by them on any series."""
_SELECTOR = re.compile(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{([^}]*)\}")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)")


def label_problems(expr: str) -> list[str]:
    """Each label ``expr`` matches on (``series{label="..."}``) that its series does not
    have, and each label it groups by (``by``, ``without``, ``on``, ``ignoring``) that none
    of its series has: such a matcher selects nothing, such a grouping merges everything,
    and the rule never fires or says nothing of what fired."""
    labels: dict[str, frozenset[str]] = {"up": frozenset()}
    for spec in CATALOGUE.values():
        for series in spec.series:
            bucket = {"le"} if series.endswith("_bucket") else set()
            labels[series] = frozenset(spec.labels) | bucket
    problems = []
    for series, matchers in _SELECTOR.findall(expr):
        for label in re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", matchers):
            if label not in labels.get(series, frozenset()) | TARGET_LABELS:
                problems.append(f"{series} has no label {label!r}")
    used = frozenset().union(*(labels.get(n, frozenset()) for n in metric_names(expr)))
    for grouping in _GROUPING.findall(expr):
        for label in (part.strip() for part in grouping.split(",")):
            if label and label not in used | TARGET_LABELS:
                problems.append(f"no series of it has the label {label!r} it groups by")
    return problems


def test_label_problems_are_found() -> None:
    assert label_problems('sum by (flavor) (trainyard_scheduler_gpus{state="idle"})') == []
    assert (
        label_problems('max without (instance, job) (trainyard_scheduler_nodes{state="lost"})')
        == []
    )
    assert label_problems('trainyard_scheduler_nodes{status="lost"}') == [
        "trainyard_scheduler_nodes has no label 'status'"
    ]
    assert label_problems("sum by (team) (trainyard_scheduler_queue_depth)") == [
        "no series of it has the label 'team' it groups by"
    ]


def test_every_label_the_rules_use_is_exported() -> None:
    """A label the series does not have makes a matcher select nothing (the alert never
    fires) and a grouping merge everything (its summary's ``$labels`` say nothing)."""
    for rule in rules():
        assert label_problems(rule["expr"]) == [], rule["alert"]


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_every_label_a_dashboard_uses_is_exported(path: Path) -> None:
    for expr in dashboard_exprs(path):
        assert label_problems(expr) == [], expr


def scrape_jobs() -> dict[str, int]:
    """Each scrape job of deploy/prometheus/prometheus.yml -> how many targets it has."""
    config = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    return {
        job["job_name"]: sum(len(s["targets"]) for s in job.get("static_configs", []))
        for job in config["scrape_configs"]
    }


def kept_labels_problems(rule: dict[str, Any]) -> list[str]:
    """Each ``$labels.X`` of the rule's annotations that its expression's aggregation
    drops: not among its ``by`` labels (where it groups by some), or among its ``without``
    ones. Prometheus fills a dropped label with nothing."""
    expr = rule["expr"]
    kept = [set(re.split(r"\s*,\s*", g.strip())) for g in re.findall(r"\bby\s*\(([^)]*)\)", expr)]
    dropped = set().union(
        *(
            set(re.split(r"\s*,\s*", g.strip()))
            for g in re.findall(r"\bwithout\s*\(([^)]*)\)", expr)
        )
    )
    problems = []
    for text in rule.get("annotations", {}).values():
        for label in re.findall(r"\$labels\.(\w+)", text):
            if (kept and not any(label in k for k in kept)) or label in dropped:
                problems.append(label)
    return problems


def test_each_alert_names_the_process_it_is_about() -> None:
    """compose's Prometheus scrapes submission, scheduler, registry and billing as one job,
    ``trainyard-services``: TrainyardDependencyAway said "trainyard-services cannot reach
    postgresql" (its rule kept ``job`` and merged the four), and TrainyardOutboxLag and
    TrainyardLoopFailing named the job the same way, so the operator paged could not tell
    which service to look at. A rule names a process by ``instance``, and every label its
    annotations use is one its aggregation keeps."""
    assert max(scrape_jobs().values()) > 1  # so a job is no process
    for rule in rules():
        for text in rule.get("annotations", {}).values():
            assert "$labels.job" not in text, rule["alert"]
        assert kept_labels_problems(rule) == [], rule["alert"]


def test_dropped_labels_are_found() -> None:
    rule = {
        "alert": "X",
        "expr": "max without (instance) (trainyard_outbox_lag_seconds) > 60",
        "annotations": {"summary": "{{ $labels.instance }} lags"},
    }
    assert kept_labels_problems(rule) == ["instance"]
    rule["expr"] = "max by (job) (trainyard_outbox_lag_seconds) > 60"
    assert kept_labels_problems(rule) == ["instance"]
    rule["expr"] = "max by (job, instance) (trainyard_outbox_lag_seconds) > 60"
    assert kept_labels_problems(rule) == []


def dashboard_targets(path: Path) -> Iterator[dict[str, Any]]:
    def walk(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for panel in panels:
            yield from panel.get("targets", [])
            yield from walk(panel.get("panels", []))

    yield from walk(json.loads(path.read_text())["panels"])


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_a_dashboard_tells_processes_apart_by_instance(path: Path) -> None:
    """The dashboard drew one line per scrape job (``max by (job)
    (trainyard_outbox_lag_seconds)``, legend ``{{job}}``): in compose the four services are
    one job, ``trainyard-services``, so their outbox lags, dependencies away, failed loop
    rounds and HTTP latencies were merged into one line named after none of them."""
    assert max(scrape_jobs().values()) > 1
    for target in dashboard_targets(path):
        for grouping in re.findall(r"\bby\s*\(([^)]*)\)", target["expr"]):
            assert "job" not in re.split(r"\s*,\s*", grouping.strip()), target["expr"]
        assert "{{job}}" not in target.get("legendFormat", ""), target["expr"]

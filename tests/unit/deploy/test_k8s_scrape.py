"""On Kubernetes nothing told Prometheus where the platform's metrics are: the pods had
no scrape annotations and deploy/ had a scrape configuration for compose only, whose
static ``platform: trainyard`` label is what ``TrainyardTargetDown`` selects on (so on
Kubernetes that alert could never fire). Now every workload's pods say where their
``/metrics`` is, and deploy/prometheus/kubernetes.yml finds them and labels them as
compose's configuration does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
WORKLOADS = ("submission", "scheduler", "registry", "billing", "runner")


def _workload(name: str) -> dict[str, Any]:
    (workload,) = [
        d
        for d in yaml.safe_load_all((ROOT / "deploy" / "k8s" / f"{name}.yaml").read_text())
        if d and d["kind"] in ("Deployment", "DaemonSet")
    ]
    return workload


@pytest.mark.parametrize("name", WORKLOADS)
def test_every_workload_s_pods_say_where_their_metrics_are(name: str) -> None:
    template = _workload(name)["spec"]["template"]
    annotations = template["metadata"].get("annotations", {})
    (container,) = template["spec"]["containers"]
    (http,) = [p for p in container["ports"] if p["name"] == "http"]
    assert annotations.get("prometheus.io/scrape") == "true"
    assert annotations.get("prometheus.io/port") == str(http["containerPort"])
    assert annotations.get("prometheus.io/path") == "/metrics"


def test_the_kubernetes_scrape_configuration_finds_them_as_compose_s_labels_them() -> None:
    config = yaml.safe_load((ROOT / "deploy" / "prometheus" / "kubernetes.yml").read_text())
    compose_config = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    assert config["rule_files"] == compose_config["rule_files"]
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "trainyard-pods"]
    (discovery,) = job["kubernetes_sd_configs"]
    assert discovery["role"] == "pod"
    assert discovery["namespaces"]["names"] == ["trainyard"]
    relabel = job["relabel_configs"]
    keep = [
        r
        for r in relabel
        if r.get("action") == "keep"
        and r["source_labels"] == ["__meta_kubernetes_pod_annotation_prometheus_io_scrape"]
    ]
    assert keep and keep[0]["regex"] == "true"
    assert {"target_label": "platform", "replacement": "trainyard"} in [
        {k: r[k] for k in ("target_label", "replacement") if k in r} for r in relabel
    ]
    targets = {r.get("target_label") for r in relabel}
    assert {"__address__", "__metrics_path__"} <= targets

"""Every ``TRAINYARD_*`` variable that deploy/compose.yaml and deploy/k8s/ give a process is
a setting of that process (pydantic-settings ignores a misspelt one silently, so a typo
would leave a default in place without a word)."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic_settings import BaseSettings

ROOT = Path(__file__).resolve().parents[3]
PROCESSES = ("submission", "scheduler", "registry", "billing", "runner")


def variables(settings_type: type[BaseSettings]) -> set[str]:
    """The environment variables ``settings_type`` reads, those of its nested settings too."""
    prefix = settings_type.model_config.get("env_prefix", "")
    names = set()
    for name, field in settings_type.model_fields.items():
        kind = field.annotation
        if isinstance(kind, type) and issubclass(kind, BaseSettings):
            names |= variables(kind)
        elif isinstance(field.validation_alias, str):
            names.add(field.validation_alias)
        else:
            names.add(f"{prefix}{name}".upper())
    return names


def settings_of(process: str) -> set[str]:
    module = importlib.import_module(f"trainyard_platform.services.{process}.config")
    settings: set[str] = variables(module.Settings)
    return settings


def given(env: dict[str, Any] | list[dict[str, Any]]) -> set[str]:
    names = env if isinstance(env, dict) else [e["name"] for e in env]
    return {n for n in names if n.startswith("TRAINYARD_")}


@pytest.mark.parametrize("process", PROCESSES)
def test_compose_sets_only_settings_of_the_process(process: str) -> None:
    compose = yaml.safe_load((ROOT / "deploy" / "compose.yaml").read_text())
    unknown = given(compose["services"][process]["environment"]) - settings_of(process)
    assert not unknown, f"{process} has no setting {sorted(unknown)}"


@pytest.mark.parametrize("process", PROCESSES)
def test_kubernetes_sets_only_settings_of_the_process(process: str) -> None:
    docs = [
        d
        for path in (ROOT / "deploy" / "k8s").glob("*.yaml")
        for d in yaml.safe_load_all(path.read_text())
        if d and d.get("kind") != "Kustomization"
    ]
    configmaps = {d["metadata"]["name"]: d["data"] for d in docs if d["kind"] == "ConfigMap"}
    (workload,) = [
        d
        for d in docs
        if d["kind"] in ("Deployment", "DaemonSet") and d["metadata"]["name"] == process
    ]
    (container,) = workload["spec"]["template"]["spec"]["containers"]
    names = given(container.get("env", []))
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            names |= given(configmaps[source["configMapRef"]["name"]])
    if process == "runner":  # set by its start script (deploy/k8s/runner.yaml)
        names |= {"TRAINYARD_RUNNER_NODE_ID", "TRAINYARD_NATS_USER", "TRAINYARD_NATS_PASSWORD"}
    unknown = names - settings_of(process)
    assert not unknown, f"{process} has no setting {sorted(unknown)}"

"""deploy/k8s/: every manifest validates strictly (no unknown field) against the Kubernetes
OpenAPI schemas that kubernetes-validate bundles (offline), and the deployment holds
together: the kustomization lists every file, each service has probes on its real health
routes and resources, the runner is a DaemonSet on GPU nodes holding nvidia.com/gpu, every
ConfigMap a pod names exists with that key, no manifest ships a Secret or a password (the
operator creates the Secrets: every one a pod names, with that key, is created by
docs/operations.md's commands), NATS gets the same users as compose, and only the four
services reach PostgreSQL."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from trainyard_platform.deploy.local.nats import (
    compose_config,
    password_variable,
    service_user_name,
)
from trainyard_platform.services.runner.config import default_node_id

ROOT = Path(__file__).resolve().parents[3]
K8S = ROOT / "deploy" / "k8s"
OPERATIONS = ROOT / "docs" / "operations.md"
KUBERNETES_VERSION = "1.33.0"
"""The oldest Kubernetes these manifests are checked against (any later release has the
same fields)."""
SERVICES = ("submission", "scheduler", "registry", "billing")
MANIFESTS = sorted(p for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def everything() -> list[dict[str, Any]]:
    return [doc for path in MANIFESTS for doc in documents(path)]


def by_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in everything() if d["kind"] == kind}


def pod_specs() -> Iterator[tuple[str, dict[str, Any]]]:
    for doc in everything():
        if doc["kind"] in ("Deployment", "StatefulSet", "DaemonSet"):
            yield doc["metadata"]["name"], doc["spec"]["template"]["spec"]


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
@pytest.mark.parametrize("version", [KUBERNETES_VERSION, "1.37.0"])
def test_every_manifest_follows_the_kubernetes_schema(path: Path, version: str) -> None:
    for doc in documents(path):
        kubernetes_validate.validate(doc, version, strict=True)


def test_the_validator_rejects_an_unknown_field() -> None:
    deployment = dict(by_kind("Deployment")["scheduler"])
    deployment["spec"] = {**deployment["spec"], "replica": 2}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)


def test_the_kustomization_lists_every_manifest_and_every_image() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert sorted(kustomization["resources"]) == [p.name for p in MANIFESTS]
    assert kustomization["namespace"] == "trainyard"
    names = {image["name"] for image in kustomization["images"]}
    for _, spec in pod_specs():
        for container in spec["containers"]:
            repository = container["image"].split(":")[0]
            if repository.startswith("trainyard-"):
                assert repository in names, f"{repository} is not set by the kustomization"
            else:
                assert container["image"].split(":")[1] != "latest"


@pytest.mark.parametrize("name", SERVICES)
def test_each_service_is_a_deployment_with_probes_and_resources(name: str) -> None:
    deployment = by_kind("Deployment")[name]
    spec = deployment["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    assert container["command"] == ["python", "-m", f"trainyard_platform.services.{name}"]
    env = {e["name"]: e for e in container["env"]}
    port = int(env[f"TRAINYARD_{name.upper()}_PORT"]["value"])
    assert env[f"TRAINYARD_{name.upper()}_HOST"]["value"] == "0.0.0.0"
    assert [p["containerPort"] for p in container["ports"]] == [port]
    # shared/runtime.py serves these two on every service.
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["startupProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["resources"]["requests"]["cpu"]
    assert container["resources"]["limits"]["memory"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert env["TRAINYARD_NATS_USER"]["value"] == name
    assert deployment["spec"]["replicas"] >= 2, "replicas: docs/operations.md, Scaling"
    assert name in by_kind("PodDisruptionBudget")
    assert by_kind("Service")[name]["spec"]["selector"] == {"app.kubernetes.io/name": name}


def test_the_runner_is_a_daemonset_on_gpu_nodes_holding_their_gpus() -> None:
    runner = by_kind("DaemonSet")["runner"]
    spec = runner["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    assert int(container["resources"]["limits"]["nvidia.com/gpu"]) >= 1
    assert spec["nodeSelector"]
    assert any(t["key"] == "nvidia.com/gpu" for t in spec["tolerations"])
    assert spec["shareProcessNamespace"] is True, "PID 1 reaps what jobs leave behind"
    env = {e["name"]: e for e in container["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    capabilities = container["securityContext"]["capabilities"]
    assert capabilities["drop"] == ["ALL"] and "SYS_ADMIN" not in capabilities["add"]
    assert "TRAINYARD_DATABASE_URL" not in env, "the runner has no database"


def test_nats_postgres_and_the_object_store_are_statefulsets_on_volumes() -> None:
    statefulsets = by_kind("StatefulSet")
    assert set(statefulsets) == {"nats", "postgres", "minio"}
    for name, statefulset in statefulsets.items():
        assert statefulset["spec"]["volumeClaimTemplates"], name
        assert name in by_kind("Service")
    args = statefulsets["nats"]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--jetstream" in args and args[args.index("--store_dir") + 1] == "/data"


def test_nats_has_the_users_of_compose() -> None:
    assert by_kind("ConfigMap")["nats-config"]["data"]["nats.conf"] == compose_config()


def secrets_the_docs_create() -> dict[str, set[str]]:
    """The Secrets docs/operations.md has the operator create (``kubectl create secret
    generic NAME --from-literal=KEY=...``), with their keys."""
    created: dict[str, set[str]] = {}
    commands = re.findall(
        r"create secret generic ([a-z0-9-]+)(.*?)(?=kubectl|```)", OPERATIONS.read_text(), re.S
    )
    for name, options in commands:
        keys = re.findall(r"--from-literal=([A-Za-z0-9_.-]+)=", options)
        created.setdefault(name, set()).update(keys)
    return created


def test_every_referenced_secret_and_configmap_key_exists() -> None:
    secrets = secrets_the_docs_create()
    configmaps = {n: set(d["data"]) for n, d in by_kind("ConfigMap").items()}
    for owner, spec in pod_specs():
        for container in spec["containers"]:
            for source in container.get("envFrom", []):
                if "secretRef" in source:
                    assert source["secretRef"]["name"] in secrets, owner
                else:
                    assert source["configMapRef"]["name"] in configmaps, owner
            for entry in container.get("env", []):
                ref = entry.get("valueFrom", {})
                if "secretKeyRef" in ref:
                    assert ref["secretKeyRef"]["key"] in secrets[ref["secretKeyRef"]["name"]]
                if "configMapKeyRef" in ref:
                    key = ref["configMapKeyRef"]["key"]
                    assert key in configmaps[ref["configMapKeyRef"]["name"]]
        for volume in spec.get("volumes", []):
            if "secret" in volume:
                assert volume["secret"]["secretName"] in secrets
            if "configMap" in volume:
                assert volume["configMap"]["name"] in configmaps


def test_no_manifest_ships_a_secret_or_a_password() -> None:
    """secrets.yaml shipped the Secrets with the value REPLACE_ME, and
    ``kubectl apply -k`` applied them: PostgreSQL, MinIO and every NATS user then started
    with a password anyone could read here. The operator creates the Secrets
    (docs/operations.md); until each exists, the pods that name it do not start."""
    assert by_kind("Secret") == {}
    assert not (K8S / "secrets.yaml").exists()
    for owner, spec in pod_specs():
        for container in spec["containers"]:
            for entry in container.get("env", []):
                if re.search(r"PASSWORD|SECRET|TOKEN", entry["name"]):
                    assert "valueFrom" in entry, f"{owner}: {entry['name']} is a literal"
    for name in ("trainyard-admin", "trainyard-postgres", "trainyard-s3", "trainyard-nats"):
        assert name in secrets_the_docs_create(), name


def test_only_the_four_services_reach_postgres() -> None:
    policies = by_kind("NetworkPolicy")
    assert policies["default-deny-ingress"]["spec"]["podSelector"] == {}
    (rule,) = policies["postgres"]["spec"]["ingress"]
    (source,) = rule["from"]
    label = source["podSelector"]["matchLabels"]
    assert list(rule["ports"]) == [{"protocol": "TCP", "port": 5432}]
    (key, value), *_ = label.items()
    carriers = {
        doc["metadata"]["name"]
        for doc in everything()
        if doc["kind"] in ("Deployment", "StatefulSet", "DaemonSet")
        and doc["spec"]["template"]["metadata"]["labels"].get(key) == value
    }
    assert carriers == set(SERVICES)
    for name, policy in policies.items():
        if name == "postgres":
            continue
        selector = policy["spec"]["podSelector"]
        assert selector.get("matchLabels", {}).get("app.kubernetes.io/name") != "postgres"


@pytest.mark.parametrize("kind", ["nats", "minio"])
def test_the_services_and_runners_reach_nats_and_the_object_store(kind: str) -> None:
    (rule,) = by_kind("NetworkPolicy")[kind]["spec"]["ingress"]
    (label,) = rule["from"][0]["podSelector"]["matchLabels"].items()
    reached = {
        doc["metadata"]["name"]
        for doc in everything()
        if doc["kind"] in ("Deployment", "DaemonSet")
        and doc["spec"]["template"]["metadata"]["labels"].get(label[0]) == label[1]
    }
    assert reached == {*SERVICES, "runner"}


@pytest.mark.parametrize(
    "node_name", ["node-1", "gpu-7.cluster.example.com", "IP-10-0-1-2.ec2.internal", "a" * 80]
)
def test_the_runner_takes_its_node_id_nats_user_and_password_from_the_node_name(
    node_name: str, tmp_path: Path
) -> None:
    """The DaemonSet's start script, run with a stand-in ``python`` that prints what the
    runner would get: the node id is ``default_node_id`` of the node name, the user and the
    password variable are those deploy.local.nats gives that node."""
    (container,) = by_kind("DaemonSet")["runner"]["spec"]["template"]["spec"]["containers"]
    _shell, flag, script = container["command"]
    node_id = default_node_id(node_name)
    user = service_user_name("runner", node_id)
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / password_variable(user)).write_text("p0123secret")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "python"
    fake.write_text(
        '#!/bin/sh\necho "$TRAINYARD_RUNNER_NODE_ID $TRAINYARD_NATS_USER $TRAINYARD_NATS_PASSWORD $*"\n'
    )
    fake.chmod(0o755)
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "NODE_NAME": node_name,
        "NATS_PASSWORD_DIR": str(secrets),
    }
    result = subprocess.run(
        ["sh", flag, script], env=env, capture_output=True, text=True, timeout=10
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [
        node_id,
        user,
        "p0123secret",
        "-m",
        "trainyard_platform.services.runner",
    ]
    (secrets / password_variable(user)).unlink()
    refused = subprocess.run(["sh", flag, script], env=env, capture_output=True, text=True)
    assert refused.returncode == 2
    assert password_variable(user) in refused.stderr


def test_kustomize_renders_a_valid_deployment_with_the_registry_images() -> None:
    """`kubectl apply -k deploy/k8s` is what operators run: the rendered documents are the
    manifests' documents, still valid, with the platform images taken from the
    kustomization. kubectl is no PyPI package: skipped where it is not installed."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl (with its built-in kustomize) is not installed")
    result = subprocess.run(
        [kubectl, "kustomize", str(K8S)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    rendered = [d for d in yaml.safe_load_all(result.stdout) if d]
    assert len(rendered) == len(everything())
    for doc in rendered:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        assert doc["metadata"].get("namespace", "trainyard") == "trainyard"
    images = [
        c["image"]
        for d in rendered
        if d["kind"] in ("Deployment", "StatefulSet", "DaemonSet")
        for c in d["spec"]["template"]["spec"]["containers"]
    ]
    assert not [i for i in images if i.startswith("trainyard-")], images

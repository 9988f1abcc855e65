"""deploy/compose.yaml against the Compose Specification's JSON Schema (the copy that
check-jsonschema ships, so nothing is downloaded), and what the schema cannot see: pinned
images that can be pulled, NATS users that match deploy/nats/nats.conf, the runner under an
init process, mounted files that exist, and Prometheus, Grafana and Jaeger configurations
that point at services of the file."""

from __future__ import annotations

import json
import re
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
DEPLOY = ROOT / "deploy"


def compose_schema() -> dict[str, Any]:
    vendored = resources.files("check_jsonschema.builtin_schemas.vendor") / "compose-spec.json"
    schema: dict[str, Any] = json.loads(vendored.read_text())
    return schema


def compose() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    return document


def services() -> dict[str, dict[str, Any]]:
    result: dict[str, dict[str, Any]] = compose()["services"]
    return result


def test_the_file_follows_the_compose_specification() -> None:
    schema = compose_schema()
    validator = jsonschema.validators.validator_for(schema)(schema)
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(compose())]
    assert not errors, "\n".join(errors)


def test_the_schema_check_catches_mistakes() -> None:
    schema = compose_schema()
    broken = compose()
    broken["services"]["nats"]["imagee"] = "nats"
    broken["services"]["runner"]["depends_on"] = {"nats": {"condition": "service_happy"}}
    validator = jsonschema.validators.validator_for(schema)(schema)
    messages = " ".join(e.message for e in validator.iter_errors(broken))
    assert "imagee" in messages
    assert "service_happy" in messages


def test_every_image_is_pinned_and_none_comes_from_a_retired_repository() -> None:
    for name, service in services().items():
        image = service["image"]
        repository, _, tag = (
            image.rpartition(":") if ":" in image.split("/")[-1] else (image, "", "")
        )
        assert tag and tag != "latest", f"{name}: {image} is not pinned to a release"
        assert not repository.startswith(("minio/", "docker.io/minio/")), (
            f"{name}: Docker Hub's minio/* images are no longer published (deploy/README.md)"
        )
        assert "all-in-one" not in repository, f"{name}: Jaeger v1 is end of life"
    assert re.fullmatch(r"quay\.io/minio/minio:RELEASE\.[0-9T:-]+Z", services()["minio"]["image"])
    assert re.fullmatch(r"jaegertracing/jaeger:2\.\d+\.\d+", services()["jaeger"]["image"])


def test_the_platform_images_are_built_from_deploy_images() -> None:
    for name, service in services().items():
        if "build" not in service:
            continue
        dockerfile = "runner.Dockerfile" if name == "runner" else "services.Dockerfile"
        assert service["build"]["dockerfile"] == f"deploy/images/{dockerfile}", name
        context = (DEPLOY / service["build"]["context"]).resolve()
        assert (context / service["build"]["dockerfile"]).exists()
    built = {n for n, s in services().items() if "build" in s}
    assert built == {"submission", "scheduler", "registry", "billing", "runner"}


def test_the_runner_runs_under_an_init_process_with_few_capabilities() -> None:
    runner = services()["runner"]
    assert runner["init"] is True
    assert runner["cap_drop"] == ["ALL"]
    assert "SYS_ADMIN" not in runner["cap_add"]


def test_the_runner_gets_no_database_credentials() -> None:
    """A runner has no database; a node taken over must not hold the URL (and password) of
    every service's tables, or it could grant itself work and bill anyone (docs/security.md,
    "Threat model"). The services that keep state there get it."""
    all_services = services()
    assert "TRAINYARD_DATABASE_URL" not in all_services["runner"]["environment"]
    for name in ("submission", "scheduler", "registry", "billing"):
        assert all_services[name]["environment"]["TRAINYARD_DATABASE_URL"].startswith(
            "postgresql://"
        )


def test_the_runner_cannot_reach_postgres() -> None:
    """Without the URL, a node taken over could still try PostgreSQL with a password it
    guessed: it shares no network with it, as the Kubernetes NetworkPolicy has it."""
    all_services = services()

    def networks(name: str) -> set[str]:
        return set(all_services[name].get("networks", ["default"]))

    assert not networks("runner") & networks("postgres")
    for name in ("submission", "scheduler", "registry", "billing"):
        assert networks(name) & networks("postgres"), name
        assert "default" in networks(name), name  # NATS, the object store, Jaeger, users


def test_nats_keeps_jetstream_on_a_volume_and_knows_every_service_user() -> None:
    nats = services()["nats"]
    command = nats["command"]
    assert "--jetstream" in command
    store = command[command.index("--store_dir") + 1]
    mounts = {m.split(":")[1]: m.split(":")[0] for m in nats["volumes"]}
    assert mounts[store] in compose()["volumes"], "the JetStream store is a named volume"
    assert mounts["/etc/nats/nats.conf"] == "./nats/nats.conf"
    conf = (DEPLOY / "nats" / "nats.conf").read_text()
    users = dict(re.findall(r'"user": "([^"]+)",\s*"password": \$([A-Z0-9_]+)', conf))
    assert set(users.values()) == set(nats["environment"])
    for name, service in services().items():
        user = service.get("environment", {}).get("TRAINYARD_NATS_USER")
        if user is None:
            continue
        assert user in users, f"{name}: NATS user {user} is not in nats.conf"
        variable = users[user]
        assert service["environment"]["TRAINYARD_NATS_PASSWORD"].startswith(f"${{{variable}:?")


def test_mounted_files_exist_and_published_ports_stay_on_loopback() -> None:
    for name, service in services().items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (DEPLOY / source).exists(), f"{name}: {source} does not exist"
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{name}: {port} is published to all"


def test_prometheus_grafana_and_jaeger_point_at_services_of_the_file() -> None:
    names = set(services())
    prometheus = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    for job in prometheus["scrape_configs"]:
        for group in job["static_configs"]:
            for target in group["targets"]:
                host = target.split(":")[0]
                assert host in names | {"127.0.0.1"}, f"{job['job_name']}: {target}"
    sources = yaml.safe_load(
        (DEPLOY / "grafana" / "provisioning" / "datasources" / "datasources.yaml").read_text()
    )
    for source in sources["datasources"]:
        assert urlsplit(source["url"]).hostname in names, source["name"]
    for dashboard in (DEPLOY / "grafana" / "dashboards").glob("*.json"):
        assert json.loads(dashboard.read_text())["uid"]
    jaeger = yaml.safe_load((DEPLOY / "jaeger" / "config.yaml").read_text())
    assert jaeger["receivers"]["otlp"]["protocols"]["http"]["endpoint"] == "0.0.0.0:4318"
    assert compose()["x-infra-env"]["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://jaeger:4318"
    # The OTLP metrics any client sends there reach Prometheus through Jaeger's exporter.
    pipelines = jaeger["service"]["pipelines"]
    assert pipelines["metrics"]["exporters"] == ["prometheus"]
    port = jaeger["exporters"]["prometheus"]["endpoint"].rpartition(":")[2]
    targets = [
        t
        for job in prometheus["scrape_configs"]
        for g in job["static_configs"]
        for t in g["targets"]
    ]
    assert f"jaeger:{port}" in targets


def test_deploy_readme_says_where_prometheus_gets_the_services_metrics() -> None:
    """deploy/README.md said the services' own `/metrics` endpoints "do not exist yet" and
    their metrics came over OTLP through Jaeger; every service serves `GET /metrics`, which
    Prometheus scrapes, and compose turns the OTLP push off."""
    readme = (DEPLOY / "README.md").read_text()
    platform = {"submission", "scheduler", "registry", "billing", "runner"}
    prometheus = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    for job in prometheus["scrape_configs"]:
        hosts = {t.split(":")[0] for g in job["static_configs"] for t in g["targets"]}
        if hosts & platform:
            assert job["metrics_path"] == "/metrics"
            assert f"`{job['job_name']}`" in readme, job["job_name"]
    exporter = compose()["x-infra-env"]["OTEL_METRICS_EXPORTER"]
    assert f"`OTEL_METRICS_EXPORTER: {exporter}`" in readme
    assert "do not exist yet" not in readme


@pytest.mark.parametrize("name", ["submission", "scheduler", "registry", "billing", "runner"])
def test_each_service_listens_where_its_healthcheck_looks(name: str) -> None:
    service = services()[name]
    prefix = f"TRAINYARD_{name.upper()}_"
    assert service["environment"][prefix + "HOST"] == "0.0.0.0"
    port = service["environment"][prefix + "PORT"]
    assert f"127.0.0.1:{port}/readyz" in " ".join(service["healthcheck"]["test"])


def test_jaegers_pipelines_use_only_components_it_configures() -> None:
    """The shape of an OpenTelemetry Collector configuration (Jaeger v2 refuses to start on
    a pipeline that names a component it does not configure); the components themselves
    are only checked by starting Jaeger."""
    jaeger = yaml.safe_load((DEPLOY / "jaeger" / "config.yaml").read_text())
    service = jaeger["service"]
    assert set(service["extensions"]) <= set(jaeger["extensions"])
    assert "jaeger_query" in service["extensions"]
    for name, pipeline in service["pipelines"].items():
        for part in ("receivers", "processors", "exporters"):
            for component in pipeline.get(part, []):
                assert component in jaeger[part], f"pipeline {name}: {component} is not configured"
    storage = jaeger["extensions"]["jaeger_query"]["storage"]["traces"]
    assert storage in jaeger["extensions"]["jaeger_storage"]["backends"]
    assert jaeger["exporters"]["jaeger_storage_exporter"]["trace_storage"] == storage
    ui_port = jaeger["extensions"]["jaeger_query"]["http"]["endpoint"].rpartition(":")[2]
    assert f"127.0.0.1:{ui_port}:{ui_port}" in services()["jaeger"]["ports"]


_INTERPOLATION = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(:?[-?+])?([^}]*)\}")
_SECRET_NAME = re.compile(r"PASSWORD|SECRET|TOKEN", re.IGNORECASE)


def _strings(node: Any, path: str = "") -> list[tuple[str, str]]:
    """Every (path, string) of the file: keys' values, lists' items, at any depth."""
    if isinstance(node, dict):
        return [s for k, v in node.items() for s in _strings(v, f"{path}.{k}")]
    if isinstance(node, list):
        return [s for i, v in enumerate(node) for s in _strings(v, f"{path}[{i}]")]
    return [(path, node)] if isinstance(node, str) else []


def test_no_password_has_a_default() -> None:
    """Compose started PostgreSQL, MinIO and Grafana with passwords everyone can read here
    (``${POSTGRES_PASSWORD:-trainyard}``), and a stack started without ``.env`` kept them:
    PostgreSQL and MinIO keep the credentials of their first start. Every password, secret
    key and token now comes from the environment or ``.env``, and compose refuses to start
    without it (``${VAR:?message}``), naming it."""
    found = []
    for path, text in _strings(compose()):
        for name, operator, rest in _INTERPOLATION.findall(text):
            if _SECRET_NAME.search(name) and operator != ":?":
                found.append(f"{path}: ${{{name}{operator}{rest}}} has a default")
            if operator == ":?":
                assert name in rest, f"{path}: the message for {name} does not name it"
        key = path.rsplit(".", 1)[-1]
        if _SECRET_NAME.search(key) and not _INTERPOLATION.fullmatch(text):
            found.append(f"{path}: a literal value")
    assert found == [], "\n".join(found)
    env = services()
    assert env["postgres"]["environment"]["POSTGRES_PASSWORD"].startswith("${POSTGRES_PASSWORD:?")
    assert env["minio"]["environment"]["MINIO_ROOT_PASSWORD"].startswith("${MINIO_ROOT_PASSWORD:?")
    url = compose()["x-database-env"]["TRAINYARD_DATABASE_URL"]
    assert "${POSTGRES_PASSWORD:?" in url
    secret_key = compose()["x-infra-env"]["TRAINYARD_STORAGE_S3_SECRET_KEY"]
    assert secret_key.startswith("${MINIO_ROOT_PASSWORD:?")

"""What each process of the local stack is told about the others (``LocalStack._child_env``):
the addresses services call each other at, without starting any of them."""

from __future__ import annotations

from pathlib import Path

from trainyard_platform.deploy.local.stack import SERVICES, LocalStack


def stack_with_ports(tmp_path: Path) -> LocalStack:
    stack = LocalStack(tmp_path)
    for i, name in enumerate(SERVICES):
        stack._ports[name] = 9100 + i
        stack._kinds[name] = name
    return stack


def test_submission_reaches_the_registry_for_data_admission_and_names_the_dashboard_apis(
    tmp_path: Path,
) -> None:
    stack = stack_with_ports(tmp_path)
    env = stack._child_env("submission")
    urls = stack.service_urls
    assert env["TRAINYARD_SUBMISSION_REGISTRY_URL"] == urls["registry"]
    for api in ("scheduler", "registry", "billing"):
        assert env[f"TRAINYARD_SUBMISSION_{api.upper()}_PUBLIC_URL"] == urls[api]


def test_the_other_services_check_user_tokens_with_submission(tmp_path: Path) -> None:
    stack = stack_with_ports(tmp_path)
    for name in ("registry", "billing", "scheduler", "runner"):
        env = stack._child_env(name)
        assert env[f"TRAINYARD_{name.upper()}_IDENTITY_URL"] == stack.submission_url
        assert "TRAINYARD_SUBMISSION_REGISTRY_URL" not in env


def test_only_the_services_with_tables_are_told_where_the_database_is(tmp_path: Path) -> None:
    """A runner has no database: a node taken over must not hold its address and credentials
    (docs/security.md, "Threat model")."""
    stack = stack_with_ports(tmp_path)
    stack._infra_env = {"TRAINYARD_DATABASE_URL": "postgresql:///trainyard?host=/sock"}
    assert "TRAINYARD_DATABASE_URL" not in stack._child_env("runner")
    for name in ("submission", "scheduler", "registry", "billing"):
        assert stack._child_env(name)["TRAINYARD_DATABASE_URL"].startswith("postgresql:")

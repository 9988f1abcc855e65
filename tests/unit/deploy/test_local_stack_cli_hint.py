"""The CLI lines `dev.py up` prints reach every service the CLI calls: the login command
had --registry-url and --billing-url but not --scheduler-url, so `trainyard admin flavors
ls` (open to every user: flavors are named in specs) and `nodes ls` ended 'no scheduler
URL'; the `export` alternative named the submission API alone, so metrics, models and costs
ended the same way."""

from __future__ import annotations

from trainyard_platform.deploy.local.__main__ import cli_hint

URLS = {
    "registry": "http://127.0.0.1:1001",
    "billing": "http://127.0.0.1:1002",
    "scheduler": "http://127.0.0.1:1003",
    "runner": "http://127.0.0.1:1004",
    "submission": "http://127.0.0.1:1005",
}


def test_the_login_command_names_every_service_the_cli_calls() -> None:
    login, export = cli_hint("ty_t", URLS)
    assert login.split() == [
        "echo",
        "ty_t",
        "|",
        "trainyard",
        "login",
        "http://127.0.0.1:1005",
        "--token-stdin",
        "--name",
        "local",
        "--registry-url",
        "http://127.0.0.1:1001",
        "--billing-url",
        "http://127.0.0.1:1002",
        "--scheduler-url",
        "http://127.0.0.1:1003",
    ]
    assert export.split() == [
        "or:",
        "export",
        "TRAINYARD_URL=http://127.0.0.1:1005",
        "TRAINYARD_TOKEN=ty_t",
        "TRAINYARD_REGISTRY_URL=http://127.0.0.1:1001",
        "TRAINYARD_BILLING_URL=http://127.0.0.1:1002",
        "TRAINYARD_SCHEDULER_URL=http://127.0.0.1:1003",
    ]

"""The flavor catalogue and budgets across services, every component a real process (NATS
JetStream, PostgreSQL, the services, one runner), none restarted.

The runner offers ``l40s``, a flavor no service knows at start (submission's bootstrap list
and billing's bootstrap prices are the defaults). An operator declares it on the scheduler
and prices it on billing; the catalogue reaches submission and billing as events, a job asks
for it, runs and is billed at that price. Then the team's budget is spent: with ``refuse``
the next job is refused naming the budget, with ``warn`` it is admitted with a warning.
With ``on_exhausted: stop``, a running job is checkpointed and stopped when the budget is
spent, waits held with the budget named in its view, and runs again once it is raised.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest

from trainyard.client import TrainyardClient
from trainyard_platform.deploy.local.stack import LocalStack

pytestmark = pytest.mark.e2e

FLAVOR = "l40s"
PRICE = Decimal("3.25")
WAIT_S = 120.0


@pytest.fixture(scope="module")
def stack() -> Iterator[LocalStack]:
    data = Path(tempfile.mkdtemp(prefix="trainyard-e2e-"))
    try:
        with LocalStack(data, extra_env={"TRAINYARD_RUNNER_GPU_FLAVOR": FLAVOR}) as running:
            yield running
    finally:
        shutil.rmtree(data, ignore_errors=True)


def eventually(check: Callable[[], Any], what: str, timeout_s: float = WAIT_S) -> Any:
    """The first true result of ``check()``, polled; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout_s:.0f} s: {what}")
        time.sleep(0.2)


CPU_MEMORY = {"cpus_per_gpu": 3, "memory_gib_per_gpu": 2}


def spec(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "command": ["python", "-c", "print('hello')"],
        "gpus": 1,
        "gpu_flavor": FLAVOR,
        "max_runtime_seconds": 600,
    }


def test_a_declared_flavor_is_usable_and_billed_and_a_spent_budget_acts(
    stack: LocalStack,
) -> None:
    token = stack.bootstrap_admin("ml", "ada")
    user = {"Authorization": f"Bearer {token}"}
    operator = {"Authorization": f"Bearer {stack.admin_token}"}
    scheduler = stack.service_urls["scheduler"]
    billing = stack.service_urls["billing"]
    jobs = f"{stack.submission_url}/v1/jobs"

    refused = httpx.post(jobs, json=spec("before"), headers=user)
    assert refused.status_code == 422, refused.text
    (error,) = refused.json()["errors"]
    assert error["field"] == "gpu_flavor" and "h100" in error["message"]
    unknown = httpx.put(
        f"{billing}/v1/prices/{FLAVOR}", json={"price_per_gpu_hour": "1"}, headers=operator
    )
    assert unknown.status_code == 422, unknown.text

    declared = httpx.put(
        f"{scheduler}/v1/admin/flavors/{FLAVOR}", json={"description": "48 GB"}, headers=operator
    )
    assert declared.status_code in (200, 201), declared.text  # the node may have made it

    def priced() -> bool:
        answer = httpx.put(
            f"{billing}/v1/prices/{FLAVOR}",
            json={
                "price_per_gpu_hour": str(PRICE),
                "price_per_cpu_hour": "0.5",
                "price_per_memory_gib_hour": "0.25",
            },
            headers=operator,
        )
        return answer.status_code == 201

    eventually(priced, "billing learns the declared flavor and takes its price")
    accepted = eventually(
        # CPUs and memory declared in the spec reach billing through the scheduler's grant.
        lambda: (
            (r := httpx.post(jobs, json={**spec("first"), **CPU_MEMORY}, headers=user)).status_code
            == 201
            and r
        ),
        "submission learns the declared flavor",
    )
    client = TrainyardClient(stack.submission_url, token)
    final = client.wait(accepted.json()["id"], timeout_s=300)
    assert final["status"] == "SUCCEEDED", final.get("failure")

    def billed() -> Any:
        answer = httpx.get(f"{billing}/v1/jobs/{final['id']}/cost", headers=user)
        return answer.status_code == 200 and answer.json()

    cost = eventually(billed, "the job is billed")
    (allocation,) = cost["allocations"]
    assert allocation["gpu_flavor"] == FLAVOR
    assert Decimal(allocation["price_per_gpu_hour"]) == PRICE
    assert Decimal(allocation["cost"]) > 0
    gpu_seconds = Decimal(allocation["gpu_seconds"])
    assert (allocation["cpus"], allocation["memory_gib"]) == (3, 2)
    assert Decimal(allocation["cpu_seconds"]) == 3 * gpu_seconds
    assert Decimal(allocation["memory_gib_seconds"]) == 2 * gpu_seconds
    assert Decimal(allocation["cpu_cost"]) > 0 and Decimal(allocation["memory_cost"]) > 0
    lines = ("gpu_cost", "cpu_cost", "memory_cost")
    assert Decimal(allocation["cost"]) == sum(Decimal(allocation[k]) for k in lines)

    # The team's budget is already spent (the job cost more than this): refuse.
    budget = {"amount": "0.000001", "thresholds": [100], "policy": "refuse"}
    put = httpx.put(f"{billing}/v1/budgets/ml", json=budget, headers=user)
    assert put.status_code == 201, put.text
    assert put.json()["exhausted"] is True

    def refused_by_budget() -> Any:
        answer = httpx.post(jobs, json=spec("over"), headers=user)
        return answer.status_code == 409 and answer

    conflict = eventually(refused_by_budget, "submission refuses a job past the budget")
    assert "the budget of team ml is spent" in conflict.json()["detail"]

    warned = httpx.put(f"{billing}/v1/budgets/ml", json={**budget, "policy": "warn"}, headers=user)
    assert warned.status_code == 200, warned.text

    def admitted_with_a_warning() -> Any:
        answer = httpx.post(jobs, json=spec("warned"), headers=user)
        return answer.status_code == 201 and answer

    admitted = eventually(admitted_with_a_warning, "submission admits with a warning")
    assert "the budget of team ml is spent" in admitted.headers["Trainyard-Budget-Warning"]
    crossed = httpx.get(f"{billing}/v1/budgets/ml", headers=user).json()
    assert crossed["policy"] == "warn" and crossed["exhausted"] is True

    # A budget that stops: a running job of the team is checkpointed and stopped when the
    # budget is spent, waits held (its view says why), and runs again once it is raised.
    stopping = {"amount": "1000", "policy": "refuse", "on_exhausted": "stop"}
    raised = httpx.put(f"{billing}/v1/budgets/ml", json=stopping, headers=user)
    assert raised.status_code == 200 and raised.json()["exhausted"] is False, raised.text
    sleeper = {**spec("long"), "command": ["python", "-c", "import time; time.sleep(600)"]}
    long_job = eventually(
        lambda: (r := httpx.post(jobs, json=sleeper, headers=user)).status_code == 201 and r,
        "submission admits a job once the budget is raised",
    ).json()["id"]
    eventually(lambda: client.get_job(long_job)["status"] == "RUNNING", "the job runs")

    spent = httpx.put(
        f"{billing}/v1/budgets/ml", json={**stopping, "amount": "0.000001"}, headers=user
    )
    assert spent.status_code == 200 and spent.json()["exhausted"] is True, spent.text

    def held() -> Any:
        view = client.get_job(long_job)
        return view["status"] == "PENDING" and view["pending"] and view

    view = eventually(held, "the running job is stopped and held")
    assert "the budget of team ml is spent" in view["pending"]["reason"]
    assert view["pending"]["blocking"] == "budget of team ml"
    assert httpx.put(f"{billing}/v1/budgets/ml", json=stopping, headers=user).status_code == 200
    eventually(lambda: client.get_job(long_job)["status"] == "RUNNING", "released, it runs")
    client.cancel(long_job)

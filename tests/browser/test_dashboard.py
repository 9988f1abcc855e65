"""The web dashboard in headless Chromium against the whole local stack.

Two teams share one runner with two virtual GPUs. Team ``audio`` (B) runs one job to the end.
Team ``vision`` (A) has a finished job (a loss curve, checkpoints, a registered model, a
cost), a running job and a pending job that waits for GPUs the running one holds; both of
the first two are runs of experiment ``lr-sweep``; the finished one is reproduced with another
learning rate (the registry's verdict: ``different``, naming ``hyperparameters.lr``); a second
user of team A runs a job billed to project ``tuning``. Team B registers a second model from
its job's checkpoint, which it grants to team A in the tests that need it. Each page is loaded
as a person would and checked for what a person looks for; screenshots go to
``TRAINYARD_SCREENSHOT_DIR`` (default: a temporary folder; docs/screenshots/ holds a set).
Then, logged in as team A, every page is read again and nothing of team B's may appear in it
but the model B granted.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import shutil
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import ROUND_CEILING, Decimal
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from trainyard.bundle import pack
from trainyard.client import TrainyardClient
from trainyard_platform.deploy.local.stack import LocalStack

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

TRAIN = textwrap.dedent(
    """
    import time
    import torch
    from trainyard import sdk

    ctx = sdk.init({"steps": 40, "sleep": 0.0, "lr": 0.1})
    hp = ctx.hyperparameters
    loss = 2.0
    for step in range(1, int(hp["steps"]) + 1):
        if ctx.should_stop():  # cancelled: stop now, not at the SIGKILL after the grace
            ctx.exit_preempted()
        loss *= 1.0 - float(hp["lr"]) / 2
        ctx.report_metrics(step, loss=loss, accuracy=1.0 - loss / 2)
        if step % 20 == 0:
            ctx.save_checkpoint(step, {"w": torch.full((2,), loss)})
        time.sleep(float(hp["sleep"]))
    print("training done at step", step, flush=True)
    """
)
WAIT_S = 20.0


@dataclass
class World:
    stack: LocalStack
    tokens: dict[str, str]
    jobs: dict[str, dict[str, Any]]
    """finished, tuning, reproduction, running, pending (team A) and other (team B): each job's
    view."""
    shots: Path


def _submit(client: TrainyardClient, code: dict[str, Any], name: str, **spec: Any) -> str:
    body = {"name": name, "gpus": 1, "gpu_flavor": "cpu", "entrypoint": "train.py", "code": code}
    return str(client.submit({**body, **spec})["id"])


def _until(what: str, check: Callable[[], Any], timeout_s: float = 120) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"not within {timeout_s:.0f} s: {what}"
        time.sleep(0.5)


@pytest.fixture(scope="module")
def world(stack: LocalStack) -> Iterator[World]:
    """Teams ``vision``, ``audio``, ``platform`` (the operator) and, made by the tests that
    need them, ``scale`` and ``many``: this module's own on the package's stack. Its jobs
    still living at the end are cancelled, so the next module finds the GPUs free."""
    data = Path(tempfile.mkdtemp(prefix="trainyard-browser-"))
    project = data / "project"
    project.mkdir()
    (project / "train.py").write_text(TRAIN)
    shots = Path(os.environ.get("TRAINYARD_SCREENSHOT_DIR") or data / "screenshots")
    shots.mkdir(parents=True, exist_ok=True)
    living: list[tuple[TrainyardClient, str]] = []
    try:
        tokens = {
            "a": stack.bootstrap_admin("vision", "alice"),
            "b": stack.bootstrap_admin("audio", "bob"),
            # A second user of team A, whose job is billed to another project.
            "a2": stack.bootstrap_admin("vision", "dave"),
            "operator": stack.bootstrap_admin("platform", "root", role="operator"),
        }
        a = TrainyardClient(stack.submission_url, tokens["a"])
        b = TrainyardClient(stack.submission_url, tokens["b"])
        dave = TrainyardClient(stack.submission_url, tokens["a2"])
        bundle = pack(project, out_dir=data)
        code = {"kind": "bundle", "sha256": bundle.sha256, "size_bytes": bundle.size_bytes}
        for client in (a, b):
            client.upload_bundle(bundle.path, bundle.sha256)
        ids = {
            # Both register their checkpoint as a model on success (the registry
            # registers only jobs whose spec asks for it).
            "other": _submit(
                b, code, "audio-secret-run", experiment="audio-only", register_model=True
            ),
            "finished": _submit(
                a,
                code,
                "vision-finished",
                experiment="lr-sweep",
                hyperparameters={"lr": 0.1},
                register_model=True,
            ),
        }
        # Billed to another project by another user: the costs page's breakdowns.
        ids["tuning"] = _submit(dave, code, "vision-tuning", project="tuning")
        for key, client in (("other", b), ("finished", a), ("tuning", dave)):
            view = client.wait(ids[key], timeout_s=180)
            assert view["status"] == "SUCCEEDED", view
        # A reproduction of the finished job with another learning rate, on purpose: its
        # verdict names what changed.
        reproduction = a.call(
            "POST",
            f"/v1/jobs/{ids['finished']}/reproduce",
            {"hyperparameters": {"lr": 0.05}},
        )
        ids["reproduction"] = str(reproduction["id"])
        view = a.wait(ids["reproduction"], timeout_s=180)
        assert view["status"] == "SUCCEEDED", view
        ids["running"] = _submit(
            a,
            code,
            "vision-running",
            experiment="lr-sweep",
            hyperparameters={"lr": 0.02, "steps": 100000, "sleep": 0.25},
            max_runtime_seconds=900,
        )
        living.append((a, ids["running"]))
        _until("the long job runs", lambda: (a.get_job(ids["running"])["step"] or 0) >= 3)
        ids["pending"] = _submit(a, code, "vision-pending", gpus=2)
        living.append((a, ids["pending"]))
        _until(
            "the 2-GPU job has a reason to wait",
            lambda: (a.get_job(ids["pending"])["pending"] or {}).get("reason"),
            60,
        )
        _until("the model is registered", lambda: a.get_job(ids["finished"])["model"], 60)
        _until("the cost is final", lambda: a.get_job(ids["finished"])["cost"]["final"], 60)
        registry = Registry(stack.service_urls["registry"], tokens["a"])
        _until("the reproduction's verdict", lambda: registry.verdict(ids["reproduction"]), 60)
        jobs = {key: (b if key == "other" else a).get_job(job) for key, job in ids.items()}
        yield World(stack, tokens, jobs, shots)
    finally:
        for client, job in living:
            # A test cancels them once it no longer needs them; one that failed first did
            # not, and the next module's jobs would wait for these GPUs.
            with contextlib.suppress(Exception):
                client.cancel(job)
        shutil.rmtree(data, ignore_errors=True)


@dataclass
class Registry:
    """The registry's API as team A reads it (what the dashboard should show)."""

    url: str
    token: str

    def get(self, path: str) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.token}"}
        return httpx.get(f"{self.url}{path}", headers=headers, timeout=10)

    def verdict(self, job_id: str) -> dict[str, Any] | None:
        answer = self.get(f"/v1/jobs/{job_id}/reproduction")
        if answer.status_code == 404:
            return None
        answer.raise_for_status()
        decided: dict[str, Any] = answer.json()
        return decided if decided["verdict"] else None


# --- driving the browser ------------------------------------------------------------------


def wait(driver: Any, what: str, check: Callable[[Any], Any], timeout_s: float = WAIT_S) -> Any:
    """``check`` asked until it answers truly; an element it reads that the page replaced
    meanwhile (a re-render: "stale element reference") or not shown yet is asked again, not a
    failure (a CI run failed on a header re-rendered between finding it and reading it)."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        return WebDriverWait(
            driver,
            timeout_s,
            poll_frequency=0.2,
            ignored_exceptions=(NoSuchElementException, StaleElementReferenceException),
        ).until(check)
    except Exception as exc:
        body = driver.find_element("tag name", "body").text[:3000]
        raise AssertionError(f"{what} (page text: {body!r})") from exc


def login(driver: Any, world: World, who: str) -> None:
    driver.get(f"{world.stack.submission_url}/ui/")
    driver.execute_script("sessionStorage.clear()")
    driver.get("about:blank")  # a fresh page load: nothing of the last session in memory
    driver.get(f"{world.stack.submission_url}/ui/#/jobs")
    field = wait(driver, "the sign-in form", lambda d: d.find_elements("id", "token"))[0]
    field.send_keys(world.tokens[who])
    driver.find_element("css selector", "#login button[type=submit]").click()
    wait(driver, "signed in", lambda d: d.find_elements("id", "logout"))


def visit(driver: Any, route: str, ready: str, timeout_s: float = WAIT_S) -> str:
    """Go to ``#route`` and wait until ``ready`` (text) shows; return the page's text."""
    driver.execute_script("location.hash = arguments[0]", route)
    wait(
        driver,
        f"{route}: {ready!r} shown",
        lambda d: (
            ready in d.find_element("tag name", "body").text
            and not d.find_elements("css selector", "main > .loading, .page > .loading")
        ),
        timeout_s,
    )
    text: str = driver.find_element("tag name", "body").text
    return text


def shot(driver: Any, world: World, name: str) -> None:
    driver.save_screenshot(str(world.shots / f"{name}.png"))


def script_errors(driver: Any) -> list[str]:
    """The console's uncaught errors and content-policy refusals since the last call (a
    refused call, such as the 403 of an operator view, is expected and not counted)."""
    return [
        entry["message"]
        for entry in driver.get_log("browser")
        if entry["level"] == "SEVERE"
        and ("Uncaught" in entry["message"] or "Content Security Policy" in entry["message"])
    ]


def money(amount: float, currency: str | None) -> str:
    """The dashboard's own formatting (ui.js ``money``): below 0.1, two significant digits."""
    if not currency and amount == 0:
        return "—"  # nothing billed
    magnitude = abs(amount)
    if magnitude == 0 or magnitude >= 0.1:
        text = f"{amount:.2f}"
    elif magnitude < 1e-6:
        text = "> -0.000001" if amount < 0 else "< 0.000001"
    else:
        decimals = min(6, 1 - math.floor(math.log10(magnitude)))
        text = f"{amount:.{decimals}f}"
        text = text[: text.index(".") + 3] + text[text.index(".") + 3 :].rstrip("0")
    return f"{text} {currency}" if currency else text


def registry_has_experiments(world: World) -> bool:
    url = world.stack.service_urls["registry"]
    answer = httpx.get(
        f"{url}/v1/experiments", headers={"Authorization": f"Bearer {world.tokens['a']}"}
    )
    return answer.status_code == 200


# --- the pages ----------------------------------------------------------------------------


def test_every_page_shows_what_a_person_looks_for(browser: Any, world: World) -> None:
    driver, jobs = browser, world.jobs
    finished, running, pending = jobs["finished"], jobs["running"], jobs["pending"]
    login(driver, world, "a")

    text = visit(driver, "/jobs", "vision-pending")
    for job in (finished, running, pending):
        assert job["name"] in text and job["id"][:8] in text
    row = driver.find_element("xpath", f"//tr[.//a[@title='{finished['id']}']]").text
    assert "succeeded" in row
    assert money(finished["cost"]["cost"], finished["cost"]["currency"]) in row
    shot(driver, world, "jobs")
    driver.find_element("id", "status-filter").send_keys("pending")
    wait(
        driver,
        "the status filter",
        lambda d: "vision-finished" not in d.find_element("id", "jobs").text,
    )
    assert "vision-pending" in driver.find_element("id", "jobs").text

    # The finished job: its loss curve, checkpoints, model, cost, timeline and output.
    text = visit(driver, f"/jobs/{finished['id']}", "training done at step 40", 30)
    assert "Checkpoints" in text and "Timeline" in text
    wait(
        driver,
        "the loss chart",
        lambda d: (
            d.find_elements("css selector", "figure.chart[data-metric=loss] canvas")
            or "loss" in d.find_element("id", "charts").text
        ),
    )
    assert driver.find_element("id", "job-cost").text == money(
        finished["cost"]["cost"], finished["cost"]["currency"]
    )
    checkpoint_rows = driver.find_elements("css selector", "#checkpoints tbody tr")
    assert len(checkpoint_rows) == len(finished["checkpoints"]) >= 1
    model = finished["model"]
    assert driver.find_element("id", "model-link").text == f"{model['name']} v{model['version']}"
    assert "succeeded" in driver.find_element("id", "timeline").text
    shot(driver, world, "job-finished")

    # The pending job: why it waits, who blocks it, the suggestion, the estimated start.
    text = visit(driver, f"/jobs/{pending['id']}", "Why it waits")
    assert driver.find_element("id", "pending-reason").text == pending["pending"]["reason"]
    if pending["pending"]["blocking"]:
        assert driver.find_element("id", "pending-blocking").text == pending["pending"]["blocking"]
    if pending["pending"]["suggestion"]:
        assert (
            driver.find_element("id", "pending-suggestion").text == pending["pending"]["suggestion"]
        )
    assert driver.find_element("id", "estimated-start").text
    shot(driver, world, "job-pending")

    # The running job: following its output.
    visit(driver, f"/jobs/{running['id']}", "following")
    assert "running" in driver.find_element("id", "job-stats").text
    shot(driver, world, "job-running")

    # The team's queue (a team admin is no operator): its waiting line, with the reason.
    text = visit(driver, "/queues", "vision-pending")
    assert pending["pending"]["reason"] in text

    # The model: versions and the lineage graph back to the job.
    href = f"/models/vision/{model['name']}"
    visit(driver, "/models", model["name"])
    text = visit(driver, href, "Lineage of")
    kinds = {
        node.get_attribute("data-kind")
        for node in driver.find_elements("css selector", "#lineage g.node")
    }
    assert {"code", "environment", "job", "checkpoint", "model"} <= kinds
    assert finished["id"][:8] in driver.find_element("id", "lineage").text
    shot(driver, world, "model-lineage")

    # Costs: the team's total is what billing says.
    text = visit(driver, "/costs", "By user")
    assert "alice" in text and "Most expensive jobs" in text
    shot(driver, world, "costs")

    # Experiments: runs side by side, or a clear word that this server has none.
    if registry_has_experiments(world):
        visit(driver, "/experiments", "lr-sweep")
        driver.find_element("link text", "lr-sweep").click()
        wait(
            driver,
            "the comparison",
            lambda d: d.find_elements("css selector", "#comparison figure.chart"),
        )
        text = driver.find_element("tag name", "body").text
        assert "vision-finished" in text and "vision-running" in text
        assert "lr" in driver.find_element("id", "parameters").text
        # A member tags a run in place (a cross-origin PUT to the registry, preflight and all).
        driver.find_element("css selector", "input.tag-input").send_keys("baseline\n")
        wait(
            driver,
            "the new tag",
            lambda d: any("baseline" in t.text for t in d.find_elements("css selector", ".tag")),
        )
        shot(driver, world, "experiment")
    else:
        visit(driver, "/experiments", "not available on this server")

    # Signing out forgets the token at once.
    driver.find_element("id", "logout").click()
    wait(driver, "the sign-in form", lambda d: d.find_elements("id", "token"))
    assert driver.execute_script("return sessionStorage.length") == 0

    # The operator's jobs: every team's, with a Team column; the team filter narrows them.
    from selenium.webdriver.common.keys import Keys

    login(driver, world, "operator")
    visit(driver, "/jobs", "Every team: newest first.")
    headers = [th.text for th in driver.find_elements("css selector", "#jobs thead th")]
    assert headers[:2] == ["Team", "Status"], headers
    team_filter = driver.find_element("id", "team-filter")
    for team, ours, theirs in (
        ("audio", world.jobs["other"], finished),
        ("vision", finished, world.jobs["other"]),
    ):
        team_filter.clear()
        team_filter.send_keys(team, Keys.ENTER)
        wait(
            driver,
            f"team {team}'s jobs only",
            lambda d, ours=ours, theirs=theirs: (
                ours["name"] in d.find_element("id", "jobs").text
                and theirs["name"] not in d.find_element("id", "jobs").text
            ),
        )
        cells = driver.find_elements("css selector", "#jobs tbody td:first-child")
        assert cells and {cell.text for cell in cells} == {team}
    assert "Team vision: newest first." in driver.find_element("tag name", "body").text

    # The operator's cluster view: queues and the GPU grid with the running job on a GPU.
    visit(driver, "/nodes", "GPUs allocated")
    cells = driver.find_elements("css selector", ".gpu.used a")
    assert running["id"][:8] in {cell.text for cell in cells}
    shot(driver, world, "nodes")
    text = visit(driver, "/queues", pending["id"][:8])
    assert "default:vision" in text and pending["pending"]["reason"] in text
    shot(driver, world, "queues")
    assert not script_errors(driver)


SHARED = "audio-shared"
"""Team B's model made from its job's checkpoint (named unlike the job), granted to team A
by the tests that need it."""


@pytest.fixture(scope="module")
def shared_model(world: World) -> str:
    """``SHARED``, registered by team B from its finished job (granted to no one yet)."""
    registry = world.stack.service_urls["registry"]
    made = httpx.post(
        f"{registry}/v1/models/audio/{SHARED}/versions",
        json={"job_id": world.jobs["other"]["id"]},
        headers={"Authorization": f"Bearer {world.tokens['b']}"},
        timeout=10,
    )
    assert made.status_code == 201, made.text
    return SHARED


def grant(world: World, model: str, *, granted: bool) -> None:
    """Team B grants ``model`` to team A (``vision``), or revokes it, by the registry's API."""
    registry = world.stack.service_urls["registry"]
    answer = httpx.request(
        "PUT" if granted else "DELETE",
        f"{registry}/v1/models/audio/{model}/grants/vision",
        headers={"Authorization": f"Bearer {world.tokens['b']}"},
        timeout=10,
    )
    assert answer.status_code == 200 and answer.json()["granted"] is granted, answer.text


def test_team_a_sees_nothing_of_team_b(browser: Any, world: World, shared_model: str) -> None:
    """Nothing of team B's reaches team A's pages but the model B granted to A: listed, and
    its page readable, without B's job, its name, experiment or user."""
    driver, jobs = browser, world.jobs
    other = jobs["other"]
    secrets = (other["id"], other["id"][:8], other["name"], "audio-only", "bob")
    grant(world, shared_model, granted=True)
    login(driver, world, "a")
    model = jobs["finished"]["model"]
    pages = [
        ("/jobs", "vision-pending"),
        (f"/jobs/{jobs['finished']['id']}", "training done"),
        (f"/jobs/{jobs['running']['id']}", "following"),
        (f"/jobs/{jobs['pending']['id']}", "Why it waits"),
        (f"/jobs/{jobs['reproduction']['id']}", "Reproduction of"),
        ("/experiments", "Experiments"),
        ("/queues", "vision-pending"),
        ("/nodes", "Nodes"),
        ("/models", shared_model),
        (f"/models/vision/{model['name']}", "Lineage of"),
        (f"/models/audio/{shared_model}", "Lineage of"),
        ("/costs", "By user"),
        ("/waste", "Jobs that wasted most"),
        ("/budgets", "for this UTC month"),
    ]
    try:
        for route, ready in pages:
            visit(driver, route, ready, 30)
            time.sleep(0.3)  # let refreshes and late sections land
            source = driver.page_source
            leaked = [s for s in secrets if s in source]
            assert not leaked, f"{route} shows team B's {leaked}"
        # The granted model's lineage is read to its end: B's job is named by its team only.
        visit(driver, f"/models/audio/{shared_model}", "Lineage of")
        wait(driver, "the upstream tree", lambda d: d.find_elements("css selector", "#upstream li"))
        assert "a job of team audio" in driver.find_element("id", "lineage").text
        # The registry shows A no lineage of B's: what reproducing it takes is B's.
        assert "team audio" in driver.find_element("id", "owner-work").text
        leaked = [s for s in secrets if s in driver.page_source]
        assert not leaked, f"the granted model's page shows team B's {leaked}"
    finally:
        grant(world, shared_model, granted=False)
    # B's job by its id answers as a job that does not exist.
    text = visit(driver, f"/jobs/{other['id']}", "No such job")
    assert other["name"] not in text
    visit(driver, "/models/audio/audio-secret-run", "No such model")
    assert not script_errors(driver)


SCALE_JOBS = 10_000


async def _insert_jobs(dsn: str, team: str, template_id: str, count: int) -> None:
    """``count`` ended jobs of ``team`` straight into the submission schema (each a copy of
    ``template_id``'s spec), a second apart: a team with a long history."""
    conn = await asyncpg.connect(dsn, server_settings={"search_path": "submission"})
    try:
        await conn.execute(
            """
            INSERT INTO jobs (id, team_id, user_id, name, spec, status, submitted_at,
                              updated_at, started_at, finished_at)
            SELECT gen_random_uuid()::text, u.team_id, u.id, 'sweep-' || n, j.spec,
                   'CANCELLED', now() - make_interval(secs => n), now(), NULL,
                   now() - make_interval(secs => n) + interval '1 second'
            FROM generate_series(1, $3::int) AS n,
                 users u JOIN teams t ON t.id = u.team_id,
                 jobs j
            WHERE t.name = $1 AND j.id = $2
            """,
            team,
            template_id,
            count,
        )
    finally:
        await conn.close()


def test_ten_thousand_jobs_list_a_page_at_a_time(browser: Any, world: World) -> None:
    """A team with 10,000 jobs: the first 50 show at once, each "Load more" adds 50 more, and
    no request ever asks for more than a page (the API's keyset cursor). What keeps the page fast
    is that bound, which is what this checks; how fast it is belongs in a benchmark, not here
    (the machines that run tests are shared)."""
    driver = browser
    world.tokens["scale"] = world.stack.bootstrap_admin("scale", "carol")
    asyncio.run(
        _insert_jobs(world.stack.database_url, "scale", world.jobs["finished"]["id"], SCALE_JOBS)
    )
    login(driver, world, "scale")
    visit(driver, "/jobs", "sweep-50 ")
    rows = lambda d: len(d.find_elements("css selector", "#jobs tbody tr"))  # noqa: E731
    assert rows(driver) == 50 and "50 shown" in driver.find_element("tag name", "body").text
    for pages in (2, 3):
        driver.find_element("id", "more").click()
        wait(driver, f"{pages * 50} rows", lambda d, n=pages * 50: rows(d) == n)
    text = driver.find_element("id", "jobs").text
    assert "sweep-150" in text and "sweep-151" not in text
    asked = driver.execute_script(
        "return performance.getEntriesByType('resource').map(e => e.name)"
        ".filter(n => n.includes('/v1/jobs?'))"
    )
    assert asked and all("limit=50" in url for url in asked), asked
    shot(driver, world, "jobs-10000")
    assert not script_errors(driver)


async def _insert_experiments(dsn: str, team: str, count: int) -> None:
    """``count`` experiments of ``team`` (no runs yet) straight into the registry schema."""
    conn = await asyncpg.connect(dsn, server_settings={"search_path": "registry"})
    try:
        await conn.execute(
            "INSERT INTO experiments (team, project, name, created_at) "
            "SELECT $1, 'many', 'exp-' || lpad(n::text, 3, '0'), now() "
            "FROM generate_series(1, $2::int) AS n",
            team,
            count,
        )
    finally:
        await conn.close()


def test_every_experiment_is_listed_page_after_page(browser: Any, world: World) -> None:
    """A team with 600 experiments: the registry answers at most 500 a page, and the
    experiments page follows its ``next`` cursor to list every one (it showed the first
    page only, so the oldest experiments were missing)."""
    driver = browser
    if not registry_has_experiments(world):
        pytest.skip("this stack's registry has no experiment tracking")
    world.tokens["many"] = world.stack.bootstrap_admin("many", "dora")
    asyncio.run(_insert_experiments(world.stack.database_url, "many", 600))
    login(driver, world, "many")
    visit(driver, "/experiments", "exp-600")
    # The newest experiment comes first, so exp-001 is on the registry's second page.
    names = driver.execute_script(
        "return [...document.querySelectorAll('a.experiment-name')].map(a => a.textContent)"
    )
    assert len(names) == 600 and "exp-001" in names, len(names)
    assert not script_errors(driver)


def test_models_show_aliases_and_lineage_and_costs_are_billings(browser: Any, world: World) -> None:
    """The models page reads the registry's models API (aliases included) and draws the
    version's upstream lineage; the costs page shows billing's exact ``/v1/costs``: the total,
    one column per day of the window, and the spend by project."""
    driver = browser
    model = world.jobs["finished"]["model"]
    headers = {"Authorization": f"Bearer {world.tokens['a']}"}
    registry = world.stack.service_urls["registry"]
    moved = httpx.put(
        f"{registry}/v1/models/vision/{model['name']}/aliases/production",
        json={"version": model["version"]},
        headers=headers,
        timeout=10,
    )
    assert moved.status_code == 200, moved.text
    login(driver, world, "a")
    text = visit(driver, "/models", f"production → v{model['version']}")
    assert model["name"] in text
    visit(driver, f"/models/vision/{model['name']}", "Where v")
    wait(driver, "the upstream tree", lambda d: d.find_elements("css selector", "#upstream li"))
    upstream = driver.find_element("id", "upstream").text
    assert world.jobs["finished"]["id"][:8] in upstream and "registered_as" in upstream
    aliases = [e.text for e in driver.find_elements("css selector", "span.tag.alias")]
    assert aliases == ["production"]
    shot(driver, world, "model-upstream")
    # A version link naming none (a number or not) says so, under the model's versions.
    for version in ("99", "latest"):
        visit(driver, f"/models/vision/{model['name']}/{version}", "Versions")
        wait(
            driver,
            f"v{version}: no such version",
            lambda d: "No such version, or not one" in d.find_element("id", "version").text,
        )

    costs = world.stack.service_urls["billing"]
    # The page's window (costs.js ``window``): the 30 UTC days up to the end of today.
    today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    end = today + timedelta(days=1)
    ours = {"from": (end - timedelta(days=30)).isoformat(), "to": end.isoformat()}
    report = httpx.get(
        f"{costs}/v1/costs",
        params={"group_by": "project", "from": ours["from"], "to": ours["to"]},
        headers=headers,
        timeout=10,
    ).json()
    assert report["rows"], report
    (total,) = report["totals"]
    visit(driver, "/costs", "By project")
    assert driver.find_element("id", "total-cost").text == money(
        float(total["cost"]), total["currency"]
    )
    by_project = driver.find_element("id", "by-project").text
    for row in report["rows"]:
        assert (row["project"] or "(none)") in by_project
    days = driver.find_elements("css selector", "#daily-spend .col")
    assert len(days) == 30
    drawn = sum(float(d.get_attribute("data-cost")) for d in days)
    assert abs(drawn - float(total["cost"])) < 1e-6
    shot(driver, world, "costs")
    assert not script_errors(driver)


def test_model_cost_reproduction_verdict_and_waste(browser: Any, world: World) -> None:
    """What only Trainyard knows, read as a person reads it: what a model version cost to make
    (the registry's ``cost``) and the teams it is granted to; a job's reproducibility record
    and a reproduction's verdict naming what differed; the team's waste figures and job
    success rate, equal to billing's ``/v1/waste``."""
    driver, jobs = browser, world.jobs
    finished, reproduction = jobs["finished"], jobs["reproduction"]
    registry = Registry(world.stack.service_urls["registry"], world.tokens["a"])
    model = finished["model"]
    base = f"/v1/models/vision/{model['name']}"
    granted = httpx.put(
        f"{registry.url}{base}/grants/platform",
        headers={"Authorization": f"Bearer {world.tokens['a']}"},
        timeout=10,
    )
    assert granted.status_code == 200, granted.text

    def costed() -> dict[str, Any] | None:
        version: dict[str, Any] = registry.get(f"{base}/versions/{model['version']}").json()
        done = version["cost"]["complete"] and float(version["cost"]["total"]) > 0
        return version if done else None

    version = _until("the version's cost is complete", costed, 60)
    cost = version["cost"]
    login(driver, world, "a")

    # The model version: its cost to make (own job + upstream) and who it is granted to.
    visit(driver, f"/models/vision/{model['name']}", "Cost to make")
    expected = money(float(cost["total"]), cost["currency"])
    assert driver.find_element("id", "version-cost-total").text == expected
    assert driver.find_element("id", "version-cost-own").text == money(
        float(cost["own_job"]), cost["currency"]
    )
    assert driver.find_element("id", "cost-state").text == "complete"
    assert finished["id"][:8] in driver.find_element("id", "model-cost").text
    row = driver.find_element("css selector", f".version-cost[data-version='{model['version']}']")
    assert row.text == expected
    assert "platform" in driver.find_element("id", "grants").text
    shot(driver, world, "model-cost")

    # The reproduction: its verdict, naming what differed, and its record in four parts.
    verdict = registry.verdict(reproduction["id"])
    assert verdict is not None and verdict["verdict"] == "different", verdict
    visit(driver, f"/jobs/{reproduction['id']}", "Reproduction of")
    wait(
        driver,
        "the verdict",
        lambda d: d.find_elements("css selector", "#verdict-word [data-verdict=different]"),
    )
    assert driver.find_element("id", "verdict-word").text == "different"
    named = {e.text for e in driver.find_elements("css selector", "#differences .difference-field")}
    assert named == {d["field"] for d in verdict["differences"]}
    assert "hyperparameters.lr" in named
    assert finished["id"][:8] in driver.find_element("id", "verdict").text
    record = registry.get(f"/v1/jobs/{reproduction['id']}/record").json()["record"]
    wait(driver, "the record", lambda d: d.find_elements("id", "record-code"))
    assert record["environment"]["python"] in driver.find_element("id", "record-environment").text
    assert record["hardware"]["gpu_flavor"] in driver.find_element("id", "record-hardware").text
    assert "lr=0.05" in driver.find_element("id", "record-data").text
    assert '{"' not in driver.find_element("id", "record").text  # no raw JSON
    shot(driver, world, "job-reproduction")
    driver.execute_script("document.getElementById('record').scrollIntoView()")
    shot(driver, world, "job-record")
    # The original lists its reproduction with the verdict.
    visit(driver, f"/jobs/{finished['id']}", "training done")
    wait(driver, "its reproductions", lambda d: d.find_elements("id", "reproductions"))
    listed = driver.find_element("id", "reproductions").text
    assert reproduction["id"][:8] in listed and "different" in listed

    # Waste: once every job of the team has ended, the figures stop moving; the page shows
    # billing's figures and success rate for the same window.
    client = TrainyardClient(world.stack.submission_url, world.tokens["a"])
    for key in ("pending", "running"):
        client.cancel(jobs[key]["id"])
    billing = world.stack.service_urls["billing"]
    today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    end = today + timedelta(days=1)
    params = {"from": (end - timedelta(days=30)).isoformat(), "to": end.isoformat()}

    def settled() -> dict[str, Any] | None:
        report: dict[str, Any] = httpx.get(
            f"{billing}/v1/waste",
            params=params,
            headers={"Authorization": f"Bearer {world.tokens['a']}"},
            timeout=10,
        ).json()
        ended = sum(s["ended"] for s in report["success"])
        return report if ended == 5 else None  # finished, tuning, reproduction, running, pending

    report = _until("billing has seen every job of the team end", settled, 60)
    succeeded = sum(s["succeeded"] for s in report["success"])
    assert succeeded == 3, report["success"]
    visit(driver, "/costs", "By user")
    driver.find_element("id", "waste-link").click()
    wait(driver, "the waste page", lambda d: d.find_elements("id", "waste-figures"))
    assert driver.find_element("id", "success-rate").text == "60.0 %"
    queueing = [t for t in report["totals"] if t["figure"] == "queueing"]
    assert queueing and float(queueing[0]["gpu_seconds"]) > 0, report["totals"]
    assert driver.find_element("id", "waste-queueing").text == money(
        float(queueing[0]["cost"]), queueing[0]["currency"]
    )
    tiles = driver.find_elements("css selector", "#waste-figures [data-figure]")
    # Unallocated GPUs belong to no team: operators only.
    assert {t.get_attribute("data-figure") for t in tiles} == {
        "idle_gpus",
        "queueing",
        "failed_attempts",
        "platform_failure",
        "lost_work",
        "input_bound",
        "low_priority_holding",
    }
    shot(driver, world, "waste")
    assert not script_errors(driver)

    # An operator sees every team's figures, and the unallocated GPUs, which are no team's.
    login(driver, world, "operator")
    visit(driver, "/waste", "Jobs that wasted most")
    tiles = driver.find_elements("css selector", "#waste-figures [data-figure]")
    assert "unallocated_gpus" in {t.get_attribute("data-figure") for t in tiles}
    assert "Every team" in driver.find_element("tag name", "body").text
    assert not script_errors(driver)


def model_row(driver: Any, team: str, name: str) -> Any:
    """The models list's row of ``team/name`` (None when it is not listed)."""
    rows = driver.find_elements(
        "xpath", f"//tr[.//a[@class='model-name' and @data-team='{team}' and text()='{name}']]"
    )
    return rows[0] if rows else None


def test_a_granted_model_is_listed_for_its_grantee_until_revoked(
    browser: Any, world: World, shared_model: str
) -> None:
    """A model team B granted to team A is on A's models list with its owner and marked
    granted, its page read-only; once B revokes the grant it is gone from the list and its
    page answers as a model that does not exist."""
    driver = browser
    own = world.jobs["finished"]["model"]["name"]
    grant(world, shared_model, granted=True)
    try:
        login(driver, world, "a")
        visit(driver, "/models", shared_model)
        row = model_row(driver, "audio", shared_model)
        assert row is not None
        access = row.find_element("css selector", ".access")
        assert access.get_attribute("data-access") == "granted"
        assert access.text == "granted by audio"
        assert "audio" in [cell.text for cell in row.find_elements("tag name", "td")]
        mine = model_row(driver, "vision", own)
        assert mine is not None
        assert mine.find_element("css selector", ".access").get_attribute("data-access") == "own"
        shot(driver, world, "models")

        row.find_element("css selector", "a.model-name").click()
        wait(driver, "the granted model's page", lambda d: d.find_elements("id", "lineage"))
        assert driver.find_element("id", "grants").text == "shared with your team by audio"
        assert driver.find_element("id", "read-only").text == "read-only"
        versions = driver.find_elements("css selector", ".card table.grid tbody tr")
        assert versions and "a job of team audio" in versions[0].text
        # Its cost counts the owner's job without listing it, and says so (it said "No job
        # billed yet." beside the job's amount).
        hidden = wait(driver, "the cost's note", lambda d: d.find_elements("id", "cost-hidden"))
        assert hidden[0].text == "1 job of other teams counted in the amounts above, not listed."
        assert "No job" not in driver.find_element("id", "model-cost").text
        shot(driver, world, "model-granted")
    finally:
        grant(world, shared_model, granted=False)

    # Revoked: the next reading of the list no longer has it; its page is a 404.
    visit(driver, "/jobs", "vision-finished")
    visit(driver, "/models", own)
    assert model_row(driver, "audio", shared_model) is None
    assert shared_model not in driver.find_element("tag name", "body").text
    visit(driver, f"/models/audio/{shared_model}", "No such model")
    assert not script_errors(driver)


@dataclass
class Costs:
    """Billing's ``/v1/costs`` for one window, as team A reads it: the pieces the page shows."""

    total: tuple[float, str]
    """the amount, and as the page writes it (``money``)"""
    days: dict[str, float]
    by_day_project: dict[tuple[str, str], float]
    by_day_user: dict[tuple[str, str], float]
    by_project: dict[str, tuple[str, str]]
    by_user: dict[str, tuple[str, str]]
    """project or user: its cost as billing's decimal and as the page writes it (``money``)."""


def billing_costs(world: World, days: int) -> Costs:
    """The report behind the costs page's window of ``days`` UTC days up to the end of today
    (costs.js ``window``)."""
    end = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0) + timedelta(1)
    window = {"from": (end - timedelta(days=days)).isoformat(), "to": end.isoformat()}

    def report(**query: str) -> dict[str, Any]:
        answer = httpx.get(
            f"{world.stack.service_urls['billing']}/v1/costs",
            params={**window, **query},
            headers={"Authorization": f"Bearer {world.tokens['a']}"},
            timeout=10,
        )
        answer.raise_for_status()
        body: dict[str, Any] = answer.json()
        assert not body["truncated"], body
        return body

    (totals,) = report()["totals"]  # one currency
    day_project = report(granularity="day", group_by="project")["rows"]
    day_user = report(granularity="day", group_by="team,user")["rows"]
    first = (end - timedelta(days=days)).date()
    daily = {str(first + timedelta(i)): 0.0 for i in range(days)}
    for row in day_project:
        daily[row["bucket"][:10]] += float(row["cost"])
    return Costs(
        total=(float(totals["cost"]), money(float(totals["cost"]), totals["currency"])),
        days=daily,
        by_day_project={
            (r["bucket"][:10], r["project"] or "(none)"): float(r["cost"]) for r in day_project
        },
        by_day_user={(r["bucket"][:10], r["user"]): float(r["cost"]) for r in day_user},
        by_project={
            r["project"] or "(none)": (r["cost"], money(float(r["cost"]), r["currency"]))
            for r in report(group_by="project")["rows"]
        },
        by_user={
            r["user"]: (r["cost"], money(float(r["cost"]), r["currency"]))
            for r in report(group_by="team,user")["rows"]
        },
    )


def page_costs(driver: Any) -> Costs:
    """The same pieces read back from the costs page."""

    def pieces(chart: str) -> dict[tuple[str, str], float]:
        return {
            (
                seg.find_element("xpath", "../..").get_attribute("data-day"),
                seg.get_attribute("data-key"),
            ): float(seg.get_attribute("data-cost"))
            for seg in driver.find_elements("css selector", f"#{chart} .seg")
        }

    def table(breakdown: str) -> dict[str, tuple[str, str]]:
        costs = {}
        for row in driver.find_elements("css selector", f"#{breakdown} tbody tr"):
            cost = row.find_element("css selector", ".breakdown-cost")
            key = row.find_element("css selector", ".breakdown-key").text
            costs[key] = (cost.get_attribute("data-cost"), cost.text)
        return costs

    total = driver.find_element("id", "total-cost")
    return Costs(
        total=(float(total.get_attribute("data-cost")), total.text),
        days={
            col.get_attribute("data-day"): float(col.get_attribute("data-cost"))
            for col in driver.find_elements("css selector", "#daily-spend .col")
        },
        by_day_project=pieces("daily-spend"),
        by_day_user=pieces("daily-by-user"),
        by_project=table("by-project"),
        by_user=table("by-user"),
    )


def assert_same_costs(page: Costs, billing: Costs) -> None:
    """Equal figures: amounts the page summed itself to a millionth (billing's places)."""

    def close(a: dict[Any, float], b: dict[Any, float], what: str) -> None:
        assert a.keys() == b.keys(), (what, sorted(a), sorted(b))
        off = {k: (a[k], b[k]) for k in a if abs(a[k] - b[k]) > 1e-6}
        assert not off, (what, off)

    assert page.total[1] == billing.total[1]
    close({"total": page.total[0]}, {"total": billing.total[0]}, "total")
    close(page.days, billing.days, "cost per day")
    close(page.by_day_project, billing.by_day_project, "per day by project")
    close(page.by_day_user, billing.by_day_user, "per day by user")
    assert page.by_project == billing.by_project
    assert page.by_user == billing.by_user


def test_costs_by_project_and_user_over_time_are_billings(browser: Any, world: World) -> None:
    """The costs page over 30 and 7 days: its total, the spend of each day, each day's spend
    per project and per user, and the window's spend per project and per user are billing's
    ``/v1/costs`` for the same window. Each window is read again when billing's answer moved
    while the page loaded (a job's bill landing), so only equal figures pass."""
    driver = browser
    login(driver, world, "a")
    for days in (30, 7):
        for _attempt in range(5):
            before = billing_costs(world, days)
            visit(driver, "/jobs", "vision-finished")
            visit(driver, f"/costs/{days}", "By user")
            page = page_costs(driver)
            if billing_costs(world, days) == before:
                break
        assert len(page.days) == days
        assert before.by_day_project and before.by_project and before.by_user
        assert_same_costs(page, before)
        active = driver.find_element("css selector", "#cost-range a.active")
        assert active.get_attribute("data-days") == str(days)
        if days == 30:
            shot(driver, world, "costs")
            driver.execute_script("document.getElementById('by-project').scrollIntoView()")
            shot(driver, world, "costs-breakdown")
    assert not script_errors(driver)


def budgets(world: World, who: str, method: str = "GET", path: str = "", **body: str) -> Any:
    """Billing's ``/v1/budgets[path]`` as ``who`` reads (or sets, or deletes) it."""
    answer = httpx.request(
        method,
        f"{world.stack.service_urls['billing']}/v1/budgets{path}",
        json=body or None,
        headers={"Authorization": f"Bearer {world.tokens[who]}"},
        timeout=10,
    )
    assert answer.status_code in (200, 201, 204), answer.text
    return answer.json() if answer.content else None


def figures(views: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """What a budget view says of money (its forecast moves with the clock)."""
    fields = ("team", "project", "amount", "spent", "remaining", "percent_spent", "exhausted")
    return [tuple(view[f] for f in fields) for view in views]


def page_budgets(driver: Any) -> dict[tuple[str, str | None], dict[str, str]]:
    """The budgets page's rows by (team, project): each figure as written, its amount as
    billing's decimal (``data-amount``), the mark and the policy."""
    found = {}
    for row in driver.find_elements("css selector", "#budgets tbody tr"):
        team, project = (td.text for td in row.find_elements("css selector", "td")[:2])

        def text(css: str, row: Any = row) -> str:
            value: str = row.find_element("css selector", css).text
            return value

        found[(team, None if project == "whole team" else project)] = {
            **{f: text(f".budget-{f}") for f in ("limit", "spent", "remaining", "percent")},
            **{
                f"{f}_amount": row.find_element("css selector", f".budget-{f}").get_attribute(
                    "data-amount"
                )
                for f in ("limit", "spent", "remaining")
            },
            "mark": row.find_element("css selector", "[data-standing]").get_attribute(
                "data-standing"
            ),
            "policy": text(".budget-policy"),
        }
    return found


def test_budgets_show_limit_spent_remaining_and_the_exhausted_mark(
    browser: Any, world: World
) -> None:
    """Team A's admin sets a budget for the team below what it spent this month (``warn``)
    and one for project ``tuning`` at about nine tenths spent (``deprioritize``) through
    billing's API. Reached from the costs page, each budget's limit, spent, remaining and
    share are billing's (as the dashboard writes money), the team's marked exhausted with
    what happens to its next job, the project's near its limit; an operator sees both; a
    member of team B sees neither, and that team B has no budget."""
    driver = browser
    client = TrainyardClient(world.stack.submission_url, world.tokens["a"])
    # Spending that stops moving: every job of team A ended (the waste test ends them).
    for key in ("pending", "running"):
        with contextlib.suppress(Exception):
            client.cancel(world.jobs[key]["id"])
    # A running job's spending grows until its bill replaces it.
    _until(
        "the long job's bill is made",
        lambda: client.get_job(world.jobs["running"]["id"])["cost"]["final"],
        60,
    )
    places = Decimal("0.000001")
    try:
        # The tuning job's bill: the project's spending this month.
        budgets(world, "a", "PUT", "/vision/tuning", amount="1000000", policy="deprioritize")
        spent = Decimal(
            _until(
                "the tuning job is billed",
                lambda: (
                    (s := budgets(world, "a", path="/vision/tuning")["spent"])
                    and Decimal(s) > 0
                    and s
                ),
                60,
            )
        )
        near = (spent / Decimal("0.9")).quantize(places, rounding=ROUND_CEILING)
        budgets(world, "a", "PUT", "/vision/tuning", amount=str(near), policy="deprioritize")
        below = max((spent / 2).quantize(places), places)  # the team spent the project's and more
        budgets(world, "a", "PUT", "/vision", amount=str(below), policy="warn")

        login(driver, world, "a")
        for _attempt in range(5):
            before = budgets(world, "a")
            visit(driver, "/costs", "By user")
            driver.find_element("id", "budgets-link").click()
            wait(driver, "the budgets", lambda d: d.find_elements("css selector", "#budgets tr"))
            page = page_budgets(driver)
            if figures(budgets(world, "a")) == figures(before):
                break  # no bill landed while the page loaded
        else:
            raise AssertionError(f"billing's budgets kept moving: {before}")
        assert page.keys() == {("vision", None), ("vision", "tuning")}, page
        for budget in before:
            row, currency = page[(budget["team"], budget["project"])], budget["currency"]
            assert row["limit"] == money(float(budget["amount"]), currency)
            assert row["spent"] == money(float(budget["spent"]), currency)
            assert row["remaining"] == money(float(budget["remaining"]), currency)
            assert row["percent"] == f"{budget['percent_spent']} %"
            assert (row["limit_amount"], row["spent_amount"], row["remaining_amount"]) == (
                budget["amount"],
                budget["spent"],
                budget["remaining"],
            )
        team, project = page[("vision", None)], page[("vision", "tuning")]
        assert Decimal(team["limit_amount"]) == below and Decimal(team["remaining_amount"]) == 0
        assert team["mark"] == "exhausted" and team["policy"] == "warn"
        assert Decimal(project["limit_amount"]) == near and project["mark"] == "near"
        assert project["policy"] == "deprioritize"
        text = driver.find_element("tag name", "body").text
        assert "A budget is spent for this month." in text
        assert "team vision: warn, new jobs are let in with a warning." in text
        shot(driver, world, "budgets")
        assert not script_errors(driver)

        login(driver, world, "operator")
        visit(driver, "/budgets", "Every team's budgets")
        assert {("vision", None), ("vision", "tuning")} <= page_budgets(driver).keys()

        # Another team's member: none of team A's, and plainly no budget of their own.
        login(driver, world, "b")
        text = visit(driver, "/budgets", "No budget set for team audio.")
        assert not driver.find_elements("css selector", "#budgets")
        assert "vision" not in driver.page_source and "tuning" not in driver.page_source
        assert not script_errors(driver)
    finally:
        for path in ("/vision/tuning", "/vision"):
            with contextlib.suppress(AssertionError):
                budgets(world, "a", "DELETE", path)

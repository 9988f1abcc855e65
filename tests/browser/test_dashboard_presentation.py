"""How the dashboard presents what it shows: amounts, long names in charts, colours.

The package's local stack (tests/browser/conftest.py), with the CPU flavor repriced for this
module's jobs so that seconds of CPU cost a few hundred-thousandths of a dollar (the price in
force before is put back after). Team design has two short runs of experiment ``long-sweep``
with 100-character names, each reporting the loss and a metric with a long key (the first
registers a model), and a job that asks for more GPUs than the runner has, so it waits for
good (nothing billed). Each test drives headless Chromium as a person would and checks what
they would read.
"""

from __future__ import annotations

import itertools
import json
import shutil
import tempfile
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.browser.conftest import PRICES, RUNNER_GPUS, WINDOW
from tests.browser.test_dashboard import _until, script_errors, visit, wait
from trainyard.bundle import pack
from trainyard.client import TrainyardClient
from trainyard_platform.deploy.local.stack import LocalStack

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

LONG_KEY = "validation_loss_on_the_held_out_set_of_every_camera_" + "k" * 40
"""A metric key far wider than a chart's legend has room for."""
RUN = "sweep-run-" + "r" * 90
"""A run of experiment ``long-sweep``, as long as a job name may be (100 characters)."""
TRAIN = textwrap.dedent(
    f"""
    import torch
    from trainyard import sdk

    ctx = sdk.init({{"lr": 0.1}})
    loss = 2.0
    for step in range(1, 11):
        loss *= 1.0 - float(ctx.hyperparameters["lr"])
        ctx.report_metrics(step, **{{"loss": loss, {LONG_KEY!r}: loss / 2}})
    ctx.save_checkpoint(10, {{"w": torch.full((2,), loss)}})
    """
)
PRICE = "0.01"
"""A cent a GPU-hour: a run of ten seconds costs a few hundred-thousandths of a dollar."""


@dataclass
class Stack:
    stack: LocalStack
    token: str
    operator: str
    runs: list[dict[str, Any]]
    """The two finished runs' views (their costs are tiny)."""
    waiting: str
    """A job that waits for good: nothing of it is billed."""

    @property
    def url(self) -> str:
        return self.stack.submission_url


def _price_cpu(stack: LocalStack, operator: str, price: str) -> None:
    """Price the CPU flavor's GPU-hour at ``price`` from now on (billing's price book)."""
    answer = httpx.put(
        f"{stack.service_urls['billing']}/v1/prices/cpu",
        json={"price_per_gpu_hour": price},
        headers={"Authorization": f"Bearer {operator}"},
        timeout=30,
    )
    assert answer.status_code in (200, 201), answer.text


@pytest.fixture(scope="module")
def priced(stack: LocalStack) -> Iterator[Stack]:
    data = Path(tempfile.mkdtemp(prefix="trainyard-browser-"))
    project = data / "project"
    project.mkdir()
    (project / "train.py").write_text(TRAIN)
    token = stack.bootstrap_admin("design", "pia")
    operator = stack.bootstrap_admin("platform", "olga", role="operator")
    _price_cpu(stack, operator, PRICE)
    try:
        client = TrainyardClient(stack.submission_url, token)
        bundle = pack(project, out_dir=data)
        client.upload_bundle(bundle.path, bundle.sha256)
        code = {"kind": "bundle", "sha256": bundle.sha256, "size_bytes": bundle.size_bytes}
        ids = [
            str(
                client.submit(
                    {
                        "name": RUN[:-1] + str(i),
                        "gpus": 1,
                        "gpu_flavor": "cpu",
                        "entrypoint": "train.py",
                        "code": code,
                        "experiment": "long-sweep",
                        "hyperparameters": {"lr": lr},
                        # The first registers a model (named as long as the run): the
                        # models page and a version's lineage graph have something.
                        "register_model": i == 1,
                    }
                )["id"]
            )
            for i, lr in ((1, 0.1), (2, 0.2))
        ]
        for job in ids:
            assert client.wait(job, timeout_s=180)["status"] == "SUCCEEDED"
        _until(
            "the costs are final",
            lambda: all(client.get_job(job)["cost"]["final"] for job in ids),
            60,
        )
        waiting = client.submit(
            {
                "name": "waits-in-design",
                "gpus": RUNNER_GPUS + 1,
                "gpu_flavor": "cpu",
                "command": ["true"],
            }
        )
        _until("the model is registered", lambda: client.get_job(ids[0])["model"], 60)
        runs = [client.get_job(job) for job in ids]
        yield Stack(stack, token, operator, runs, str(waiting["id"]))
        # The waiting job is of no use to the modules after this one.
        client.cancel(str(waiting["id"]))
    finally:
        _price_cpu(stack, operator, str(json.loads(PRICES)["cpu"]))
        shutil.rmtree(data, ignore_errors=True)


@pytest.fixture
def spent_budget(priced: Stack) -> Iterator[None]:
    """Team design's budget, a millionth of a dollar (``warn``): spent, so the budgets page
    shows its table, the exhausted mark and the message above it. Deleted after."""
    url = f"{priced.stack.service_urls['billing']}/v1/budgets/design"
    headers = {"Authorization": f"Bearer {priced.token}"}
    body = {"amount": "0.000001", "policy": "warn"}
    answer = httpx.put(url, json=body, headers=headers, timeout=30)
    assert answer.status_code in (200, 201) and answer.json()["exhausted"], answer.text
    try:
        yield
    finally:
        httpx.delete(url, headers=headers, timeout=30)


def sign_in(driver: Any, priced: Stack, route: str = "/jobs", token: str | None = None) -> None:
    driver.get(f"{priced.url}/ui/")
    driver.execute_script("sessionStorage.clear()")
    driver.get("about:blank")
    driver.get(f"{priced.url}/ui/#{route}")
    field = wait(driver, "the sign-in form", lambda d: d.find_elements("id", "token"))[0]
    field.send_keys(token or priced.token)
    driver.find_element("css selector", "#login button[type=submit]").click()
    wait(driver, "signed in", lambda d: d.find_elements("id", "logout"))


def cell(driver: Any, job_id: str, column: str) -> str:
    """The text of the jobs list's ``column`` in ``job_id``'s row."""
    titles = [th.text for th in driver.find_elements("css selector", "#jobs thead th")]
    row = driver.find_element("xpath", f"//tr[.//a[@title='{job_id}']]")
    text: str = row.find_elements("css selector", "td")[titles.index(column)].text
    return text


def amount(text: str) -> float:
    """The number of a money amount as the page writes it ("0.000031 USD")."""
    return float(text.split()[0])


def test_a_tiny_cost_is_shown_as_what_it_is(browser: Any, priced: Stack) -> None:
    """A run of ten seconds at a cent a GPU-hour costs a few hundred-thousandths of a
    dollar: the job's page and the jobs list say that amount (two significant digits), not
    ``0.0000 USD``, the list on one line."""
    driver = browser
    run = priced.runs[0]
    cost, currency = run["cost"]["cost"], run["cost"]["currency"]
    assert 0 < cost < 0.001, run["cost"]
    sign_in(driver, priced, f"/jobs/{run['id']}")
    shown = wait(driver, "the job's cost", lambda d: d.find_elements("id", "job-cost"))[0].text
    assert shown.endswith(f" {currency}")
    assert amount(shown) == pytest.approx(cost, rel=0.05), shown
    visit(driver, "/jobs", "waits-in-design")
    shown = cell(driver, run["id"], "Cost")
    assert amount(shown) == pytest.approx(cost, rel=0.05), shown
    # The amount and its currency on one line, however narrow the column.
    lines = driver.execute_script(
        "const range = document.createRange(); range.selectNodeContents(arguments[0]);"
        "return new Set([...range.getClientRects()].map((r) => Math.round(r.top))).size",
        driver.find_element("xpath", f"//tr[.//a[@title='{run['id']}']]/td[.='{shown}']"),
    )
    assert lines == 1, f"{shown!r} is written on {lines} lines"
    assert not script_errors(driver)


def test_a_cost_with_nothing_billed_is_not_a_bare_number(browser: Any, priced: Stack) -> None:
    """A job that waits has nothing billed, so no currency either: its page and its row say
    "—" (its page: "nothing billed yet"), never a bare ``0.00`` with no currency."""
    driver = browser
    sign_in(driver, priced, f"/jobs/{priced.waiting}")
    wait(driver, "why it waits", lambda d: d.find_elements("id", "pending-reason"))
    assert driver.find_element("id", "job-cost").text == "—"
    stat = driver.find_element("xpath", "//div[@class='stat'][.//span[@id='job-cost']]").text
    assert "nothing billed yet" in stat
    visit(driver, "/jobs", "waits-in-design")
    assert cell(driver, priced.waiting, "Cost") == "—"
    assert not script_errors(driver)


LABELS = """
return [...document.querySelectorAll('figure.chart')].flatMap((figure) => {
  const box = figure.getBoundingClientRect();
  const labels = figure.querySelectorAll('figcaption .chart-title, .u-legend .u-series .u-label');
  return [...labels].map((e) => {
    const r = e.getBoundingClientRect();
    return {text: e.textContent, title: e.title, inside: r.left >= box.left - 1 && r.right <= box.right + 1,
            cut: e.scrollWidth > e.clientWidth, ellipsis: getComputedStyle(e).textOverflow === 'ellipsis'};
  });
});
"""
"""Each chart's title and legend labels: their text, tooltip, whether they lie within the
chart and whether they are cut (and with "…")."""


def chart_labels(driver: Any) -> list[dict[str, Any]]:
    labels: list[dict[str, Any]] = driver.execute_script(LABELS)
    return labels


def readable(labels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The labels a person cannot read whole: outside the chart (clipped by it), or cut
    without "…" or without the whole name in the tooltip."""
    return [
        label
        for label in labels
        if not label["inside"]
        or (label["cut"] and (not label["ellipsis"] or label["title"] != label["text"]))
    ]


@pytest.mark.parametrize("width", [1360, 390])
def test_a_chart_names_each_series_whole_or_cut_with_an_ellipsis(
    browser: Any, priced: Stack, width: int
) -> None:
    """A job's chart titled with a long metric key, and an experiment's charts whose legend
    names 100-character runs: every title and legend label lies within its chart, and one
    cut for room ends in "…" with the whole name as its tooltip (wide and phone-wide)."""
    driver = browser
    driver.set_window_size(width, 900)
    try:
        sign_in(driver, priced, f"/jobs/{priced.runs[0]['id']}")
        wait(
            driver,
            "the long key's chart",
            lambda d: d.find_elements("css selector", "figure.chart .u-legend"),
        )
        labels = chart_labels(driver)
        assert LONG_KEY in [label["text"] for label in labels], labels
        assert not readable(labels), readable(labels)

        visit(driver, "/experiments", "long-sweep")
        driver.find_element("link text", "long-sweep").click()
        wait(
            driver,
            "the compared runs' charts",
            lambda d: len(d.find_elements("css selector", "figure.chart .u-legend")) == 2,
        )
        labels = chart_labels(driver)
        names = {run["name"] for run in priced.runs}
        assert names <= {label["text"].split(" (")[0] for label in labels}, labels
        assert not readable(labels), readable(labels)
        assert not script_errors(driver)
    finally:
        driver.set_window_size(*WINDOW)


CONTRAST = """
const parse = (c) => {
  const m = c.match(/rgba?\\(([^)]+)\\)/);
  if (!m) return null;
  const [r, g, b, a] = m[1].split(/[ ,\\/]+/).filter(Boolean).map(Number);
  return [r, g, b, a === undefined ? 1 : a];
};
const over = (top, under) => top.slice(0, 3).map((v, i) => v * top[3] + under[i] * (1 - top[3])).concat(1);
const luminance = (c) => {
  const [r, g, b] = c.slice(0, 3).map((v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; });
  return 0.2126 * r + 0.7152 * g + 0.0722 * b;
};
const ratio = (a, b) => { const [x, y] = [luminance(a), luminance(b)].sort((p, q) => q - p); return (x + 0.05) / (y + 0.05); };
// What is painted behind an element: its own and its ancestors' backgrounds, composited
// down to the first opaque one (the canvas is white). An SVG text sits on its group's shape.
const backdrop = (e) => {
  const layers = [];
  for (let n = e; n; n = n.parentElement) {
    const shape = n instanceof SVGElement && n.tagName !== 'svg' ? n.querySelector(':scope > rect') : null;
    const colour = parse(shape ? getComputedStyle(shape).fill : getComputedStyle(n).backgroundColor);
    if (colour && colour[3] > 0) { layers.push(colour); if (colour[3] === 1) break; }
  }
  return layers.reverse().reduce((under, top) => over(top, under), [255, 255, 255, 1]);
};
const opacity = (e) => { let o = 1; for (let n = e; n; n = n.parentElement) o *= Number(getComputedStyle(n).opacity); return o; };
const texts = [...document.querySelectorAll('body *')].filter((e) =>
  (['INPUT', 'SELECT', 'TEXTAREA'].includes(e.tagName) && e.type !== 'hidden') ||
  [...e.childNodes].some((n) => n.nodeType === Node.TEXT_NODE && n.textContent.trim()));
const failures = [];
for (const e of texts) {
  if (!e.getClientRects().length || getComputedStyle(e).visibility !== 'visible') continue;
  // uPlot greys out a series a person switched off: an inactive control.
  if (e.closest('.u-off') || e.tagName === 'OPTION') continue;
  const style = getComputedStyle(e);
  const back = backdrop(e);
  const ink = parse(e instanceof SVGElement ? style.fill : style.color);
  const seen = over([...ink.slice(0, 3), ink[3] * opacity(e)], back);
  const size = parseFloat(style.fontSize), bold = Number(style.fontWeight) >= 700;
  const needed = size >= 24 || (bold && size >= 18.66) ? 3 : 4.5;
  const r = ratio(seen, back);
  if (r < needed) failures.push(`${e.tagName.toLowerCase()}.${e.getAttribute('class') || ''} ` +
    `"${e.textContent.trim().slice(0, 40)}": ${seen.slice(0, 3).map(Math.round)} on ${back.slice(0, 3).map(Math.round)}: ` +
    `${r.toFixed(2)}:1 < ${needed}:1`);
}
return failures;
"""
"""Every text shown (and every form field) whose colour against what is painted behind it
falls under WCAG AA: 4.5:1, 3:1 for large text."""


def contrast_failures(driver: Any) -> list[str]:
    failures: list[str] = driver.execute_script(CONTRAST)
    return failures


def test_every_text_on_every_page_has_the_contrast_wcag_aa_asks(
    browser: Any, priced: Stack, spent_budget: None
) -> None:
    """Each page, as a member and as an operator, with its messages and empty states: every
    text colour the stylesheet gives against its background is at least 4.5:1 (3:1 for large
    text), so muted text, hints, badges and notes stay readable. The dashboard has one theme."""
    driver = browser
    run, model = priced.runs[0], priced.runs[0]["model"]
    failures: dict[str, list[str]] = {}

    driver.get(f"{priced.url}/ui/")
    driver.execute_script("sessionStorage.clear()")
    driver.get("about:blank")
    driver.get(f"{priced.url}/ui/#/jobs")
    wait(driver, "the sign-in form", lambda d: d.find_elements("id", "token"))
    failures["sign-in"] = contrast_failures(driver)
    driver.find_element("id", "token").send_keys("not a token")
    driver.find_element("css selector", "#login button[type=submit]").click()
    wait(driver, "the refusal", lambda d: d.find_elements("css selector", ".login-status .message"))
    failures["sign-in refused"] = contrast_failures(driver)

    sign_in(driver, priced)
    pages = [
        ("/jobs", "waits-in-design"),
        (f"/jobs/{run['id']}", LONG_KEY),
        (f"/jobs/{priced.waiting}", "Why it waits"),
        ("/jobs/00000000-0000-0000-0000-000000000000", "No such job"),
        ("/experiments", "long-sweep"),
        ("/queues", "waits-in-design"),
        ("/nodes", "Nodes"),
        ("/models", model["name"]),
        (f"/models/design/{model['name']}", "Lineage of"),
        ("/costs", "Most expensive jobs"),
        ("/waste", "Jobs that wasted most"),
        ("/budgets", "A budget is spent"),
    ]
    for route, ready in pages:
        visit(driver, route, ready, 30)
        failures[route] = contrast_failures(driver)
    # An experiment: its runs, those compared highlighted, their charts.
    visit(driver, "/experiments", "long-sweep")
    driver.find_element("link text", "long-sweep").click()
    wait(driver, "the comparison", lambda d: d.find_elements("css selector", "#parameters"))
    failures["experiment long-sweep"] = contrast_failures(driver)
    sign_in(driver, priced, token=priced.operator)
    for route, ready in (
        ("/jobs", "Every team: newest first."),
        ("/queues", "Every team's queue"),
        ("/nodes", "Nodes"),
        ("/costs", "Most expensive jobs"),
        ("/budgets", "Every team's budgets"),
    ):
        visit(driver, route, ready, 30)
        failures[f"{route} (operator)"] = contrast_failures(driver)
    found = [f"{page}: {failure}" for page, each in failures.items() for failure in each]
    assert not found, "\n".join(found)
    assert not script_errors(driver)


NARROW = """
const e = document.documentElement;
const squeezed = [...document.querySelectorAll('dl.kv')].flatMap((list) => [...list.querySelectorAll(':scope > dd')]
  .filter((dd) => dd.getBoundingClientRect().width < list.getBoundingClientRect().width / 2)
  .map((dd) => `${dd.previousElementSibling.textContent.slice(0, 30)}: ${Math.round(dd.getBoundingClientRect().width)} px`));
return {wide: e.scrollWidth > e.clientWidth ? `${e.scrollWidth} px in ${e.clientWidth}` : null, squeezed};
"""
"""Whether the page scrolls sideways, and the values of key-value lists squeezed to less than
half of their list's width (a long key took the room)."""


def test_a_phone_wide_window_shows_every_page_without_scrolling_sideways(
    browser: Any, priced: Stack, spent_budget: None
) -> None:
    """390 pixels wide: a 100-character job or model name in a page's title wraps, the charts,
    columns and nodes fit the width, and a key-value list whose key is a 92-character metric
    name leaves its values room (wide tables still scroll inside their card)."""
    driver = browser
    run, model = priced.runs[0], priced.runs[0]["model"]
    driver.set_window_size(390, 900)
    try:
        sign_in(driver, priced)
        found = {}
        for route, ready in (
            ("/jobs", "waits-in-design"),
            (f"/jobs/{run['id']}", LONG_KEY),
            (f"/jobs/{priced.waiting}", "Why it waits"),
            ("/experiments", "long-sweep"),
            ("/queues", "waits-in-design"),
            ("/nodes", "Nodes"),
            ("/models", model["name"]),
            (f"/models/design/{model['name']}", "Lineage of"),
            ("/costs", "Most expensive jobs"),
            ("/waste", "Jobs that wasted most"),
            ("/budgets", "A budget is spent"),
        ):
            visit(driver, route, ready, 30)
            measured = driver.execute_script(NARROW)
            if measured["wide"] or measured["squeezed"]:
                found[route] = measured
        assert not found
        assert not script_errors(driver)
    finally:
        driver.set_window_size(*WINDOW)


DATES = """
const labels = [...document.querySelectorAll(arguments[0] + ' .col')].map((col) => {
  const label = col.querySelector('.col-label'), r = label.getBoundingClientRect();
  const range = document.createRange(); range.selectNodeContents(label);
  const text = range.getBoundingClientRect();
  return {day: col.dataset.day, text: label.textContent.trim(), left: text.left, right: text.right,
          whole: label.scrollWidth <= label.clientWidth || getComputedStyle(label).overflowX === 'visible'};
}).filter((label) => label.text);
return labels;
"""
"""The dates written under a costs chart's columns: each with its column's day and where
its text lies."""


@pytest.mark.parametrize("width", [1360, 390])
def test_the_costs_chart_dates_are_readable_in_any_window(
    browser: Any, priced: Stack, width: int
) -> None:
    """Under the spend-per-day columns, over 7, 30 and 90 days: the dates written are whole
    (month and day of their own column), at least one a week apart, and none overlaps the
    next, however narrow the window."""
    driver = browser
    driver.set_window_size(width, 900)
    try:
        sign_in(driver, priced)
        for days in (7, 30, 90):
            visit(driver, f"/costs/{days}", "Most expensive jobs", 30)
            labels = driver.execute_script(DATES, "#daily-spend")
            assert len(labels) >= min(days, 6), labels
            for label in labels:
                assert label["whole"] and label["text"] == label["day"][5:], label
            for one, other in itertools.pairwise(labels):
                assert one["right"] <= other["left"], (one, other)
        assert not script_errors(driver)
    finally:
        driver.set_window_size(*WINDOW)

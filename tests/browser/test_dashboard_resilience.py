"""The dashboard where people stumble: the keyboard, odd links, odd tokens, long names.

The package's local stack (one runner of ``RUNNER_GPUS`` virtual GPUs) and a team of this
module's own (``speech``) whose job asks for more GPUs than that, so it waits for good: a living
job whose page and row redraw themselves every few seconds. Each test drives headless Chromium
as a person would and checks what they would see.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.browser.conftest import RUNNER_GPUS
from tests.browser.test_dashboard import _until, script_errors, wait
from trainyard_platform.deploy.local.stack import LocalStack

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

LONG_NAME = "a-very-long-run-name-" + "x" * 79
"""As long as a job name may be (100 characters), with no space to break it at."""
ONE_RUN = "one-run-" + "y" * 92
"""A run of experiment ``EXPERIMENT``, as long a name as ``LONG_NAME``."""
EXPERIMENT = "long-runs"
"""This module's experiment, named as no other module's is (an operator lists them all)."""
TEAM = "speech"
"""This module's team: the other module's teams and their experiments are not in its lists."""
TOO_MANY = RUNNER_GPUS + 1
"""GPUs a job asks for that the cluster does not have: it waits for good."""
MARKUP = '<img src=x onerror="document.title=1">'
"""Markup in the text people choose (a label, a parameter, a note, what a job prints): shown
as written, never parsed into an element."""
MARKUP_EXPERIMENT = "markup-runs"


@dataclass
class Stack:
    stack: LocalStack
    token: str
    operator: str
    waiting: str
    """The id of a job that waits for good (it asks for more GPUs than the cluster has)."""
    markup: str
    """The id of a run (of ``MARKUP_EXPERIMENT``) that failed printing ``MARKUP``, with it in
    its command, a label, a parameter's name and value and its note."""

    @property
    def url(self) -> str:
        return self.stack.submission_url


def _submit(stack: LocalStack, token: str, name: str, **spec: Any) -> str:
    body = {"name": name, "gpus": TOO_MANY, "gpu_flavor": "cpu", "command": ["sleep", "1"], **spec}
    answer = httpx.post(
        f"{stack.submission_url}/v1/jobs",
        json=body,
        headers={"Authorization": f"Bearer {token}"},
        timeout=10,
    )
    assert answer.status_code == 201, answer.text
    return str(answer.json()["id"])


@pytest.fixture(scope="module")
def small(stack: LocalStack) -> Iterator[Stack]:
    token = stack.bootstrap_admin(TEAM, "alice")
    operator = stack.bootstrap_admin("platform", "rita", role="operator")
    waiting = _submit(stack, token, "waits-for-more")
    _submit(stack, token, LONG_NAME)
    # Two runs of an experiment (the registry makes one when a run starts), with
    # names as long as names go and parameters that differ.
    for run, lr in ((ONE_RUN, 0.1), (ONE_RUN.replace("-y", "-z"), 0.2)):
        _submit(
            stack,
            token,
            run,
            gpus=1,
            command=["true"],
            experiment=EXPERIMENT,
            hyperparameters={"lr": lr},
        )
    experiments = f"{stack.service_urls['registry']}/v1/experiments"
    _until(
        "the experiment's two runs",
        lambda: [
            e
            for e in httpx.get(
                experiments, headers={"Authorization": f"Bearer {token}"}, timeout=10
            ).json()["experiments"]
            if e["runs"] == 2
        ],
    )
    # Two runs, so their comparison has a parameter that differs (the one named in markup).
    markup, plain = (
        _submit(
            stack,
            token,
            "prints-markup",
            gpus=1,
            command=["sh", "-c", f"echo '{MARKUP}'; exit 3"],
            max_restarts=0,
            experiment=MARKUP_EXPERIMENT,
            labels={"origin": MARKUP},
            hyperparameters={MARKUP: value},
        )
        for value in (MARKUP, "plain")
    )
    headers = {"Authorization": f"Bearer {token}"}
    _until(
        "the run's note",
        lambda: (
            httpx.put(
                f"{stack.service_urls['registry']}/v1/jobs/{markup}/note",
                json={"note": f"see {MARKUP}"},
                headers=headers,
                timeout=10,
            ).status_code
            == 200
        ),
    )
    for run in (markup, plain):
        _until(
            "the markup runs failed",
            lambda run=run: (
                httpx.get(
                    f"{stack.submission_url}/v1/jobs/{run}", headers=headers, timeout=10
                ).json()["status"]
                == "FAILED"
            ),
        )
    yield Stack(stack, token, operator, waiting, markup)


def sign_in(driver: Any, small: Stack, route: str = "/jobs", token: str | None = None) -> None:
    driver.get(f"{small.url}/ui/")
    driver.execute_script("sessionStorage.clear()")
    driver.get("about:blank")
    driver.get(f"{small.url}/ui/#{route}")
    field = wait(driver, "the sign-in form", lambda d: d.find_elements("id", "token"))[0]
    field.send_keys(token or small.token)
    driver.find_element("css selector", "#login button[type=submit]").click()
    wait(driver, "signed in", lambda d: d.find_elements("id", "logout"))


def focused(driver: Any) -> str:
    """The focused element as a person would name it: its tag, target and text."""
    described: str = driver.execute_script(
        "const e = document.activeElement;"
        "return `${e.tagName} ${e.getAttribute('href') || ''} ${e.textContent.trim()}`"
    )
    return described


def refreshed(driver: Any, selector: str) -> None:
    """Wait until the element under ``selector`` is replaced by the page's own refresh."""
    driver.execute_script("document.querySelector(arguments[0]).dataset.old = 'yes'", selector)
    wait(
        driver,
        f"{selector} redrawn",
        lambda d: d.execute_script(
            "const e = document.querySelector(arguments[0]); return e && !e.dataset.old",
            selector,
        ),
    )


def test_the_keyboard_focus_survives_the_pages_own_refreshes(browser: Any, small: Stack) -> None:
    """The jobs list redraws every 5 s and a living job's page every 3 s: a person who tabbed
    to a job's link or to "Cancel job" stays there, and the redrawn list is not announced."""
    driver = browser
    sign_in(driver, small)
    link = wait(
        driver,
        "the waiting job's row",
        lambda d: d.find_elements("css selector", f"#jobs a[title='{small.waiting}']"),
    )[0]
    driver.execute_script("arguments[0].focus()", link)
    before = focused(driver)
    assert small.waiting in before
    refreshed(driver, "#jobs table")
    assert focused(driver) == before
    # Nor does a screen reader read the table out again at each refresh: what a page redraws
    # is in no live region (the whole page was one, aria-live on <main>).
    live = "[aria-live], [role=status], [role=alert], [role=log]"
    assert not driver.execute_script(
        "return document.querySelector('#jobs').closest(arguments[0])", live
    )

    driver.execute_script("location.hash = arguments[0]", f"/jobs/{small.waiting}")
    cancel = wait(
        driver, "the cancel button", lambda d: d.find_elements("css selector", "button.danger")
    )[0]
    driver.execute_script("arguments[0].focus()", cancel)
    refreshed(driver, ".page-header")
    assert focused(driver).strip() == "BUTTON  Cancel job"
    assert not script_errors(driver)


def test_markup_in_what_people_write_shows_as_text(browser: Any, small: Stack) -> None:
    """``MARKUP`` in a run's command, label, parameter, note and output is shown as written on
    the job's page (its spec, record, failure and logs), the experiment's runs and their
    comparison: no page makes an element of it (the content policy would also stop its
    handler; this is the line before it)."""
    driver = browser
    sign_in(driver, small, f"/jobs/{small.markup}")
    wait(driver, "the failure's log", lambda d: MARKUP in d.find_element("id", "logs").text)
    wait(driver, "the record", lambda d: MARKUP in d.find_element("id", "record").text)
    wait(
        driver,
        "why it failed",
        lambda d: MARKUP in d.find_element("css selector", ".card.failed").text,
    )
    page = driver.find_element("tag name", "main").text
    for shown in (f"echo '{MARKUP}'", f"origin={MARKUP}", f"{MARKUP}={MARKUP}"):
        assert shown in page, shown
    assert not driver.find_elements("css selector", "main img")
    driver.execute_script("location.hash = '/experiments'")
    wait(driver, "the list", lambda d: d.find_elements("link text", MARKUP_EXPERIMENT))[0].click()
    wait(
        driver,
        "the parameter that differs",
        lambda d: MARKUP in d.find_element("id", "parameters").text,
    )
    assert f"see {MARKUP}" in driver.find_element("tag name", "main").text
    assert not driver.find_elements("css selector", "main img")
    assert driver.title == "Trainyard"
    assert not script_errors(driver)


REFUSED_CANCEL = """
window.confirm = () => true;
const real = window.fetch;
window.fetch = (url, options) => String(url).endsWith("/cancel")
  ? Promise.resolve(new Response(JSON.stringify({ detail: "the scheduler is busy" }),
      { status: 503, headers: { "Content-Type": "application/json" } }))
  : real(url, options);
"""
"""Every cancel answered 503 by the browser itself (the job stays as it is), and the
confirmation accepted."""


def test_a_refused_cancel_says_so_and_stays_said(browser: Any, small: Stack) -> None:
    """A cancel the platform refuses says the job was not cancelled and why, and the message
    outlives the page's redraw every 3 s (it was drawn in the header the redraw replaces, so
    it was gone before a person read it)."""
    driver = browser
    sign_in(driver, small, f"/jobs/{small.waiting}")
    cancel = wait(
        driver, "the cancel button", lambda d: d.find_elements("css selector", "button.danger")
    )
    driver.execute_script(REFUSED_CANCEL)
    cancel[0].click()
    notice = wait(
        driver,
        "the refusal",
        lambda d: [e for e in d.find_elements("id", "job-notice") if "not cancelled" in e.text],
    )[0]
    assert "the scheduler is busy" in notice.text
    refreshed(driver, ".page-header")
    assert "The job was not cancelled." in driver.find_element("id", "job-notice").text
    assert not script_errors(driver)


def test_a_mangled_link_says_there_is_no_such_job(browser: Any, small: Stack) -> None:
    """A job link whose percent-encoding was cut (``%E0%A4%A``) is a job that does not exist,
    not a page stuck on "Loading…"; the next link works; ``#/constructor`` is no page (it
    said "This page could not be shown": the router took any key of an object for a page)."""
    driver = browser
    sign_in(driver, small)
    driver.execute_script("location.hash = arguments[0]", "/jobs/%E0%A4%A")
    wait(driver, "no such job", lambda d: "No such job" in d.find_element("tag name", "body").text)
    driver.execute_script("location.hash = arguments[0]", f"/jobs/{small.waiting}")
    wait(driver, "the job", lambda d: d.find_elements("css selector", "button.danger"))
    # A page name that is a name of every object's (a typo, a probe): no page, so the jobs.
    driver.execute_script("location.hash = '/constructor'")
    wait(driver, "the jobs", lambda d: "waits-for-more" in d.find_element("id", "jobs").text)
    assert not script_errors(driver)


def sign_in_with(driver: Any, small: Stack, typed: str) -> Any:
    """Type ``typed`` into a fresh sign-in form, submit it, and return the form's status."""
    driver.get(f"{small.url}/ui/")
    driver.execute_script("sessionStorage.clear()")
    driver.get("about:blank")
    driver.get(f"{small.url}/ui/#/jobs")
    wait(driver, "the sign-in form", lambda d: d.find_elements("id", "token"))
    return sign_in_again(driver, typed)


def sign_in_again(driver: Any, typed: str) -> Any:
    """Type ``typed`` into the sign-in form shown, submit it, and return the form's status."""
    driver.find_element("id", "token").send_keys(typed)
    driver.find_element("css selector", "#login button[type=submit]").click()
    return driver.find_element("css selector", ".login-status")


def test_a_token_that_cannot_be_sent_or_checked_gets_a_clear_answer(
    browser: Any, small: Stack
) -> None:
    """A token pasted with a character no header can hold ("…") is refused naming it, one the
    platform does not know is "not accepted", and a platform that does not answer the
    sign-in says so; none leaves "Checking…" for ever."""
    driver = browser
    status = sign_in_with(driver, small, small.token[:10] + "…")
    # The form names the command that makes a token, as the CLI spells it.
    assert "(trainyard token create," in driver.find_element("id", "login").text
    wait(driver, "the refusal", lambda d: "That is not a token" in status.text)
    assert "character 11 is U+2026" in status.text
    assert driver.execute_script("return sessionStorage.length") == 0

    # A token that could be one but is not (mistyped, never made): not accepted, which is
    # not "your session ended" (there was none).
    driver.find_element("id", "token").clear()
    sign_in_again(driver, "ty_" + "x" * 40)

    def status_text(d: Any) -> str:
        return str(d.find_element("css selector", ".login-status").text)

    wait(driver, "the token refused", lambda d: "That token was not accepted" in status_text(d))
    assert "session ended" not in status_text(driver)
    assert driver.execute_script("return sessionStorage.length") == 0

    # The platform goes down after the form was shown.
    small.stack.stop_service("submission")
    try:
        driver.find_element("id", "token").clear()
        status = sign_in_again(driver, small.token)
        wait(driver, "the platform's silence", lambda d: "did not answer" in status.text)
        assert "submission service cannot be reached" in status.text
        assert driver.execute_script("return sessionStorage.length") == 0
    finally:
        small.stack.start_service("submission")
    sign_in(driver, small)
    assert not script_errors(driver)


def test_a_hundred_character_name_keeps_the_jobs_table_on_the_page(
    browser: Any, small: Stack
) -> None:
    """A job name as long as the API allows, with nowhere to break, wraps in its column: the
    table is no wider than the page, so the cost column stays in view."""
    driver = browser
    sign_in(driver, small)
    wait(driver, "the long name", lambda d: LONG_NAME in d.find_element("id", "jobs").text)
    jobs = driver.find_element("id", "jobs")
    width, visible = driver.execute_script(
        "return [arguments[0].scrollWidth, arguments[0].clientWidth]", jobs
    )
    assert width <= visible, f"the jobs table is {width} px wide in a {visible} px box"
    assert driver.find_element("xpath", "//div[@id='jobs']//th[.='Cost']").is_displayed()


def test_times_name_their_time_zone(browser: Any, small: Stack) -> None:
    """A job's link read in Tokyo shows its times in Tokyo's zone and says which zone that
    is (the costs pages count UTC days: a bare "1:22 AM" would be read as either)."""
    driver = browser
    driver.execute_cdp_cmd("Emulation.setTimezoneOverride", {"timezoneId": "Asia/Tokyo"})
    try:
        sign_in(driver, small, f"/jobs/{small.waiting}")
        details = wait(driver, "the job's details", lambda d: d.find_elements("id", "details"))
        wait(driver, "the submission time", lambda d: "by alice" in details[0].text)
        submitted = details[0].text.split("Submitted")[1].split("by alice")[0]
        assert "GMT+9" in submitted, submitted
        driver.execute_script("location.hash = '/jobs'")
        submitted = wait(
            driver, "the jobs", lambda d: d.find_elements("css selector", "#jobs time")
        )
        assert "GMT+9" in submitted[0].get_attribute("title")
    finally:
        driver.execute_cdp_cmd("Emulation.setTimezoneOverride", {"timezoneId": ""})


def test_an_experiment_link_naming_none_says_so(browser: Any, small: Stack) -> None:
    """An experiment's id is a number: a link with anything else, or a number naming none,
    is "no such experiment", not "this server has no experiments"."""
    driver = browser
    sign_in(driver, small)
    for route in ("/experiments/lr-sweep", "/experiments/999"):
        driver.execute_script("location.hash = arguments[0]", route)
        wait(
            driver,
            f"{route}: no such experiment",
            lambda d: (
                "No such experiment, or not one your team can see"
                in d.find_element("tag name", "main").text
            ),
        )
        assert "not available" not in driver.find_element("tag name", "main").text
    assert not script_errors(driver)


ANSWER_S = 30
"""How long the dashboard waits for an answer (api.js ``ANSWER_S``)."""


def test_a_service_that_hangs_is_named_and_the_rest_still_works(browser: Any, small: Stack) -> None:
    """With the registry frozen (SIGSTOP), the experiments page says it is loading, then
    names the registry as the service that did not answer; the jobs page still works."""
    driver = browser
    sign_in(driver, small)
    small.stack.pause("registry")
    try:
        driver.execute_script("location.hash = '/experiments'")
        wait(driver, "loading", lambda d: d.find_elements("css selector", "main > .loading"))
        wait(
            driver,
            "the registry named",
            lambda d: (
                f"the registry service did not answer within {ANSWER_S} s"
                in d.find_element("tag name", "main").text
            ),
            ANSWER_S + 30,
        )
        assert not driver.find_elements("css selector", "main > .loading")
        driver.execute_script("location.hash = '/jobs'")
        wait(driver, "the jobs", lambda d: "waits-for-more" in d.find_element("id", "jobs").text)
    finally:
        small.stack.resume("registry")
    assert not script_errors(driver)


def test_the_job_page_shows_the_trace_id_of_its_submission(browser: Any, small: Stack) -> None:
    """The trace id the job view carries (the request that submitted it) is on the job's
    page, where an operator copies it into the tracing UI; the waiting job's timeline says how
    long it has waited so far."""
    driver = browser
    view = httpx.get(
        f"{small.url}/v1/jobs/{small.waiting}",
        headers={"Authorization": f"Bearer {small.token}"},
        timeout=10,
    ).json()
    assert view["trace_id"]
    sign_in(driver, small, f"/jobs/{small.waiting}")
    shown = wait(driver, "the trace id", lambda d: d.find_elements("id", "trace-id"))[0]
    assert shown.text == view["trace_id"]
    # The status it is in has lasted until now: the timeline says how long it has waited.
    last = driver.find_elements("css selector", "#timeline li .tl-head")[-1].text
    assert last.startswith("pending") and last.endswith(" so far"), last


def test_an_operator_reads_every_teams_experiments_as_such(browser: Any, small: Stack) -> None:
    """The registry lists an operator every team's experiments: the page says so and names
    each one's team, rather than calling them the operator's own team's."""
    driver = browser
    sign_in(driver, small, "/experiments", small.operator)
    main = wait(driver, "the list", lambda d: d.find_elements("css selector", "main table"))[0]
    header = driver.find_element("css selector", ".page-header").text
    assert "Every team" in header and "Team platform" not in header
    row = main.find_element("xpath", f".//tr[.//a[.='{EXPERIMENT}']]").text
    assert TEAM in row
    main.find_element("link text", EXPERIMENT).click()
    wait(
        driver,
        "the experiment's team",
        lambda d: f"Team {TEAM}" in d.find_element("css selector", ".page-header").text,
    )
    assert not script_errors(driver)


def test_a_tag_the_registry_refuses_is_refused_naming_the_rule(browser: Any, small: Stack) -> None:
    """A tag typed with a "/" (which the registry's route cannot even receive) is refused with
    the registry's rule for tags, not "Not Found"; a good tag is then added."""
    driver = browser
    sign_in(driver, small, "/experiments")
    wait(driver, "the list", lambda d: d.find_elements("link text", EXPERIMENT))[0].click()
    field = wait(
        driver, "the tag field", lambda d: d.find_elements("css selector", "input.tag-input")
    )
    field[0].send_keys("team/a\n")
    refusal = wait(
        driver,
        "the refusal",
        lambda d: [e.text for e in d.find_elements("css selector", ".inline-error") if e.text],
    )
    assert refusal == [
        "Not saved: tag: must be 1 to 64 letters, digits, '_', '.', ':' or '-', "
        "not starting with one of the last four"
    ]
    field = driver.find_element("css selector", "input.tag-input")
    field.clear()
    field.send_keys("baseline\n")
    wait(
        driver,
        "the tag",
        lambda d: any(
            t.text.startswith("baseline") for t in d.find_elements("css selector", ".tag")
        ),
    )
    assert not script_errors(driver)


def test_a_tab_reloaded_after_its_token_was_revoked_says_why(browser: Any, small: Stack) -> None:
    """A token revoked while a job's page is open ends the session, saying so; a tab whose
    token was revoked since it signed in, reloaded (or its link opened again in it), says the
    same; after signing in again the link's page shows."""
    driver = browser
    headers = {"Authorization": f"Bearer {small.token}"}
    # Revoked while its page is open: the page's next read (every 3 s) ends the session.
    open_tab = httpx.post(f"{small.url}/v1/tokens", json={"name": "open"}, headers=headers).json()
    sign_in(driver, small, f"/jobs/{small.waiting}", open_tab["token"])
    wait(driver, "the job", lambda d: d.find_elements("css selector", "button.danger"))
    revoked = httpx.delete(f"{small.url}/v1/tokens/{open_tab['id']}", headers=headers)
    assert revoked.status_code == 204, revoked.text
    wait(
        driver,
        "the session ended",
        lambda d: "Your session ended" in d.find_element("css selector", ".login-status").text,
    )
    made = httpx.post(f"{small.url}/v1/tokens", json={"name": "tab"}, headers=headers).json()
    driver.get(f"{small.url}/ui/")
    driver.execute_script("sessionStorage.clear()")
    driver.get("about:blank")
    driver.get(f"{small.url}/ui/")
    # The tab kept the token; this page has started without it (it reads it only at start).
    wait(driver, "the sign-in form", lambda d: d.find_elements("id", "token"))
    driver.execute_script("sessionStorage.setItem('trainyard.token', arguments[0])", made["token"])
    revoked = httpx.delete(f"{small.url}/v1/tokens/{made['id']}", headers=headers)
    assert revoked.status_code == 204, revoked.text
    driver.get("about:blank")
    driver.get(f"{small.url}/ui/#/jobs/{small.waiting}")
    status = wait(
        driver, "the sign-in form", lambda d: d.find_elements("css selector", ".login-status")
    )
    wait(driver, "the notice", lambda d: "Your session ended" in status[0].text)
    driver.find_element("id", "token").send_keys(small.token)
    driver.find_element("css selector", "#login button[type=submit]").click()
    wait(driver, "the linked job", lambda d: d.find_elements("css selector", "button.danger"))
    assert not script_errors(driver)


def test_the_navigation_says_which_page_is_shown(browser: Any, small: Stack) -> None:
    """The highlighted link of the navigation is also marked for screen readers
    (``aria-current="page"``), and only that one."""
    driver = browser
    sign_in(driver, small)
    for page in ("costs", "jobs"):
        driver.execute_script("location.hash = arguments[0]", f"/{page}")
        wait(
            driver,
            f"{page} marked",
            lambda d, page=page: (
                [
                    link.get_attribute("data-page")
                    for link in d.find_elements("css selector", "#nav a[aria-current=page]")
                ]
                == [page]
            ),
        )


def test_a_status_link_typed_in_lower_case_filters(browser: Any, small: Stack) -> None:
    """``#/jobs?status=pending`` (as the CLI takes it) lists the pending jobs with the filter
    set to pending; a status that does not exist lists every job with the filter on "All"."""
    driver = browser
    sign_in(driver, small, "/jobs?status=pending")
    wait(
        driver, "the pending jobs", lambda d: "waits-for-more" in d.find_element("id", "jobs").text
    )
    assert "one-run" not in driver.find_element("id", "jobs").text
    assert driver.find_element("id", "status-filter").get_attribute("value") == "PENDING"
    driver.get("about:blank")
    driver.get(f"{small.url}/ui/#/jobs?status=sleeping")
    wait(driver, "every job", lambda d: "one-run" in d.find_element("id", "jobs").text)
    assert driver.find_element("id", "status-filter").get_attribute("value") == ""
    assert not script_errors(driver)


def test_an_experiment_of_long_named_runs_stays_within_the_window(
    browser: Any, small: Stack
) -> None:
    """Two runs named as long as names go, compared: the runs table and the parameters that
    differ (one column per run, headed by its name) keep the page from scrolling sideways."""
    driver = browser
    sign_in(driver, small, "/experiments")
    wait(driver, "the list", lambda d: d.find_elements("link text", EXPERIMENT))[0].click()
    wait(
        driver,
        "both runs",
        lambda d: len(d.find_elements("css selector", "#parameters thead th")) == 3,
    )
    width, window = driver.execute_script(
        "const e = document.documentElement; return [e.scrollWidth, e.clientWidth]"
    )
    assert width <= window, f"the page is {width} px wide in a {window} px window"
    assert not script_errors(driver)


SLOW_LOGS = """
const real = window.fetch;
window.fetch = (url, options) => String(url).includes("/logs")
  ? new Promise((resolve) => setTimeout(resolve, 2500)).then(() => real(url, options))
  : real(url, options);
"""
"""Every read of a job's logs answered 2.5 s late: longer than the page's 2 s between reads
(a slow network, a page of megabytes)."""


def test_a_log_read_slower_than_the_refresh_shows_each_line_once(
    browser: Any, small: Stack
) -> None:
    """A living job's log is read again every 2 s; a read still waiting for its answer when
    the next began asked from the same place, and both added what they got: every line
    came two to four times. The job prints only once the page is open (its first read,
    which the page waits for, finds nothing), so the reads that follow overlap."""
    lines = 40
    job = _submit(
        small.stack,
        small.token,
        "prints-lines",
        gpus=1,
        command=[
            "sh",
            "-c",
            f"sleep 10; for i in $(seq 1 {lines}); do echo line-$i.; sleep 0.5; done",
        ],
    )
    try:
        driver = browser
        sign_in(driver, small)
        driver.execute_script(SLOW_LOGS)
        driver.execute_script("location.hash = arguments[0]", f"/jobs/{job}")
        wait(
            driver,
            "the last line",
            lambda d: f"line-{lines}." in d.find_element("id", "logs").text,
            120,
        )
        text = driver.find_element("id", "logs").text
        repeated = [n for n in range(1, lines + 1) if text.count(f"line-{n}.") != 1]
        assert not repeated, text
        assert not script_errors(driver)
    finally:
        httpx.post(
            f"{small.url}/v1/jobs/{job}/cancel",
            headers={"Authorization": f"Bearer {small.token}"},
            timeout=10,
        )

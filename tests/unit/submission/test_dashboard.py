"""The dashboard's routes: its files and config for anyone, under a strict content policy;
nothing outside its folder; and every module the pages import is there."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import TestClient
from pydantic import SecretStr

from trainyard_platform.services.submission.config import Settings
from trainyard_platform.services.submission.dashboard import (
    WEB,
    content_security_policy,
    dashboard_routes,
    page_config,
)
from trainyard_platform.shared.access import service_guard
from trainyard_platform.shared.http_app import service_app

REGISTRY = "http://127.0.0.1:9002"


@pytest.fixture
def client() -> Iterator[TestClient[Any]]:
    settings = Settings(registry_public_url=f"{REGISTRY}/", billing_public_url=None)
    app = service_app("submission", dashboard_routes(settings), service_guard(SecretStr("op")))
    with TestClient(app) as test_client:
        yield test_client


def test_the_pages_and_their_config_need_no_token(client: TestClient[Any]) -> None:
    page = client.get("/ui/")
    assert page.status_code == 200 and 'src="app.js"' in page.text
    assert client.get("/", follow_redirects=False).headers["location"] == "/ui/"
    config = client.get("/ui/config.json")
    assert config.json() == {
        "scheduler_url": None,
        "registry_url": f"{REGISTRY}/",
        "billing_url": None,
    }
    assert "no-store" in config.headers["cache-control"]


def test_every_answer_carries_the_content_policy(client: TestClient[Any]) -> None:
    for path in ("/ui/", "/ui/config.json", "/ui/app.js", "/ui/vendor/uPlot.esm.js"):
        answer = client.get(path)
        policy = answer.headers["content-security-policy"]
        assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy
        assert f"connect-src 'self' {REGISTRY}" in policy, policy
        assert answer.headers["x-content-type-options"] == "nosniff"


def test_nothing_outside_the_folder_is_served(client: TestClient[Any]) -> None:
    for path in ("/ui/%2e%2e/dashboard.py", "/ui/..%2fconfig.py", "/ui/missing.js"):
        assert client.get(path).status_code == 404, path


def test_every_imported_module_exists_and_the_chart_library_keeps_its_licence() -> None:
    imports = re.compile(r"""(?:from\s+|import\(\s*)["'](\.{1,2}/[^"']+)["']""")
    for script in WEB.rglob("*.js"):
        if "vendor" in script.parts:
            continue
        for target in imports.findall(script.read_text()):
            assert (script.parent / target).resolve().is_file(), f"{script.name}: {target}"
    assert "MIT License" in (WEB / "vendor" / "uPlot.LICENSE").read_text()


def test_the_pages_never_insert_html() -> None:
    """User text (job names, reasons, logs) goes in as text: no innerHTML anywhere."""
    for script in WEB.rglob("*.js"):
        if "vendor" not in script.parts:
            assert not re.search(
                r"innerHTML|outerHTML|insertAdjacentHTML|document\.write", script.read_text()
            ), script


@pytest.mark.parametrize(
    ("public_url", "source"),
    [
        ("https://trainyard.example/registry", "https://trainyard.example/registry/"),
        ("https://trainyard.example/registry/", "https://trainyard.example/registry/"),
        (f"{REGISTRY}", f"{REGISTRY}/"),
    ],
)
def test_the_policy_lets_the_page_call_an_api_behind_a_path(public_url: str, source: str) -> None:
    """A CSP source whose path does not end in ``/`` matches that one path only (CSP3,
    "path-part match"): ``https://host/registry`` let no request to
    ``https://host/registry/v1/models`` through, and every page of a registry served behind a
    path said it could not reach it."""
    settings = Settings(registry_public_url=public_url)
    policy = content_security_policy(page_config(settings))
    connect = next(d for d in policy.split("; ") if d.startswith("connect-src "))
    assert connect == f"connect-src 'self' {source}", policy


def test_the_policy_allows_no_inline_style(client: TestClient[Any]) -> None:
    """``style-src 'unsafe-inline'`` let an injected ``style`` attribute or element restyle
    the page (hide a warning, overlay a control); the pages' own bar widths and colours go
    through the CSSOM instead (``ui.js`` ``h``), which the policy does not judge."""
    policy = client.get("/ui/").headers["content-security-policy"]
    assert "style-src 'self';" in policy and "unsafe-inline" not in policy
    index = (WEB / "index.html").read_text()
    assert not re.search(r"<style|\sstyle=", index)
    for script in WEB.rglob("*.js"):
        if "vendor" not in script.parts:
            text = script.read_text()
            assert not re.search(r"""setAttribute\(\s*["']style|\.cssText|<style""", text), script


HTML_HELPER = """
const set = [], attributes = [];
globalThis.Node = class {};
globalThis.document = {
  createElement: (tag) => ({
    tag, dataset: {}, append() {},
    style: { setProperty: (name, value) => set.push([name, value]) },
    setAttribute: (name, value) => attributes.push([name, value]),
  }),
};
const { h } = await import(process.argv[2]);
h("span", { class: "bar", style: "width:40%; --c:hsl(120, 50%, 40%);", title: "t" });
console.log(JSON.stringify({ set, attributes }));
"""


@pytest.mark.skipif(shutil.which("node") is None, reason="needs node to run the page's module")
def test_the_pages_set_styles_through_the_cssom_not_an_attribute(tmp_path: Path) -> None:
    script = tmp_path / "h.mjs"
    script.write_text(HTML_HELPER)
    ran = subprocess.run(
        ["node", str(script), (WEB / "ui.js").as_uri()],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert json.loads(ran.stdout) == {
        "set": [["width", "40%"], ["--c", "hsl(120, 50%, 40%)"]],
        "attributes": [["title", "t"]],
    }

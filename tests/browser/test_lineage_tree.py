"""The models page's lineage tree (``pages/models.js`` ``lineageTree``) in a real browser.

No platform is started: the dashboard's static files are served as they are, and a blank
page of the same origin imports the module and draws trees of made-up registry answers. The
registry answers chains of up to 10,000 nodes (a model fine-tuned from one fine-tuned from
...), and a damaged or hand-made graph may hold a cycle: neither may overflow the browser's
stack or hang the page, and an ordinary graph is drawn as before.
"""

from __future__ import annotations

import functools
import re
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

import trainyard_platform.services.submission as submission_service
from tests.browser.test_dashboard import script_errors

WEB = Path(submission_service.__file__).parent / "web"
BLANK = b"<!doctype html><html><head><title>lineage</title></head><body></body></html>"

DRAW = """
const [graph, options, done] = arguments;
import("/pages/models.js").then((m) => {
  const tree = options ? m.lineageTree(graph, options) : m.lineageTree(graph);
  document.body.replaceChildren(tree);
  // The tree as text: one line per item, indented by how deep its list is nested.
  const lines = [];
  for (const li of tree.querySelectorAll("li")) {
    let depth = 0;
    for (let e = li.parentElement; e !== tree; e = e.parentElement) if (e.tagName === "UL") depth += 1;
    const own = [...li.childNodes].filter((c) => c.tagName !== "UL").map((c) => c.textContent).join("");
    lines.push("  ".repeat(depth - 1) + own);
  }
  let deepest = 0;
  for (const ul of tree.querySelectorAll("ul")) {
    let depth = 0;
    for (let e = ul; e !== tree; e = e.parentElement) depth += 1;
    deepest = Math.max(deepest, depth);
  }
  const more = tree.querySelector("#lineage-more");
  done({ lines, deepest, more: more ? more.textContent : null,
         notes: [...tree.querySelectorAll("p")].map((p) => p.textContent) });
}).catch((error) => done({ error: String((error && error.stack) || error) }));
"""


class _Files(SimpleHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path in ("/", "/blank.html"):
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(BLANK)))
            self.end_headers()
            self.wfile.write(BLANK)
            return
        super().do_GET()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def page(browser: Any) -> Iterator[Any]:
    """The browser on a blank page served with the dashboard's files."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Files, directory=str(WEB)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        browser.set_script_timeout(60)
        browser.get(f"http://127.0.0.1:{server.server_address[1]}/blank.html")
        script_errors(browser)
        yield browser
    finally:
        server.shutdown()
        server.server_close()


def draw(driver: Any, graph: dict[str, Any], **options: int) -> dict[str, Any]:
    drawn: dict[str, Any] = driver.execute_async_script(DRAW, graph, options or None)
    assert "error" not in drawn, drawn.get("error")
    assert script_errors(driver) == []
    return drawn


def model(team: str, name: str, version: int) -> dict[str, Any]:
    node_id = f"model_version:{team}/{name}:{version}"
    return {"id": node_id, "kind": "model_version", "team": team, "name": name, "version": version}


def chain(levels: int) -> dict[str, Any]:
    """An upstream answer of ``levels`` model versions, each fine-tuned from the next."""
    nodes = [model("vision", "cnn", v) for v in range(levels, 0, -1)]
    edges = [
        {"from": nodes[i + 1]["id"], "to": nodes[i]["id"], "relation": "parent_of"}
        for i in range(levels - 1)
    ]
    return {"root": nodes[0]["id"], "direction": "upstream", "nodes": nodes, "edges": edges}


def test_an_ordinary_graph_is_drawn_as_nested_lists_each_node_once(page: Any) -> None:
    """A diamond (two checkpoints of one job, both read by the next) is listed in full once,
    then named "(see above)"; children in order; no note of anything left out."""
    job = {"id": "job:j1", "kind": "job", "job_id": "j1", "name": "train", "status": "succeeded"}
    data = {
        "id": "dataset_version:vision/digits:3",
        "kind": "dataset_version",
        "team": "vision",
        "name": "digits",
        "version": 3,
    }
    graph = {
        "root": "model_version:vision/cnn:2",
        "direction": "upstream",
        "nodes": [model("vision", "cnn", 2), model("vision", "cnn", 1), job, data],
        "edges": [
            {"from": "job:j1", "to": "model_version:vision/cnn:2", "relation": "made"},
            {
                "from": "model_version:vision/cnn:1",
                "to": "model_version:vision/cnn:2",
                "relation": "parent_of",
            },
            {"from": "dataset_version:vision/digits:3", "to": "job:j1", "relation": "read_by"},
            {"from": "job:j1", "to": "model_version:vision/cnn:1", "relation": "made"},
        ],
        "hidden": 2,
        "truncated": False,
    }
    drawn = draw(page, graph)
    assert drawn["lines"] == [
        "model vision/cnn:2",
        "  made job j1 train (succeeded)",
        "    read_by dataset vision/digits:3",
        "  parent_of model vision/cnn:1",
        "    made job j1 train (succeeded) (see above)",
    ]
    assert drawn["more"] is None
    assert drawn["notes"] == ["2 nodes of other teams hidden"]


def test_a_chain_of_twenty_thousand_levels_is_drawn_cut_with_how_many_more(page: Any) -> None:
    """Deeper than the browser's stack: drawn, nested no deeper than the cap (deeper levels
    written), listing the first lines and counting the rest, naming the CLI command."""
    drawn = draw(page, chain(20_000))
    assert len(drawn["lines"]) == 500
    assert drawn["lines"][0] == "model vision/cnn:20000"
    assert drawn["lines"][40].strip() == "(40) parent_of model vision/cnn:19960"
    assert drawn["deepest"] <= 2 * 33  # a <ul> and an <li> a level, 32 levels and the root
    assert drawn["more"] == (
        "19,500 more nodes not shown (the first 500 lines are); "
        "the whole tree: trainyard lineage up vision/cnn:20000"
    )


def test_a_cycle_ends_where_it_closes_and_says_so(page: Any) -> None:
    """A graph whose chain leads back to its root (no registry answer should, a damaged one
    might) lists each node once and names the repeat as a cycle."""
    graph = chain(3)
    graph["edges"].append(
        {"from": graph["root"], "to": graph["nodes"][-1]["id"], "relation": "parent_of"}
    )
    drawn = draw(page, graph)
    assert drawn["lines"] == [
        "model vision/cnn:3",
        "  parent_of model vision/cnn:2",
        "    parent_of model vision/cnn:1",
        "      parent_of model vision/cnn:3 (cycle: see above)",
    ]
    assert drawn["more"] is None


def test_a_graph_of_shared_nodes_and_cycles_is_cut_counting_nodes_and_repeats(page: Any) -> None:
    """Every node of a 5,000-node chain also leads back to the root: past the cap, the note
    counts the nodes left out and, apart, the mentions of nodes already listed; together
    with the lines shown they are every mention of the graph (each edge, and the root)."""
    graph = chain(5_000)
    root = graph["root"]
    for node in graph["nodes"][1:]:
        graph["edges"].append({"from": root, "to": node["id"], "relation": "parent_of"})
    drawn = draw(page, graph, maxLines=100)
    assert len(drawn["lines"]) == 100
    listed = [line for line in drawn["lines"] if not line.endswith("see above)")]
    more = re.fullmatch(
        r"([\d,]+) more nodes and ([\d,]+) more mentions of nodes listed above not shown "
        r"\(the first 100 lines are\); the whole tree: trainyard lineage up vision/cnn:5000",
        drawn["more"] or "",
    )
    assert more, drawn["more"]
    nodes, repeats = (int(group.replace(",", "")) for group in more.groups())
    assert len(listed) + nodes == 5_000
    assert len(drawn["lines"]) + nodes + repeats == len(graph["edges"]) + 1

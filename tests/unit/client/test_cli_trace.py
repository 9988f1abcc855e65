"""``trainyard trace``: a job's spans, read from recorded span files, printed as a tree.

``data/spans.jsonl`` was recorded with the services' JSON-lines exporter
(``shared.telemetry.JsonLinesSpanExporter``) from SDK spans of four services and two jobs;
``data/spans.otlp.jsonl`` holds the same spans as OTLP-JSON, one export request per line
(as an OpenTelemetry Collector's file exporter writes them).

A span file that services keep appending to can hold a line that is not a span: a write cut
short when the disk filled up, or by a writer that died, which the next span then continues.
One such line used to make every trace of the file unreadable; it is skipped with a warning.
OTLP-JSON spans bring their status and events, which the tree shows.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from tests.unit.client.conftest import routed_api
from trainyard.cli import main
from trainyard.cli_trace import load_spans, render_tree

DATA = Path(__file__).parent / "data"
JOB = "3f2a9c1e-5b7d-4e21-9a0c-7d1e2f3a4b5c"
OTHER = "9e8d7c6b-5a49-4382-8170-6f5e4d3c2b1a"
UNSEEN = "5d6e7f80-1a2b-4c3d-8e9f-0a1b2c3d4e5f"
"""A job none of whose spans are in the files."""


@pytest.fixture(autouse=True)
def no_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINYARD_CONFIG", str(tmp_path / "config.json"))
    for name in ("URL", "TOKEN", "CONTEXT"):
        monkeypatch.delenv(f"TRAINYARD_{name}", raising=False)


def _trace(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["trace", *argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("name", ["spans.jsonl", "spans.otlp.jsonl"])
def test_the_job_s_trace_is_a_tree_across_services(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _trace(capsys, JOB[:8], "--file", str(DATA / name))
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("trace ") and "8 spans" in lines[0]
    names = [line.strip(" │├└─").split("  [")[0] for line in lines[1:]]
    assert names == [
        "POST /v1/jobs",
        "job.submitted publish",
        "job.submitted process",
        "allocation.granted publish",
        "allocation.granted process",
        "checkpoint upload",
        "job.succeeded publish",
        "job.succeeded process",
    ]
    assert lines[1].startswith("POST /v1/jobs  [submission]")
    assert lines[2].startswith("└─ job.submitted publish  [submission]")
    assert lines[3].startswith("   └─ job.submitted process  [scheduler]")
    assert lines[6].startswith("            ├─ checkpoint upload  [runner]")
    assert "[registry]" in lines[8]
    assert all(" ms  @+" in line for line in lines[1:])
    assert OTHER not in out and "(parent missing)" not in out


def test_a_trace_id_selects_that_trace(capsys: pytest.CaptureFixture[str]) -> None:
    spans = load_spans(DATA / "spans.jsonl")
    other = next(
        s.trace_id for s in spans if s.attributes.get("cloudevents.event_subject") == OTHER
    )
    code, out, _ = _trace(capsys, other, "--file", str(DATA / "spans.jsonl"), "--json")
    assert code == 0
    listed = json.loads(out)
    assert len(listed) == 7 and {s["trace_id"] for s in listed} == {other}


def test_a_span_whose_parent_is_not_in_the_file_is_shown_at_the_top(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = (DATA / "spans.jsonl").read_text().splitlines()
    kept = [line for line in lines if json.loads(line)["name"] != "allocation.granted publish"]
    partial = tmp_path / "partial.jsonl"
    partial.write_text("\n".join(kept) + "\n")
    code, out, _ = _trace(capsys, JOB, "--file", str(partial))
    assert code == 0
    assert "allocation.granted process  [runner]" in out
    assert [line for line in out.splitlines() if "(parent missing)" in line] == [
        next(line for line in out.splitlines() if line.startswith("allocation.granted process"))
    ]


def test_an_ambiguous_prefix_is_refused_naming_the_jobs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The jobs of the file share no prefix, so the other one is renamed to share "3f2a".
    # (This test used the empty JOB as its prefix, which is now a usage error: below.)
    near = "3f2a0000-5a49-4382-8170-6f5e4d3c2b1a"
    spans = tmp_path / "spans.jsonl"
    spans.write_text((DATA / "spans.jsonl").read_text().replace(OTHER, near))
    code, _, err = _trace(capsys, "3f2a", "--file", str(spans))
    assert code != 0
    assert "several jobs" in err and JOB in err and near in err
    code, _, err = _trace(capsys, "", "--file", str(spans))
    assert (
        code == 2
        and err == "trainyard: error: JOB is empty: give a job id or the beginning of one\n"
    )


def test_an_unknown_job_and_a_missing_file_are_one_line_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = _trace(capsys, "0000aaaa", "--file", str(DATA / "spans.jsonl"))
    assert code != 0 and "no spans of 0000aaaa" in err
    code, _, err = _trace(capsys, JOB, "--file", str(tmp_path / "none.jsonl"))
    assert code != 0 and "cannot read spans" in err and "Traceback" not in err


def test_a_line_that_is_not_a_span_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.jsonl"
    half = json.dumps({"name": "half", "attributes": {"cloudevents.event_subject": JOB}})
    bad.write_text((DATA / "spans.jsonl").read_text() + half + "\n")
    code, out, err = _trace(capsys, JOB, "--file", str(bad))
    assert code == 0 and "8 spans" in out  # skipped, not fatal
    assert "skipped 1 line(s)" in err and f"{bad}:16: not a span record" in err
    only_bad = tmp_path / "only-bad.jsonl"
    only_bad.write_text('{"name": "half"}\n')
    code, _, err = _trace(capsys, JOB, "--file", str(only_bad))
    assert code != 0 and f"{only_bad}:1: not a span record" in err


def test_render_tree_of_nothing_is_empty() -> None:
    assert render_tree([]) == ""


def test_a_torn_line_in_the_middle_of_the_file_hides_no_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = (DATA / "spans.jsonl").read_text().splitlines()
    torn = tmp_path / "spans.jsonl"
    # Line 5 was cut after 40 characters, and the next span was appended right after it.
    torn.write_text("\n".join([*lines[:4], lines[4][:40] + lines[5], *lines[6:]]) + "\n")
    code = main(["trace", JOB[:8], "--file", str(torn)])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert out.startswith("trace ") and "POST /v1/jobs  [submission]" in out
    assert "skipped 1 line(s)" in err and f"{torn}:5: not a span record" in err


def _otlp_line(status: dict[str, object], events: list[dict[str, object]]) -> str:
    span = {
        "traceId": "AB" * 16,
        "spanId": "01" * 8,
        "name": "scheduler queue wait",
        "startTimeUnixNano": "1000000000",
        "endTimeUnixNano": "3000000000",
        "attributes": [{"key": "cloudevents.event_subject", "value": {"stringValue": JOB}}],
        "status": status,
        "events": events,
    }
    resource = {"attributes": [{"key": "service.name", "value": {"stringValue": "scheduler"}}]}
    document = {"resourceSpans": [{"resource": resource, "scopeSpans": [{"spans": [span]}]}]}
    return json.dumps(document) + "\n"


def test_otlp_json_status_and_events_are_shown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    event = {
        "timeUnixNano": "2000000000",
        "name": "job.pending",
        "attributes": [
            {"key": "trainyard.pending.reason", "value": {"stringValue": "needs 2 GPUs\nfree 1"}}
        ],
    }
    path = tmp_path / "otlp.jsonl"
    path.write_text(_otlp_line({"code": 2, "message": "revoked"}, [event]))
    code = main(["trace", JOB, "--file", str(path)])
    out, err = capsys.readouterr()
    assert code == 0, err
    lines = out.splitlines()
    assert lines[1].endswith("@+0.000s  ERROR: revoked")
    assert lines[2] == "   · job.pending  @+1.000s  trainyard.pending.reason=needs 2 GPUs free 1"
    path.write_text(_otlp_line({"code": "STATUS_CODE_OK"}, []))
    assert main(["trace", JOB, "--file", str(path)]) == 0
    out, _ = capsys.readouterr()
    assert "ERROR" not in out and "·" not in out


def test_spans_that_come_twice_or_loop_are_shown_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # An exporter that sent its batches again wrote every span three times: the tree was
    # walked once per copy of each parent (3^depth lines; a real file never finished).
    text = (DATA / "spans.jsonl").read_text()
    copies = tmp_path / "copies.jsonl"
    copies.write_text(text * 3)
    code, out, err = _trace(capsys, JOB, "--file", str(copies))
    single = _trace(capsys, JOB, "--file", str(DATA / "spans.jsonl"))[1]
    assert code == 0, err
    assert out == single
    code, out, _ = _trace(capsys, JOB, "--file", str(copies), "--json")
    assert len(json.loads(out)) == 8
    # Two spans each naming the other as parent (a damaged file): both shown, once.
    looped = tmp_path / "looped.jsonl"
    records = [json.loads(line) for line in text.splitlines()]
    first, second = [r for r in records if r["parent_id"]][:2]
    first["parent_id"], second["parent_id"] = second["span_id"], first["span_id"]
    second["trace_id"] = first["trace_id"]
    looped.write_text("".join(json.dumps(r) + "\n" for r in records))
    code, out, err = _trace(capsys, first["trace_id"], "--file", str(looped))
    assert code == 0, err
    in_trace = sum(r["trace_id"] == first["trace_id"] for r in records)
    assert len(out.splitlines()) == 1 + in_trace  # the heading, then each span once


def test_only_lines_naming_the_job_or_its_traces_are_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A damaged line about nothing sought is not even parsed: no warning, same tree.
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text("not json at all\n" + (DATA / "spans.jsonl").read_text())
    code, out, err = _trace(capsys, JOB[:8], "--file", str(mixed))
    assert code == 0 and err == ""
    assert out == _trace(capsys, JOB[:8], "--file", str(DATA / "spans.jsonl"))[1]


def test_a_trace_deeper_than_python_s_recursion_limit_is_printed_whole(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Each span a child of the one before (a chain of events, each handled under the span
    # that published it): the tree was walked by recursion, and 3,000 levels ended in
    # "unexpected RecursionError" instead of the trace.
    depth = 3000
    trace_id = "ab" * 16
    deep = tmp_path / "deep.jsonl"
    deep.write_text(
        "".join(
            json.dumps(
                {
                    "service": "runner",
                    "name": f"step {i}",
                    "trace_id": trace_id,
                    "span_id": format(i + 1, "016x"),
                    "parent_id": format(i, "016x") if i else None,
                    "attributes": {"trainyard.job_id": JOB},
                    "start_ns": i,
                    "end_ns": 2 * depth - i,
                }
            )
            + "\n"
            for i in range(depth)
        )
    )
    code, out, err = _trace(capsys, JOB, "--file", str(deep))
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith(f"trace {trace_id}: {depth} spans")
    assert [line.strip(" │├└─").split("  [")[0] for line in lines[1:]] == [
        f"step {i}" for i in range(depth)
    ]
    assert lines[2].startswith("└─ step 1  [runner]")
    assert lines[3].startswith("   └─ step 2  [runner]")


def test_a_span_being_written_at_the_end_of_the_file_is_left_without_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A service appends to the file while the command reads it: its last line can be a
    # span cut short with no line end yet. That is no damage to warn about (it was, twice:
    # once per pass); it is read whole by the next run.
    text = (DATA / "spans.jsonl").read_text()
    growing = tmp_path / "spans.jsonl"
    naming = next(line for line in text.splitlines() if JOB in line)
    growing.write_text(text + naming[: naming.index(JOB) + len(JOB) + 2])
    code, out, err = _trace(capsys, JOB[:8], "--file", str(growing))
    assert code == 0, err
    assert err == ""
    assert out == _trace(capsys, JOB[:8], "--file", str(DATA / "spans.jsonl"))[1]


def test_bytes_that_are_not_utf_8_on_one_line_hide_no_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A damaged block of the disk in the middle of the file: the whole command failed with
    # "unexpected UnicodeDecodeError", whatever the job.
    lines = (DATA / "spans.jsonl").read_bytes().splitlines(keepends=True)
    damaged = tmp_path / "spans.jsonl"
    damaged.write_bytes(b"".join([*lines[:3], b"\xff\xfe\x00 " + JOB.encode() + b"\n", *lines[3:]]))
    code, out, err = _trace(capsys, JOB[:8], "--file", str(damaged))
    assert code == 0, err
    assert out == _trace(capsys, JOB[:8], "--file", str(DATA / "spans.jsonl"))[1]
    assert "skipped 1 line(s)" in err and f"{damaged}:4: not a span record" in err
    assert "UnicodeDecodeError" not in err


def test_an_unknown_job_does_not_parse_every_span_of_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # To tell "no spans of JOB" from "a file with no span at all" the command parsed every
    # line of the file (a stack's file of weeks: all its spans in memory, for nothing); one
    # span record settles it.
    import trainyard.cli_trace as cli_trace

    big = tmp_path / "spans.jsonl"
    big.write_text((DATA / "spans.jsonl").read_text() * 200)
    parsed: list[object] = []
    real = cli_trace._span
    monkeypatch.setattr(cli_trace, "_span", lambda record: parsed.append(record) or real(record))
    code, _, err = _trace(capsys, "0000aaaa", "--file", str(big))
    assert code != 0 and "no spans of 0000aaaa" in err
    assert len(parsed) <= 1


def test_a_big_file_is_read_line_by_line_not_held_whole(tmp_path: Path) -> None:
    # A stack's span file grows for weeks. The command read it whole into memory, and then
    # as a list of its lines, before keeping the few that name the job: about three times
    # the file's size, however small the trace.
    import tracemalloc

    from trainyard.cli_trace import _naming

    text = (DATA / "spans.jsonl").read_text()
    others = "".join(line + "\n" for line in text.splitlines() if JOB not in line)
    big = tmp_path / "big.jsonl"
    with big.open("w") as out:
        while out.tell() < 24_000_000:
            out.write(others * 100)
        out.write(text)
    tracemalloc.start()
    try:
        spans = load_spans(big, keep=_naming({JOB}))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert spans
    assert peak < 4_000_000, peak


def _server_with(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, view: dict[str, object]
) -> dict[str, object]:
    """A submission API that answers ``view`` for the job ``UNSEEN``, with a token set."""
    state = routed_api(tmp_path, monkeypatch, {"TRAINYARD_URL": "http://api.test"})
    monkeypatch.setenv("TRAINYARD_TOKEN", "t0ken")
    state["route"] = lambda request: (
        httpx.Response(200, json={"id": UNSEEN, "status": "SUCCEEDED", **view})
        if request.url.path == f"/v1/jobs/{UNSEEN}"
        else httpx.Response(404, json={"detail": "no such thing", "errors": []})
    )
    return state


def test_a_job_whose_trace_was_not_sampled_is_said_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The file holds none of the job's spans and its view's ``trace_id`` is null: the job's
    trace was never recorded, which the error says, rather than "no spans in the file"."""
    _server_with(tmp_path, monkeypatch, {"trace_id": None})
    code, out, err = _trace(capsys, UNSEEN, "--file", str(DATA / "spans.jsonl"))
    assert (code, out) == (1, "")
    assert err.startswith(f"trainyard: error: job {UNSEEN}'s trace was not sampled: ")
    assert "OTEL_TRACES_SAMPLER" in err and "Traceback" not in err


def test_a_recorded_trace_not_in_the_file_is_no_spans_of_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _server_with(tmp_path, monkeypatch, {"trace_id": "ab" * 16})
    code, _, err = _trace(capsys, UNSEEN, "--file", str(DATA / "spans.jsonl"))
    assert code == 1 and f"no spans of {UNSEEN} in" in err and "not sampled" not in err

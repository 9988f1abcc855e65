"""``trainyard trace JOB [--file PATH]``: a job's trace as a tree of spans with durations.

Reads spans from a file, so an operator needs no Jaeger: the JSON-lines file the local stack
writes (``python3 dev.py up``: ``.trainyard/local/spans.jsonl``, the default ``--file``), or an
OTLP-JSON file (an OpenTelemetry Collector's ``file`` exporter: one
``ExportTraceServiceRequest`` object per line, or one object for the whole file).

JOB is a job id or a unique prefix of one, or a 32-hex-digit trace id. The job's trace is
found in the file by the job id its event spans carry (``cloudevents.event_subject``);
failing that, and when a server is configured, by the ``trace_id`` of the job's view. A
view whose ``trace_id`` is null (the job's trace was not sampled at submission, or tracing
was off) is an error saying the job's trace was not sampled: there are no spans to find.

Each line: the span's name, its service, its duration and its start relative to the trace's
first span, and ``ERROR: <description>`` for a span that ended in error; the span's events
(a queue wait's ``job.pending`` with its reason, an exception) follow it, one line each with
their attributes. Children are indented under their parent, in start order. A span whose
parent is not in the file (not yet flushed, or another process's file) is shown at the top
level marked ``(parent missing)``. ``--json`` prints the spans as a list instead.

The file is read a line at a time, and only the lines that name the job (or, in a second
pass, its traces' ids) are parsed: the file grows for as long as a stack runs. Only an
OTLP-JSON document spread over several lines is read whole. Those that are not span records (a line cut short
when a disk filled up or a writer died, then continued by the next span) are skipped with a
warning on stderr naming how many and the first one, so one bad line never hides every
trace of a file that services keep appending to; a file with no span record at all is an
error naming its first bad line. Bytes that are not UTF-8 make their line such a line. The
last line, when it has no line end yet and is no span record, is a span being written: it
is left out without a warning (the next run reads it whole).
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

from trainyard.cli_base import CliError, Session, note, resolve
from trainyard.client import TrainyardError

DEFAULT_FILE = Path(".trainyard/local/spans.jsonl")
_TRACE_ID = re.compile(r"[0-9a-f]{32}")
_JOB_KEYS = ("cloudevents.event_subject", "trainyard.job_id", "job.id")


@dataclass
class Span:
    trace_id: str
    span_id: str
    parent_id: str | None
    name: str
    service: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    """The status description of a span that ended in error ("" when it gave none)."""
    events: list[dict[str, Any]] = field(default_factory=list)
    """``{"name", "time_ns", "attributes"}`` of each event, in order."""

    @property
    def duration_s(self) -> float:
        return max(self.end_ns - self.start_ns, 0) / 1e9


def load_spans(
    path: Path, keep: Callable[[str], bool] | None = None, *, enough: int | None = None
) -> list[Span]:
    """Every span in ``path`` (JSON lines of spans, or OTLP-JSON); ``CliError`` naming the
    file and line when it is neither. With ``keep``, only the lines (of a file of lines) it
    is true for are read: a file that services append to for weeks holds far more spans than
    one trace, and reading each cost about 4 KB of memory. With ``enough``, reading stops
    once that many spans are read (whether the file holds any span at all: one)."""
    try:
        # Bytes that are not UTF-8 (a damaged block) spoil their own line only: it is not
        # JSON, so it is skipped as any line that is not a span record.
        with path.open(encoding="utf-8", errors="replace") as handle:
            whole = _whole_document(handle)
            if whole is not None:
                return list(_otlp_spans(whole))
            handle.seek(0)
            spans, bad = _read_lines(path, handle, keep, enough)
    except OSError as exc:
        raise CliError(f"cannot read spans from {path}: {exc.strerror or exc}") from None
    if bad and not spans:
        raise CliError(bad[0])
    if bad:
        note(f"warning: skipped {len(bad)} line(s) that are not span records; the first: {bad[0]}")
    return spans


def _read_lines(
    path: Path,
    handle: TextIO,
    keep: Callable[[str], bool] | None,
    enough: int | None,
) -> tuple[list[Span], list[str]]:
    """The spans of the file's lines, read one at a time (a file of weeks is never held
    whole), and what is said of each line that is not a span record."""
    spans: list[Span] = []
    bad: list[str] = []
    for number, raw in enumerate(handle, 1):
        if enough is not None and len(spans) >= enough:
            break
        line = raw.rstrip("\n")
        if not line.strip() or (keep is not None and not keep(line)):
            continue
        try:
            record = json.loads(line)
            spans.extend(_otlp_spans(record) if "resourceSpans" in record else [_span(record)])
        except (json.JSONDecodeError, AttributeError, KeyError, TypeError, ValueError) as exc:
            # A last line with no line end may be a span a service is writing now:
            # unreadable, it is left for the next run rather than warned about.
            if raw.endswith("\n"):
                bad.append(f"{path}:{number}: not a span record ({exc})")
    return spans, bad


def _whole_document(handle: TextIO) -> dict[str, Any] | None:
    """The file as one OTLP-JSON document spread over several lines (a collector's export
    written pretty), or None for a file of lines. Only a file whose first line starts a
    JSON object it does not finish is read whole."""
    first = next((raw.strip() for raw in handle if raw.strip()), "")
    if not first.startswith("{"):
        return None
    try:
        json.loads(first)
        return None  # a whole document on its line: a file of lines
    except json.JSONDecodeError:
        pass
    handle.seek(0)
    try:
        whole = json.loads(handle.read())
    except json.JSONDecodeError:
        return None
    return whole if isinstance(whole, dict) and "resourceSpans" in whole else None


def _span(record: dict[str, Any]) -> Span:
    return Span(
        trace_id=str(record["trace_id"]),
        span_id=str(record["span_id"]),
        parent_id=record.get("parent_id"),
        name=str(record["name"]),
        service=str(record.get("service") or "?"),
        start_ns=int(record["start_ns"]),
        end_ns=int(record.get("end_ns") or record["start_ns"]),
        attributes=dict(record.get("attributes") or {}),
        error=_error(record.get("status"), record.get("status_description")),
        events=[
            {
                "name": str(e["name"]),
                "time_ns": int(e.get("time_ns") or 0),
                "attributes": dict(e.get("attributes") or {}),
            }
            for e in record.get("events") or []
        ],
    )


def _error(status: object, description: object) -> str | None:
    """The error text of a span whose status is ERROR (the SDK's name, or OTLP-JSON's code
    2 / ``STATUS_CODE_ERROR``), else None."""
    if status in ("ERROR", 2, "STATUS_CODE_ERROR"):
        return str(description or "")
    return None


def _otlp_spans(document: dict[str, Any]) -> Iterator[Span]:
    for resource_spans in document.get("resourceSpans", []):
        resource = _otlp_attributes(resource_spans.get("resource", {}).get("attributes", []))
        service = str(resource.get("service.name", "?"))
        for scope_spans in resource_spans.get("scopeSpans", []):
            for s in scope_spans.get("spans", []):
                yield Span(
                    trace_id=str(s["traceId"]).lower(),
                    span_id=str(s["spanId"]).lower(),
                    parent_id=str(s["parentSpanId"]).lower() if s.get("parentSpanId") else None,
                    name=str(s["name"]),
                    service=service,
                    start_ns=int(s["startTimeUnixNano"]),
                    end_ns=int(s.get("endTimeUnixNano") or s["startTimeUnixNano"]),
                    attributes=_otlp_attributes(s.get("attributes", [])),
                    error=_error(
                        (s.get("status") or {}).get("code"), (s.get("status") or {}).get("message")
                    ),
                    events=[
                        {
                            "name": str(e["name"]),
                            "time_ns": int(e.get("timeUnixNano") or 0),
                            "attributes": _otlp_attributes(e.get("attributes", [])),
                        }
                        for e in s.get("events", [])
                    ],
                )


def _otlp_attributes(pairs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        value = pair.get("value", {})
        out[str(pair["key"])] = next(iter(value.values()), None) if value else None
    return out


def traces_of_job(spans: Iterable[Span], ref: str) -> set[str]:
    """The trace ids of spans about job ``ref`` (its id, or a unique prefix of the job ids
    the file names); ``CliError`` when the prefix names several jobs."""
    by_job: dict[str, set[str]] = {}
    for s in spans:
        for key in _JOB_KEYS:
            value = s.attributes.get(key)
            if isinstance(value, str) and value.startswith(ref):
                by_job.setdefault(value, set()).add(s.trace_id)
    if ref in by_job:
        return by_job[ref]
    if len(by_job) > 1:
        jobs = ", ".join(sorted(by_job)[:5])
        raise CliError(f"{ref!r} is the start of several jobs' ids in the file: {jobs}")
    return next(iter(by_job.values()), set())


def render_tree(spans: list[Span]) -> str:
    """One trace's spans as an indented tree (see the module). A span that comes twice (an
    exporter that sent a batch again, files put together) is shown once; spans whose parents
    form a loop (a damaged file) are shown at the top, each once."""
    spans = list({s.span_id: s for s in reversed(spans)}.values())[::-1]  # the first of each
    if not spans:
        return ""
    ids = {s.span_id for s in spans}
    children: dict[str | None, list[Span]] = {}
    for s in spans:
        parent = s.parent_id if s.parent_id in ids else None
        children.setdefault(parent, []).append(s)
    for group in children.values():
        group.sort(key=lambda s: (s.start_ns, s.name))
    origin = min(s.start_ns for s in spans)
    end = max(s.end_ns for s in spans)
    lines = [f"trace {spans[0].trace_id}: {len(spans)} spans, {_duration((end - origin) / 1e9)}"]

    shown: set[str] = set()

    def walk(root: Span) -> None:
        # An explicit stack, not recursion: a chain of events each handled under the span
        # that published it can be deeper than Python's recursion limit.
        stack: list[tuple[Span, str, bool, bool]] = [(root, "", True, True)]
        while stack:
            span, prefix, last, top = stack.pop()
            if span.span_id in shown:
                continue
            shown.add(span.span_id)
            branch = "" if top else ("└─ " if last else "├─ ")
            missing = "  (parent missing)" if top and span.parent_id else ""
            start = (span.start_ns - origin) / 1e9
            error = "" if span.error is None else f"  ERROR: {span.error}".rstrip()
            lines.append(
                f"{prefix}{branch}{span.name}  [{span.service}]  {_duration(span.duration_s)}"
                f"  @+{start:.3f}s{error}{missing}"
            )
            below = children.get(span.span_id, [])
            deeper = prefix if top else prefix + ("   " if last else "│  ")
            for event in span.events:
                at = (event["time_ns"] - origin) / 1e9 if event["time_ns"] else start
                said = " ".join(f"{k}={_one_line(v)}" for k, v in event["attributes"].items())
                lines.append(
                    f"{deeper}{'│' if below else ' '}  · {event['name']}  @+{at:.3f}s  {said}"
                )
            for i in reversed(range(len(below))):  # pushed last first: shown in order
                stack.append((below[i], deeper, i == len(below) - 1, False))

    for root in children.get(None, []):
        walk(root)
    for span in sorted(spans, key=lambda s: (s.start_ns, s.name)):
        walk(span)  # only those in a loop of parents are left
    return "\n".join(lines)


def _one_line(value: object, limit: int = 200) -> str:
    """An event attribute on one line, cut at ``limit`` characters (a stack trace is long)."""
    text = " ".join(str(value).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _duration(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:.1f} ms"
    if seconds < 120:
        return f"{seconds:.2f} s"
    return f"{seconds / 60:.1f} min"


def add_command(command: Callable[..., argparse.ArgumentParser]) -> None:
    trace = command("trace", run_trace, "a job's trace as a tree of spans, from a span file")
    trace.add_argument("job", metavar="JOB", help="a job id (or prefix), or a trace id")
    trace.add_argument(
        "--file",
        type=Path,
        default=DEFAULT_FILE,
        help=f"JSON-lines or OTLP-JSON spans (default {DEFAULT_FILE}, dev.py up's)",
    )


def run_trace(session: Session) -> int:
    args = session.args
    ref = str(args.job).lower()
    if args.file is DEFAULT_FILE and not DEFAULT_FILE.exists():
        # The default is relative: from any folder but the stack's checkout it names nothing.
        raise CliError(
            f"cannot read spans from {DEFAULT_FILE}: No such file or directory (the default, "
            "relative to the current folder: name the stack's span file with --file; dev.py "
            "up prints it on its 'spans' line)"
        )
    if _TRACE_ID.fullmatch(ref):
        wanted = {ref}
    else:  # two passes over the file, each reading only the lines that name what it seeks
        wanted = traces_of_job(load_spans(args.file, keep=_naming({ref})), ref)
        if not wanted:
            wanted = _trace_from_server(session, args.job, args.file)
    spans = load_spans(args.file, keep=_naming(wanted)) if wanted else []
    unique = {(s.trace_id, s.span_id): s for s in reversed(spans) if s.trace_id in wanted}
    chosen = sorted(unique.values(), key=lambda s: s.start_ns)  # each span once (render_tree)
    if not chosen:
        # A file with no span at all is named as such (CliError); one span settles it.
        load_spans(args.file, enough=1)
        raise CliError(f"no spans of {args.job} in {args.file}")
    by_trace: dict[str, list[Span]] = {}
    for s in chosen:
        by_trace.setdefault(s.trace_id, []).append(s)
    session.emit(
        [asdict(s) for s in chosen],
        lambda: "\n\n".join(render_tree(group) for group in by_trace.values()),
    )
    return 0


def _naming(texts: set[str]) -> Callable[[str], bool]:
    """Whether a line of the file names one of ``texts`` (lower case), as written or in
    upper case (ids in OTLP-JSON may be upper-case hex). A line that does not cannot hold a
    span of what is sought."""
    forms = tuple({form for t in texts for form in (t, t.upper())})
    return lambda line: any(form in line for form in forms)


def _trace_from_server(session: Session, ref: str, file: Path) -> set[str]:
    """The ``trace_id`` of the job's view, as a set; empty when no server is configured or
    it knows no such job (the file was all). A view whose ``trace_id`` is null says the
    job's trace was never recorded (not sampled at submission): a ``CliError`` saying so,
    as no file or trace store can hold spans of it."""
    try:
        job_id = resolve(session.client, ref)
        view = session.client.get_job(job_id)
    except (CliError, TrainyardError):
        return set()
    trace_id = view.get("trace_id")
    if "trace_id" in view and trace_id is None:
        raise CliError(
            f"job {job_id}'s trace was not sampled: the submission API recorded no trace for "
            "it (its sampler, OTEL_TRACES_SAMPLER, dropped it, or tracing was off), so no "
            f"spans of it are in {file} or in any trace store"
        )
    return {trace_id} if isinstance(trace_id, str) and trace_id else set()

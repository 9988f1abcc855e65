"""The cost of tracing and metrics on the scheduler's end-to-end decisions per second.

Run: ``.venv/bin/python -m bench.tracing_cost [--rounds 4] [--modes on off] [--nodes 100]
[--jobs-per-gpu 3]``. Prints a line per run, the median of each mode and their ratio, and writes
``bench/results/tracing_cost.json``.

What is measured: ``bench.scheduler_e2e``'s run (a real ``python -m trainyard_platform.services.scheduler`` on a
local NATS server and PostgreSQL, simulated runners, ``job.submitted`` events published as
fast as the client can, each with a W3C trace context as the submission service sends it (a
new trace, recorded as the mode's sampler decides), the clock from the first submit to the
last ``allocation.granted``;
with ``--finish`` each granted job succeeds at once so the rest start as GPUs free up),
alternately in two modes, in the same run, each scheduler fresh:

* **on**: the standard variables send spans over OTLP/HTTP (protobuf) to a receiver in this
  process (``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, ``OTEL_EXPORTER_OTLP_PROTOCOL``), with
  the SDK's default batch processor and sampler (parent-based, always on), database spans
  and the Prometheus metrics reader: everything a deployment has on;
* **off**: ``OTEL_SDK_DISABLED=true``: no span, no metric recorded (tracers and meters are
  no-ops, no instrumentation installed);
* two of the operator's knobs, for the record: **no-db-spans** is *on* with
  ``OTEL_PYTHON_DISABLED_INSTRUMENTATIONS=asyncpg``, **sampled-10%** is *on* with
  ``OTEL_TRACES_SAMPLER=parentbased_traceidratio`` and ``OTEL_TRACES_SAMPLER_ARG=0.1``
  (``--modes on off`` leaves them out);
* two more that split the cost: **not-exported** (``OTEL_TRACES_EXPORTER=none``: every span
  is made, ended and dropped, none encoded or sent) and **sampled-0%**
  (``OTEL_TRACES_SAMPLER=always_off``: no span recorded, but the trace context still travels
  in every header and outbox row and every instrumented call is still entered).

The receiver only reads each request and answers 200 while the clock runs (it decodes the
bodies afterwards to count the spans), so it takes as little as it can of the 2 cores the
scheduler, NATS, PostgreSQL and the client share. Each round runs every mode once, the order
rotating from round to round, so a slow spell of the machine hits every mode alike; the
target is on/off >= 0.95 of the medians.

Besides the ratio of the medians (the target's), each mode's **ratio paired by round** is
printed and kept: the median over the rounds of its decisions per second over *off*'s in the
same round (``_paired_ratios``).

Each run also records the scheduler process's CPU seconds, start to exit (``getrusage`` of
ended children: the scheduler is the only child that ends during a run), and each mode's
median CPU milliseconds per decision: a figure that another load on the machine disturbs far
less than decisions per second. A run's CPU includes the start-up (imports, the exporter's
set-up, migrations), which differs by mode, so it is measured once per mode on its own (a
scheduler started and stopped as soon as it is ready) and taken off.

On Linux each run also reads the scheduler's CPU by thread from ``/proc`` every 50 ms while
it runs, the last reading before it stops kept: the event loop's thread and the others
(the batch span processor's export thread, and asyncio's resolver threads, which take next
to nothing), so the export's CPU is seen directly, per decision, not only as the difference
of two modes' medians. The last reading comes before the scheduler's shutdown, so the
exporter's final flush (the spans still queued, at most a batch) is left out of it.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import random
import resource
import statistics
import sys
import tempfile
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from bench._host import describe
from bench.scheduler_e2e import ADMIN_TOKEN, _delete_streams, _measure, _wait_ready
from trainyard_platform.deploy.local.nats import NatsServer
from trainyard_platform.deploy.local.ports import LOOPBACK, free_port
from trainyard_platform.deploy.local.postgres import PostgresServer
from trainyard_platform.deploy.local.processes import ManagedProcess

RESULTS = Path(__file__).parent / "results" / "tracing_cost.json"
TARGET_RATIO = 0.95
_ON = {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}  # + the receiver's endpoint
MODES: dict[str, dict[str, str]] = {
    "on": _ON,
    "off": {"OTEL_SDK_DISABLED": "true"},
    "no-db-spans": {**_ON, "OTEL_PYTHON_DISABLED_INSTRUMENTATIONS": "asyncpg"},
    "sampled-10%": {
        **_ON,
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": "0.1",
    },
    # Where the cost is: everything but the export, and everything but the spans.
    "not-exported": {"OTEL_TRACES_EXPORTER": "none"},
    "sampled-0%": {**_ON, "OTEL_TRACES_SAMPLER": "always_off"},
}
_OTEL_KEYS = (
    "OTEL_SDK_DISABLED",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_TRACES_EXPORTER",
    "OTEL_METRICS_EXPORTER",
    "OTEL_PYTHON_DISABLED_INSTRUMENTATIONS",
    "OTEL_TRACES_SAMPLER",
    "OTEL_TRACES_SAMPLER_ARG",
)


class Sink:
    """An OTLP/HTTP endpoint that keeps the request bodies and answers 200."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                sink.bodies.append(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self._server = ThreadingHTTPServer((LOOPBACK, 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/v1/traces"

    def take_spans(self) -> Counter[str]:
        """Spans received since the last call, by name (decoded now, outside any
        measurement)."""
        bodies, self.bodies = self.bodies, []
        names: Counter[str] = Counter()
        for body in bodies:
            request = ExportTraceServiceRequest.FromString(body)
            for spans_of in request.resource_spans:
                for scope in spans_of.scope_spans:
                    names.update(span.name for span in scope.spans)
        return names

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    """``os.environ`` with no ``OTEL_*`` switch but ``values`` (``_measure`` hands its own
    environment to the scheduler it starts)."""
    saved = {k: os.environ.pop(k) for k in _OTEL_KEYS if k in os.environ}
    os.environ.update(values)
    try:
        yield
    finally:
        for key in values:
            os.environ.pop(key, None)
        os.environ.update(saved)


def _children_cpu_seconds() -> float:
    """CPU seconds (user + system) of this process's children that have ended: read around
    one run, the scheduler's own (the only child that ends during it; NATS and PostgreSQL
    end last), from its start to its exit, whatever else loads the machine meanwhile."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class ThreadCpu:
    """The CPU seconds of the scheduler's threads during one run (see the module): ``with``
    around the run, then ``main`` (the event loop's thread) and ``other`` (every other
    thread), or None for both where ``/proc`` cannot be read."""

    POLL_S = 0.05

    def __init__(self) -> None:
        self._done = threading.Event()
        self._pid: int | None = None
        self._seconds: dict[int, float] = {}
        self._tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def __enter__(self) -> ThreadCpu:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._done.set()
        self._thread.join()

    @property
    def main(self) -> float | None:
        if self._pid is None or self._pid not in self._seconds:
            return None
        return round(self._seconds[self._pid], 3)

    @property
    def other(self) -> float | None:
        if self.main is None:
            return None
        return round(sum(s for tid, s in self._seconds.items() if tid != self._pid), 3)

    def _poll(self) -> None:
        while not self._done.wait(self.POLL_S):
            if self._pid is None:
                self._pid = _scheduler_pid()
            if self._pid is not None:
                self._read(self._pid)

    def _read(self, pid: int) -> None:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            return  # ended (or not Linux): the last reading stands
        for tid in tids:
            try:
                stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()  # after the command's name
            self._seconds[int(tid)] = (int(fields[11]) + int(fields[12])) / self._tick


def _scheduler_pid() -> int | None:
    """The running scheduler child of this process (``/proc``), if any."""
    me = os.getpid()
    try:
        entries = [e for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        return None
    for entry in entries:
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            if int(stat.rsplit(")", 1)[1].split()[1]) != me:
                continue
            if (
                b"trainyard_platform.services.scheduler"
                in Path(f"/proc/{entry}/cmdline").read_bytes()
            ):
                return int(entry)
        except (OSError, ValueError, IndexError):
            continue
    return None


def _values(mode: str, sink: Sink) -> dict[str, str]:
    values = dict(MODES[mode])
    if mode not in ("off", "not-exported"):
        values["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = sink.endpoint
    return values


def _startup_cpu_seconds(base: Path, nats_url: str, pg: PostgresServer) -> float:
    """CPU seconds of a scheduler started as ``_measure`` starts it (in the current
    environment) and stopped as soon as it is ready: the part of a run's CPU that is not
    deciding (imports, the exporter's set-up, migrations, stream set-up, shutdown)."""
    port = free_port()
    name = f"bench_start_{uuid.uuid4().hex[:6]}"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("TRAINYARD_")},
        "TRAINYARD_NATS_URL": nats_url,
        "TRAINYARD_DATABASE_URL": pg.create_database(name),
        "TRAINYARD_SCHEDULER_PORT": str(port),
        "TRAINYARD_SCHEDULER_ADMIN_TOKEN": ADMIN_TOKEN,
    }
    before = _children_cpu_seconds()
    process = ManagedProcess(
        "scheduler",
        [sys.executable, "-m", "trainyard_platform.services.scheduler"],
        env=env,
        log_path=base / f"scheduler-{name}.log",
        cwd=Path(__file__).parents[1],
    )
    process.start()
    try:
        _wait_ready(f"http://127.0.0.1:{port}/readyz", process)
    finally:
        process.stop()
        asyncio.run(_delete_streams(nats_url))
    return _children_cpu_seconds() - before


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tracing_cost")
    parser.add_argument("--rounds", type=int, default=4, help="runs of each mode")
    parser.add_argument(
        "--modes", nargs="+", choices=list(MODES), default=list(MODES), help="on and off first"
    )
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--jobs-per-gpu", type=float, default=3.0)
    parser.add_argument(
        "--no-finish",
        action="store_true",
        help="one burst of one job per GPU instead of jobs that finish and free their GPU",
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    finish = not args.no_finish
    modes: list[str] = list(dict.fromkeys(["on", "off", *args.modes]))
    jobs = int(args.nodes * 8 * args.jobs_per_gpu)

    runs: list[dict[str, Any]] = []
    load_before = os.getloadavg()
    sink = Sink()
    try:
        with tempfile.TemporaryDirectory(prefix="trainyard-bench-") as tmp:
            base = Path(tmp)
            os.chmod(base, 0o755)  # PostgreSQL runs as its own user when we are root
            with NatsServer(base / "nats") as nats_server, PostgresServer(base / "pg") as pg:
                startup: dict[str, float] = {}
                for mode in modes:
                    with _environment(_values(mode, sink)):
                        startup[mode] = round(_startup_cpu_seconds(base, nats_server.url, pg), 3)
                    sink.take_spans()
                    print(f"{mode:>11}: start and stop alone: scheduler CPU {startup[mode]:.2f} s")
                for round_ in range(args.rounds):
                    # The order rotates, so no mode always runs on a warmer (or busier) machine.
                    shift = round_ % len(modes)
                    for mode in modes[shift:] + modes[:shift]:
                        cpu_before = _children_cpu_seconds()
                        with _environment(_values(mode, sink)), ThreadCpu() as threads:
                            measured = _measure(
                                base, nats_server.url, pg, args.nodes, jobs, finish, None
                            )
                        run = {
                            "mode": mode,
                            "round": round_,
                            **measured,
                            "scheduler_cpu_seconds": round(_children_cpu_seconds() - cpu_before, 3),
                            "scheduler_thread_cpu_seconds": {
                                "event_loop": threads.main,
                                "other_threads": threads.other,
                            },
                        }
                        names = sink.take_spans()
                        run["spans"] = sum(names.values())
                        run["spans_by_name"] = dict(names.most_common())
                        runs.append(run)
                        print(
                            f"{mode:>11}: {run['granted']} granted in {run['seconds']:.2f} s = "
                            f"{run['decisions_per_second']:.0f} decisions/s, "
                            f"scheduler CPU {run['scheduler_cpu_seconds']:.2f} s, "
                            f"{run['spans']} spans exported",
                            flush=True,
                        )
    finally:
        sink.close()

    medians = {
        mode: statistics.median(r["decisions_per_second"] for r in runs if r["mode"] == mode)
        for mode in modes
    }
    vs_off = {mode: round(medians[mode] / medians["off"], 3) for mode in modes}
    paired = _paired_ratios(runs, modes)
    ratio = vs_off["on"]
    complete = all(r["granted"] == jobs for r in runs)
    spans_per_decision = {
        mode: round(
            sum(r["spans"] for r in runs if r["mode"] == mode)
            / max(1, sum(r["granted"] for r in runs if r["mode"] == mode)),
            2,
        )
        for mode in modes
    }
    cpu_ms = {
        mode: round(
            statistics.median(
                1000 * (r["scheduler_cpu_seconds"] - startup[mode]) / max(1, r["granted"])
                for r in runs
                if r["mode"] == mode
            ),
            3,
        )
        for mode in modes
    }
    other_threads_ms = _other_threads_ms(runs, modes)
    for mode in modes:
        others = other_threads_ms[mode]
        print(
            f"{mode:>11}: median {medians[mode]:.0f} decisions/s of {args.rounds} runs, "
            f"{vs_off[mode]:.3f} of off (paired by round {paired[mode]:.3f}), "
            f"{spans_per_decision[mode]} spans per decision, "
            f"scheduler CPU {cpu_ms[mode]:.3f} ms per decision "
            f"(start-up's {startup[mode]:.2f} s taken off), "
            f"CPU off/{mode} {cpu_ms['off'] / cpu_ms[mode]:.3f}"
            + ("" if others is None else f", threads other than the event loop's {others:.3f} ms")
        )
    interval = _paired_interval(runs, "on")
    verdict = _verdict(interval, TARGET_RATIO)
    print(
        f"ratio on/off {ratio:.3f} (paired by round {paired['on']:.3f}, 95% interval "
        f"{interval[0]:.3f}-{interval[1]:.3f} over {args.rounds} rounds): {verdict} the "
        f"{TARGET_RATIO} target" + ("" if complete else "; SOME RUNS DID NOT GRANT EVERY JOB")
    )
    result: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": machine(load_before),
        "settings": {
            "nodes": args.nodes,
            "jobs": jobs,
            "finish": finish,
            "rounds": args.rounds,
            "modes": {
                "on": "OTLP/HTTP protobuf to a loopback receiver, batch processor, always-on "
                "sampler, database spans, Prometheus metrics reader",
                **{m: " ".join(f"{k}={v}" for k, v in MODES[m].items()) for m in modes[1:]},
            },
        },
        "target_ratio": TARGET_RATIO,
        "median_decisions_per_second": medians,
        "ratio_vs_off": vs_off,
        "paired_ratio_vs_off": paired,
        "ratio": ratio,
        "paired_ratio_interval_95": list(interval),
        "verdict": verdict,
        "meets_target": verdict == MEETS,
        "every_job_granted": complete,
        "spans_per_decision": spans_per_decision,
        "scheduler_startup_cpu_seconds": startup,
        "scheduler_cpu_ms_per_decision": cpu_ms,
        "cpu_ratio_vs_off": {mode: round(cpu_ms["off"] / cpu_ms[mode], 3) for mode in modes},
        "other_threads_cpu_ms_per_decision": other_threads_ms,
        "runs": runs,
    }
    write_result(args.out, result)
    return 0


def _paired_ratios(runs: list[dict[str, Any]], modes: list[str]) -> dict[str, float]:
    """Each mode's decisions per second over *off*'s in the same round, the median over the
    rounds: a round's runs follow one another within a minute or two, so a change of the
    machine's speed between rounds (seen here: every mode at about 1,400/s in two rounds and
    900/s in the next two) moves both sides of each quotient, where it moves the medians
    apart at random."""
    by_round = {(r["mode"], r["round"]): r["decisions_per_second"] for r in runs}
    rounds = sorted({r["round"] for r in runs})
    return {
        mode: round(
            statistics.median(by_round[(mode, n)] / by_round[("off", n)] for n in rounds), 3
        )
        for mode in modes
    }


MEETS, MISSES, UNSETTLED = "meets", "misses", "cannot tell whether it meets"
BOOTSTRAP_RESAMPLES = 10_000


def _paired_interval(runs: list[dict[str, Any]], mode: str) -> tuple[float, float]:
    """A 95% bootstrap interval of the median of ``mode``'s per-round ratios over *off*
    (``_paired_ratios``'s statistic): the rounds resampled with replacement, with a fixed
    seed so a result file can be recomputed from its runs. Single runs on a shared 2-core
    machine spread by +-15%, so a median of a few rounds alone cannot say which side of a
    5% target a mode is on."""
    by_round = {(r["mode"], r["round"]): r["decisions_per_second"] for r in runs}
    ratios = [
        by_round[(mode, n)] / by_round[("off", n)]
        for n in sorted({r["round"] for r in runs})
        if (mode, n) in by_round and ("off", n) in by_round
    ]
    rng = random.Random(0)
    medians = sorted(
        statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(BOOTSTRAP_RESAMPLES)
    )
    low = medians[int(0.025 * BOOTSTRAP_RESAMPLES)]
    high = medians[int(0.975 * BOOTSTRAP_RESAMPLES) - 1]
    return round(low, 3), round(high, 3)


def _verdict(interval: tuple[float, float], target: float) -> str:
    """Met only when the whole interval is at or above ``target``, missed only when it is all
    below; otherwise the rounds do not settle it and the benchmark says so."""
    low, high = interval
    if low >= target:
        return MEETS
    if high < target:
        return MISSES
    return UNSETTLED


def _other_threads_ms(runs: list[dict[str, Any]], modes: list[str]) -> dict[str, float | None]:
    """Each mode's median CPU milliseconds per decision of the scheduler's threads other than
    the event loop's (the export thread), None where ``/proc`` gave no reading."""
    result: dict[str, float | None] = {}
    for mode in modes:
        seen = [
            1000 * r["scheduler_thread_cpu_seconds"]["other_threads"] / max(1, r["granted"])
            for r in runs
            if r["mode"] == mode and r["scheduler_thread_cpu_seconds"]["other_threads"] is not None
        ]
        result[mode] = round(statistics.median(seen), 3) if seen else None
    return result


def machine(load_before: tuple[float, float, float]) -> dict[str, Any]:
    """The machine a result was measured on, with its load average before and now."""
    return describe(load_average_before=[round(x, 2) for x in load_before])


def write_result(path: Path, result: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())

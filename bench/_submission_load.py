"""The load generator of ``bench.submission``: HTTP/1.1 keep-alive connections on raw asyncio.

Run by the bench as its own process (``python -m bench._submission_load``), so that it does
not share an interpreter (and a GIL) with the server it drives. It reads one JSON object
from stdin and writes one JSON object to stdout. It is kept cheap: each request is a
prebuilt byte string written on a kept-alive connection, and a response is read by
splitting off its headers and counting ``Content-Length`` bytes (no HTTP library). Its own
CPU time is reported (``cpu_s``) so the bench can show it is not the bottleneck.

Modes (``"mode"``):

* ``closed``: ``connections`` clients, each sending its next request as soon as the last
  one answered, for ``warmup_s`` then ``duration_s``; only requests sent and answered
  inside the measured window count for throughput and latency.
* ``open``: requests arrive at a fixed ``rate`` per second whatever the answers (no
  coordinated omission): request ``i`` is due at ``t0 + i / rate`` and its latency runs from
  that moment, so waiting for a free connection (at most ``connections``) counts. Requests
  due in the warm-up are not counted. The slowest answer of each second is reported too
  (``worst_ms_by_second``), which tells stalls from a steady queue.
* ``walk``: one client; ``GET`` the first request, then follow the ``Link: <...>;
  rel="next"`` header of each answer for ``pages`` pages, ``rounds`` times.

Every ``201`` answer's ``Location`` header is returned in ``created`` (all of them, warm-up
included), so the bench can check that each accepted job is in the database.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import time
from dataclasses import dataclass, field
from typing import Any

_LINK_NEXT = re.compile(rb'<([^>]*)>\s*;\s*rel="?next"?', re.IGNORECASE)


@dataclass
class Answer:
    status: int
    headers: bytes
    body: bytes


class _Connection(asyncio.Protocol):
    """One kept-alive HTTP/1.1 connection; one request in flight at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._buf = bytearray()
        self._waiter: asyncio.Future[Answer] | None = None
        self._closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(ConnectionError(f"connection lost: {exc}"))
        if not self._closed.done():
            self._closed.set_result(None)

    def data_received(self, data: bytes) -> None:
        self._buf += data
        if self._waiter is None or self._waiter.done():
            return
        end = self._buf.find(b"\r\n\r\n")
        if end < 0:
            return
        head = bytes(self._buf[:end])
        lower = head.lower()
        at = lower.find(b"\ncontent-length:")
        if at < 0:
            self._waiter.set_exception(ValueError("answer without Content-Length"))
            return
        stop = lower.find(b"\r\n", at + 1)
        length = int(head[at + 16 : stop if stop >= 0 else len(head)])
        total = end + 4 + length
        if len(self._buf) < total:
            return
        body = bytes(self._buf[end + 4 : total])
        del self._buf[:total]
        self._waiter.set_result(Answer(int(head[9:12]), head, body))

    async def request(self, raw: bytes) -> Answer:
        assert self.transport is not None
        self._waiter = asyncio.get_running_loop().create_future()
        self.transport.write(raw)
        return await self._waiter

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


async def _connect(host: str, port: int) -> _Connection:
    loop = asyncio.get_running_loop()
    _, conn = await loop.create_connection(_Connection, host, port)
    return conn


def _location(headers: bytes) -> str | None:
    lower = headers.lower()
    at = lower.find(b"\nlocation:")
    if at < 0:
        return None
    stop = headers.find(b"\r\n", at + 1)
    return headers[at + 10 : stop if stop >= 0 else len(headers)].strip().decode()


@dataclass
class _Tally:
    """What a run saw: latencies of counted requests, statuses, created jobs, errors."""

    latencies: list[float] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)
    created: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    lag: list[float] = field(default_factory=list)

    def answer(self, answer: Answer) -> None:
        self.statuses[answer.status] = self.statuses.get(answer.status, 0) + 1
        if answer.status == 201:
            location = _location(answer.headers)
            if location is not None:
                self.created.append(location.rsplit("/", 1)[-1])


def _summary(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"n": 0, "p50_ms": None, "p90_ms": None, "p99_ms": None, "max_ms": None}
    ordered = sorted(values)

    def pct(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 3)

    return {
        "n": len(ordered),
        "p50_ms": pct(0.50),
        "p90_ms": pct(0.90),
        "p99_ms": pct(0.99),
        "max_ms": round(ordered[-1] * 1000, 3),
        "mean_ms": round(sum(ordered) / len(ordered) * 1000, 3),
    }


async def _closed(cfg: dict[str, Any], requests: list[bytes]) -> dict[str, Any]:
    tally = _Tally()
    counted_ok = 0
    start = time.perf_counter()
    window_start = start + cfg["warmup_s"]
    window_end = window_start + cfg["duration_s"]

    async def client(index: int) -> None:
        nonlocal counted_ok
        raw = requests[index % len(requests)]
        conn = await _connect(cfg["host"], cfg["port"])
        try:
            while True:
                sent = time.perf_counter()
                if sent >= window_end:
                    return
                try:
                    answer = await conn.request(raw)
                except (ConnectionError, ValueError) as exc:
                    tally.errors.append(str(exc))
                    conn.close()
                    conn = await _connect(cfg["host"], cfg["port"])
                    continue
                done = time.perf_counter()
                tally.answer(answer)
                if sent >= window_start and done <= window_end:
                    tally.latencies.append(done - sent)
                    if 200 <= answer.status < 300:
                        counted_ok += 1
        finally:
            conn.close()

    await asyncio.gather(*(client(i) for i in range(cfg["connections"])))
    return {
        "ok_per_s": round(counted_ok / cfg["duration_s"], 1),
        "counted": len(tally.latencies),
        "counted_ok": counted_ok,
        "latency": _summary(tally.latencies),
        "statuses": tally.statuses,
        "created": tally.created,
        "errors": tally.errors[:20],
        "error_count": len(tally.errors),
    }


async def _open(cfg: dict[str, Any], requests: list[bytes]) -> dict[str, Any]:
    tally = _Tally()
    rate: float = cfg["rate"]
    total = int(rate * (cfg["warmup_s"] + cfg["duration_s"]))
    first_counted = int(rate * cfg["warmup_s"])
    queue: asyncio.Queue[tuple[int, float] | None] = asyncio.Queue()
    counted_ok = 0
    late_arrivals = 0
    worst: dict[int, float] = {}
    t0 = time.perf_counter() + 0.05

    async def dispatcher() -> None:
        nonlocal late_arrivals
        for i in range(total):
            due = t0 + i / rate
            now = time.perf_counter()
            if due > now:
                await asyncio.sleep(due - now)
            elif now - due > 0.005:
                late_arrivals += 1  # the generator itself is behind its schedule
            queue.put_nowait((i, due))
        for _ in range(cfg["connections"]):
            queue.put_nowait(None)

    async def worker(index: int) -> None:
        nonlocal counted_ok
        raw = requests[index % len(requests)]
        conn = await _connect(cfg["host"], cfg["port"])
        try:
            while (item := await queue.get()) is not None:
                i, due = item
                sent = time.perf_counter()
                try:
                    answer = await conn.request(raw)
                except (ConnectionError, ValueError) as exc:
                    tally.errors.append(str(exc))
                    conn.close()
                    conn = await _connect(cfg["host"], cfg["port"])
                    continue
                done = time.perf_counter()
                tally.answer(answer)
                if i >= first_counted:
                    second = int(due - t0 - cfg["warmup_s"])
                    worst[second] = max(worst.get(second, 0.0), done - due)
                    tally.latencies.append(done - due)
                    tally.lag.append(sent - due)
                    if 200 <= answer.status < 300:
                        counted_ok += 1
        finally:
            conn.close()

    workers = [asyncio.create_task(worker(i)) for i in range(cfg["connections"])]
    await dispatcher()
    await asyncio.gather(*workers)
    return {
        "rate": rate,
        "counted": len(tally.latencies),
        "counted_ok": counted_ok,
        "latency": _summary(tally.latencies),
        "wait_for_connection": _summary(tally.lag),
        "worst_ms_by_second": [round(worst[k] * 1000, 1) for k in sorted(worst)],
        "generator_late_arrivals": late_arrivals,
        "statuses": tally.statuses,
        "created": tally.created,
        "errors": tally.errors[:20],
        "error_count": len(tally.errors),
    }


async def _walk(cfg: dict[str, Any], requests: list[bytes]) -> dict[str, Any]:
    """Follow ``rel="next"`` links; ``requests[0]`` is the first page's request whose
    request line is rewritten with each link's path."""
    tally = _Tally()
    first = requests[0]
    line_end = first.index(b"\r\n")
    method, _, _ = first[:line_end].split(b" ", 2)
    rest = first[line_end:]
    conn = await _connect(cfg["host"], cfg["port"])
    pages = 0
    rows = 0
    try:
        for _ in range(cfg["rounds"]):
            raw = first
            for _ in range(cfg["pages"]):
                sent = time.perf_counter()
                answer = await conn.request(raw)
                tally.latencies.append(time.perf_counter() - sent)
                tally.answer(answer)
                pages += 1
                if answer.status != 200:
                    tally.errors.append(f"{answer.status}: {answer.body[:200]!r}")
                    break
                rows += len(json.loads(answer.body))
                link = _LINK_NEXT.search(answer.headers)
                if link is None:
                    break
                raw = method + b" " + link.group(1) + b" HTTP/1.1" + rest
    finally:
        conn.close()
    return {
        "pages": pages,
        "rows": rows,
        "latency": _summary(tally.latencies),
        "statuses": tally.statuses,
        "errors": tally.errors[:20],
        "error_count": len(tally.errors),
    }


async def _main(cfg: dict[str, Any]) -> dict[str, Any]:
    requests = [r.encode("latin-1") for r in cfg["requests"]]
    modes = {"closed": _closed, "open": _open, "walk": _walk}
    cpu0, wall0 = time.process_time(), time.perf_counter()
    result = await modes[cfg["mode"]](cfg, requests)
    result["generator_cpu_s"] = round(time.process_time() - cpu0, 3)
    result["generator_wall_s"] = round(time.perf_counter() - wall0, 3)
    return result


def main() -> int:
    cfg = json.load(sys.stdin)
    json.dump(asyncio.run(_main(cfg)), sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The chaos suite's faults: a seeded schedule, the injector, and the poison messages.

``schedule(rng, platform, rounds, ...)`` lists the faults: in every round each kind once, in
an order drawn from the seed; targets (which runner, which process to cut off) and outage
lengths are drawn too. ``inject(platform, fault)`` drives one fault to its end (the process
restarted, resumed or healed, NATS or PostgreSQL back) and returns; the caller then times the
recovery. Kinds:

- ``kill <service>`` for each of submission, scheduler, registry, billing, and ``kill runner``:
  SIGKILL, down for the outage, started again on its old port;
- ``kill nats``: SIGKILL of the server (its file store stays: a kill -9 keeps the page cache,
  so this is no power loss), started again after the outage;
- ``kill postgres``: SIGKILL of the postmaster and every backend, crash recovery on start;
- ``pause postgres``: SIGSTOP of the postmaster and every backend for the outage, then
  SIGCONT: a server that keeps its connections and answers nothing (a hung host, a stalled
  network path), which only the services' statement, acquire and connect timeouts end;
- ``pause runner``: SIGSTOP of a runner and its jobs for longer than the scheduler's node
  timeout (a frozen node that comes back), then SIGCONT;
- ``cut off NATS``: one service's or runner's NATS connections dropped and refused by its
  proxy for a few seconds;
- ``lose JetStream``: NATS stopped, its JetStream store deleted, started empty.

``poison(nats_url, tag)`` publishes the messages the suite makes poisonous (unparseable, a
rejected heartbeat, a forged ``job.succeeded``) and returns their message ids; the checks
expect exactly those in the dead-letter stream.
"""

from __future__ import annotations

import json
import math
import random
import time
import uuid
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

import nats

from bench._chaos_platform import DB_SERVICES, ChaosPlatform

KINDS = (
    *(f"kill {service}" for service in DB_SERVICES),
    "kill runner",
    "kill nats",
    "kill postgres",
    "pause postgres",
    "pause runner",
    "cut off NATS",
    "lose JetStream",
)


@dataclass
class Fault:
    kind: str
    target: str
    outage_s: float
    injected_at: float = 0.0
    """Seconds since the run started."""
    ended_at: float = 0.0
    ready_s: float | None = None
    """From the fault's end until every process answered /readyz 200."""
    recovered_s: float | None = None
    """From the fault's end until a probe job submitted then was terminal with its cost."""
    not_ready: dict[str, str] = field(default_factory=dict)
    """Processes that were not ready when the wait for them ended, with their ``/readyz``."""

    def row(self) -> dict[str, Any]:
        return {k: (round(v, 2) if isinstance(v, float) else v) for k, v in asdict(self).items()}


def outage(rng: random.Random, low: float, high: float) -> float:
    """An outage length between ``low`` and ``high``, log-uniform (short ones are common)."""
    return math.exp(rng.uniform(math.log(low), math.log(high)))


def schedule(
    rng: random.Random,
    platform: ChaosPlatform,
    rounds: int,
    *,
    outage_s: tuple[float, float] = (1.0, 60.0),
    cut_s: tuple[float, float] = (2.0, 8.0),
    pause_past_timeout_s: tuple[float, float] = (2.0, 6.0),
) -> list[Fault]:
    faults: list[Fault] = []
    timeout = platform.config.node_timeout_s
    for _ in range(rounds):
        kinds = list(KINDS)
        rng.shuffle(kinds)
        for kind in kinds:
            if kind.startswith("kill ") and kind.removeprefix("kill ") in DB_SERVICES:
                target, length = kind.removeprefix("kill "), outage(rng, *outage_s)
            elif kind == "kill runner":
                target, length = rng.choice(platform.runners), outage(rng, *outage_s)
            elif kind in ("kill nats", "kill postgres", "pause postgres"):
                target = kind.split(" ", 1)[1]
                length = outage(rng, *outage_s)
            elif kind == "pause runner":
                target = rng.choice(platform.runners)
                length = timeout + rng.uniform(*pause_past_timeout_s)
            elif kind == "cut off NATS":
                target, length = rng.choice(platform.processes), rng.uniform(*cut_s)
            else:
                target, length = "nats", 0.0
            faults.append(Fault(kind, target, round(length, 2)))
    return faults


def inject(platform: ChaosPlatform, fault: Fault, sleep: Any = time.sleep) -> None:
    """Drive ``fault`` from its start to its end (module docstring)."""
    kind, target = fault.kind, fault.target
    if kind.startswith("kill "):
        platform.kill(target)
        sleep(fault.outage_s)
        platform.restart(target)
    elif kind.startswith("pause "):
        platform.pause(target)
        sleep(fault.outage_s)
        platform.resume(target)
    elif kind == "cut off NATS":
        platform.cut(target)
        sleep(fault.outage_s)
        platform.heal(target)
    elif kind == "lose JetStream":
        platform.lose_jetstream()
    else:
        raise ValueError(f"unknown fault {kind!r}")


# --- poison ---------------------------------------------------------------------------------


def _event(kind: str, source: str, subject: str, data: dict[str, Any], event_id: str) -> bytes:
    return json.dumps(
        {
            "specversion": "1.0",
            "id": event_id,
            "source": source,
            "type": kind,
            "time": datetime.now(UTC).isoformat(),
            "subject": subject,
            "datacontenttype": "application/json",
            "data": data,
        }
    ).encode()


async def poison(nats_url: str, tag: str) -> list[str]:
    """Publish the suite's poison messages (module docstring); returns their message ids."""
    now = datetime.now(UTC).isoformat()
    node = f"poison-node-{tag}"
    job = f"poison-job-{tag}-{uuid.uuid4()}"
    messages = [
        # Not an event at all: the scheduler (job.submitted's consumer) dead-letters it.
        ("trainyard.job.submitted.v1.poison", b"this is not an event", f"poison-{tag}-bytes"),
        # A heartbeat its handler refuses (a negative GPU count).
        (
            f"trainyard.runner.heartbeat.v1.{node}",
            _event(
                "trainyard.runner.heartbeat.v1",
                "trainyard/runner",
                node,
                {
                    "node_id": node,
                    "hostname": "nowhere",
                    "gpu_flavor": "cpu",
                    "gpu_count": -1,
                    "sent_at": now,
                },
                f"poison-{tag}-heartbeat",
            ),
            f"poison-{tag}-heartbeat",
        ),
        # A job's success said by the submission service, which may not say it: forged,
        # dead-lettered by each of its consumers (submission, scheduler, registry).
        (
            f"trainyard.job.succeeded.v1.{job}",
            _event(
                "trainyard.job.succeeded.v1",
                "trainyard/submission",
                job,
                {
                    "job_id": job,
                    "allocation_id": str(uuid.uuid4()),
                    "node_id": node,
                    "epoch": 1,
                    "finished_at": now,
                },
                f"poison-{tag}-forged",
            ),
            f"poison-{tag}-forged",
        ),
    ]
    nc = await nats.connect(nats_url, max_reconnect_attempts=10)
    try:
        js = nc.jetstream()
        for subject, body, msg_id in messages:
            await js.publish(subject, body, headers={"Nats-Msg-Id": msg_id}, timeout=10)
    finally:
        await nc.close()
    return [msg_id for _, _, msg_id in messages]

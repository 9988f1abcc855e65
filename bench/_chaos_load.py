"""The chaos suite's load: small jobs from several teams, submitted through the HTTP API.

``Load(url, tokens, seed)`` plans jobs from a seeded generator and submits them over HTTP with
an ``Idempotency-Key`` each, so a POST retried after a timeout or a 5xx (the submission
service down, PostgreSQL away) names the same job: a job is *accepted* when an answer was
201 (or 200: the key's job already exists). Kinds, all on ``cpu`` virtual GPUs:

- ``sleep``: ``sleep 0.2..1.5`` (a tenth ask for 2 GPUs), ``max_restarts`` 8;
- ``checkpoint``: a Python job that saves one checkpoint through the SDK (so the registry
  makes a model version), ``max_restarts`` 8;
- ``fail``: exits 3 every time, ``max_restarts`` 1 (two attempts, then FAILED);
- ``cancel``: ``sleep 60``, cancelled through the API 1-3 s after it was accepted.

``probe()`` submits one tiny job of the ``probe`` team at priority ``high`` and waits until
its view is terminal with its cost: the end-to-end path (submission, scheduler, a runner,
billing) works again. The suite times recoveries with it.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from bench._chaos_check import TERMINAL, Accepted

TEAMS = ("vision", "nlp", "speech")
PROBE_TEAM = "probe"
KINDS = (("sleep", 0.78), ("checkpoint", 0.08), ("fail", 0.07), ("cancel", 0.07))

CHECKPOINT_JOB = """\
from trainyard import sdk
ctx = sdk.init()
ctx.report_metrics(1, loss=0.5)
ctx.save_checkpoint(1, {"weights": [1.0, 2.0, 3.0], "step": 1})
"""


@dataclass(frozen=True)
class Planned:
    key: str
    team: str
    kind: str
    spec: dict[str, Any]


def plan(rng: random.Random, team: str, index: int) -> Planned:
    """One job of a kind drawn by ``KINDS``' weights."""
    kind = rng.choices([k for k, _ in KINDS], [w for _, w in KINDS])[0]
    spec: dict[str, Any] = {"name": f"chaos-{kind}-{index}", "gpus": 1, "gpu_flavor": "cpu"}
    spec["max_runtime_seconds"] = 300
    if kind == "sleep":
        spec["command"] = ["sleep", f"{rng.uniform(0.2, 1.5):.2f}"]
        spec["gpus"] = 2 if rng.random() < 0.1 else 1
        spec["max_restarts"] = 8
    elif kind == "checkpoint":
        spec["command"] = ["python3", "-c", CHECKPOINT_JOB]
        spec["max_restarts"] = 8
        spec["register_model"] = True  # registration on success is checked under faults
    elif kind == "fail":
        spec["command"] = ["sh", "-c", "echo 'ValueError: chaos says no' >&2; exit 3"]
        spec["max_restarts"] = 1
    else:
        spec["command"] = ["sleep", "60"]
        spec["max_restarts"] = 8
    return Planned(f"chaos-{uuid.UUID(int=rng.getrandbits(128))}", team, kind, spec)


@dataclass
class Counters:
    submitted: int = 0
    accepted: int = 0
    retries: int = 0
    refused: int = 0
    cancels: int = 0
    errors: list[str] = field(default_factory=list)


class Load:
    """Submits planned jobs and remembers what was accepted (module docstring)."""

    def __init__(
        self,
        url: str,
        tokens: dict[str, str],
        seed: int,
        *,
        retry_for_s: float = 180.0,
        say: Callable[[str], None] = lambda _: None,
    ) -> None:
        self.url = url
        self.tokens = tokens
        self.rng = random.Random(seed)
        self.retry_for_s = retry_for_s
        self.accepted = Accepted(teams=set(tokens))
        self.counters = Counters()
        self.kinds: dict[str, str] = {}
        self._say = say
        self._lock = threading.Lock()
        self._local = threading.local()
        self._index = 0
        self._cancels: list[tuple[float, str, str]] = []  # (due, team, job id)

    # --- HTTP ----------------------------------------------------------------------------

    def _http(self) -> httpx.Client:
        client: httpx.Client | None = getattr(self._local, "client", None)
        if client is None:
            client = httpx.Client(base_url=self.url, timeout=10.0, trust_env=False)
            self._local.client = client
        return client

    def _call(
        self, method: str, path: str, team: str, stop: threading.Event, **kwargs: Any
    ) -> httpx.Response | None:
        """One request, retried while the platform cannot answer (connection errors, 5xx,
        429) for up to ``retry_for_s``; None if it never answered."""
        deadline = time.monotonic() + self.retry_for_s
        headers = {"Authorization": f"Bearer {self.tokens[team]}", **kwargs.pop("headers", {})}
        pause = 0.2
        while True:
            try:
                response = self._http().request(method, path, headers=headers, **kwargs)
                if response.status_code < 500 and response.status_code != 429:
                    return response
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or stop.is_set():
                return None
            with self._lock:
                self.counters.retries += 1
            stop.wait(pause)
            pause = min(pause * 2, 2.0)

    # --- jobs ----------------------------------------------------------------------------

    def next_plan(self, team: str | None = None) -> Planned:
        with self._lock:
            self._index += 1
            team = team or self.rng.choice(sorted(t for t in self.tokens if t != PROBE_TEAM))
            return plan(self.rng, team, self._index)

    def submit(self, planned: Planned, stop: threading.Event) -> str | None:
        """POST the job (retried with its key); the job id if it was accepted."""
        with self._lock:
            self.counters.submitted += 1
        response = self._call(
            "POST",
            "/v1/jobs",
            planned.team,
            stop,
            json=planned.spec,
            headers={"Idempotency-Key": planned.key},
        )
        if response is None or response.status_code not in (200, 201):
            with self._lock:
                self.counters.refused += 1
                if len(self.counters.errors) < 20:
                    detail = "no answer" if response is None else response.text[:300]
                    self.counters.errors.append(f"{planned.spec['name']}: {detail}")
            return None
        job_id = str(response.json()["id"])
        with self._lock:
            self.counters.accepted += 1
            self.accepted.jobs[job_id] = (planned.team, planned.kind)
            self.kinds[job_id] = planned.kind
            if planned.kind == "checkpoint":
                self.accepted.saves_checkpoint.add(job_id)
            if planned.kind == "cancel":
                due = time.monotonic() + self.rng.uniform(1.0, 3.0)
                self._cancels.append((due, planned.team, job_id))
        return job_id

    def cancel_due(self, stop: threading.Event, everything: bool = False) -> None:
        """Cancel the cancel-kind jobs whose time has come (all of them with ``everything``)."""
        now = time.monotonic()
        with self._lock:
            due = [c for c in self._cancels if everything or c[0] <= now]
            self._cancels = [c for c in self._cancels if c not in due]
        for _, team, job_id in due:
            response = self._call("POST", f"/v1/jobs/{job_id}/cancel", team, stop)
            with self._lock:
                self.counters.cancels += 1
                if response is None or response.status_code not in (200, 202, 409):
                    self.counters.errors.append(f"cancel {job_id}: no answer")

    def run(self, stop: threading.Event, per_minute: float) -> None:
        """Submit jobs at ``per_minute`` (exponential gaps) until ``stop``."""
        while not stop.is_set():
            self.submit(self.next_plan(), stop)
            self.cancel_due(stop)
            stop.wait(self.rng.expovariate(per_minute / 60.0))
        self.cancel_due(threading.Event(), everything=True)

    def view(self, team: str, job_id: str, stop: threading.Event) -> dict[str, Any] | None:
        response = self._call("GET", f"/v1/jobs/{job_id}", team, stop)
        if response is None or response.status_code != 200:
            return None
        view: dict[str, Any] = response.json()
        return view

    def probe(self, stop: threading.Event, timeout_s: float = 300.0) -> float | None:
        """Seconds for a probe job from submission to a terminal view with its cost; None
        if that did not happen within ``timeout_s``."""
        started = time.monotonic()
        planned = self.next_plan(PROBE_TEAM)
        spec = {
            "name": f"chaos-probe-{self._index}",
            "gpus": 1,
            "gpu_flavor": "cpu",
            "command": ["sleep", "0.1"],
            "priority": "high",
            "max_restarts": 8,
            "max_runtime_seconds": 120,
        }
        probe = Planned(planned.key, PROBE_TEAM, "probe", spec)
        job_id = self.submit(probe, stop)
        if job_id is None:
            return None
        while time.monotonic() - started < timeout_s and not stop.is_set():
            view = self.view(PROBE_TEAM, job_id, stop)
            if view is not None and view["status"] in TERMINAL and view.get("cost"):
                return time.monotonic() - started
            stop.wait(0.25)
        return None

"""What an event changes in a kept pass at issue 16's scale: how much of an event's pass an
exact incremental decision could reuse (BENCHMARKS.md, "Scheduler scale").

Run: ``.venv/bin/python -m bench.scheduler_scale_events`` (``--nodes``, ``--queues``,
``--events``; about a minute per event at 10,000 nodes). Pure policy, no I/O; prints one
line per event and writes nothing.

For the ``--ten-x`` scenario of ``bench.scheduler_scale`` and its seeded event mix
(``event_mix``), each event is applied to an ``Incremental`` (a whole pass) and the pass
after it is compared with the pass before, decision by decision:
- the first step (count of decisions) at which the job decided, or what was decided for it,
  differs: everything before it is the old pass again;
- the decisions whose outcome changed, by what changed: a job placed on other GPUs, placed
  against waiting, the kind of its wait, the reservations it would delay (``conflicts``),
  its reservation, its shape; a position alone in its queue is counted apart; a job that
  arrived is not counted;
- the preemption notices that differ.
Before the events, the kept pass's waiting jobs are described as runs of each queue's order
that only wait for quota (or are invalid): an upper bound of what deciding a queue's blocked
tail in bulk would skip, since a run ends at any job of the queue that is decided otherwise.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections import Counter

from bench.scheduler_scale import event_mix, scenario
from trainyard_platform.services.scheduler.policy.engine import PolicyState, Waiting
from trainyard_platform.services.scheduler.policy.incremental import Incremental
from trainyard_platform.services.scheduler.policy.model import Placement, PolicyConfig

Outcome = Placement | Waiting


def outcomes(state: PolicyState) -> dict[str, Outcome]:
    """Job id -> what the pass decided for it."""
    found: dict[str, Outcome] = {w.job.job_id: w for w in state.waiting}
    found.update((p.job_id, p) for p in state.placements)
    return found


def change(old: Outcome, new: Outcome) -> str | None:
    """What differs between two decisions for the same job (None: nothing)."""
    if isinstance(old, Placement) or isinstance(new, Placement):
        if isinstance(old, Placement) and isinstance(new, Placement):
            return None if old == new else "placed on other GPUs"
        return "placed <-> waiting"
    if old.kind != new.kind:
        return f"wait {old.kind} -> {new.kind}"
    if [r.job_id for r in old.conflicts] != [r.job_id for r in new.conflicts]:
        return "conflicts"

    def held(w: Waiting) -> tuple[str, float] | None:
        return None if w.reservation is None else (w.reservation.job_id, w.reservation.start)

    if held(old) != held(new):
        return "reservation"
    if old.shape != new.shape or old.victims != new.victims:
        return "shape or victims"
    return "position only" if old.position != new.position else None


def first_difference(old: PolicyState, new: PolicyState) -> int | None:
    """The first step whose decided job, or its decision but for its position, differs."""
    before, after = outcomes(old), outcomes(new)
    old_order = sorted(old.decided_at, key=old.decided_at.__getitem__)
    new_order = sorted(new.decided_at, key=new.decided_at.__getitem__)
    for step, (a, b) in enumerate(zip(old_order, new_order, strict=False), 1):
        if a != b or change(before[a], after[b]) not in (None, "position only"):
            return step
    return None


def quota_runs(state: PolicyState) -> list[int]:
    """Lengths of the maximal runs of each queue's order that only wait for quota."""
    kinds = {w.job.job_id: w.kind for w in state.waiting}
    lengths: list[int] = []
    for jobs in state.queue_order.values():
        run = 0
        for job in jobs:
            if kinds.get(job.job_id) in ("quota", "invalid"):
                run += 1
                continue
            if run:
                lengths.append(run)
            run = 0
        if run:
            lengths.append(run)
    return lengths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--queues", type=int, default=500)
    parser.add_argument("--events", type=int, default=8)
    args = parser.parse_args(argv)
    snapshot = scenario(args.nodes, queues_count=args.queues, submit_times=True)
    incremental = Incremental(snapshot, PolicyConfig())
    runs = quota_runs(incremental.state)
    print(
        f"{len(snapshot.pending):,} pending, {len(incremental.state.waiting):,} waiting: "
        f"{sum(runs):,} only wait for quota, in {len(runs):,} runs of their queues' orders "
        f"(mean {statistics.fmean(runs) if runs else 0:.1f}, longest {max(runs, default=0)})"
    )
    for kind, apply in event_mix(incremental, snapshot, args.nodes, args.events):
        old = incremental.state
        old_outcomes = outcomes(old)
        old_notices = {(p.job_id, p.for_job_id) for p in old.preemptions}
        cpu = time.process_time()
        apply()
        cpu = time.process_time() - cpu
        new = incremental.state
        if new is old:
            print(f"{kind:6} CPU {cpu * 1000:.1f} ms: decided alone (an isolated arrival)")
            continue
        changes = Counter(
            c
            for job_id, outcome in outcomes(new).items()
            if job_id in old_outcomes and (c := change(old_outcomes[job_id], outcome))
        )
        notices = old_notices ^ {(p.job_id, p.for_job_id) for p in new.preemptions}
        moved = changes.pop("position only", 0)
        print(
            f"{kind:6} pass CPU {cpu:.2f} s; first difference at step "
            f"{first_difference(old, new)} of {len(new.decided_at):,}; "
            f"{sum(changes.values()):,} decisions changed ({', '.join(f'{k} {v:,}' for k, v in changes.most_common())}); "
            f"{moved:,} moved in their queue only; {len(notices)} notices differ",
            flush=True,
        )
    print(f"load average (1 min) at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    return 0


if __name__ == "__main__":
    sys.exit(main())

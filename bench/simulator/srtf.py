"""ORACLE: shortest remaining time first with the true durations, preemptive.

Not a policy a scheduler could run: it reads every job's true duration from the trace, which
no other policy sees. It is a bound on what knowing durations is worth, and reports mark it
as an oracle. Contract:
- Remaining time of a pending job: its true duration less the work it has checkpointed (the
  engine shrinks the declared runtime by exactly that work, so it is recovered as the whole
  declared runtime of the job's current submission minus the declared runtime in the
  snapshot). Of a running job: that, less the time since its allocation began. The whole
  declared runtime is the trace's, doubled at each resubmission after a stop at the limit
  (the engine's rule), which the oracle sees as a pending job with a new submit time: it
  keeps, per job, the submit time it last saw and that submission's whole declaration.
- Pending jobs go shortest remaining first (ties by arrival); a pending job may preempt any
  running job with a strictly longer remaining time (longest first,
  ``preemptive.PreemptivePass``). Gangs are all-or-nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from bench.simulator.preemptive import PreemptivePass
from bench.simulator.trace import TraceJob
from trainyard_platform.services.scheduler.policy.model import (
    Decisions,
    PendingJob,
    RunningJob,
    Snapshot,
)


class SrtfOracle:
    """The oracle policy for the jobs of one trace."""

    def __init__(self, jobs: Iterable[TraceJob]) -> None:
        self.truth = {j.job_id: (j.duration, j.declared_runtime) for j in jobs}
        self.submissions: dict[str, tuple[float, float]] = {}
        """Job id -> (submit time last seen, whole declared runtime of that submission)."""

    def declared(self, job: PendingJob | RunningJob) -> float:
        """The whole declared runtime of ``job``'s current submission (module docstring)."""
        seen = self.submissions.get(job.job_id)
        if isinstance(job, PendingJob):
            if seen is None:
                seen = (job.submitted_at, self.truth[job.job_id][1])
            elif job.submitted_at != seen[0]:
                seen = (job.submitted_at, 2 * seen[1])  # resubmitted after a stop at the limit
            self.submissions[job.job_id] = seen
        return seen[1] if seen is not None else self.truth[job.job_id][1]

    def remaining(self, job: PendingJob | RunningJob, now: float) -> float:
        duration = self.truth[job.job_id][0]
        left = duration - (self.declared(job) - job.declared_runtime_s)
        if isinstance(job, RunningJob):
            left -= now - job.started_at
        return max(0.0, left)

    def __call__(self, snapshot: Snapshot) -> Decisions:
        now = snapshot.now
        left = {r.job_id: self.remaining(r, now) for r in snapshot.running}
        p = PreemptivePass(snapshot, lambda r: (-left[r.job_id], -r.started_at))
        for job in sorted(snapshot.pending, key=lambda j: (self.remaining(j, now), j.seq)):
            mine = self.remaining(job, now)
            p.start(
                job,
                _above(left, mine),
                f"oracle SRTF: {mine:.0f} s remaining is shorter",
            )
        return p.decisions()


def _above(left: Mapping[str, float], mine: float) -> Callable[[RunningJob], bool]:
    """Victims: running jobs with strictly more time remaining than ``mine``."""
    return lambda v: left[v.job_id] > mine

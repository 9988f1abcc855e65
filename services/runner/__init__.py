"""The runner: one node agent per GPU machine; it owns nothing durable but its processes.

It listens to ``allocation.granted`` and ``allocation.revoked`` for its own node (durable
consumer ``runner-<node_id>``), runs each allocation as ``python -m <entrypoint> <args>``
in ``code_dir`` with the job's context in ``TRAINYARD_*`` variables and a control pipe, and
says ``runner.heartbeat`` (every interval, with its running allocations), ``job.started``
(code version, environment, the checkpoint it resumes from), ``job.progress`` (throttled
metrics), ``checkpoint.saved``, and exactly one of ``job.succeeded`` / ``job.failed`` /
``job.preempted`` per allocation. Without a database it publishes directly, with
deterministic event ids (JetStream drops re-publishes); a file ledger in ``work_dir``
remembers allocations across restarts and holds each terminal event until it is sent.

Preemption, cancellation and the runner's own shutdown are all SIGTERM to the job (which
checkpoints and exits 75), SIGKILL after the grace, and ``job.preempted`` with the reason
(``preempted``, ``cancelled``, ``fenced`` or ``runner shutting down``): a cancel is reported
as preempted with reason ``cancelled`` because the scheduler, which asked for it, already
ends the job CANCELLED. Every event of a job is published in the job's trace.
"""

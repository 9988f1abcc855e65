"""The scheduler: owns the GPU inventory, the queue of jobs to place, and GPU leases.

It listens to ``runner.heartbeat`` (supply), ``job.submitted`` / ``job.cancel_requested``
(demand) and the runner's ``job.started`` / ``job.succeeded`` / ``job.failed`` /
``job.preempted`` (fenced by allocation id and epoch). After every change of supply or demand
it runs a scheduling pass (``policy.first_fit`` over a snapshot) in the same transaction and
says ``allocation.granted`` (to the node), ``allocation.revoked`` (cancel, fencing),
``allocation.released`` (for billing), ``job.pending`` (reason and position, only when they
change), ``job.cancelled`` and, for jobs whose node was lost once too often, ``job.failed``.
No GPU is leased twice: a partial unique index over live leases forbids it.
"""

"""The scheduler: owns the GPU inventory, team queues with quotas, priority classes, the
queue of jobs to place, and GPU leases.

It listens to ``runner.heartbeat`` (supply), ``job.submitted`` / ``job.cancel_requested``
(demand), the runner's ``job.started`` / ``checkpoint.saved`` / ``job.succeeded`` /
``job.failed`` / ``job.preempted`` (fenced by allocation id and epoch). After every change of
supply or demand, and on a timer, it runs a scheduling pass (the pure policy
``policy.engine.schedule`` over a snapshot) in one transaction and says ``allocation.granted``
(to each node of a gang), ``allocation.revoked`` (cancel, preemption notice, fencing),
``allocation.released`` (for billing), ``job.pending`` (reason, position, blocking,
suggestion, estimated start; only when they change), ``job.cancelled``, and on behalf of a
runner that cannot: ``job.failed`` (node lost too often) and ``job.preempted`` (grace over).
No GPU is leased twice: a partial unique index over live leases forbids it, and an
allocation the scheduler ends before its runner says the job stopped keeps its leases
until that runner has (``leases``). Several
processes may run; one leads (a Postgres advisory lock), the others stand by.
"""

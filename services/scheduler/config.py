"""Settings of the scheduler service (environment prefix ``TRAINYARD_SCHEDULER_``)."""

from __future__ import annotations

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from trainyard_platform.services.scheduler.inventory import InventoryMode
from trainyard_platform.shared.settings import GuardedServiceSettings, Port


class Settings(GuardedServiceSettings):
    """The scheduler: GPU inventory, queue and leases."""

    model_config = SettingsConfigDict(env_prefix="TRAINYARD_SCHEDULER_")

    port: Port = 8081
    """Port of the HTTP server (health, readiness, ``GET /v1/queue``, ``/v1/admin/...``)."""
    node_inventory: InventoryMode = InventoryMode.OPTIONAL
    """What a node the node inventory (``PUT /v1/admin/node-inventory/{node_id}``) does not
    declare gets: ``optional``, what its heartbeat claims (the zero-configuration local
    stack); ``required``, no GPU until an operator declares it. A declared node gets no more
    than its declaration either way (``inventory``)."""
    node_check_interval_seconds: float = Field(default=2.0, gt=0)
    """How often nodes are checked for missed heartbeats."""
    node_timeout_seconds: float = Field(default=15.0, gt=0)
    """A node the scheduler could have heard for this long, and did not, is LOST: its leases
    are released and its jobs requeued. Only time the scheduler itself was hearing counts
    (up, leading, connected to NATS, its consumer fetching and caught up): its own downtime,
    outage or backlog never passes for a silent node (``node_watch``)."""
    node_reconnect_grace_seconds: float = Field(default=5.0, ge=0)
    """Added to the timeout after the scheduler (re)starts hearing (a start, a NATS
    reconnect, a consumer resuming after a fault): runners cut off by the same outage get
    this long to reconnect and beat again before any of them is judged."""
    revoke_grace_seconds: float = Field(default=30.0, ge=0)
    """Time a runner gets to checkpoint and stop a job whose allocation is revoked (cancel)."""
    preemption_grace_seconds: float = Field(default=300.0, ge=0)
    """Time a preempted job gets to checkpoint and stop after its notice; then its GPUs are
    revoked by force (lease released, job requeued, the old runner fenced)."""
    restart_backoff_seconds: float = Field(default=5.0, ge=0)
    """A job restarted after a failure (``user_error``, ``out_of_memory``; while
    ``max_restarts`` allows) waits this long times 2**(restarts-1) before it may be placed
    again, and one retried after a ``platform_error`` this long times 2**(platform
    retries-1); 0: no back-off."""
    restart_backoff_max_seconds: float = Field(default=300.0, ge=0)
    """The longest restart back-off."""
    platform_retries: int = Field(default=3, ge=0)
    """A job whose attempt fails through the platform (``platform_error``: a node's full
    disk, the package index or object store away) is requeued this many times at most,
    backing off as a restart does; these retries never use up the job's ``max_restarts``.
    0: such a job fails at once."""
    cordon_after_platform_failures: int = Field(default=3, ge=0)
    """A node whose allocations end in ``platform_error`` this many times in a row (a success
    on it resets the count) is cordoned for ``cordon_seconds``: no new allocation is placed
    on it, its running jobs go on. 0: never."""
    cordon_seconds: float = Field(default=600.0, gt=0)
    """How long an automatic cordon lasts (an operator's lasts until uncordoned)."""
    max_waiting_jobs_per_team: int = Field(default=10_000, ge=0)
    """A team may have at most this many jobs waiting (queued, not yet granted GPUs); a job
    submitted beyond it is refused on arrival (``job.failed``, ``rejected``, saying so), so
    one team's flood of submissions cannot make every scheduling pass, and so every team's
    wait, longer. 0: no limit."""
    pass_interval_seconds: float = Field(default=5.0, gt=0)
    """A scheduling pass runs after every change of supply or demand, and at least this often
    (ageing, estimates, forced releases after the preemption grace)."""
    fair_share_half_life_seconds: float = Field(default=7 * 24 * 3600.0, gt=0)
    """Half-life of a team's past GPU-seconds in fair share (Slurm's default: 7 days)."""
    ageing_seconds: float = Field(default=3600.0, gt=0)
    """Every this long of waiting lifts a job by one priority level and one fair share."""
    size_weight: float = Field(default=8.0, ge=0)
    """Smaller jobs first: a job declaring ten times another's GPU-hours is ordered as if it
    had waited ``size_weight`` times ``ageing_seconds`` less (0: submit order within a
    priority level)."""
    backfill: bool = True
    """Let smaller, shorter jobs start ahead of blocked ones when they cannot delay them."""
    preemption: bool = True
    """Priority preemption within a queue and reclaim of lent quota across a cohort."""
    reservations: int = Field(default=8, ge=0)
    """Blocked jobs per flavor that get a reservation backfill must not delay."""
    min_runtime_seconds: float = Field(default=60.0, ge=0)
    """Anti-thrash: a preemptible job runs at least this long per allocation before it may
    be preempted, doubled for each earlier preemption (a class's own minimum, if longer,
    wins)."""
    max_preemptions: int = Field(default=3, ge=0)
    """Anti-thrash: a job preempted this many times runs its next allocation to its end."""
    oversize_protection_seconds: float = Field(default=4 * 3600.0, ge=0)
    """Anti-thrash: reclaim spares a borrowed job larger than what its queue borrows for this
    long in an allocation (taking it would take that queue below its nominal quota)."""
    leader_retry_seconds: float = Field(default=1.0, gt=0)
    """How often a follower tries to take the leader lock."""
    leader_check_seconds: float = Field(default=1.0, gt=0)
    """How often the leader checks its lock connection; a failed check ends its leadership."""
    leader_session_timeout_seconds: float = Field(default=10.0, ge=0)
    """Postgres ends the leader's lock session after this long without a query from it (a
    hung or partitioned leader), freeing the lock for a follower; 0 disables (PostgreSQL
    14+ only)."""

    @model_validator(mode="after")
    def _lock_session_stays_busy(self) -> Settings:
        timeout = self.leader_session_timeout_seconds
        if timeout and max(self.leader_check_seconds, self.leader_retry_seconds) >= timeout:
            raise ValueError(
                "leader_session_timeout_seconds must exceed leader_check_seconds and "
                "leader_retry_seconds, or Postgres ends a healthy leader's lock session"
            )
        return self

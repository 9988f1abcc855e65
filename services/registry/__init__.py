"""The registry: owns runs, checkpoints, models, model versions and their lineage, and
experiment tracking (experiments, every metric point of every job, tags and notes).

It listens to ``job.started`` (the run's reproducibility record: spec, code version,
environment, the checkpoint it resumed from), ``checkpoint.saved``, ``job.succeeded``,
``job.metrics`` (every metric point), the scheduler's ``job.failed`` and ``job.cancelled``
(a run's end) (durable consumer ``registry``). A succeeded job becomes the next version of
the model named by its spec's ``name`` within its ``team`` (versions 1, 2, 3, ... per model;
one version per job however often the success is delivered), with the run's artifact, final
metrics and a lineage that lets anyone reproduce it; members also register any committed
checkpoint of their team's jobs explicitly. A version's artifact is an immutable copy the
registry owns, verified by sha256 when registered and whenever served (``models``,
``artifacts``). It says ``model.registered`` (through its outbox).

Its model API (``api``, ``model_api``; docs/models.md: versions, aliases, downloads,
deletion) and its tracking API (``tracking_api``; docs/tracking.md) answer any user of the
team, and operators; another team's model, job or experiment answers 404. Its storage
collector (``collector``) frees what nothing references.
"""

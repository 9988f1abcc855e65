"""The registry: owns runs, checkpoints, models, model versions and their lineage.

It listens to ``job.started`` (the run's reproducibility record: spec, code version,
environment, the checkpoint it resumed from), ``checkpoint.saved`` and ``job.succeeded``
(durable consumer ``registry``). A succeeded job becomes the next version of the model named
by its spec's ``name`` within its ``team`` (versions 1, 2, 3, ... per model; one version per
job however often the success is delivered), with the run's artifact, final metrics and a
lineage that lets anyone reproduce it. It says ``model.registered`` (through its outbox).

Its read API (``GET /v1/models/{team}/{name}/versions[/{version}]``) is an operator
endpoint for now: it does not check the caller's team yet (see ``api``).
"""

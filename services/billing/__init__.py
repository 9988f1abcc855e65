"""Billing: owns the price book and the usage ledger.

It listens to ``allocation.released`` and turns each ended allocation into one ledger row:
GPU-seconds (GPUs x lease duration) x the flavor's price per GPU-hour, in exact decimals,
attributed to job, user and team. It says ``cost.recorded`` once per allocation; a
redelivered or repeated release never bills twice (the ledger is keyed by allocation id).
An attempt whose runner said it failed through the platform is charged to the platform,
not the team, every member of a gang included (the scheduler's release says so:
``platform_failure``; ``handlers``).
"""

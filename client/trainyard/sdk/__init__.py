"""The in-job SDK: hyperparameters, seeding, metrics, checkpoints and graceful stopping.

Training code calls ``ctx = trainyard.sdk.init(defaults)`` once and uses the context;
the same code runs on the platform and on a laptop (see ``trainyard.sdk.context``)::

    with trainyard.sdk.init({"lr": 0.01, "seed": 0}) as ctx:
        ctx.seed_everything()
        restored = ctx.restore_latest()
        ...
        ctx.report_metrics(step, loss=loss)
        ctx.save_checkpoint(step, {"model": model.state_dict(), ...})
        if ctx.should_stop():
            ctx.exit_preempted()
"""

from trainyard.control import PREEMPTED_EXIT_CODE
from trainyard.sdk.checkpoints import CheckpointError, CheckpointManifest
from trainyard.sdk.context import JobContext, init

__all__ = ["PREEMPTED_EXIT_CODE", "CheckpointError", "CheckpointManifest", "JobContext", "init"]

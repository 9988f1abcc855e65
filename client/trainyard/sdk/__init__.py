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

PyTorch is the training environment's own (CPU, CUDA or ROCm build, any version the SDK
supports): the ``trainyard`` distribution does not install it. Importing the SDK where
torch is missing raises ``ImportError`` saying so; the CLI and the HTTP client never need it.
"""

import importlib.util

if importlib.util.find_spec("torch") is None:
    raise ImportError(
        "trainyard.sdk needs PyTorch, which is not installed in this environment; install the "
        "torch build for your hardware (https://pytorch.org/get-started/locally/). The "
        "trainyard package does not pin torch so that the one you choose is used."
    )

from trainyard.control import PREEMPTED_EXIT_CODE
from trainyard.sdk.checkpoints import CheckpointError, CheckpointManifest
from trainyard.sdk.context import JobContext, init

__all__ = ["PREEMPTED_EXIT_CODE", "CheckpointError", "CheckpointManifest", "JobContext", "init"]

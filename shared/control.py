"""The job <-> runner contract, under the platform's name for it.

The contract lives in the client distribution (``trainyard.control``), which a training job
installs; the platform depends on the client, never the reverse, so this module only names
the same objects for the services' code.
"""

from trainyard.control import (
    ENV_ALLOCATION_ID,
    ENV_ATTEMPT,
    ENV_CHECKPOINT_URI,
    ENV_CONTROL_SOCKET,
    ENV_DATASET,
    ENV_GPU_INDICES,
    ENV_HYPERPARAMETERS,
    ENV_JOB_ID,
    ENV_SEED,
    MAX_CONTROL_LINE_BYTES,
    MAX_STEP,
    MAX_UNIX_PATH,
    PREEMPTED_EXIT_CODE,
    CheckpointMessage,
    CheckpointRef,
    ControlMessage,
    HyperValue,
    JobRuntimeEnv,
    MetricsMessage,
    parse_control_line,
    unix_address,
)

__all__ = [
    "ENV_ALLOCATION_ID",
    "ENV_ATTEMPT",
    "ENV_CHECKPOINT_URI",
    "ENV_CONTROL_SOCKET",
    "ENV_DATASET",
    "ENV_GPU_INDICES",
    "ENV_HYPERPARAMETERS",
    "ENV_JOB_ID",
    "ENV_SEED",
    "MAX_CONTROL_LINE_BYTES",
    "MAX_STEP",
    "MAX_UNIX_PATH",
    "PREEMPTED_EXIT_CODE",
    "CheckpointMessage",
    "CheckpointRef",
    "ControlMessage",
    "HyperValue",
    "JobRuntimeEnv",
    "MetricsMessage",
    "parse_control_line",
    "unix_address",
]

"""``JobContext``: what training code sees of the platform, with local fallbacks.

Inside the platform the runner sets the ``TRAINYARD_*`` variables of
``trainyard.control.JobRuntimeEnv``; outside it (no ``TRAINYARD_JOB_ID``) the same code runs
with the caller's defaults, seed ``defaults["seed"]`` (else 0), metrics printed to stdout
and checkpoints in ``./.trainyard/local-checkpoints/<name>``, so a rerun there resumes too.

Stopping: ``init`` installs a SIGTERM handler (main thread only) that merely sets a flag.
The runner sends SIGTERM on preemption, cancellation and node shutdown, then SIGKILL
after a grace period; the loop should poll ``should_stop()``, save a checkpoint and call
``exit_preempted()``, which waits for the upload and exits with ``PREEMPTED_EXIT_CODE``
(75) so the runner can tell "stopped early, resume me" from "finished" (0). A loop that
never polls ``should_stop()`` keeps running until the SIGKILL.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import re
import signal
import socket
import sys
import threading
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, NoReturn, SupportsFloat, TypeVar

import torch

from trainyard.control import (
    MAX_CONTROL_LINE_BYTES,
    PREEMPTED_EXIT_CODE,
    CheckpointMessage,
    CheckpointRef,
    JobRuntimeEnv,
    MetricsMessage,
    unix_address,
)
from trainyard.sdk.checkpoints import CheckpointWriter, restore_latest
from trainyard.sdk.throughput import DataMeter
from trainyard.storage import ObjectStore, open_store

log = logging.getLogger("trainyard.sdk")

LOCAL_CHECKPOINT_ROOT = "file://./.trainyard/local-checkpoints"
"""Where checkpoints go outside the platform: one folder per job name under this."""

LOCAL_JOB_ID = "local"

T = TypeVar("T")

_SignalHandler = Any  # what signal.signal returns: a callable, a Handlers value, or None


class ControlChannel:
    """Writes control messages as lines to the runner's Unix socket; safe from several
    threads.

    If the runner has gone (connection refused or broken) the job keeps training: it warns
    once and drops further messages, since committed checkpoints are what a restart relies
    on.
    """

    def __init__(self, path: str) -> None:
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        try:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(unix_address(path))
            self._sock = sock
        except OSError as exc:
            log.warning("cannot reach the runner's control socket %s (%s)", path, exc)

    def send(self, message: MetricsMessage | CheckpointMessage) -> None:
        data = message.encode()
        if len(data) > MAX_CONTROL_LINE_BYTES:
            raise ValueError(f"control message is {len(data)} bytes, over the limit")
        with self._lock:
            if self._sock is None:
                return
            try:
                self._sock.sendall(data)
            except OSError as exc:
                log.warning("control channel to the runner failed (%s); messages dropped", exc)
                self._close_locked()

    def close(self) -> None:
        with self._lock:
            self._close_locked()

    def _close_locked(self) -> None:
        if self._sock is not None:
            sock, self._sock = self._sock, None
            # OSError: the runner closed first; there is nothing left to flush.
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_WR)
            sock.close()


class JobContext:
    """One job's view of the platform. Create it with ``trainyard.sdk.init``."""

    def __init__(
        self,
        *,
        runtime: JobRuntimeEnv | None,
        hyperparameters: Mapping[str, Any],
        seed: int,
        store: ObjectStore,
        control: ControlChannel | None = None,
        all_ranks_metrics: bool = False,
    ) -> None:
        self.runtime = runtime
        self._all_ranks_metrics = all_ranks_metrics
        self._data_meter = DataMeter()
        """The platform's variables; ``None`` outside the platform."""
        self._hyperparameters = dict(hyperparameters)
        self._seed = seed
        self._store = store
        self._control = control
        self._writer = CheckpointWriter(
            store,
            job_id=self.job_id,
            attempt=self.attempt,
            on_saved=self._checkpoint_saved,
        )
        self._stop_requested = False
        self._stop_logged = False
        self._previous_sigterm: _SignalHandler = None
        self._handler_installed = False
        self._closed = False

    # --- identity and configuration ---------------------------------------------------

    @property
    def job_id(self) -> str:
        return self.runtime.job_id if self.runtime else LOCAL_JOB_ID

    @property
    def attempt(self) -> int:
        """The platform's attempt number; 0 outside the platform."""
        return self.runtime.attempt if self.runtime else 0

    @property
    def seed(self) -> int:
        return self._seed

    @property
    def rank(self) -> int:
        """This process's global rank (``RANK``, set by ``torchrun``); 0 for one process."""
        return _env_int("RANK", 0)

    @property
    def local_rank(self) -> int:
        return _env_int("LOCAL_RANK", 0)

    @property
    def world_size(self) -> int:
        return _env_int("WORLD_SIZE", 1)

    @property
    def is_main(self) -> bool:
        """Rank 0: the process that commits checkpoints and reports metrics."""
        return self.rank == 0

    @property
    def hyperparameters(self) -> dict[str, Any]:
        """A copy: the defaults given to ``init``, overridden by the platform's values."""
        return dict(self._hyperparameters)

    @property
    def dataset(self) -> str | None:
        return self.runtime.dataset if self.runtime else None

    @property
    def checkpoint_store(self) -> ObjectStore:
        return self._store

    @property
    def checkpoint_uri(self) -> str:
        return self._store.root_uri

    def seed_everything(self) -> int:
        """Seed Python's ``random``, NumPy (when installed) and torch (CPU and CUDA) with
        ``seed``."""
        random.seed(self._seed)
        # NumPy is the training code's choice, not a dependency of this distribution:
        # without it there is no NumPy generator to seed.
        with contextlib.suppress(ImportError):
            import numpy as np

            np.random.seed(self._seed % 2**32)  # NumPy accepts only 32-bit seeds
        torch.manual_seed(self._seed)
        return self._seed

    # --- metrics ------------------------------------------------------------------------

    def report_metrics(self, step: int, **metrics: SupportsFloat) -> None:
        """Report metrics at ``step`` to the runner (outside the platform: print them).

        Values are anything ``float()`` takes except text: Python and NumPy numbers, and
        one-element tensors (which ``float()`` copies from the GPU). When batches come
        through ``data(loader)``, ``data_wait_fraction`` and ``samples_per_s`` since the
        previous report are added.
        """
        values: dict[str, float] = {}
        for name, value in metrics.items():
            try:
                if isinstance(value, str | bytes):
                    raise TypeError  # float("0.5") works, but a string here is a bug
                values[name] = float(value)
            except (TypeError, ValueError):
                raise TypeError(
                    f"metric {name!r} must be a number, not {type(value).__name__}"
                ) from None
        values.update(self._data_meter.take())
        if not self.is_main and not self._all_ranks_metrics:
            return
        if not self.is_main:
            values = {f"rank{self.rank}/{name}": value for name, value in values.items()}
        message = MetricsMessage(step=step, metrics=values)
        if self._control is not None:
            self._control.send(message)
        else:
            shown = " ".join(f"{k}={v:.6g}" for k, v in values.items())
            print(f"[trainyard] step {step}: {shown}", flush=True)

    def data(self, loader: Iterable[T]) -> Iterator[T]:
        """Iterate ``loader`` while measuring how long the loop waits for each batch (see
        ``trainyard.sdk.throughput``): ``for x, y in ctx.data(train_loader): ...``."""
        return self._data_meter.wrap(loader)

    # --- checkpoints ------------------------------------------------------------------

    def save_checkpoint(self, step: int, state: dict[str, Any]) -> None:
        """Copy ``state`` to CPU memory now and upload it in the background.

        Waits first for the previous upload (and raises ``CheckpointError`` if it failed),
        so at most one checkpoint is in flight. In a distributed job only rank 0 commits
        (replicated DDP state is the same on every rank); other ranks return at once, so
        one checkpoint exists per step whatever the number of processes.
        """
        if not self.is_main:
            return
        self._writer.save(step, state)

    def wait_for_checkpoints(self) -> CheckpointRef | None:
        """Block until the upload in flight is done; returns its reference, re-raises its
        error as ``CheckpointError``."""
        return self._writer.wait()

    def restore_latest(self) -> tuple[int, dict[str, Any]] | None:
        """``(step, state)`` of the newest checkpoint whose object matches its manifest."""
        restored = restore_latest(self._store)
        if restored is not None:
            log.info("restored checkpoint of step %d from %s", restored[0], self.checkpoint_uri)
        return restored

    def _checkpoint_saved(self, ref: CheckpointRef) -> None:
        if self._control is not None:
            self._control.send(CheckpointMessage(checkpoint=ref))

    # --- stopping -----------------------------------------------------------------------

    def install_sigterm_handler(self) -> bool:
        """Make SIGTERM set the ``should_stop`` flag; False if not on the main thread."""
        if threading.current_thread() is not threading.main_thread():
            log.warning("trainyard.sdk.init() not called on the main thread: SIGTERM not handled")
            return False
        self._previous_sigterm = signal.signal(signal.SIGTERM, self._on_sigterm)
        self._handler_installed = True
        return True

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        # Only set a flag: logging or I/O from a signal handler can deadlock or raise.
        self._stop_requested = True

    def should_stop(self) -> bool:
        """True once SIGTERM arrived: checkpoint, then call ``exit_preempted()``.

        In a distributed job (``torch.distributed`` initialised, more than one process) this
        is a collective: every rank must call it at the same point of the loop, and all of
        them get the same answer (any rank asked to stop stops them all), so no rank is left
        waiting in a collective its peers never reach.
        """
        stop = self._stop_requested
        if self.world_size > 1 and _distributed_ready():
            flag = torch.tensor([int(stop)], dtype=torch.int32, device=_collective_device())
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
            # The ranks' answer; the flag is only ever raised here, never cleared: a SIGTERM
            # that arrived during the collective is not lost, it counts at the next call.
            stop = bool(flag.item())
            if stop:
                self._stop_requested = True
        if stop and not self._stop_logged:
            self._stop_logged = True
            log.warning("SIGTERM received: the job should checkpoint and exit")
        return stop

    def exit_preempted(self) -> NoReturn:
        """Wait for checkpoints, close, and exit with ``PREEMPTED_EXIT_CODE`` (75).

        An upload that failed is logged, not raised: the job still stopped because it was
        asked to, and the runner resumes it from the newest complete checkpoint.
        """
        try:
            self.close()
        except Exception:
            log.exception("a checkpoint failed while stopping; resuming from an older one")
        raise SystemExit(PREEMPTED_EXIT_CODE)

    # --- lifetime -----------------------------------------------------------------------

    def close(self) -> None:
        """Wait for checkpoint uploads (re-raising a failure), restore the SIGTERM
        handler and close the control channel. Safe to call more than once."""
        if self._closed:
            return
        self._closed = True
        try:
            self._writer.close()
        finally:
            if self._handler_installed and threading.current_thread() is threading.main_thread():
                # None: the old handler wasn't set from Python; the default is closest.
                previous = self._previous_sigterm
                signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
                self._handler_installed = False
            if self._control is not None:
                self._control.close()

    def __enter__(self) -> JobContext:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            self.close()
            return
        # Don't let an upload error hide the exception that is already propagating.
        try:
            self.close()
        except Exception:
            log.exception("checkpoint upload failed while handling another error")


def init(
    defaults: Mapping[str, Any] | None = None,
    *,
    name: str | None = None,
    all_ranks_metrics: bool = False,
) -> JobContext:
    """Create the job's context from the runner's environment, or local fallbacks.

    ``defaults`` are the hyperparameters used when the platform gives none; the
    platform's values override them key by key. ``defaults["seed"]`` is the local seed
    (not a hyperparameter). ``name`` names the local checkpoint folder (default: the
    script's file name). Metrics come from rank 0 only unless ``all_ranks_metrics`` (then
    other ranks' names are prefixed ``rank<N>/``).
    """
    hyperparameters = dict(defaults or {})
    local_seed = int(hyperparameters.pop("seed", 0))
    runtime = JobRuntimeEnv.from_env(os.environ)
    if runtime is not None:
        hyperparameters.update(runtime.hyperparameters)
        seed, checkpoint_uri = runtime.seed, runtime.checkpoint_uri
    else:
        seed = local_seed
        checkpoint_uri = f"{LOCAL_CHECKPOINT_ROOT}/{_safe_name(name or _script_name())}"
    control = None
    if runtime is not None and runtime.control_socket is not None:
        control = ControlChannel(runtime.control_socket)
    context = JobContext(
        runtime=runtime,
        hyperparameters=hyperparameters,
        seed=seed,
        store=open_store(checkpoint_uri),
        control=control,
        all_ranks_metrics=all_ranks_metrics,
    )
    context.install_sigterm_handler()
    return context


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    try:
        return int(value) if value else default
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {value!r}") from None


def _distributed_ready() -> bool:
    return bool(torch.distributed.is_available() and torch.distributed.is_initialized())


def _collective_device() -> torch.device:
    """Where a tensor for a collective of the default group must live: on the CPU when the
    group has a CPU backend (gloo: ``"cpu:gloo,cuda:gloo"``, or ``"cpu:gloo,cuda:nccl"``),
    else on this rank's GPU (NCCL alone, ``"cuda:nccl"``, raises on CPU tensors)."""
    devices = {pair.split(":")[0] for pair in torch.distributed.get_backend_config().split(",")}
    if "cpu" in devices or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device())


def _script_name() -> str:
    script = Path(sys.argv[0]) if sys.argv and sys.argv[0] not in ("", "-c") else None
    if script is None:
        return "job"
    # ``python -m package`` runs package/__main__.py: the package is the better name.
    return script.parent.name if script.stem == "__main__" else script.stem


def _safe_name(name: str) -> str:
    """A single, safe key segment: anything but letters, digits, ``._-`` becomes ``_``."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "_", name).strip(".") or "job"
    return cleaned

"""The training script of ``bench.execution``: run bare (``python train.py ...``) and as a job.

A small MLP on synthetic tensors, one CPU thread, a fixed number of steps; every batch comes
through ``ctx.data(...)`` (data-wait measurement on) and metrics are reported every
``--report-every`` steps. It measures itself and prints one line at the end::

    TRAINYARD_BENCH {"samples_per_s": ..., "loop_s": ..., ...}

``samples_per_s`` counts the steps after ``--warmup`` only, from the end of the warm-up to
the end of the last step: interpreter start, imports, ``sdk.init`` and model building are
excluded.

Checkpoint mode (``--checkpoint-mb M``): the state also holds ``M`` MiB of float32 tensors,
and every ``--checkpoint-every-s`` seconds of training the loop saves a checkpoint, either
with the SDK (``ctx.save_checkpoint``: a snapshot copy, written in the background) or, with
``--sync-store``, synchronously (``torch.save`` to a local file, then ``put_file`` to the
object store named by ``TRAINYARD_STORAGE_*``). The time the loop is blocked by each call
is printed in ``stalls_s``, with the wall-clock time (``time.time()``) it began; with the
SDK, ``waits_for_previous_s`` is the part of it spent waiting for the previous checkpoint's
background write (``save_checkpoint`` waits for it; the rest is the snapshot copy).

Only the standard library, torch and ``trainyard.sdk`` (and ``shared.storage`` for
``--sync-store``): it runs from a code bundle in the runner's job environment.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

from trainyard import sdk

MARKER = "TRAINYARD_BENCH"


def batches(
    x: torch.Tensor, y: torch.Tensor, steps: int, batch: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """``steps`` batches, cycling over the synthetic data set (slices: no copies)."""
    per_epoch = x.shape[0] // batch
    for step in range(steps):
        i = (step % per_epoch) * batch
        yield x[i : i + batch], y[i : i + batch]


def big_state(mib: int) -> dict[str, torch.Tensor]:
    """``mib`` MiB of float32 tensors in 16 MiB pieces (like the layers of a model)."""
    piece = 16 * 1024 * 1024 // 4
    count = max(1, mib // 16)
    return {f"layer{i}.weight": torch.randn(piece) for i in range(count)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--features", type=int, default=256)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--report-every", type=int, default=10)
    parser.add_argument("--checkpoint-mb", type=int, default=0)
    parser.add_argument("--checkpoint-every-s", type=float, default=5.0)
    parser.add_argument("--checkpoints", type=int, default=0, help="stop after this many")
    parser.add_argument("--sync-store", default="", help="an object-store URI (sync mode)")
    args = parser.parse_args()

    torch.set_num_threads(1)
    ctx = sdk.init(defaults={"lr": 0.01, "seed": 0})
    ctx.seed_everything()
    x = torch.randn(8192, args.features)
    y = torch.randint(0, 10, (8192,))
    model = nn.Sequential(
        nn.Linear(args.features, args.hidden),
        nn.ReLU(),
        nn.Linear(args.hidden, args.hidden),
        nn.ReLU(),
        nn.Linear(args.hidden, 10),
    )
    opt = torch.optim.SGD(model.parameters(), lr=float(ctx.hyperparameters["lr"]))
    loss_fn = nn.CrossEntropyLoss()

    state = big_state(args.checkpoint_mb) if args.checkpoint_mb else {}
    store = None
    if args.sync_store:
        from trainyard_platform.shared.storage import open_store

        store = open_store(args.sync_store)
    stalls: list[float] = []
    stall_started: list[float] = []
    stall_steps: list[int] = []
    waits: list[float] = []
    report_total_s = report_max_s = 0.0
    last_checkpoint = 0.0

    loop_start = time.perf_counter()
    loop_cpu_start = time.process_time()
    steps = 0
    samples = 0
    for step, (xb, yb) in enumerate(ctx.data(batches(x, y, args.steps, args.batch)), start=1):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(xb), yb)
        loss.backward()
        opt.step()
        if step == args.warmup:
            loop_start = time.perf_counter()
            loop_cpu_start = time.process_time()
            last_checkpoint = loop_start
            steps, samples = 0, 0
            continue
        steps += 1
        samples += xb.shape[0]
        if step % args.report_every == 0 or step == 1:
            reported = time.perf_counter()
            ctx.report_metrics(step, loss=loss.item())
            report_s = time.perf_counter() - reported
            report_total_s += report_s
            report_max_s = max(report_max_s, report_s)
        due = time.perf_counter() - last_checkpoint >= args.checkpoint_every_s
        if not state or step < args.warmup or not due:
            continue
        if len(stalls) >= args.checkpoints:
            break  # a whole interval of training after the last checkpoint
        checkpoint = {"model": model.state_dict(), "step": step, **state}
        stall_started.append(time.time())
        stall_steps.append(step)
        began = time.perf_counter()
        if store is None:
            # save_checkpoint waits for the previous write itself; waiting first only
            # splits the stall into that wait and the snapshot copy.
            ctx.wait_for_checkpoints()
            waits.append(time.perf_counter() - began)
            ctx.save_checkpoint(step, checkpoint)
        else:
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / "checkpoint.pt"
                torch.save(checkpoint, path)
                store.put_file(f"step-{step:08d}/checkpoint.pt", path)
        stalls.append(time.perf_counter() - began)
        last_checkpoint = time.perf_counter()
    loop_s = time.perf_counter() - loop_start
    loop_cpu_s = time.process_time() - loop_cpu_start
    ctx.report_metrics(step, loss=loss.item())
    wait_started = time.perf_counter()
    ctx.close()  # waits for the checkpoint in flight
    result = {
        "samples_per_s": samples / loop_s,
        "loop_s": loop_s,
        "loop_cpu_s": loop_cpu_s,
        "steps_measured": steps,
        "batch": args.batch,
        "stalls_s": stalls,
        "stall_started_at": stall_started,
        "stall_steps": stall_steps,
        "waits_for_previous_s": waits,
        "close_s": time.perf_counter() - wait_started,
        "report_metrics_total_s": report_total_s,
        "report_metrics_max_s": report_max_s,
        "platform": ctx.runtime is not None,
        "python": sys.executable,
    }
    print(MARKER, json.dumps(result), flush=True)


if __name__ == "__main__":
    main()

"""Data-parallel training (DDP) of a small MLP on scikit-learn's bundled 8x8 digits.

One process per GPU, started by ``torchrun`` (the runner does that for a job with more
than one GPU, or a gang of nodes); on CPU (virtual GPUs, ``CUDA_VISIBLE_DEVICES=""``) the
processes talk over gloo, on GPUs over NCCL. Try it without the platform::

    python -m torch.distributed.run --standalone --nproc_per_node=2 examples/ddp_digits.py
    python examples/ddp_digits.py          # one process, world size 1

On the platform submit ``examples/ddp_digits.job.json``. What it shows:

* ``dist.init_process_group`` from torchrun's variables (``RANK``, ``WORLD_SIZE``,
  ``MASTER_ADDR``, ``MASTER_PORT``); run plainly it makes a group of one;
* a ``DistributedSampler``: each rank trains on its own shard, the shuffle of an epoch is
  a function of (seed, epoch) only, so a resumed run replays the batches it would have seen;
* every rank restores the same checkpoint; only rank 0 commits checkpoints and reports
  metrics (the SDK ignores the others), every ``checkpoint_every`` steps and at the end;
* ``ctx.should_stop()`` every step on every rank: it is a collective, so all ranks agree
  to stop at the same step (checkpoint, then ``exit_preempted``);
* at the end every rank prints ``FINAL_WEIGHTS rank=<r> sha256=<hex>`` of its parameters:
  DDP keeps the replicas identical, so all ranks print the same digest.

``step`` counts optimizer steps; steps per epoch depend on the world size, so resume with
the world size the checkpoint was written with.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from trainyard import sdk

DEFAULTS: dict[str, Any] = {
    "lr": 0.05,
    "batch_size": 32,  # per rank
    "epochs": 4,
    "checkpoint_every": 20,
    "log_every": 10,
    "seed": 42,
}


def init_distributed() -> torch.device:
    """Join the process group torchrun describes (or make a group of one) and return this
    rank's device."""
    use_cuda = torch.cuda.is_available() and os.environ.get("CUDA_VISIBLE_DEVICES") != ""
    backend = "nccl" if use_cuda else "gloo"
    if "WORLD_SIZE" in os.environ:  # started by torchrun: the env:// rendezvous
        dist.init_process_group(backend, init_method="env://")
    else:
        # Run plainly: a group of one, its store on any free port of this host.
        dist.init_process_group(backend, init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
    if not use_cuda:
        return torch.device("cpu")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


def say(line: str) -> None:
    """Print ``line`` in one write: run under torchrun without the platform the ranks share
    stdout, and print() writes in pieces (the platform gives each rank a pipe of its own)."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def make_model() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))


def load_data(seed: int) -> tuple[TensorDataset, TensorDataset]:
    """Train/validation sets (80/20, stratified by the seed), pixels scaled to [0, 1]."""
    digits = load_digits()
    x = torch.from_numpy(digits.data.astype("float32") / 16.0)
    y = torch.from_numpy(digits.target).long()
    x_train, x_val, y_train, y_val = train_test_split(
        x, y, test_size=0.2, random_state=seed, stratify=digits.target
    )
    return TensorDataset(x_train, y_train), TensorDataset(x_val, y_val)


def weights_sha256(model: nn.Module) -> str:
    """sha256 over the bytes of every tensor of the state dict, in its order."""
    digest = hashlib.sha256()
    for tensor in model.state_dict().values():
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


@torch.no_grad()
def accuracy(model: nn.Module, data: TensorDataset, device: torch.device) -> float:
    x, y = (t.to(device) for t in data.tensors)
    model.eval()
    predictions = model(x).argmax(dim=1)
    model.train()
    return float((predictions == y).float().mean())


def train(ctx: sdk.JobContext, device: torch.device) -> nn.Module:
    """Train (resuming if a checkpoint exists); returns the trained (unwrapped) model."""
    hp = ctx.hyperparameters
    lr, batch_size, epochs = float(hp["lr"]), int(hp["batch_size"]), int(hp["epochs"])
    checkpoint_every, log_every = int(hp["checkpoint_every"]), int(hp["log_every"])

    ctx.seed_everything()  # same seed on every rank: the same initial weights
    train_set, val_set = load_data(ctx.seed)
    sampler: DistributedSampler[tuple[torch.Tensor, ...]] = DistributedSampler(
        train_set, num_replicas=ctx.world_size, rank=ctx.rank, shuffle=True, seed=ctx.seed
    )
    loader = DataLoader(train_set, batch_size=batch_size, sampler=sampler)
    steps_per_epoch = len(loader)  # the same on every rank: the sampler pads its shards
    total_steps = epochs * steps_per_epoch

    module = make_model().to(device)
    optimizer = torch.optim.SGD(module.parameters(), lr=lr, momentum=0.9)
    step = 0
    restored = ctx.restore_latest()  # every rank reads the same staged checkpoint
    if restored is not None:
        _, saved = restored
        module.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        step = int(saved["step"])
        if ctx.is_main:
            print(f"resumed at step {step} of {total_steps}", flush=True)
    resumed_at = step
    # DDP broadcasts rank 0's parameters (a collective: no rank trains, so none saves a
    # checkpoint, before every rank has restored) and averages gradients in backward().
    model = DistributedDataParallel(
        module, device_ids=[device.index] if device.type == "cuda" else None
    )
    loss_fn = nn.CrossEntropyLoss()

    def state() -> dict[str, Any]:
        return {"model": module.state_dict(), "optimizer": optimizer.state_dict(), "step": step}

    while step < total_steps:
        epoch, first_batch = divmod(step, steps_per_epoch)
        sampler.set_epoch(epoch)  # the epoch's shuffle, the same on every rank
        for x, y in ctx.data(itertools.islice(loader, first_batch, None)):
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            step += 1
            if step % log_every == 0:
                ctx.report_metrics(step, loss=loss.item(), epoch=epoch)  # rank 0 only
            if step < total_steps:  # the last step gets the final checkpoint below
                stopping = ctx.should_stop()  # a collective: every rank, every step
                if stopping or step % checkpoint_every == 0:
                    ctx.save_checkpoint(step, state())  # rank 0 only
                if stopping:
                    say(f"STOPPING rank={ctx.rank} step={step}")
                    ctx.exit_preempted()

    if resumed_at < total_steps:  # else the final checkpoint exists already
        val_accuracy = accuracy(module, val_set, device)
        ctx.report_metrics(step, val_accuracy=val_accuracy)
        ctx.save_checkpoint(step, {**state(), "val_accuracy": val_accuracy})
    return module


def main() -> None:
    # One thread per process: a tiny model gains nothing from more, and it keeps runs
    # reproducible and polite on a shared node.
    torch.set_num_threads(1)
    started = time.perf_counter()
    device = init_distributed()
    try:
        with sdk.init(DEFAULTS, name="ddp_digits") as ctx:
            model = train(ctx, device)
            say(f"FINAL_WEIGHTS rank={ctx.rank} sha256={weights_sha256(model)}")
            if ctx.is_main:
                print(f"done in {time.perf_counter() - started:.1f}s", flush=True)
            # Every rank leaves together: a rank that tears its connections down while
            # another is still finishing (rank 0 checkpoints last) can make gloo's
            # background thread see the peer gone and abort that rank (SIGABRT).
            dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

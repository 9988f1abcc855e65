"""A small CNN on scikit-learn's bundled 8x8 digits: the reference Trainyard job.

Run it anywhere with ``python -m examples.digits_cnn`` (no platform, no download); on the
platform submit ``examples/digits.job.json``. It shows the SDK's whole contract:

* hyperparameters from the platform over the defaults below, seeded determinism;
* resume: the latest verified checkpoint restores model, optimizer, step and epoch. The
  batch order of an epoch depends only on (seed, epoch), so a resumed run replays the
  same batches and ends with the same weights as an uninterrupted one;
* a checkpoint every ``checkpoint_every`` steps, and a final one with the final metrics;
* on SIGTERM: checkpoint at the current step and exit with ``PREEMPTED_EXIT_CODE``.

``step`` counts optimizer steps taken; ``epoch`` in a checkpoint is the epoch the next
step belongs to (``step // steps_per_epoch``). Locally, checkpoints land in
``.trainyard/local-checkpoints/digits_cnn``: delete that folder to train from scratch.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn

from trainyard import sdk

DEFAULTS: dict[str, Any] = {
    "lr": 0.003,
    "batch_size": 64,
    "epochs": 8,
    "checkpoint_every": 50,
    "log_every": 10,
    "seed": 42,
}


class DigitsCNN(nn.Module):
    """Two 3x3 convolutions, one pooling, two dense layers: ~40k parameters."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.Conv2d(16, 32, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),  # 8x8 -> 4x4
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(32 * 4 * 4, 64),
            nn.ReLU(),
            nn.Linear(64, 10),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.classifier(self.features(x))
        return out


def load_data(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Train/validation tensors (80/20, stratified by the seed), pixels scaled to [0, 1]."""
    digits = load_digits()
    images = digits.images.astype("float32") / 16.0
    x_train, x_val, y_train, y_val = train_test_split(
        images, digits.target, test_size=0.2, random_state=seed, stratify=digits.target
    )

    def to_x(a: Any) -> torch.Tensor:
        return torch.from_numpy(a).unsqueeze(1)  # N x 1 x 8 x 8

    def to_y(a: Any) -> torch.Tensor:
        return torch.from_numpy(a).long()

    return to_x(x_train), to_y(y_train), to_x(x_val), to_y(y_val)


def epoch_order(seed: int, epoch: int, n: int) -> torch.Tensor:
    """The shuffle of one epoch, a function of (seed, epoch) only, so resuming mid-epoch
    replays exactly the batches an uninterrupted run would have seen."""
    generator = torch.Generator().manual_seed(seed * 100_003 + epoch)
    return torch.randperm(n, generator=generator)


@torch.no_grad()
def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    model.eval()
    predictions = model(x).argmax(dim=1)
    model.train()
    return float((predictions == y).float().mean())


def train(ctx: sdk.JobContext) -> dict[str, float]:
    """Train (resuming if a checkpoint exists) and return the final metrics."""
    hp = ctx.hyperparameters
    lr, batch_size, epochs = float(hp["lr"]), int(hp["batch_size"]), int(hp["epochs"])
    checkpoint_every, log_every = int(hp["checkpoint_every"]), int(hp["log_every"])

    ctx.seed_everything()
    x_train, y_train, x_val, y_val = load_data(ctx.seed)
    model = DigitsCNN()
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    loss_fn = nn.CrossEntropyLoss()
    steps_per_epoch = math.ceil(len(x_train) / batch_size)
    total_steps = epochs * steps_per_epoch

    def state(step: int, **extra: Any) -> dict[str, Any]:
        return {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "step": step,
            "epoch": step // steps_per_epoch,
            **extra,
        }

    step = 0
    restored = ctx.restore_latest()
    if restored is not None:
        _, saved = restored
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        step = int(saved["step"])
        print(f"resumed at step {step} (epoch {saved['epoch']}) of {total_steps}", flush=True)
        if step >= total_steps and "metrics" in saved:
            return {k: float(v) for k, v in saved["metrics"].items()}

    model.train()
    while step < total_steps:
        epoch, first_batch = divmod(step, steps_per_epoch)
        order = epoch_order(ctx.seed, epoch, len(x_train))
        batches = (
            (x_train[index], y_train[index])
            for b in range(first_batch, steps_per_epoch)
            for index in [order[b * batch_size : (b + 1) * batch_size]]
        )
        # ctx.data times each batch: the platform sees samples/s and the time spent waiting.
        for x, y in ctx.data(batches):
            optimizer.zero_grad(set_to_none=True)
            logits = model(x)
            loss = loss_fn(logits, y)
            loss.backward()
            optimizer.step()
            step += 1

            if step % log_every == 0:
                train_accuracy = float((logits.argmax(dim=1) == y).float().mean())
                ctx.report_metrics(step, loss=loss.item(), train_accuracy=train_accuracy)
            # The final step gets the final checkpoint below instead, with metrics in it;
            # a stop request that late is moot, the job is about to finish anyway.
            if step < total_steps:
                stopping = ctx.should_stop()
                if stopping or step % checkpoint_every == 0:
                    ctx.save_checkpoint(step, state(step))
                if stopping:
                    ctx.exit_preempted()
        ctx.report_metrics(step, epoch=epoch + 1, val_accuracy=accuracy(model, x_val, y_val))

    final = {
        "loss": float(loss_fn(model(x_train), y_train).detach()),
        "train_accuracy": accuracy(model, x_train, y_train),
        "val_accuracy": accuracy(model, x_val, y_val),
    }
    ctx.report_metrics(step, **final)
    ctx.save_checkpoint(step, state(step, metrics=final))
    return final


def main() -> None:
    # One thread: small convolutions gain nothing from more, and it keeps runs
    # bit-for-bit reproducible and polite on a shared node.
    torch.set_num_threads(1)
    started = time.perf_counter()
    with sdk.init(DEFAULTS, name="digits_cnn") as ctx:
        final = train(ctx)
    seconds = time.perf_counter() - started
    shown = ", ".join(f"{k}={v:.4f}" for k, v in final.items())
    print(f"done in {seconds:.1f}s: {shown}", flush=True)


if __name__ == "__main__":
    main()

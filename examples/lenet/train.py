#!/usr/bin/env python3
"""Train LeNet-5 on procedurally augmented digits with the Pollux agent (adaptive batch size).

Runs alone, under torchrun, or under the Pollux scheduler (which sets the POLLUX_* variables)::

    .venv/bin/python examples/lenet/train.py
    .venv/bin/torchrun --nproc_per_node=2 examples/lenet/train.py
    POLLUX_CHECKPOINT_DIR=/tmp/lenet-ckpt .venv/bin/python examples/lenet/train.py
    .venv/bin/python examples/lenet/train.py --fixed        # baseline: the batch stays at M0

The training recipe is the one of AdaptDL's CIFAR-10 example, scaled down to a CPU: SGD with momentum
0.9 and weight decay 5e-4, one optimiser parameter group per parameter, a per-epoch ``MultiStepLR``
step schedule (×0.1 at 50 % and 75 % of the epochs), and per-epoch metrics summed over the replicas
with the script's own ``torch.distributed.all_reduce``.

The data are made here, nothing is downloaded: scikit-learn's 1797 8×8 digits are split once (seed
0, stratified, independent of ``--seed``) into 1347 training and 450 validation originals; each
original is upsampled to 16×16, placed on a 20×20 canvas and copied several times with a random
rotation (±12°), scaling (±10 %), shift (±2 px) and pixel noise: 8 copies per training original
(10776 images) and 10 per validation original (4500 images). Validation digits are never seen in
training, so validation accuracy measures generalisation.

Rank 0 prints one JSON line per epoch on stdout,
``{"event": "epoch", "epoch": e, "val_acc": a, "time": t, "batch_size": M, "replicas": K, "run": r, ...}``,
and a final ``{"event": "final", ...}`` line. Batch-size decisions are logged by the library on the
``pollux.torch`` logger (stderr).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import time
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch.utils.data import TensorDataset

import pollux.torch as ptorch
from pollux.contract import LOG_FORMAT

#: The data (split and augmentations) are fixed, independent of --seed.
DATA_SEED = 0
VAL_FRACTION = 0.25
TRAIN_COPIES, VAL_COPIES = 8, 10
CANVAS = 20
REFIT_ENV = "POLLUX_REFIT_INTERVAL_S"

log = logging.getLogger("lenet")


class LeNet(nn.Module):
    """LeNet-5 (conv 5×5 → pool → conv 5×5 → pool → 120 → 84 → 10) for 20×20 inputs; 44 k parameters."""

    def __init__(self, size: int = CANVAS) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 5, padding=2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        side = (size // 2 - 4) // 2
        self.fc1 = nn.Linear(16 * side * side, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = torch.flatten(x, 1)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


def augment(images: np.ndarray, labels: np.ndarray, copies: int, gen: torch.Generator
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """``copies`` randomly rotated, scaled, shifted and noised 20×20 versions of each 8×8 image."""
    x = torch.from_numpy(images).float()[:, None]                       # n×1×8×8 in [0, 1]
    x = F.interpolate(x, size=(16, 16), mode="bilinear", align_corners=False)
    pad = (CANVAS - 16) // 2
    x = F.pad(x, (pad, pad, pad, pad)).repeat(copies, 1, 1, 1)
    y = torch.from_numpy(labels).long().repeat(copies)
    n = len(x)
    angle = (torch.rand(n, generator=gen) * 2 - 1) * math.radians(12)
    scale = 1 + (torch.rand(n, generator=gen) * 2 - 1) * 0.10
    shift = (torch.rand(n, 2, generator=gen) * 2 - 1) * (2 * 2 / CANVAS)   # ±2 px in [-1, 1] coordinates
    cos, sin = torch.cos(angle) / scale, torch.sin(angle) / scale
    rows = [torch.stack([cos, -sin, shift[:, 0]], 1), torch.stack([sin, cos, shift[:, 1]], 1)]
    theta = torch.stack(rows, 1)                                        # n×2×3 affine matrices
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    x = F.grid_sample(x, grid, align_corners=False)
    x = (x + 0.15 * torch.randn(x.shape, generator=gen)).clamp_(0.0, 1.0)
    return x, y


def load_data() -> tuple[TensorDataset, torch.Tensor, torch.Tensor]:
    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)
    x_train, x_val, y_train, y_val = train_test_split(
        images, digits.target, test_size=VAL_FRACTION, random_state=DATA_SEED, stratify=digits.target)
    gen = torch.Generator().manual_seed(DATA_SEED)
    xt, yt = augment(x_train, y_train, TRAIN_COPIES, gen)
    xv, yv = augment(x_val, y_val, VAL_COPIES, gen)
    mean, std = float(xt.mean()), float(xt.std())
    return TensorDataset((xt - mean) / std, yt), (xv - mean) / std, yv


class History:
    """The run's record, checkpointed with the job so that it survives restarts."""

    def __init__(self) -> None:
        self.batch_sizes: list[int] = []      # distinct global batch sizes, in the order used
        self.epochs: list[dict[str, Any]] = []
        self.seconds = 0.0                    # training time of the earlier runs of this job
        self.runs = 1

    def note_batch_size(self, size: int) -> None:
        if not self.batch_sizes or self.batch_sizes[-1] != size:
            self.batch_sizes.append(int(size))

    def state_dict(self) -> dict[str, Any]:
        return {"batch_sizes": list(self.batch_sizes), "epochs": list(self.epochs), "seconds": self.seconds,
                "runs": self.runs}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.batch_sizes = [int(b) for b in state["batch_sizes"]]
        self.epochs = list(state["epochs"])
        self.seconds = float(state["seconds"])
        self.runs = int(state["runs"]) + 1


@torch.no_grad()
def evaluate(module: nn.Module, x: torch.Tensor, y: torch.Tensor, rank: int, replicas: int) -> float:
    """Validation accuracy: each replica scores its share, the counts are summed over replicas."""
    module.eval()
    xs, ys = x[rank::replicas], y[rank::replicas]
    correct = sum(int((module(xs[i:i + 1024]).argmax(1) == ys[i:i + 1024]).sum())
                  for i in range(0, len(xs), 1024))
    module.train()
    counts = torch.tensor([float(correct), float(len(ys))], dtype=torch.float64)
    dist.all_reduce(counts)
    return float(counts[0] / counts[1])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--epochs", type=int, default=20, help="epochs of training progress (default 20)")
    p.add_argument("--seed", type=int, default=0, help="model initialisation and data order")
    p.add_argument("--batch-size", type=int, default=32, help="initial global batch size M0 (default 32)")
    p.add_argument("--max-batch-size", type=int, default=1024, help="largest global batch (default 1024)")
    p.add_argument("--local-bsz-bounds", type=int, nargs=2, default=(8, 256), metavar=("LO", "HI"),
                   help="bounds of the per-replica micro-batch (default 8 256)")
    p.add_argument("--lr", type=float, default=0.02, help="SGD learning rate at M0 (default 0.02)")
    p.add_argument("--fixed", action="store_true",
                   help="baseline: no autoscale_batch_size call, the batch stays at M0")
    p.add_argument("--refit-interval", type=float, default=None,
                   help="seconds between throughput refits and batch-size decisions (default: "
                        "$POLLUX_REFIT_INTERVAL_S if set, else 5)")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format=LOG_FORMAT)
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    if args.refit_interval is not None:
        os.environ[REFIT_ENV] = str(args.refit_interval)
    else:
        os.environ.setdefault(REFIT_ENV, "5")

    ptorch.init_process_group("gloo")
    rank, replicas = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)
    train_set, x_val, y_val = load_data()

    net = LeNet()
    optimizer = torch.optim.SGD([{"params": [p]} for p in net.parameters()], lr=args.lr, momentum=0.9,
                                weight_decay=5e-4)
    milestones = [args.epochs // 2, args.epochs * 3 // 4]
    lr_scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones, gamma=0.1)
    model = ptorch.AdaptiveDataParallel(net, optimizer, lr_scheduler)
    loader = ptorch.AdaptiveDataLoader(train_set, batch_size=args.batch_size, shuffle=True, seed=args.seed)
    if not args.fixed:
        loader.autoscale_batch_size(args.max_batch_size, local_bsz_bounds=tuple(args.local_bsz_bounds),
                                    gradient_accumulation=True)
    history = History()
    if ptorch.register_state("lenet_history", history) and rank == 0:
        log.info("resumed at epoch %d (run %d of this job), batch sizes so far %s",
                 ptorch.current_epoch(), history.runs, history.batch_sizes)
    earlier = history.seconds

    for epoch in ptorch.remaining_epochs_until(args.epochs):
        sums = torch.zeros(3, dtype=torch.float64)          # loss × examples, correct, examples
        for x, y in loader:
            history.note_batch_size(loader.current_batch_size)
            optimizer.zero_grad()
            out = model(x)
            loss = F.cross_entropy(out, y)
            loss.backward()
            optimizer.step()
            sums += torch.tensor([float(loss.detach()) * len(y), float((out.argmax(1) == y).sum()), len(y)],
                                 dtype=torch.float64)
        dist.all_reduce(sums)                                # the same on every replica
        lr_scheduler.step()
        seen = float(sums[2])
        # An epoch can have no batches (resumed right at its end): no loss, no training accuracy.
        train_loss = float(sums[0]) / seen if seen > 0 else None
        train_acc = float(sums[1]) / seen if seen > 0 else None
        val_acc = evaluate(model.module, x_val, y_val, rank, replicas)
        history.seconds = earlier + time.perf_counter() - start
        record = {"event": "epoch", "epoch": epoch, "val_acc": val_acc, "train_loss": train_loss,
                  "train_acc": train_acc, "time": time.time(), "batch_size": loader.current_batch_size,
                  "replicas": replicas, "run": history.runs, "progress": model.progress,
                  "lr": optimizer.param_groups[0]["lr"], "seconds": history.seconds}
        history.epochs.append({k: record[k] for k in ("epoch", "val_acc", "batch_size", "replicas", "run")})
        if rank == 0:
            print(json.dumps(record), flush=True)

    val_acc = evaluate(model.module, x_val, y_val, rank, replicas)
    if rank == 0:
        print(json.dumps({
            "event": "final", "val_acc": val_acc,
            "best_val_acc": max((e["val_acc"] for e in history.epochs), default=val_acc),
            "batch_sizes": history.batch_sizes, "epochs": ptorch.current_epoch(), "progress": model.progress,
            "steps": model.steps, "replicas": replicas, "runs": history.runs, "fixed": args.fixed,
            "seed": args.seed, "final_batch_size": loader.current_batch_size,
            "pgns": float(model.pgns) if math.isfinite(model.pgns) else None,
            "seconds": earlier + time.perf_counter() - start, "time": time.time(),
        }), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Train an MLP on a synthetic tabular classification task with Adam(W) and the Pollux agent.

Runs alone, under torchrun, or under the Pollux scheduler (which sets the POLLUX_* variables)::

    .venv/bin/python examples/tabular/train.py
    .venv/bin/torchrun --nproc_per_node=2 examples/tabular/train.py
    POLLUX_CHECKPOINT_DIR=/tmp/tabular-ckpt .venv/bin/python examples/tabular/train.py
    .venv/bin/python examples/tabular/train.py --fixed --optimizer adam   # baseline with Adam

The data are made here, nothing is downloaded: ``sklearn.datasets.make_classification`` with a fixed
seed (independent of ``--seed``) draws 40 000 rows of 32 features (16 informative, 8 redundant) in
4 classes of 3 clusters each, with 2 % of the labels flipped; the first 30 000 rows are the training
set, the last 10 000 the validation set. Features are standardised with the training set's mean and
standard deviation.

The model is a 32 → 256 → 256 → 4 ReLU MLP (75 k parameters), trained with AdamW (default; weight
decay 1e-4) or Adam, with a per-epoch cosine learning-rate schedule (``CosineAnnealingLR`` down to
1 % of the initial rate). For the Adam family the agent measures the gradient noise under Adam's
pre-conditioner and scales the learning rate with the square-root rule.

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
from sklearn.datasets import make_classification
from torch.utils.data import TensorDataset

import pollux.torch as ptorch
from pollux.contract import LOG_FORMAT

#: The data set and its split are fixed, independent of --seed.
DATA_SEED = 0
N_TRAIN, N_VAL = 30_000, 10_000
FEATURES, CLASSES = 32, 4
REFIT_ENV = "POLLUX_REFIT_INTERVAL_S"

log = logging.getLogger("tabular")


def load_data() -> tuple[TensorDataset, torch.Tensor, torch.Tensor]:
    x, y = make_classification(n_samples=N_TRAIN + N_VAL, n_features=FEATURES, n_informative=16,
                               n_redundant=8, n_classes=CLASSES, n_clusters_per_class=3, class_sep=1.0,
                               flip_y=0.02, random_state=DATA_SEED)
    x = x.astype(np.float32)
    mean, std = x[:N_TRAIN].mean(axis=0), x[:N_TRAIN].std(axis=0)
    x = (x - mean) / std
    xt, yt = torch.from_numpy(x[:N_TRAIN]), torch.from_numpy(y[:N_TRAIN]).long()
    xv, yv = torch.from_numpy(x[N_TRAIN:]), torch.from_numpy(y[N_TRAIN:]).long()
    return TensorDataset(xt, yt), xv, yv


def mlp(width: int = 256) -> nn.Module:
    return nn.Sequential(nn.Linear(FEATURES, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                         nn.Linear(width, CLASSES))


class History:
    """The run's record, checkpointed with the job so that it survives restarts."""

    def __init__(self) -> None:
        self.batch_sizes: list[int] = []
        self.best_val_acc = 0.0
        self.seconds = 0.0
        self.runs = 1

    def state_dict(self) -> dict[str, Any]:
        return {"batch_sizes": list(self.batch_sizes), "best_val_acc": self.best_val_acc,
                "seconds": self.seconds, "runs": self.runs}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.batch_sizes = [int(b) for b in state["batch_sizes"]]
        self.best_val_acc = float(state["best_val_acc"])
        self.seconds = float(state["seconds"])
        self.runs = int(state["runs"]) + 1


@torch.no_grad()
def accuracy(module: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """Every replica scores the whole validation set (10 000 rows: a few milliseconds)."""
    module.eval()
    acc = float((module(x).argmax(dim=1) == y).float().mean())
    module.train()
    return acc


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--epochs", type=int, default=16, help="epochs of training progress (default 16)")
    p.add_argument("--seed", type=int, default=0, help="model initialisation and data order")
    p.add_argument("--batch-size", type=int, default=64, help="initial global batch size M0 (default 64)")
    p.add_argument("--max-batch-size", type=int, default=2048, help="largest global batch (default 2048)")
    p.add_argument("--local-bsz-bounds", type=int, nargs=2, default=(16, 1024), metavar=("LO", "HI"),
                   help="bounds of the per-replica micro-batch (default 16 1024)")
    p.add_argument("--optimizer", choices=("adamw", "adam"), default="adamw")
    p.add_argument("--lr", type=float, default=1e-3, help="learning rate at M0 (default 1e-3)")
    p.add_argument("--weight-decay", type=float, default=1e-4, help="AdamW's decoupled weight decay")
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

    net = mlp()
    if args.optimizer == "adamw":
        optimizer: torch.optim.Optimizer = torch.optim.AdamW(net.parameters(), lr=args.lr,
                                                             weight_decay=args.weight_decay)
    else:
        optimizer = torch.optim.Adam(net.parameters(), lr=args.lr)
    lr_scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs,
                                                              eta_min=args.lr / 100)
    model = ptorch.AdaptiveDataParallel(net, optimizer, lr_scheduler)
    loader = ptorch.AdaptiveDataLoader(train_set, batch_size=args.batch_size, shuffle=True, seed=args.seed)
    if not args.fixed:
        loader.autoscale_batch_size(args.max_batch_size, local_bsz_bounds=tuple(args.local_bsz_bounds),
                                    gradient_accumulation=True)
    history = History()
    if ptorch.register_state("tabular_history", history) and rank == 0:
        log.info("resumed at epoch %d (run %d of this job)", ptorch.current_epoch(), history.runs)
    earlier = history.seconds

    for epoch in ptorch.remaining_epochs_until(args.epochs):
        loss_sum, seen = 0.0, 0
        for x, y in loader:
            if not history.batch_sizes or history.batch_sizes[-1] != loader.current_batch_size:
                history.batch_sizes.append(loader.current_batch_size)
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            loss_sum += float(loss.detach()) * len(y)
            seen += len(y)
        lr_scheduler.step()
        val_acc = accuracy(model.module, x_val, y_val)
        history.best_val_acc = max(history.best_val_acc, val_acc)
        history.seconds = earlier + time.perf_counter() - start
        if rank == 0:
            print(json.dumps({
                "event": "epoch", "epoch": epoch, "val_acc": val_acc,
                "train_loss": loss_sum / seen if seen else None,      # rank 0's share of the examples
                "time": time.time(), "batch_size": loader.current_batch_size, "replicas": replicas,
                "run": history.runs, "progress": model.progress, "lr": optimizer.param_groups[0]["lr"],
                "seconds": history.seconds,
            }), flush=True)

    val_acc = accuracy(model.module, x_val, y_val)
    if rank == 0:
        print(json.dumps({
            "event": "final", "val_acc": val_acc, "best_val_acc": max(history.best_val_acc, val_acc),
            "batch_sizes": history.batch_sizes, "epochs": ptorch.current_epoch(), "progress": model.progress,
            "steps": model.steps, "replicas": replicas, "runs": history.runs, "fixed": args.fixed,
            "seed": args.seed, "optimizer": args.optimizer, "final_batch_size": loader.current_batch_size,
            "pgns": float(model.pgns) if math.isfinite(model.pgns) else None,
            "seconds": earlier + time.perf_counter() - start, "time": time.time(),
        }), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

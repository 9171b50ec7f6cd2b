"""Measure the PGNS on a loss whose per-example gradient distribution is known and fixed.

Loss ``L = −w·x`` with ``x ~ N(g, diag(σ²))`` per example: the per-example gradient is ``−x`` whatever
w is, so the true gradient is ``−g`` and the covariance ``diag(σ²)``. The weights are split over two
optimiser parameter groups. Writes the measured and the true statistics as JSON (rank 0).

Usage: pgns_worker.py OUT.json {sgd,adam} STEPS M0 [ACCUM_LOCAL_BOUND]

PGNS_BALANCE=mode turns LB-BSP balancing on and PGNS_SLOW="r:s" makes rank r sleep s seconds per
example between forward and backward, so the replicas get unequal shares (the unequal-size estimator).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time

import torch

import pollux.torch as ptorch

DIM = 64
SPLIT = 40


def problem() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1234)
    g = torch.randn(DIM, generator=gen, dtype=torch.float64) * 0.5
    sigma = torch.exp(torch.randn(DIM, generator=gen, dtype=torch.float64) * 0.6) * 1.5
    return g, sigma


class Examples(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        g, sigma = problem()
        gen = torch.Generator().manual_seed(99)
        z = torch.randn(n, DIM, generator=gen, dtype=torch.float64)
        self.x = (g + sigma * z).float()

    def __len__(self) -> int:
        return self.x.shape[0]

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.x[i]


class Linear(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w1 = torch.nn.Parameter(torch.zeros(SPLIT))
        self.w2 = torch.nn.Parameter(torch.zeros(DIM - SPLIT))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return -(x[:, :SPLIT] @ self.w1 + x[:, SPLIT:] @ self.w2)


def main() -> None:
    out, opt_name, steps, m0 = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    accum_bound = int(sys.argv[5]) if len(sys.argv) > 5 else None
    torch.set_num_threads(1)
    ptorch.init_process_group("gloo")
    model = Linear()
    groups = [{"params": [model.w1]}, {"params": [model.w2]}]
    if opt_name == "adam":
        optimizer = torch.optim.Adam(groups, lr=1e-3)
    else:
        optimizer = torch.optim.SGD(groups, lr=1e-3)
    adp = ptorch.AdaptiveDataParallel(model, optimizer)
    loader = ptorch.AdaptiveDataLoader(Examples(steps * m0), batch_size=m0, shuffle=True, seed=5)
    if accum_bound is not None:
        loader.autoscale_batch_size(m0, local_bsz_bounds=(1, accum_bound), gradient_accumulation=True)
    if os.environ.get("PGNS_BALANCE"):
        loader.balance_batches(os.environ["PGNS_BALANCE"])
    slow = dict(item.split(":") for item in os.environ.get("PGNS_SLOW", "").split(",") if item)
    per_example = float(slow.get(str(torch.distributed.get_rank()), 0.0))
    unequal_steps = 0
    for _ in ptorch.remaining_epochs_until(1):
        for x in loader:
            optimizer.zero_grad()
            loss = adp(x).mean()
            if per_example:
                time.sleep(per_example * len(x))
            loss.backward()
            optimizer.step()
            shares = [v for k, v in adp.to_scalars().items() if k.startswith("balance_share")]
            unequal_steps += len(set(shares)) > 1
    g, sigma = problem()
    if opt_name == "adam":
        p2 = []
        for p in (model.w1, model.w2):
            st = optimizer.state[p]
            vhat = st["exp_avg_sq"].double() / (1 - 0.999 ** float(st["step"]))
            p2.append(1.0 / (vhat.sqrt() + 1e-8) ** 2)
        p2 = torch.cat(p2)
    else:
        p2 = torch.ones(DIM, dtype=torch.float64)
    true_sqr = float((g * g * p2).sum())
    true_var = float((sigma * sigma * p2).sum()) / m0
    stats = adp.grad_stats
    if torch.distributed.get_rank() == 0:
        with open(out, "w") as f:
            json.dump({"sqr": stats.sqr, "var": stats.var, "pgns": adp.pgns, "true_sqr": true_sqr,
                       "true_var": true_var, "true_pgns": true_var * m0 / true_sqr, "steps": adp.steps,
                       "local_bsz": loader.local_bsz, "accum_steps": loader.accumulation_steps,
                       "biased": adp.biased_stats, "replicas": torch.distributed.get_world_size(),
                       "finite": math.isfinite(adp.pgns), "unequal_steps": unequal_steps}, f)


if __name__ == "__main__":
    main()

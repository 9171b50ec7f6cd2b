"""One replica of the LB-BSP exactness check (tests/test_torch_balance.py).

Each replica takes its share ``x_r`` of every micro-step chunk (contiguous, as the sampler hands them
out), computes the usual mean loss over its local batch and runs one synchronised step through
``AdaptiveDataParallel``'s communication hook; the reduced gradient is compared with the gradient of
the mean loss over the whole global batch in one process. A second step sends a compute time in the
control packet and checks that every replica receives all of them.

Usage: balance_worker.py SHARES MICRO_STEPS WEIGHTED OUT_JSON [TAIL]  (SHARES like "3,13"; TAIL "1":
the step is an epoch's tail step, not a full one, which the gradient statistics skip but whose
gradient is weighted by its shares all the same).
"""

from __future__ import annotations

import json
import sys
from contextlib import nullcontext

import torch

import pollux.torch as ptorch
from pollux.torch.api import StepInfo
from pollux.torch.context import get_context


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(5, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def main() -> None:
    shares = tuple(int(x) for x in sys.argv[1].split(","))
    micro, weighted, out = int(sys.argv[2]), sys.argv[3] == "1", sys.argv[4]
    tail = len(sys.argv) > 5 and sys.argv[5] == "1"
    torch.set_default_dtype(torch.float64)
    ptorch.init_process_group("gloo")
    ctx = get_context()
    rank, k = ctx.rank, ctx.replicas
    assert len(shares) == k, (shares, k)
    model = make_model()
    adp = ptorch.AdaptiveDataParallel(model, torch.optim.SGD(model.parameters(), lr=0.1))
    chunk = sum(shares)
    gen = torch.Generator().manual_seed(1)
    x_all = torch.randn(chunk * micro, 5, generator=gen)
    y_all = torch.randn(chunk * micro, 3, generator=gen)
    offset = sum(shares[:rank])
    result: dict[str, object] = {"rank": rank}
    for step in range(2):
        info = StepInfo(sid=ctx.new_sid(), replicas=k, micro_steps=micro, local_bsz=shares[rank],
                        shares=shares if weighted else None, micro_sizes=(shares[rank],) * micro,
                        step_time=(0.5 + rank) if step == 1 else None, full=not (tail and step == 0))
        ctx.begin_step(info)
        for j in range(micro):
            info.micro = j
            lo = j * chunk + offset
            x, y = x_all[lo:lo + shares[rank]], y_all[lo:lo + shares[rank]]
            with adp.no_sync() if j < micro - 1 else nullcontext():
                torch.nn.functional.mse_loss(adp(x), y).backward()
        outcome = ctx.finish_step()
        if step == 0:
            got = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
            ref_model = make_model()
            torch.nn.functional.mse_loss(ref_model(x_all), y_all).backward()
            ref = torch.cat([p.grad.reshape(-1) for p in ref_model.parameters()])
            result["rel_error"] = float((got - ref).norm() / ref.norm())
            model.zero_grad(set_to_none=True)
        else:
            result["step_times"] = outcome.step_times
    with open(out.replace("RANK", str(rank)), "w", encoding="utf-8") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()

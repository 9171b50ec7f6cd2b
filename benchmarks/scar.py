#!/usr/bin/env python3
"""The rework-cost benchmark of issue 15 (SCAR, thesis §5.5): pure numpy, no Ray.

Usage:
    benchmarks/scar.py [--json] [--trials 100] [--seed 0] [--models mlr,mf,lda,cnn] [--plots DIR]

For every model, `pollux.scar.rework.sweep.model_sweep` runs the points of thesis Figs. 5.7 and 5.9 with
`--trials` seeded trials each (failure at a geometric iteration, a random fraction of the blocks
lost, rework = extra iterations to the unperturbed run's convergence threshold) and checks:

- partial vs full recovery from traditional checkpoints at lost fractions 1/4, 1/2, 3/4: the
  reduction of the mean rework within the thesis's ranges ± 10 points (49–99 %, 21–72 %, 2–52 %)
  and ordered 1/4 > 1/2 > 3/4;
- priority checkpoints of r = 1/8 of the blocks, 8× as often, with partial recovery, against
  traditional checkpoints with full recovery, half the blocks lost: reduction ≥ 78 %; priority's
  rework non-increasing as 1/r goes 1, 2, 4, 8; random (r = 1/8) not better than full checkpoints
  (both with partial recovery; "not better" = not below full's mean minus its 95 % interval).

Then the two theorems (`pollux.scar.rework.theory`): Theorem 5.4.2 (mean ‖δ′‖² / ‖δ‖² equals the lost
fraction ± 0.05) and Theorem 5.3.1 (no trial's rework on a quadratic program exceeds the bound).

Prints one JSON object with `--json` (progress on stderr); a failed target is reported as measured.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

# Small-matrix numerics: one BLAS thread each (the machine has 2 cores; see docs/benchmarks.md).
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

DEFAULT_MODELS = ("mlr", "mf", "lda", "cnn")


def theorems(trials: int, seed: int, say: Any) -> dict[str, Any]:
    """Theorem 5.4.2 and Theorem 5.3.1 checks (see `pollux.scar.rework.theory`)."""
    from pollux.scar.rework import theory

    t0 = time.perf_counter()
    ratios = {}
    for p in (0.25, 0.5, 0.75):
        r = theory.perturbation_ratio(lost_fraction=p, trials=max(trials, 200), seed=seed)
        ratios[f"{p:g}"] = r.to_dict()
    ok_542 = all(abs(v["mean_ratio"] - float(k)) <= 0.05 for k, v in ratios.items())
    shown = ", ".join(f"p={k}: {v['mean_ratio']:.3f}" for k, v in ratios.items())
    say(f"theorem 5.4.2: {shown}")
    bound = theory.rework_bound_trials(trials=max(trials, 200), seed=seed)
    say(f"theorem 5.3.1: {bound.violations} of {bound.trials} trials above the bound")
    return {
        "theorem_5_4_2": {"ratios": ratios, "ok": bool(ok_542)},
        "theorem_5_3_1": {**bound.to_dict(), "ok": bool(bound.violations == 0)},
        "seconds": round(time.perf_counter() - t0, 2),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    ap.add_argument("--trials", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--models", default=",".join(DEFAULT_MODELS))
    ap.add_argument("--plots", default=None, metavar="DIR", help="write recovery.png and strategies.png")
    args = ap.parse_args(argv)

    from pollux.scar.rework.models.registry import MODELS, make_model
    from pollux.scar.rework.sweep import model_sweep

    names = [n for n in args.models.split(",") if n]
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        ap.error(f"--models: unknown {', '.join(unknown)} (known: {', '.join(MODELS)})")

    def say(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    t0 = time.perf_counter()
    sweeps = [model_sweep(make_model(n), trials=args.trials, seed=args.seed, progress=say) for n in names]
    theory = theorems(args.trials, args.seed, say)
    plots: list[str] = []
    if args.plots:
        from pollux.scar.rework.plots import write_plots

        plots = [str(p) for p in write_plots(sweeps, args.plots)]
    result = {
        "benchmark": "scar",
        "trials": args.trials,
        "seed": args.seed,
        "models": {sw["model"]: sw for sw in sweeps},
        "theory": theory,
        "summary": {
            sw["model"]: {
                "reduction": sw["layouts"][next(iter(sw["layouts"]))]["reduction"],
                "priority_1_8_reduction": sw["checks"]["priority_1_8_reduction"],
                "checks_pass": sw["checks"]["all"],
                "seconds": sw["seconds"],
            }
            for sw in sweeps
        },
        "all_pass": bool(
            all(sw["checks"]["all"] for sw in sweeps)
            and theory["theorem_5_4_2"]["ok"]
            and theory["theorem_5_3_1"]["ok"]
        ),
        "plots": plots,
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(json.dumps(result["summary"], indent=2))
        print(f"all pass: {result['all_pass']}  ({result['wall_s']} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

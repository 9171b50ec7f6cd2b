#!/usr/bin/env python3
"""Hyper-parameter optimisation in the simulator (issue 37, part 2): Pollux against static allocation.

Usage:
    benchmarks/hpo.py [--json] [--seeds 5] [--trials 100] [--concurrent 4] [--gpus 16]
        [--pruner median|none|both] [--plots DIR | --no-plots] [--data ../shared/data/pollux-osdi21]
        [--application cifar10] [--epochs N] [--static-gpus 4] [--static-local-batch N]
        [--sensitivity 32,64,128,256]

The thesis's experiment (§3.5.5, Table 3.3) replayed by :mod:`pollux.sim.hpo`: a TPE study (Optuna,
sampler seeds 0..seeds−1) of ``trials`` trials, ``concurrent`` at a time, over the five
hyper-parameters of ResNet-18 on CIFAR-10, each trial a job of the cifar10 profile on a cluster of
``gpus`` GPUs in nodes of 4, what it reaches given by the fixed synthetic surface of
:mod:`pollux.sim.hpo_space`. Two arms per seed: ``pollux`` (the Pollux policy, adaptive trials that
start on one GPU) and ``static`` (FIFO, every trial on ``static-gpus`` GPUs with a fixed batch per
GPU, by default the application's initial batch: 128 for CIFAR-10, i.e. 512 on 4 GPUs).

Reported per pruner variant (``none``: every trial runs to its end; ``median``: Optuna's median
pruner, pruned trials' jobs stopped and their GPUs freed), per arm and seed: makespan of the study,
mean trial JCT (submission — when its predecessor ended — to its end; pruned trials included), best
objective and the mean of the top 5 (the thesis's accuracy figure), pruned trials, GPU-hours and the
trials' records; per seed and as the mean over seeds: ``makespan_reduction`` and
``mean_jct_reduction`` = 1 − pollux / static; the best objective of both arms against the seeds'
spread (within the noise when the difference of the means is at most two standard errors of it,
Welch). The top-level ``makespan_reduction`` and ``mean_jct_reduction`` are those of the unpruned
variant (the thesis's setting; of the pruned one when only it runs); ``pruning`` holds the pruned
variant's reductions and how much more (or less) Pollux gains with pruning than without.

Targets (issue 37, the thesis's figures): ``makespan_reduction`` ≥ 0.30, ``mean_jct_reduction`` ≥
0.25, best objective within the seeds' noise. The static arm's local batch is a choice the thesis
does not state, so ``static_batch_sensitivity`` (no target; unpruned; cheap, as the static arm's
runs take about a second) repeats the static arm at other local batches against the same Pollux runs.

Plot ``out/hpo/hpo.png``: the trials of seed 0 over time in both arms (one bar per trial, coloured by
the GPUs it holds; pruned trials hatched) and the best objective so far against time for every seed.

Progress lines go to stderr; ``--json`` prints one JSON object on stdout. The studies run one after
another in this process. Toy sizes for the tests: ``--trials``, ``--seeds``, ``--epochs`` (trials
shortened to their first N epochs).

Exit status: 0 when every target is met, 1 when one is missed, 2 on bad input.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import optuna

from pollux.sim.engine import SimConfig
from pollux.sim.hpo import PRUNERS, HpoConfig, HpoResult, result_dict, run_study
from pollux.sim.hpo_space import EPOCH_NOISE, FLOOR, PEAK, RUN_NOISE, SPACE, Surface
from pollux.sim.profiles import AppProfile, default_metadata, load_profiles
from pollux.sim.scaling_bound import epoch_work, gpu_rates
from pollux.sim.study_bound import makespan_bound, mean_jct_bound

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO.parent / "shared" / "data" / "pollux-osdi21"
DEFAULT_PLOTS = REPO / "out" / "hpo"
GPUS_PER_NODE = 4
#: The thesis's figures (Table 3.3: makespan 10 h against 14 h, average trial JCT 25 against 34 min).
TARGETS = {"makespan_reduction": 0.30, "mean_jct_reduction": 0.25}
#: The best objectives of the two arms are "the same" when their means differ by at most this many
#: standard errors of the difference (Welch).
NOISE_SE = 2.0
DEFAULT_SENSITIVITY = "32,64,128,256"


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------
# Figures
# --------------------------------------------------------------------------------------------


def reduction(pollux: float, static: float) -> float:
    """1 − pollux / static: the fraction of the static arm's figure Pollux saves."""
    return 1.0 - pollux / static


def spread(values: Sequence[float]) -> dict[str, float]:
    """Mean and sample standard deviation over seeds (0 for one seed)."""
    arr = np.asarray(values, dtype=np.float64)
    sd = float(arr.std(ddof=1)) if arr.size > 1 else 0.0
    return {"mean": float(arr.mean()), "sd": sd, "min": float(arr.min()), "max": float(arr.max())}


def best_comparison(pollux: Sequence[float], static: Sequence[float]) -> dict[str, Any]:
    """The arms' best objectives over seeds: their spread, the difference of the means, and whether
    it is within ``NOISE_SE`` standard errors of that difference."""
    p, s = spread(pollux), spread(static)
    se = float(np.sqrt(p["sd"] ** 2 / len(pollux) + s["sd"] ** 2 / len(static)))
    diff = p["mean"] - s["mean"]
    return {"pollux": p, "static": s, "difference": diff, "se_difference": se,
            "allowed": NOISE_SE * se, "within_noise": bool(abs(diff) <= NOISE_SE * se)}


def variant_figures(pruner: str, studies: dict[str, list[HpoResult]]) -> dict[str, Any]:
    """One pruner variant: per arm and seed, per seed the reductions, and the means over seeds."""
    pol, sta = studies["pollux"], studies["static"]
    per_seed = []
    for p, s in zip(pol, sta, strict=True):
        per_seed.append({"seed": p.config.seed,
                         "makespan_reduction": reduction(p.makespan, s.makespan),
                         "mean_jct_reduction": reduction(p.mean_jct, s.mean_jct)})
    best_p = [r.best_value for r in pol if r.best_value is not None]
    best_s = [r.best_value for r in sta if r.best_value is not None]
    return {
        "pruner": pruner,
        "arms": {arm: [result_dict(r) for r in runs] for arm, runs in studies.items()},
        "per_seed": per_seed,
        "makespan_reduction": float(np.mean([x["makespan_reduction"] for x in per_seed])),
        "mean_jct_reduction": float(np.mean([x["mean_jct_reduction"] for x in per_seed])),
        "makespan_h": {arm: spread([r.makespan / 3600.0 for r in runs]) for arm, runs in studies.items()},
        "mean_jct_min": {arm: spread([r.mean_jct / 60.0 for r in runs]) for arm, runs in studies.items()},
        "top5_mean": {arm: spread([r.top5_mean for r in runs if r.top5_mean is not None])
                      for arm, runs in studies.items()},
        "pruned_trials": {arm: spread([float(r.pruned) for r in runs]) for arm, runs in studies.items()},
        "best": best_comparison(best_p, best_s) if best_p and best_s else None,
    }


def clairvoyant_figures(args: argparse.Namespace, profile: AppProfile,
                        static: list[HpoResult]) -> dict[str, Any]:
    """The most any scheduler could gain over the static arm on this protocol without pruning: lower
    bounds on the makespan and the mean trial JCT of trials that know their true profile
    (:mod:`pollux.sim.study_bound`), against the static arm's figures seed by seed. Below a target,
    no scheduler can meet it."""
    rates = gpu_rates(profile, args.gpus, GPUS_PER_NODE)
    work = epoch_work(profile)
    restart = SimConfig().restart_delay
    makespan = makespan_bound(rates, work, args.trials, args.concurrent, restart)
    jct = mean_jct_bound(rates, work, args.trials, args.concurrent, restart)
    most_makespan = float(np.mean([reduction(makespan, r.makespan) for r in static]))
    most_jct = float(np.mean([reduction(jct, r.mean_jct) for r in static]))
    return {
        "makespan_lower_bound_h": makespan / 3600.0, "mean_jct_lower_bound_min": jct / 60.0,
        "max_makespan_reduction": most_makespan, "max_mean_jct_reduction": most_jct,
        "makespan_target_reachable": bool(most_makespan >= TARGETS["makespan_reduction"]),
        "mean_jct_target_reachable": bool(most_jct >= TARGETS["mean_jct_reduction"]),
    }


# --------------------------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------------------------


def study_config(args: argparse.Namespace, arm: str, pruner: str, seed: int,
                 local_batch: int | None = None) -> HpoConfig:
    return HpoConfig(arm=arm, application=args.application, trials=args.trials,
                     concurrent=args.concurrent, gpus=args.gpus, gpus_per_node=GPUS_PER_NODE, seed=seed,
                     pruner=pruner, static_gpus=args.static_gpus,
                     static_local_batch=local_batch if local_batch is not None else args.static_local_batch)


def run_variant(args: argparse.Namespace, profiles: dict[str, AppProfile], pruner: str
                ) -> dict[str, list[HpoResult]]:
    studies: dict[str, list[HpoResult]] = {"pollux": [], "static": []}
    for seed in range(args.seeds):
        for arm in ("static", "pollux"):
            say(f"hpo: pruner {pruner}, seed {seed}, arm {arm}: {args.trials} trials, {args.concurrent} at "
                f"a time, {args.gpus} GPUs ...")
            res = run_study(study_config(args, arm, pruner, seed), profiles, progress=say)
            studies[arm].append(res)
            say(f"hpo: pruner {pruner}, seed {seed}, arm {arm}: makespan {res.makespan / 3600:.2f} h, "
                f"mean JCT {res.mean_jct / 60:.1f} min, best {res.best_value}, pruned {res.pruned} "
                f"({res.wall_s:.0f} s)")
    return studies


def sensitivity(args: argparse.Namespace, profiles: dict[str, AppProfile],
                pollux: list[HpoResult]) -> dict[str, Any]:
    """The static arm (unpruned) at other local batches, against the same Pollux studies."""
    out: dict[str, Any] = {"note": "no target: the static arm's fixed local batch is a choice the thesis "
                                   "does not state; the Pollux studies are the unpruned ones above",
                           "local_batches": {}}
    for local in args.sensitivity:
        runs = []
        for seed in range(args.seeds):
            runs.append(run_study(study_config(args, "static", "none", seed, local), profiles))
        out["local_batches"][str(local)] = {
            "global_batch": local * args.static_gpus,
            "static_makespan_h": spread([r.makespan / 3600.0 for r in runs]),
            "static_mean_jct_min": spread([r.mean_jct / 60.0 for r in runs]),
            "makespan_reduction": float(np.mean([reduction(p.makespan, s.makespan)
                                                 for p, s in zip(pollux, runs, strict=True)])),
            "mean_jct_reduction": float(np.mean([reduction(p.mean_jct, s.mean_jct)
                                                 for p, s in zip(pollux, runs, strict=True)])),
        }
        f = out["local_batches"][str(local)]
        say(f"hpo: sensitivity: static local batch {local}: makespan reduction "
            f"{f['makespan_reduction']:.3f}, mean JCT reduction {f['mean_jct_reduction']:.3f}")
    return out


# --------------------------------------------------------------------------------------------
# Plot
# --------------------------------------------------------------------------------------------


def plot(variants: dict[str, dict[str, list[HpoResult]]], out_dir: Path, title: str) -> Path:
    """``hpo.png``: (a, b) the trials of seed 0 in each arm of the first variant, one bar per trial
    from its submission to its end, coloured by the GPUs it holds (grey: waiting), pruned trials
    hatched; (c) the best objective so far against time, every seed, both arms (dashed: pruned)."""
    from matplotlib import colormaps
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize
    from matplotlib.figure import Figure

    out_dir.mkdir(parents=True, exist_ok=True)
    first = next(iter(variants.values()))
    fig = Figure(figsize=(12, 10), dpi=110, layout="constrained")
    ax_s, ax_p, ax_best = fig.subplots(3, 1, sharex=True, height_ratios=[2, 2, 1.5])
    top = max(max((g for t in r[0].trials for _, g in t.gpus), default=1) for r in first.values())
    cmap = colormaps["viridis"]
    norm = Normalize(vmin=0, vmax=max(top, 1))
    for ax, arm in ((ax_s, "static"), (ax_p, "pollux")):
        res = first[arm][0]
        for t in res.trials:
            assert t.end is not None
            hatch = "///" if t.state == "pruned" else None
            waited = (t.start if t.start is not None else t.end) - t.submit
            ax.broken_barh([(t.submit / 3600.0, waited / 3600.0)], (t.number - 0.4, 0.8), color="lightgrey")
            points = [*t.gpus, [t.end, 0]]
            for (a, g), (b, _) in itertools.pairwise(points):
                ax.broken_barh([(a / 3600.0, (b - a) / 3600.0)], (t.number - 0.4, 0.8), color=cmap(norm(g)),
                               hatch=hatch, edgecolor="white" if hatch else None, linewidth=0)
        ax.set_ylabel("trial")
        ax.set_title(f"({'a' if arm == 'static' else 'b'}) {arm}, seed 0, pruner {res.config.pruner}: "
                     f"makespan {res.makespan / 3600:.2f} h, mean trial JCT {res.mean_jct / 60:.1f} min")
        ax.grid(True, axis="x", alpha=0.3)
    fig.colorbar(ScalarMappable(norm=norm, cmap=cmap), ax=[ax_s, ax_p], label="GPUs held")
    colours = {"pollux": "tab:blue", "static": "tab:orange"}
    for pruner, studies in variants.items():
        style = "--" if pruner == "median" else "-"
        for arm, runs in studies.items():
            for i, r in enumerate(runs):
                done = sorted((t.end, t.value) for t in r.trials
                              if t.state == "complete" and t.value is not None and t.end is not None)
                if not done:
                    continue
                times = [e / 3600.0 for e, _ in done]
                best = np.maximum.accumulate([v for _, v in done])
                label = f"{arm}, pruner {pruner}" if i == 0 else None
                ax_best.step([*times, r.makespan / 3600.0], [*best, best[-1]], where="post", linestyle=style,
                             color=colours[arm], alpha=0.7, linewidth=1, label=label)
    ax_best.set_title("(c) best objective so far (every seed)")
    ax_best.set_ylabel("best accuracy")
    ax_best.set_xlabel("time since the study started (h)")
    ax_best.grid(True, alpha=0.3)
    ax_best.legend(fontsize=8, loc="lower right")
    fig.suptitle(title)
    path = out_dir / "hpo.png"
    fig.savefig(path)
    return path


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------


def _positive(parser: argparse.ArgumentParser, name: str, value: int) -> None:
    if value < 1:
        parser.error(f"{name}: must be at least 1, got {value}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    parser.add_argument("--seeds", type=int, default=5, help="sampler seeds 0..N-1 (default 5)")
    parser.add_argument("--trials", type=int, default=100, help="trials per study (default 100)")
    parser.add_argument("--concurrent", type=int, default=4, help="trials at a time (default 4)")
    parser.add_argument("--gpus", type=int, default=16,
                        help=f"GPUs of the cluster, in nodes of {GPUS_PER_NODE} (default 16)")
    parser.add_argument("--pruner", choices=["median", "none", "both"], default="both",
                        help="pruner variants to run (default both)")
    parser.add_argument("--plots", type=Path, default=DEFAULT_PLOTS, metavar="DIR",
                        help=f"write hpo.png here (default {DEFAULT_PLOTS.relative_to(REPO)})")
    parser.add_argument("--no-plots", action="store_true", help="write no plot")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA,
                        help="the pollux-osdi21 data folder (traces/)")
    parser.add_argument("--application", default="cifar10", help="the trials' profile (default cifar10)")
    parser.add_argument("--epochs", type=int, default=None,
                        help="shorten every trial to its first N epochs (default: the profile's)")
    parser.add_argument("--static-gpus", type=int, default=4, help="GPUs of a static trial (default 4)")
    parser.add_argument("--static-local-batch", type=int, default=None,
                        help="static trials' batch per GPU (default: the application's initial batch)")
    parser.add_argument("--sensitivity", default=DEFAULT_SENSITIVITY,
                        help=f"static local batches of the sensitivity section, or 'none' "
                             f"(default {DEFAULT_SENSITIVITY})")
    args = parser.parse_args(argv)
    args.plots = None if args.no_plots else args.plots
    for name in ("seeds", "trials", "concurrent", "gpus", "static_gpus"):
        _positive(parser, "--" + name.replace("_", "-"), getattr(args, name))
    if args.gpus % GPUS_PER_NODE:
        parser.error(f"--gpus: {args.gpus} is not a whole number of nodes of {GPUS_PER_NODE} GPUs")
    if args.static_gpus > args.gpus:
        parser.error(f"--static-gpus: {args.static_gpus} is more than the cluster's {args.gpus} GPUs")
    traces = args.data / "traces"
    if not traces.is_dir():
        parser.error(f"--data {args.data}: no traces/ folder")
    known = sorted(p.name for p in traces.iterdir() if p.is_dir())
    if args.application not in known:
        parser.error(f"--application {args.application!r}: no profile under {traces} "
                     f"(one of {', '.join(known)})")
    meta = default_metadata().get(args.application)
    if args.epochs is not None:
        if meta is None:
            parser.error(f"--epochs: {args.application} has no metadata entry to shorten")
        if not 1 <= args.epochs <= meta.epochs:
            parser.error(f"--epochs: must be in [1, {meta.epochs}] for {args.application}, got {args.epochs}")
    lo, hi = (meta.min_local_bsz, meta.max_local_bsz) if meta is not None else (1, sys.maxsize)
    try:
        args.sensitivity = ([] if args.sensitivity.strip() == "none" else
                            sorted({int(x) for x in args.sensitivity.split(",") if x.strip()}))
    except ValueError:
        parser.error(f"--sensitivity {args.sensitivity!r}: expected comma-separated local batches or 'none'")
    chosen = [] if args.static_local_batch is None else [args.static_local_batch]
    for local in [*args.sensitivity, *chosen]:
        if not lo <= local <= hi:
            parser.error(f"--static-local-batch/--sensitivity: local batch {local} outside "
                         f"{args.application}'s range [{lo}, {hi}]")
    return args


def load(args: argparse.Namespace) -> dict[str, AppProfile]:
    metadata = default_metadata()
    if args.epochs is not None:
        metadata = {**metadata, args.application: replace(metadata[args.application], epochs=args.epochs)}
    return load_profiles(args.data / "traces", [args.application], metadata=metadata)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    started = time.perf_counter()
    profiles = load(args)
    meta = profiles[args.application].meta
    local = args.static_local_batch if args.static_local_batch is not None else meta.init_batch_size
    pruners = [p for p in PRUNERS if args.pruner in (p, "both")]
    runs = {p: run_variant(args, profiles, p) for p in pruners}
    variants = {p: variant_figures(p, studies) for p, studies in runs.items()}
    main_variant = "none" if "none" in variants else pruners[0]
    head = variants[main_variant]
    result: dict[str, Any] = {
        "benchmark": "hpo", "application": args.application, "data": str(args.data),
        "gpus": args.gpus, "nodes": args.gpus // GPUS_PER_NODE, "gpus_per_node": GPUS_PER_NODE,
        "trials": args.trials, "concurrent": args.concurrent, "seeds": list(range(args.seeds)),
        "epochs": meta.epochs, "sampler": "TPE (Optuna defaults, seeded)",
        "static": {"policy": "fifo", "gpus": args.static_gpus, "local_batch": local,
                   "global_batch": local * args.static_gpus},
        "pollux": {"policy": "pollux", "initial_gpus": 1, "initial_batch": meta.init_batch_size},
        "median_pruner": {"n_startup_trials": 5, "n_warmup_steps": meta.epochs // 10},
        "surface": {"peak": PEAK, "floor": FLOOR, "run_noise": RUN_NOISE, "epoch_noise": EPOCH_NOISE,
                    "optimum": Surface().optimum_params(),
                    "space": {d.name: [d.low, d.high, "log" if d.log else "linear"] for d in SPACE}},
        "variants": variants, "target_variant": main_variant,
        "makespan_reduction": head["makespan_reduction"], "mean_jct_reduction": head["mean_jct_reduction"],
        "best": head["best"], "targets": {**TARGETS, "best_within_noise_se": NOISE_SE},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "numpy": np.__version__,
                    "optuna": optuna.__version__},
    }
    result["ok_makespan"] = bool(result["makespan_reduction"] >= TARGETS["makespan_reduction"])
    result["ok_jct"] = bool(result["mean_jct_reduction"] >= TARGETS["mean_jct_reduction"])
    result["ok_best"] = bool(head["best"] is not None and head["best"]["within_noise"])
    if "none" in variants and "median" in variants:
        plain, pruned = variants["none"], variants["median"]
        result["pruning"] = {
            "makespan_reduction": pruned["makespan_reduction"],
            "mean_jct_reduction": pruned["mean_jct_reduction"],
            "extra_makespan_reduction": pruned["makespan_reduction"] - plain["makespan_reduction"],
            "extra_mean_jct_reduction": pruned["mean_jct_reduction"] - plain["mean_jct_reduction"],
        }
    if "none" in runs:
        result["clairvoyant"] = clairvoyant_figures(args, profiles[args.application], runs["none"]["static"])
    if args.sensitivity and "none" in runs:
        result["static_batch_sensitivity"] = sensitivity(args, profiles, runs["none"]["pollux"])
    title = (f"HPO replay: TPE, {args.trials} trials, {args.concurrent} at a time, {args.gpus} GPUs, "
             f"{args.application}")
    result["plot"] = str(plot(runs, args.plots, title)) if args.plots else None
    result["ok"] = result["ok_makespan"] and result["ok_jct"] and result["ok_best"]
    result["seconds"] = round(time.perf_counter() - started, 1)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print_summary(result)
    return 0 if result["ok"] else 1


def print_summary(result: dict[str, Any]) -> None:
    print(f"== hpo ({result['application']}, {result['trials']} trials, {result['concurrent']} at a time, "
          f"{result['gpus']} GPUs, seeds {result['seeds']}, {result['seconds']} s)")
    for name, v in result["variants"].items():
        print(f"  pruner {name}:")
        for arm in ("pollux", "static"):
            mk, jct, top5 = v["makespan_h"][arm], v["mean_jct_min"][arm], v["top5_mean"][arm]
            print(f"    {arm:7s} makespan {mk['mean']:6.2f} h  mean JCT {jct['mean']:6.1f} min  "
                  f"top-5 {top5['mean']:.4f}  pruned {v['pruned_trials'][arm]['mean']:.1f}")
        print(f"    makespan_reduction {v['makespan_reduction']:.3f}  "
              f"mean_jct_reduction {v['mean_jct_reduction']:.3f}")
    for key, ok in (("makespan_reduction", result["ok_makespan"]), ("mean_jct_reduction", result["ok_jct"])):
        print(f"  {key} {result[key]:.3f} (target >= {result['targets'][key]}): {'ok' if ok else 'MISSED'}")
    if "clairvoyant" in result:
        c = result["clairvoyant"]
        print(f"  clairvoyant bound (no pruning): makespan >= {c['makespan_lower_bound_h']:.2f} h, "
              f"mean JCT >= {c['mean_jct_lower_bound_min']:.1f} min: reductions of at most "
              f"{c['max_makespan_reduction']:.3f} and {c['max_mean_jct_reduction']:.3f}")
    best = result["best"]
    if best is not None:
        print(f"  best objective: pollux {best['pollux']['mean']:.4f}, static {best['static']['mean']:.4f}, "
              f"difference {best['difference']:+.4f} (allowed ±{best['allowed']:.4f}): "
              f"{'ok' if result['ok_best'] else 'MISSED'}")
    if "pruning" in result:
        p = result["pruning"]
        print(f"  with pruning: makespan_reduction {p['makespan_reduction']:.3f} "
              f"({p['extra_makespan_reduction']:+.3f}), mean_jct_reduction {p['mean_jct_reduction']:.3f} "
              f"({p['extra_mean_jct_reduction']:+.3f})")


if __name__ == "__main__":
    sys.exit(main())

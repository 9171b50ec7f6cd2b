#!/usr/bin/env python3
"""Benchmark of the policies on Sia's heterogeneous cluster (issue 13), beside Sia's published figures.

Usage: benchmarks/heterogeneous.py [--data ../shared/data/sia-sosp23] [--workloads 1,2] [--policies
sia,pollux] [--processes N] [--quick] [--scale | --scale-only] [--json]

Setting (Sia's artifact): the eight 160-job Philly workloads of ``sia-sosp23/workloads/philly``, the
64-GPU cluster ``aws:6x4,rtx:3x8,dgx-ext:2x8``, 60 s rounds, seed 0, Sia's per-application speed
calibration (cifar10 1.8, ncf 1.5, gpt_pmp 1.0, others 1.2) and a 60 GPU-second 1-GPU bootstrap per
GPU type for the jobs of type-aware policies. Policies: sia, pollux (type-unaware), gavel, tiresias —
those registered (others are skipped with a note). Per policy it prints the mean over workloads of
average JCT, p99 JCT, makespan (hours), GPU-hours per job, restarts per job and the median policy
time per round, beside Sia's published figures (SOSP'23; ``sia-sosp23/README.md``).

``--scale`` times Sia's ``decide`` on a synthetic 2048-GPU cluster (aws 128×4, rtx 96×8, dgx-ext
96×8) with 500 jobs whose per-type models are fitted to the measured profiles (a cold first round
and a warm second round holding the first round's allocation); skipped when sia is not registered.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

from pollux.goodput import GoodputModel, fit_throughput
from pollux.goodput.records import ThroughputParams
from pollux.policy.base import JobView, fixed_shape
from pollux.policy.clusterspec import format_cluster, parse_cluster
from pollux.policy.registry import REGISTRY, make_policy
from pollux.sim.engine import SimConfig, SimResult, sia_slowdown
from pollux.sim.report import summarize
from pollux.sim.runner import RunSpec, run_many, stdout_to_stderr, typed_profiles

REPO = Path(__file__).resolve().parent.parent
DEFAULT_DATA = REPO.parent / "shared" / "data" / "sia-sosp23"
CLUSTER = "aws:6x4,rtx:3x8,dgx-ext:2x8"
POLICIES = ("sia", "pollux", "gavel", "tiresias")
QUICK_WORKLOADS = ("workload-1", "workload-2")
BOOTSTRAP_S = 60.0
SCALE_CLUSTER = "aws:128x4,rtx:96x8,dgx-ext:96x8"
SCALE_JOBS = 500

#: Sia SOSP'23, Philly workloads on the 64-GPU heterogeneous cluster (hours; restarts; ms).
PUBLISHED = {
    "sia": {"avg_jct_h": 0.6, "p99_jct_h": 9.5, "makespan_h": 14.2, "gpu_hours_per_job": 4.0,
            "restarts_per_job": 2.6, "policy_ms_median": 96.0},
    "pollux": {"avg_jct_h": 1.0, "p99_jct_h": 14.9, "makespan_h": 24.5, "gpu_hours_per_job": 5.6,
               "restarts_per_job": 5.1},
    "gavel": {"avg_jct_h": 1.9, "p99_jct_h": 30.0, "makespan_h": 33.8, "gpu_hours_per_job": 9.0},
}
COLUMNS = ("avg_jct_h", "p99_jct_h", "makespan_h", "gpu_hours_per_job", "restarts_per_job",
           "policy_ms_median")


def _mean(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return float(np.mean(vals)) if vals else None


def policy_means(results: list[SimResult]) -> dict[str, dict[str, float | None]]:
    """Per policy, the mean over its workloads of each figure of :data:`COLUMNS`."""
    out: dict[str, dict[str, float | None]] = {}
    for policy in dict.fromkeys(r.policy for r in results):
        runs = [r for r in results if r.policy == policy]
        sums = [summarize(r) for r in runs]
        hours = [{k: (s[k] / 3600 if s[k] is not None else None) for k in ("avg_jct", "p99_jct", "makespan")}
                 for s in sums]
        out[policy] = {
            "workloads": len(runs),
            "avg_jct_h": _mean([h["avg_jct"] for h in hours]),
            "p99_jct_h": _mean([h["p99_jct"] for h in hours]),
            "makespan_h": _mean([h["makespan"] for h in hours]),
            "gpu_hours_per_job": _mean([s["gpu_hours_per_job"] for s in sums]),
            "restarts_per_job": _mean([s["restarts_per_job"] for s in sums]),
            "policy_ms_median": _mean([float(np.median(r.decide_times)) * 1e3 if r.decide_times else None
                                       for r in runs]),
            "completed_share": _mean([s["completed"] / s["num_jobs"] for s in sums]),
            "wall_s": _mean([r.wall_time_s for r in runs]),
        }
    return out


def _cell(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def print_table(means: dict[str, dict[str, float | None]]) -> None:
    header = ["policy", "runs", "avg JCT h", "p99 JCT h", "makespan h", "GPU-h/job", "restarts/job",
              "policy ms (median)", "wall s"]
    rows = []
    for p, m in means.items():
        rows.append([p, str(m["workloads"]), *(_cell(m[c]) for c in COLUMNS), _cell(m["wall_s"], 1)])
        pub = PUBLISHED.get(p)
        if pub:
            rows.append([f"  {p} (Sia paper)", "8", *(_cell(pub.get(c)) for c in COLUMNS), ""])
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, ["-" * w for w in widths], *rows]:
        cells = zip(r, widths, strict=True)
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(cells)))
    if "sia" in means and "pollux" in means:
        a, b = means["sia"]["avg_jct_h"], means["pollux"]["avg_jct_h"]
        if a is not None and b:
            print(f"sia avg JCT vs type-unaware pollux: {100 * (a - b) / b:+.1f} % (paper: -40 %)")


# --------------------------------------------------------------------------------------------
# The scaled policy-time measurement
# --------------------------------------------------------------------------------------------


def scale_views(data: Path, cluster, num_jobs: int, seed: int = 0) -> list[JobView]:
    """Synthetic jobs of the Philly applications with per-type models fitted to the measured rows."""
    typed = typed_profiles(data / "traces", cluster.type_names)
    apps = [a for a in ("bert", "cifar10", "deepspeech2", "imagenet", "yolov3") if a in typed]
    rng = np.random.default_rng(seed)
    fitted: dict[tuple[str, str], ThroughputParams] = {}
    for app in apps:
        for t, prof in typed[app].items():
            n, r, m, step, sync = prof.throughput_rows()
            fit = fit_throughput(n, r, m, step, step - sync)
            fitted[app, t] = fit.params
    views = []
    for j in range(num_jobs):
        app = apps[int(rng.integers(len(apps)))]
        per_type = typed[app]
        any_prof = next(iter(per_type.values()))
        m0 = any_prof.meta.init_batch_size
        stats = any_prof.grad_stats(int(rng.integers(any_prof.meta.epochs)), m0)
        models = {t: GoodputModel(fitted[app, t], stats, m0) for t in per_type}
        limits = {t: p.meta.limits(accumulation=True) for t, p in per_type.items()}
        views.append(JobView(
            id=f"job-{j:04d}", submit_time=float(j), age_s=float(rng.uniform(60, 36000)),
            attained_service=float(rng.uniform(0, 1e5)), max_replicas=64,
            model=models.get("aws", next(iter(models.values()))),
            limits=limits.get("aws", next(iter(limits.values()))),
            max_replicas_seen=int(rng.choice([1, 2, 4, 8, 16])),
            fixed=fixed_shape(int(rng.choice([1, 2, 4, 8])), m0), application=app,
            type_models=models, type_limits=limits))
    return views


def scale_benchmark(data: Path) -> dict[str, object]:
    from dataclasses import replace as dc_replace

    cluster = parse_cluster(SCALE_CLUSTER)
    views = scale_views(data, cluster, SCALE_JOBS)
    policy = make_policy("sia")
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    alloc, state = policy.decide(views, cluster, None, 0.0, rng)
    cold = time.perf_counter() - t0
    warm_views = [dc_replace(v, allocation=alloc.get(v.id, {}), age_s=v.age_s + 60) for v in views]
    t0 = time.perf_counter()
    policy.decide(warm_views, cluster, state, 60.0, rng)
    warm = time.perf_counter() - t0
    return {"cluster": SCALE_CLUSTER, "gpus": cluster.total_gpus, "jobs": SCALE_JOBS,
            "first_round_s": cold, "second_round_s": warm,
            "jobs_running": sum(1 for v in views if alloc.get(v.id)),
            "gpus_allocated": int(sum(sum(a.values()) for a in alloc.values()))}


# --------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA, help="the sia-sosp23 data folder")
    ap.add_argument("--workloads", help="comma-separated workload names or numbers (default: all 8)")
    ap.add_argument("--policies", default=",".join(POLICIES), help="comma-separated policy names")
    ap.add_argument("--processes", type=int, default=None, help="parallel simulations (default: CPUs)")
    ap.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK_WORKLOADS)}")
    ap.add_argument("--scale", action="store_true", help="also time sia on 2048 GPUs / 500 jobs")
    ap.add_argument("--scale-only", action="store_true", help="only the 2048-GPU timing")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args(argv)

    if not (args.data / "workloads" / "philly").is_dir():
        print(f"{args.data}: no sia-sosp23 data (workloads/philly)", file=sys.stderr)
        return 2
    out: dict[str, object] = {"cluster": CLUSTER, "interval_s": 60.0, "seed": 0, "bootstrap_s": BOOTSTRAP_S,
                              "machine": {"cpus": os.cpu_count(), "python": platform.python_version()}}
    notes: list[str] = []
    if not args.scale_only:
        files = sorted((args.data / "workloads" / "philly").glob("workload-*.csv"),
                       key=lambda p: int(p.stem.split("-")[-1]))
        if args.quick:
            files = [f for f in files if f.stem in QUICK_WORKLOADS]
        if args.workloads:
            wanted = {w if w.startswith("workload-") else f"workload-{w}" for w in args.workloads.split(",")}
            files = [f for f in files if f.stem in wanted]
        policies = []
        for p in args.policies.split(","):
            if p in REGISTRY:
                policies.append(p)
            else:
                notes.append(f"policy {p!r} is not registered: skipped")
        cluster = parse_cluster(CLUSTER)
        typed = typed_profiles(args.data / "traces", cluster.type_names)
        config = SimConfig(interval=60.0, seed=0, cluster=cluster, slowdown=sia_slowdown(sorted(typed)),
                           bootstrap_s=BOOTSTRAP_S)
        specs = [RunSpec(f, p, config) for p in policies for f in files]
        print(f"{len(files)} workload(s) x {len(policies)} policy(ies) on {format_cluster(cluster)} ...",
              file=sys.stderr)
        started = time.perf_counter()
        with stdout_to_stderr():
            results = run_many(specs, args.data / "traces", processes=args.processes, progress=False)
        means = policy_means(results)
        out.update(workloads=[f.stem for f in files], policies=means, published=PUBLISHED,
                   runs=[{k: v for k, v in summarize(r).items() if k not in ("rho", "app_jct")}
                         for r in results],
                   elapsed_s=time.perf_counter() - started)
        if not args.json:
            print_table(means)
    if args.scale or args.scale_only:
        if "sia" in REGISTRY:
            with stdout_to_stderr():
                out["scale"] = scale_benchmark(args.data)
            if not args.json:
                s = out["scale"]
                print(f"sia decide on {s['gpus']} GPUs / {s['jobs']} jobs: first round "  # type: ignore[index]
                      f"{s['first_round_s']:.3f} s, second round {s['second_round_s']:.3f} s")  # type: ignore[index]
        else:
            notes.append("sia is not registered: --scale skipped")
    out["notes"] = notes
    for n in notes:
        print(f"note: {n}", file=sys.stderr)
    if args.json:
        print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Benchmark of the Pollux policy: round time and fitness against reference searches.

Usage: benchmarks/policy.py [--data ../shared/data/pollux-osdi21/traces] [--json] [--quick]

Inputs are fixed and seeded. Jobs are drawn from the six shared application profiles: each job's
throughput model is fitted (pollux.goodput.fit_throughput, with the exploration priors) to the profile
rows with at most as many replicas as the job has held, its gradient statistics come from a random
epoch row of the application's validation-<M0>.csv, and its batch limits are the SPEC §7 constants.
Ages, restarts, attained service and current allocations are random; a warm population comes from a
few previous rounds (ages advance by 60 s, allocations follow the policy, restarts count changes).

Scenarios: 64 GPUs (16 × 4) with 20, 80 and 200 jobs, compared with the plain 100 × 100 genetic
search on the same inputs and state; 4096 GPUs (1024 × 4) with 1000 jobs, compared with a greedy
marginal-gain allocation (one GPU at a time to the job with the largest objective gain). Round times
are measured with a cold speedup-table cache (a fresh policy each round: every table is rebuilt), the
case of a round where every job's model changed; ``warm_cache_ms`` is the same round when no model
changed since the last round.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pollux.goodput import BatchLimits, GoodputModel, GradStats, fit_throughput
from pollux.policy.base import Cluster, JobView, to_matrix, with_allocation
from pollux.policy.pollux import PolluxPolicy, PolluxProblem, _utility
from trace_rows import read_throughput_rows

#: SPEC §7: M0, max batch, local batch bounds.
APPS = {
    "bert": (12, 384, 4, 12),
    "cifar10": (128, 4096, 32, 1024),
    "deepspeech2": (20, 640, 10, 80),
    "imagenet": (200, 12800, 20, 200),
    "ncf": (256, 32768, 32, 32768),
    "yolov3": (8, 512, 4, 8),
}
SEEN_LEVELS = (1, 2, 4, 8, 16, 32, 64)
DEFAULT_DATA = Path(__file__).resolve().parent.parent.parent / "shared/data/pollux-osdi21/traces"


# --------------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------------


def load_profiles(data: Path) -> dict[str, dict]:
    """Per application: fitted throughput params per 'most replicas seen' level, and grad rows."""
    out = {}
    for app, (m0, mx, lo, hi) in APPS.items():
        rows = read_throughput_rows(data / app)
        fits = {}
        for seen in SEEN_LEVELS:
            sel = rows.replicas <= seen
            fit = fit_throughput(rows.nodes[sel], rows.replicas[sel], rows.local_bsz[sel],
                                 rows.step_time[sel], rows.accum_time[sel])
            fits[seen] = fit.params
        grads = []
        with (data / app / f"validation-{m0}.csv").open(newline="") as fh:
            for row in csv.DictReader(fh):
                grads.append(GradStats(float(row["grad_sqr"]), float(row["grad_var"])))
        limits = BatchLimits(m0, mx, lo, hi, accumulation=True)
        out[app] = {"fits": fits, "grads": grads, "limits": limits, "m0": m0}
    return out


def make_jobs(profiles: dict, rng: np.random.Generator, num_jobs: int, cluster: Cluster,
              now: float) -> tuple[list[JobView], dict[str, dict[str, int]]]:
    """Random jobs and a random feasible current allocation (consolidated, in random order)."""
    free = cluster.capacity().copy()
    gpn = int(free.max())
    apps = list(APPS)
    jobs, alloc = [], {}
    share = max(cluster.total_gpus / num_jobs, 1.0)
    for i in rng.permutation(num_jobs):
        app = apps[int(rng.integers(len(apps)))]
        prof = profiles[app]
        jid = f"job-{i:04d}"
        age = float(rng.exponential(3600.0)) + 1.0
        row: dict[str, int] = {}
        if rng.random() < 0.7:
            want = int(min(max(1, round(rng.exponential(share))), 64))
            # consolidated placement on the most free nodes
            left = want
            for n in np.argsort(-free, kind="stable"):
                if left == 0 or free[n] == 0:
                    break
                t = int(min(left, free[n]))
                row[cluster.nodes[n]] = t
                free[n] -= t
                left -= t
            if len(row) > 1 and left == 0 and want <= gpn:
                pass
        held = sum(row.values())
        seen = max(held, int(rng.choice([0, 1, 2, 4, 8])))
        if seen == 0 and rng.random() < 0.5:
            model, limits = None, None
        else:
            level = min(s for s in SEEN_LEVELS if s >= max(seen, 1))
            grad = prof["grads"][int(rng.integers(len(prof["grads"])))]
            model = GoodputModel(prof["fits"][level], grad, prof["m0"])
            limits = prof["limits"]
        restarts = int(rng.integers(0, 1 + min(6, int(age // 600))))
        jobs.append(JobView(
            id=jid, submit_time=now - age, age_s=age, restarts=restarts,
            attained_service=float(rng.exponential(3600.0 * max(held, 1))), allocation=row,
            min_replicas=0, max_replicas=64, preemptible=bool(rng.random() > 0.05 or not row),
            model=model, limits=limits, max_replicas_seen=seen, application=app,
        ))
        if row:
            alloc[jid] = row
    jobs.sort(key=lambda j: j.id)
    return jobs, alloc


def advance(jobs: list[JobView], old: dict, new: dict, dt: float) -> list[JobView]:
    out = []
    for job in jobs:
        before, after = old.get(job.id, {}), new.get(job.id, {})
        restarts = job.restarts + (1 if (before and after != before) else 0)
        held = sum(after.values())
        out.append(replace(job, age_s=job.age_s + dt, submit_time=job.submit_time, restarts=restarts,
                           allocation=after, attained_service=job.attained_service + held * dt,
                           max_replicas_seen=max(job.max_replicas_seen, held)))
    return out


def churn(profiles: dict, rng: np.random.Generator, jobs: list[JobView], alloc: dict, now: float,
          cluster: Cluster) -> tuple[list[JobView], dict]:
    """What changes between two rounds: ~10 % of jobs finish, as many arrive, ~20 % get new statistics."""
    keep = [j for j in jobs if rng.random() >= 0.1]
    alloc = {k: v for k, v in alloc.items() if any(j.id == k for j in keep)}
    out = []
    for job in keep:
        if job.model is not None and rng.random() < 0.2:
            prof = profiles[job.application]
            grad = prof["grads"][int(rng.integers(len(prof["grads"])))]
            job = replace(job, model=GoodputModel(job.model.throughput_params, grad, prof["m0"]))
        out.append(job)
    fresh, _ = make_jobs(profiles, rng, max(1, len(jobs) - len(keep)), cluster, now)
    base = 1 + max(int(j.id.split("-")[1]) for j in jobs)
    for i, job in enumerate(fresh):
        age = float(rng.uniform(1.0, 60.0))
        out.append(replace(job, id=f"job-{base + i:04d}", age_s=age, submit_time=now - age, restarts=0,
                           allocation={}, attained_service=0.0, preemptible=True))
    return out, alloc


def warm_inputs(profiles: dict, seed: int, num_jobs: int, cluster: Cluster, warm_rounds: int):
    """Jobs, allocation and policy state after ``warm_rounds`` rounds of the policy, then churn."""
    rng = np.random.default_rng(seed)
    now = 0.0
    jobs, alloc = make_jobs(profiles, rng, num_jobs, cluster, now)
    policy = PolluxPolicy()
    state = None
    for _ in range(warm_rounds):
        new, state = policy.decide(with_allocation(jobs, alloc), cluster, state, now, rng)
        jobs = advance(jobs, alloc, new, 60.0)
        alloc, now = new, now + 60.0
        jobs, alloc = churn(profiles, rng, jobs, alloc, now, cluster)
    return jobs, alloc, state, now


# --------------------------------------------------------------------------------------------
# Greedy baseline: one GPU at a time to the job with the largest objective gain
# --------------------------------------------------------------------------------------------


def greedy_baseline(prob: PolluxProblem, start: np.ndarray) -> np.ndarray:
    """Repeatedly give one more GPU to the job whose objective term gains most.

    The GPU goes to a node the job already uses if one has a free GPU (most free first); a job
    without GPUs gets the most-free node; otherwise the job spreads to the most-free node without
    another distributed job (only if none of its own nodes hosts another distributed job, and within
    max_nodes). The objective is separable (FITNESS_p is monotone in Σ u(SPEEDUP_j)), so the largest
    fitness gain is the largest gain of one job's term. Stops when no GPU gains.
    """
    a = prob.repair_one(start)
    p = prob.p
    free = prob.cap - a.sum(axis=0)
    r = a.sum(axis=1)
    n = np.count_nonzero(a, axis=1)
    u_now = _utility(prob.job_speedups(prob.stack([a]))[:, 0], p)
    own_free = (a > 0).astype(np.int64) @ free
    owner = prob.owners(a) if prob.interference else np.full(prob.num_nodes, -1)
    blocked = ~prob.movable.copy()
    while free.sum() > 0:
        elig = owner < 0
        best_elig = int(np.argmax(np.where(elig, free, -1)))
        elig_ok = bool(elig[best_elig]) and free[best_elig] > 0
        best_any = int(np.argmax(free))
        inplace = (r > 0) & (own_free > 0)
        n_new = np.where(inplace, n, np.where(r == 0, 1, n + 1))
        ok = ~blocked & (r < prob.max_replicas) & (r + 1 >= prob.min_replicas)
        ok &= inplace | (r == 0) | (elig_ok & (n + 1 <= prob.max_nodes))
        if not ok.any():
            break
        s_new = prob.lookup(np.arange(prob.num_jobs), n_new, r + 1)
        gain = np.where(ok, _utility(s_new * prob.pen, p) - u_now, -np.inf)
        j = int(np.argmax(gain))
        if gain[j] <= 0:
            break
        row = a[j]
        if inplace[j]:
            nodes = np.flatnonzero(row)
            node = int(nodes[np.argmax(free[nodes])])
        elif r[j] == 0:
            node = best_any
        else:
            mine = np.flatnonzero(row)
            cand = np.where(elig & (row == 0), free, 0)
            if (prob.interference and ((owner[mine] >= 0) & (owner[mine] != j)).any()) or cand.max() <= 0:
                blocked[j] = True
                continue
            node = int(np.argmax(cand))
        joined = row[node] == 0
        row[node] += 1
        free[node] -= 1
        own_free -= (a[:, node] > 0).astype(np.int64)
        if joined:
            own_free[j] += int(free[node]) + 1
        r[j] += 1
        n[j] = np.count_nonzero(row)
        if prob.interference and n[j] > 1:
            owner[row > 0] = j
        u_now[j] = _utility(prob.speedup_at(j, int(n[j]), int(r[j]),
                                            bool((row != prob.cur[j]).any())), p)
    return a


def greedy_reference(policy: PolluxPolicy, jobs, cluster, alloc) -> tuple[float, float]:
    """Best of the greedy baseline from nothing (pinned jobs only) and from the current allocation."""
    start = time.perf_counter()
    best = -np.inf
    for from_current in (False, True):
        prob = policy.problem(with_allocation(jobs, alloc), cluster)
        s = prob.cur if from_current else np.where(prob.pinned[:, None], prob.cur, 0)
        a = greedy_baseline(prob, s)
        best = max(best, prob.fitness(a))
    return best, time.perf_counter() - start


# --------------------------------------------------------------------------------------------
# Scenarios
# --------------------------------------------------------------------------------------------


def measure(policy_factory, jobs, cluster, alloc, state, now, seeds) -> dict[str, list[float]]:
    """Wall and CPU time and fitness of one decide per seed, each with a fresh policy (cold cache)."""
    out: dict[str, list[float]] = {"wall": [], "cpu": [], "fitness": []}
    views = with_allocation(jobs, alloc)
    for seed in seeds:
        policy = policy_factory()
        rng = np.random.default_rng(seed)
        w0, c0 = time.perf_counter(), time.process_time()
        alloc_out, _ = policy.decide(views, cluster, state, now, rng)
        out["wall"].append(time.perf_counter() - w0)
        out["cpu"].append(time.process_time() - c0)
        prob = policy.problem(views, cluster)
        out["fitness"].append(prob.fitness(to_matrix(alloc_out, prob.job_ids, cluster)))
    return out


def warm_cache_time(jobs, cluster, alloc, state, now, repeats: int) -> float:
    """Median wall time of a round whose speedup tables are all cached (no model changed)."""
    policy = PolluxPolicy()
    views = with_allocation(jobs, alloc)
    policy.decide(views, cluster, state, now, np.random.default_rng(0))
    times = []
    for seed in range(repeats):
        t0 = time.perf_counter()
        policy.decide(views, cluster, state, now, np.random.default_rng(100 + seed))
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def scenario(profiles, nodes: int, num_jobs: int, rounds: int, ref_runs: int, seed: int,
             large: bool) -> dict:
    cluster = Cluster.uniform(nodes, 4)
    jobs, alloc, state, now = warm_inputs(profiles, seed, num_jobs, cluster, warm_rounds=2 if large else 3)
    m = measure(PolluxPolicy, jobs, cluster, alloc, state, now, range(rounds))
    out = {
        "gpus": cluster.total_gpus, "jobs": len(jobs), "rounds": rounds,
        "median_ms": float(np.median(m["wall"]) * 1e3), "p95_ms": float(np.percentile(m["wall"], 95) * 1e3),
        "median_cpu_ms": float(np.median(m["cpu"]) * 1e3),
        "warm_cache_ms": warm_cache_time(jobs, cluster, alloc, state, now, 3) * 1e3,
        "fitness_median": float(np.median(m["fitness"])), "fitness_min": float(np.min(m["fitness"])),
    }
    if large:
        ref, ref_t = greedy_reference(PolluxPolicy(), jobs, cluster, alloc)
        out.update(reference="greedy marginal gain, one GPU at a time (best of two starts)",
                   reference_fitness=ref, reference_ms=ref_t * 1e3)
        out["ratio_min"] = out["fitness_min"] / ref
    else:
        plain = lambda: PolluxPolicy(patience=None, greedy_seed=False)  # noqa: E731
        r = measure(plain, jobs, cluster, alloc, state, now, range(1000, 1000 + ref_runs))
        out.update(reference="plain 100 x 100 genetic search",
                   reference_fitness=float(np.median(r["fitness"])),
                   reference_fitness_max=float(np.max(r["fitness"])),
                   reference_ms=float(np.median(r["wall"]) * 1e3))
        out["ratio_min"] = out["fitness_min"] / float(np.max(r["fitness"]))
    out["ratio_median"] = out["fitness_median"] / out["reference_fitness"]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="folder of application profiles")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--quick", action="store_true", help="fewer rounds (a smoke run)")
    args = parser.parse_args(argv)
    if not args.data.is_dir():
        parser.error(f"--data {args.data}: no such folder")
    t0 = time.perf_counter()
    profiles = load_profiles(args.data)
    rounds, ref_runs = (3, 1) if args.quick else (9, 3)
    results = {}
    for name, nodes, jobs, large in (("64gpu_20jobs", 16, 20, False), ("64gpu_80jobs", 16, 80, False),
                                     ("64gpu_200jobs", 16, 200, False),
                                     ("4096gpu_1000jobs", 1024, 1000, True)):
        r = max(3, rounds // 2) if large else rounds
        results[name] = scenario(profiles, nodes, jobs, r, ref_runs, seed=7, large=large)
        if not args.json:
            res = results[name]
            print(f"{name:18s} median={res['median_ms']:8.1f} ms (cpu {res['median_cpu_ms']:7.1f}) "
                  f"p95={res['p95_ms']:8.1f} ms "
                  f"warm={res['warm_cache_ms']:7.1f} ms fitness={res['fitness_median']:.5g} "
                  f"ref={res['reference_fitness']:.5g} ratio={res['ratio_median']:.4f} "
                  f"(min {res['ratio_min']:.4f})", file=sys.stderr)
    result = {
        "scenarios": results,
        "total_s": time.perf_counter() - t0,
        "machine": {"python": platform.python_version(), "numpy": np.__version__, "cpus": os.cpu_count(),
                    "processor": platform.machine()},
    }
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

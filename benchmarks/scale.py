#!/usr/bin/env python3
"""How the simulator and the policies scale with jobs and GPUs (issue 38, step 3).

Usage: benchmarks/scale.py [--json] [--quick] [--parts sims,rounds] [--policies pollux,sia]
[--jobs 160,480,960,2000] [--jobs-gpus 64] [--gpus 64,512,4096] [--gpus-jobs 960]
[--round-gpus 64,512,4096] [--round-jobs 100,1000,5000] [--warm-rounds 3] [--cap-hours H]
[--pollux-data DIR] [--sia-data DIR]

Three measurements, each answering one acceptance figure of issue 38:

* **Simulation wall time against jobs** (``growth_exponent``): workloads of ``--jobs`` jobs generated
  in this process by the function ``pollux workload generate`` runs (``--trace philly.csv --seed
  0``, the command's built-in profiles), simulated on ``--jobs-gpus`` GPUs. ``pollux`` runs on a
  uniform cluster of 4-GPU nodes with the pollux-osdi21 profiles, ``sia`` on Sia's typed mix scaled
  to that size with the sia-sosp23 profiles and Sia's speed calibration — exactly the settings of
  ``benchmarks/sim_profile.py`` (its ``setting``), so the two benchmarks' figures can be read side by
  side. Only ``simulate`` is timed (``time.perf_counter``, and ``time.process_time`` for CPU time):
  generating the workload, loading the profiles and the report are not the simulator's cost. The
  growth exponent is the least-squares slope of log(wall) on log(jobs) over the sizes run. Why a
  fitted exponent and not a ratio: the acceptance is "no faster than jobs^1.2 from 160 to 2,000",
  and a slope over four sizes is less at the mercy of one noisy run than the ratio of two.
* **Against GPUs** (``gpu_growth_exponent``): the same at ``--gpus`` GPUs with ``--gpus-jobs`` jobs
  (the clusters as sim_profile scales them). A run shared by both axes (960 jobs on 64 GPUs, say)
  runs once.
* **Policy round time** (``round_s``, keyed by policy then by size ``"<gpus>x<jobs>"``): one round of
  ``decide`` on jobs with fitted goodput models. Pollux's jobs are built as ``benchmarks/policy.py``
  builds them (pollux-osdi21 profiles, random ages, attained service and current allocations) on a
  uniform 4-GPU-node cluster; Sia's as ``benchmarks/heterogeneous.py --scale`` builds them (per-type
  models fitted to the sia-sosp23 profiles, every job arriving without GPUs: the first round the
  issue measured at 4.35 s) on Sia's mix. ``first_s`` is the first round of a fresh policy with no
  state (every speedup table, goodput memo and population built from nothing); ``warm_median_s`` the
  median of ``--warm-rounds`` later rounds of the same policy, its state carried and the jobs
  advanced 60 s on the allocation the previous round chose (ages, attained service, restarts). Peak
  memory: ``tracemalloc_peak_mib`` is the peak of Python and numpy allocations during one more cold
  round, run apart so that tracing does not slow the timed one (HiGHS's own C++ memory is not
  traced); ``maxrss_mib`` is the process's peak resident size after the size, which only grows.
  More jobs than GPUs (5,000 jobs on 64 GPUs) is still a valid round: most jobs queue.

Caps: whole simulations of 2,000 jobs take tens of minutes on a 2-core machine. ``--cap-hours H``
leaves out the jobs submitted after H simulated hours and stops every job still running at the
first round ending at or after H (sim_profile's ``HoursCap``, through the engine's round hook: the
engine runs unchanged). Every generated workload is submitted within [0, 8 h), so a cap keeps a
share of each workload's jobs roughly proportional to its size: a capped exponent measures how the
cost of the first H hours grows, which is not the whole run's growth — every capped run and every
exponent fitted over a capped run says so (``"capped": true`` and ``cap_hours``). ``--quick`` runs
tiny sizes with a short cap (a smoke test, under a minute on an idle 2-core machine).

The round-time part runs first, so that its ``maxrss_mib`` is not inflated by the simulations.
The benchmark runs with ``OMP_NUM_THREADS=1`` (set, by re-executing itself, when it is unset).
JSON goes to stdout with ``--json``; progress lines always go to stderr.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import resource
import sys
import time
import tracemalloc
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

# The sibling benchmarks are scripts, not a package: their folder is on the path when this one runs
# as a script; added here for ``import`` from elsewhere (the tests load it by path).
sys.path.insert(0, str(Path(__file__).resolve().parent))
import commit_id
import heterogeneous as hetero_bench
import policy as policy_bench
import sim_profile
from pollux.policy.base import Cluster, JobView
from pollux.policy.clusterspec import format_cluster, parse_cluster
from pollux.policy.registry import make_policy
from pollux.sim.engine import SimResult, simulate
from pollux.sim.runner import stdout_to_stderr

POLICIES = ("pollux", "sia")
PARTS = ("rounds", "sims")
DEFAULT_JOBS = (160, 480, 960, 2000)
DEFAULT_JOBS_GPUS = 64
DEFAULT_GPUS = (64, 512, 4096)
DEFAULT_GPUS_JOBS = 960
DEFAULT_ROUND_GPUS = (64, 512, 4096)
DEFAULT_ROUND_JOBS = (100, 1000, 5000)
DEFAULT_WARM_ROUNDS = 3
ROUND_INTERVAL_S = 60.0
ROUND_SEED = 0


@dataclass(frozen=True)
class Quick:
    """The sizes of ``--quick``: a few jobs' worth of simulation and small rounds.

    The generated workloads are spread over 8 hours, so a short cap needs workloads of hundreds of
    jobs to simulate any at all: 480 and 960 jobs capped at 0.1 h simulate 5 and 9 in 4 and 6
    rounds, two points per axis for a slope (a cap of 0.25 h, 12 and 17 jobs, took twice as long).
    """

    jobs: tuple[int, ...] = (480, 960)
    jobs_gpus: int = 64
    gpus: tuple[int, ...] = (64, 512)
    gpus_jobs: int = 480
    round_gpus: tuple[int, ...] = (64, 512)
    round_jobs: tuple[int, ...] = (20, 100)
    warm_rounds: int = 2
    cap_hours: float = 0.1


QUICK = Quick()


# --------------------------------------------------------------------------------------------
# Records
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SimRun:
    """One simulation: its setting, whether and where it was capped, and its cost."""

    policy: str
    workload_jobs: int
    gpus: int
    cluster: str
    jobs_simulated: int
    jobs_left_out: int
    capped: bool
    cap_hours: float | None
    stopped_at_cap: int
    completed: int
    rounds: int
    simulated_hours: float
    wall_s: float | None
    cpu_s: float | None
    decide_s: float | None
    skipped: str | None = None


@dataclass(frozen=True)
class Growth:
    """The fitted exponent of wall (and CPU) time against one axis, for one policy."""

    policy: str
    axis: str
    fixed: dict[str, int]
    exponent: float | None
    cpu_exponent: float | None
    capped: bool
    cap_hours: float | None
    points: list[dict[str, Any]] = field(default_factory=list)
    note: str | None = None


@dataclass(frozen=True)
class RoundTiming:
    """One policy's round times at one size, and the memory its cold round needs."""

    policy: str
    gpus: int
    jobs: int
    cluster: str
    first_s: float
    first_cpu_s: float
    warm_s: list[float]
    warm_median_s: float | None
    running_before_first: int
    running_after_first: int
    gpus_allocated_after_first: int
    tracemalloc_peak_mib: float
    maxrss_mib: float
    build_s: float


# --------------------------------------------------------------------------------------------
# Simulations
# --------------------------------------------------------------------------------------------


def progress_line(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def run_simulation(policy_name: str, jobs: int, gpus: int, inputs: sim_profile.Inputs,
                   cap_hours: float | None) -> SimRun:
    """Simulate one generated workload; only ``simulate`` itself is timed."""
    size = sim_profile.Size(f"philly-{jobs}x{gpus}", jobs, gpus, typed=False, capped=cap_hours is not None)
    where = sim_profile.setting(size, policy_name, inputs)
    workload = inputs.workload(size)
    hook = None
    if cap_hours is not None:
        limit = cap_hours * 3600.0
        kept = [j for j in workload if j.submit_time < limit]
        hook = sim_profile.HoursCap(limit)
    else:
        kept = list(workload)
    cluster = where.cluster
    cluster_name = format_cluster(cluster) if cluster.types else f"{cluster.num_nodes}x4 (untyped)"
    base = {"policy": policy_name, "workload_jobs": jobs, "gpus": cluster.total_gpus,
            "cluster": cluster_name, "jobs_simulated": len(kept), "jobs_left_out": len(workload) - len(kept),
            "capped": cap_hours is not None, "cap_hours": cap_hours}
    if not kept:
        return SimRun(**base, stopped_at_cap=0, completed=0, rounds=0, simulated_hours=0.0, wall_s=None,
                      cpu_s=None, decide_s=None, skipped="no job is submitted before the cap")

    def progress(message: str) -> None:
        progress_line(f"  {size.name}: {message.strip()}")

    policy = make_policy(policy_name)
    gc.collect()
    with stdout_to_stderr():
        cpu0 = time.process_time()
        start = time.perf_counter()
        result: SimResult = simulate(kept, where.profiles, policy, where.config, workload_name=size.name,
                                     progress=progress, typed_profiles=where.typed, hook=hook)
        wall = time.perf_counter() - start
        cpu = time.process_time() - cpu0
    stopped = sum(1 for j in result.jobs if j.stopped)
    finished = sum(1 for j in result.jobs if j.completion is not None and not j.stopped)
    hours = (result.timeline["time"][-1] + sim_profile.INTERVAL_S) / 3600.0 if result.rounds else 0.0
    return SimRun(**base, stopped_at_cap=stopped, completed=finished, rounds=result.rounds,
                  simulated_hours=hours, wall_s=wall, cpu_s=cpu, decide_s=result.decide_time_s)


def fit_exponent(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Least-squares slope of log(y) on log(x); None with fewer than two distinct x."""
    if len(set(xs)) < 2:
        return None
    slope, _ = np.polyfit(np.log(np.asarray(xs, dtype=np.float64)),
                          np.log(np.asarray(ys, dtype=np.float64)), 1)
    return float(slope)


def growth(policy_name: str, axis: str, fixed: dict[str, int], runs: list[SimRun]) -> Growth:
    """The exponent of ``runs`` along ``axis`` ("jobs" or "gpus"); skipped runs are left out."""
    xs: list[float] = []
    walls: list[float] = []
    cpus: list[float] = []
    points: list[dict[str, Any]] = []
    caps: set[float] = set()
    left_out: list[str] = []
    for r in runs:
        x = r.workload_jobs if axis == "jobs" else r.gpus
        if r.wall_s is None or r.cpu_s is None:
            left_out.append(str(x))
            continue
        xs.append(float(x))
        walls.append(r.wall_s)
        cpus.append(r.cpu_s)
        points.append({axis: x, "wall_s": r.wall_s, "cpu_s": r.cpu_s, "jobs_simulated": r.jobs_simulated,
                       "rounds": r.rounds, "capped": r.capped})
        if r.cap_hours is not None:
            caps.add(r.cap_hours)
    notes = []
    if caps:
        notes.append("capped: the slope of the first cap_hours simulated hours, not of whole runs "
                     "(jobs_simulated grows with the workload, since every workload spans 8 h)")
    if left_out:
        notes.append(f"left out (nothing to simulate before the cap): {', '.join(left_out)}")
    return Growth(policy=policy_name, axis=axis, fixed=fixed, exponent=fit_exponent(xs, walls),
                  cpu_exponent=fit_exponent(xs, cpus), capped=bool(caps),
                  cap_hours=max(caps) if caps else None, points=points,
                  note="; ".join(notes) if notes else None)


# --------------------------------------------------------------------------------------------
# Policy rounds
# --------------------------------------------------------------------------------------------


class RoundInputs:
    """The data the round jobs are built from, read once: the pollux-osdi21 profiles fitted as
    ``benchmarks/policy.py`` fits them (its ``load_profiles``); Sia's jobs read their own."""

    def __init__(self, pollux_data: Path, sia_data: Path) -> None:
        self.pollux_data = pollux_data
        self.sia_data = sia_data
        self._pollux_profiles: dict[str, dict] | None = None

    def cluster(self, policy_name: str, gpus: int) -> Cluster:
        """Pollux: ``gpus / 4`` nodes of 4 GPUs; Sia: sim_profile's scaled Sia mix."""
        if policy_name == "sia":
            return parse_cluster(sim_profile.SIA_MIX[gpus])
        return Cluster.uniform(gpus // 4, 4)

    def jobs(self, policy_name: str, cluster: Cluster, num_jobs: int) -> list[JobView]:
        """The jobs of one round (seeded: the same size gives the same jobs)."""
        if policy_name == "sia":
            return hetero_bench.scale_views(self.sia_data, cluster, num_jobs, seed=ROUND_SEED)
        if self._pollux_profiles is None:
            self._pollux_profiles = policy_bench.load_profiles(self.pollux_data / "traces")
        rng = np.random.default_rng(ROUND_SEED)
        views, _ = policy_bench.make_jobs(self._pollux_profiles, rng, num_jobs, cluster, now=0.0)
        return views


def allocation_of(views: Sequence[JobView]) -> dict[str, dict[str, int]]:
    return {v.id: dict(v.allocation) for v in views if v.allocation}


def traced_peak_mib(policy_name: str, views: Sequence[JobView], cluster: Cluster) -> float:
    """Peak traced memory (MiB) of one cold round: a fresh policy, no state."""
    policy = make_policy(policy_name)
    gc.collect()
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        with stdout_to_stderr():
            policy.decide(views, cluster, None, 0.0, np.random.default_rng(ROUND_SEED))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak / 2**20


def maxrss_mib() -> float:
    """The process's peak resident size so far (Linux reports KiB, macOS bytes)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2**20 if sys.platform == "darwin" else rss / 2**10


def time_rounds(policy_name: str, gpus: int, num_jobs: int, warm_rounds: int,
                inputs: RoundInputs) -> RoundTiming:
    """The cold first round and ``warm_rounds`` later ones of ``policy_name`` at one size."""
    build0 = time.perf_counter()
    cluster = inputs.cluster(policy_name, gpus)
    views = inputs.jobs(policy_name, cluster, num_jobs)
    build_s = time.perf_counter() - build0
    rng = np.random.default_rng(ROUND_SEED)
    policy = make_policy(policy_name)
    gc.collect()
    with stdout_to_stderr():
        cpu0 = time.process_time()
        start = time.perf_counter()
        alloc, state = policy.decide(views, cluster, None, 0.0, rng)
        first_s = time.perf_counter() - start
        first_cpu_s = time.process_time() - cpu0
    before = allocation_of(views)
    first_alloc = alloc
    now = 0.0
    warm: list[float] = []
    for _ in range(warm_rounds):
        # The jobs ran one round on what the policy chose: ages, service and restarts advance.
        views = policy_bench.advance(views, before, alloc, ROUND_INTERVAL_S)
        now += ROUND_INTERVAL_S
        before = alloc
        with stdout_to_stderr():
            start = time.perf_counter()
            alloc, state = policy.decide(views, cluster, state, now, rng)
            warm.append(time.perf_counter() - start)
    first_views = inputs.jobs(policy_name, cluster, num_jobs)
    peak = traced_peak_mib(policy_name, first_views, cluster)
    return RoundTiming(
        policy=policy_name, gpus=cluster.total_gpus, jobs=num_jobs,
        cluster=format_cluster(cluster) if cluster.types else f"{cluster.num_nodes}x4 (untyped)",
        first_s=first_s, first_cpu_s=first_cpu_s, warm_s=warm,
        warm_median_s=float(np.median(warm)) if warm else None,
        running_before_first=sum(1 for v in first_views if v.allocation),
        running_after_first=sum(1 for a in first_alloc.values() if a),
        gpus_allocated_after_first=int(sum(sum(a.values()) for a in first_alloc.values())),
        tracemalloc_peak_mib=peak, maxrss_mib=maxrss_mib(), build_s=build_s)


# --------------------------------------------------------------------------------------------
# Options and report
# --------------------------------------------------------------------------------------------


def parse_ints(text: str, option: str, parser: argparse.ArgumentParser) -> tuple[int, ...]:
    """A comma-separated list of positive integers (kept in order, duplicates dropped)."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        parser.error(f"{option}: expected comma-separated integers, got {text!r}")
    if not values or any(v < 1 for v in values):
        parser.error(f"{option}: expected positive integers, got {text!r}")
    return tuple(dict.fromkeys(values))


def parse_names(text: str, known: Sequence[str], option: str, parser: argparse.ArgumentParser) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        parser.error(f"{option}: unknown {', '.join(unknown) or '(empty)'}; choose from {', '.join(known)}")
    return list(dict.fromkeys(names))


def check_gpus(values: Sequence[int], policies: Sequence[str], option: str,
               parser: argparse.ArgumentParser) -> None:
    """Pollux needs whole 4-GPU nodes; Sia's mix exists at the sizes sim_profile scales it to."""
    for g in values:
        if g % 4:
            parser.error(f"{option}: {g} is not a multiple of 4 (the 4-GPU nodes of the uniform cluster)")
        if "sia" in policies and g not in sim_profile.SIA_MIX:
            parser.error(f"{option}: sia runs on Sia's mix at {', '.join(map(str, sim_profile.SIA_MIX))} "
                         f"GPUs only, got {g}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    add = parser.add_argument
    add("--json", action="store_true", help="print one JSON object on stdout")
    add("--quick", action="store_true", help="tiny sizes, a short cap: a smoke test (sizes options ignored)")
    add("--parts", default=",".join(PARTS), help="comma-separated: rounds, sims")
    add("--policies", default=",".join(POLICIES), help="comma-separated: pollux, sia")
    add("--jobs", default=",".join(map(str, DEFAULT_JOBS)), help="workload sizes of the jobs axis")
    add("--jobs-gpus", type=int, default=DEFAULT_JOBS_GPUS, help="GPUs of the jobs axis")
    add("--gpus", default=",".join(map(str, DEFAULT_GPUS)), help="cluster sizes of the GPUs axis")
    add("--gpus-jobs", type=int, default=DEFAULT_GPUS_JOBS, help="workload size of the GPUs axis")
    add("--round-gpus", default=",".join(map(str, DEFAULT_ROUND_GPUS)), help="cluster sizes of the rounds")
    add("--round-jobs", default=",".join(map(str, DEFAULT_ROUND_JOBS)), help="job counts of the rounds")
    add("--warm-rounds", type=int, default=DEFAULT_WARM_ROUNDS, help="later rounds timed after the first")
    add("--cap-hours", type=float, default=None,
        help="simulate only the first H simulated hours of every run (default: whole runs)")
    add("--pollux-data", type=Path, default=sim_profile.DEFAULT_POLLUX_DATA, help="pollux-osdi21 folder")
    add("--sia-data", type=Path, default=sim_profile.DEFAULT_SIA_DATA, help="sia-sosp23 folder")
    return parser


@dataclass(frozen=True)
class Plan:
    """What one invocation runs, after the options (and ``--quick``) are read."""

    parts: list[str]
    policies: list[str]
    jobs: tuple[int, ...]
    jobs_gpus: int
    gpus: tuple[int, ...]
    gpus_jobs: int
    round_gpus: tuple[int, ...]
    round_jobs: tuple[int, ...]
    warm_rounds: int
    cap_hours: float | None
    pollux_data: Path
    sia_data: Path
    quick: bool


def read_plan(argv: list[str] | None) -> tuple[Plan, bool]:
    """The plan and whether to print JSON; exits 2 naming the option on a bad value."""
    parser = build_parser()
    args = parser.parse_args(argv)
    parts = parse_names(args.parts, PARTS, "--parts", parser)
    policies = parse_names(args.policies, POLICIES, "--policies", parser)
    if args.quick:
        plan = Plan(parts, policies, QUICK.jobs, QUICK.jobs_gpus, QUICK.gpus, QUICK.gpus_jobs,
                    QUICK.round_gpus, QUICK.round_jobs, QUICK.warm_rounds, QUICK.cap_hours,
                    args.pollux_data, args.sia_data, quick=True)
    else:
        if args.cap_hours is not None and not (math.isfinite(args.cap_hours) and args.cap_hours > 0):
            parser.error(f"--cap-hours: must be a positive number, got {args.cap_hours}")
        if args.warm_rounds < 0:
            parser.error(f"--warm-rounds: must be >= 0, got {args.warm_rounds}")
        for option, value in (("--jobs-gpus", args.jobs_gpus), ("--gpus-jobs", args.gpus_jobs)):
            if value < 1:
                parser.error(f"{option}: must be a positive integer, got {value}")
        plan = Plan(parts, policies, parse_ints(args.jobs, "--jobs", parser), args.jobs_gpus,
                    parse_ints(args.gpus, "--gpus", parser), args.gpus_jobs,
                    parse_ints(args.round_gpus, "--round-gpus", parser),
                    parse_ints(args.round_jobs, "--round-jobs", parser), args.warm_rounds, args.cap_hours,
                    args.pollux_data, args.sia_data, quick=False)
    if "sims" in parts:
        check_gpus((plan.jobs_gpus, *plan.gpus), policies, "--jobs-gpus/--gpus", parser)
    if "rounds" in parts:
        check_gpus(plan.round_gpus, policies, "--round-gpus", parser)
    if not (plan.pollux_data / "traces" / "philly.csv").is_file():
        parser.error(f"--pollux-data {plan.pollux_data}: no traces/philly.csv")
    if "sia" in policies and not (plan.sia_data / "traces").is_dir():
        parser.error(f"--sia-data {plan.sia_data}: no traces folder")
    return plan, args.json


def run_rounds(plan: Plan) -> dict[str, dict[str, dict[str, Any]]]:
    """``round_s``: per policy, per size ``"<gpus>x<jobs>"``, the round timings."""
    inputs = RoundInputs(plan.pollux_data, plan.sia_data)
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for policy_name in plan.policies:
        out[policy_name] = {}
        for gpus in plan.round_gpus:
            for jobs in plan.round_jobs:
                progress_line(f"scale: round {policy_name} {gpus}x{jobs} ...")
                timing = time_rounds(policy_name, gpus, jobs, plan.warm_rounds, inputs)
                warm = "-" if timing.warm_median_s is None else f"{timing.warm_median_s:.3f}"
                progress_line(f"scale: round {policy_name} {gpus}x{jobs}: first {timing.first_s:.3f} s, "
                              f"warm median {warm} s, traced peak {timing.tracemalloc_peak_mib:.0f} MiB")
                out[policy_name][f"{gpus}x{jobs}"] = asdict(timing)
    return out


def run_sims(plan: Plan) -> tuple[list[SimRun], dict[str, Any], dict[str, Any]]:
    """Every simulation of both axes (each (policy, jobs, GPUs) once) and the two fits per policy."""
    inputs = sim_profile.Inputs(plan.pollux_data, plan.sia_data, reuse_profiles=plan.quick)
    done: dict[tuple[str, int, int], SimRun] = {}

    def run(policy_name: str, jobs: int, gpus: int) -> SimRun:
        key = (policy_name, jobs, gpus)
        if key not in done:
            cap = "none" if plan.cap_hours is None else f"{plan.cap_hours:g} h"
            progress_line(f"scale: simulate {policy_name} {jobs} jobs on {gpus} GPUs (cap {cap}) ...")
            result = run_simulation(policy_name, jobs, gpus, inputs, plan.cap_hours)
            wall = "skipped" if result.wall_s is None else f"{result.wall_s:.1f} s wall"
            progress_line(f"scale: simulate {policy_name} {jobs}x{gpus}: {wall}, {result.rounds} rounds, "
                          f"{result.jobs_simulated} jobs")
            done[key] = result
        return done[key]

    by_jobs: dict[str, Any] = {}
    by_gpus: dict[str, Any] = {}
    for policy_name in plan.policies:
        runs = [run(policy_name, j, plan.jobs_gpus) for j in plan.jobs]
        by_jobs[policy_name] = asdict(growth(policy_name, "jobs", {"gpus": plan.jobs_gpus}, runs))
        runs = [run(policy_name, plan.gpus_jobs, g) for g in plan.gpus]
        by_gpus[policy_name] = asdict(growth(policy_name, "gpus", {"jobs": plan.gpus_jobs}, runs))
    return list(done.values()), by_jobs, by_gpus


def head_commit() -> str | None:
    """The checked-out commit, short form (:func:`commit_id.read_commit`), or None."""
    full = commit_id.read_commit(sim_profile.REPO)
    return full[:7] if full else None


def main(argv: list[str] | None = None) -> int:
    plan, as_json = read_plan(argv)
    started = time.perf_counter()
    report: dict[str, Any] = {"quick": plan.quick, "parts": plan.parts, "policies": plan.policies,
                              "cap_hours": plan.cap_hours}
    if "rounds" in plan.parts:
        report["round_sizes"] = {"gpus": list(plan.round_gpus), "jobs": list(plan.round_jobs),
                                 "warm_rounds": plan.warm_rounds}
        report["round_s"] = run_rounds(plan)
        report["round_maxrss_mib"] = maxrss_mib()
    if "sims" in plan.parts:
        runs, by_jobs, by_gpus = run_sims(plan)
        report["sim_sizes"] = {"jobs": list(plan.jobs), "jobs_gpus": plan.jobs_gpus, "gpus": list(plan.gpus),
                               "gpus_jobs": plan.gpus_jobs}
        report["runs"] = [asdict(r) for r in runs]
        report["growth_exponent"] = by_jobs
        report["gpu_growth_exponent"] = by_gpus
    report["elapsed_s"] = time.perf_counter() - started
    report["commit"] = head_commit()
    report["machine"] = {
        "cpus": os.cpu_count(), "python": platform.python_version(), "numpy": np.__version__,
        "processor": platform.machine(), "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()], "maxrss_mib_at_end": maxrss_mib(),
    }
    if as_json:
        print(json.dumps(report, indent=1))
    else:
        print_summary(report)
    return 0


def print_summary(report: dict[str, Any]) -> None:
    """The headline figures as text (the JSON has everything)."""
    for policy_name, sizes in report.get("round_s", {}).items():
        for size, t in sizes.items():
            warm = "-" if t["warm_median_s"] is None else f"{t['warm_median_s']:.3f}"
            print(f"round {policy_name:6s} {size:>10s}: first {t['first_s']:.3f} s  warm {warm} s  "
                  f"peak {t['tracemalloc_peak_mib']:.0f} MiB")
    for key in ("growth_exponent", "gpu_growth_exponent"):
        for policy_name, g in report.get(key, {}).items():
            exp = "-" if g["exponent"] is None else f"{g['exponent']:.2f}"
            pts = ", ".join(f"{p[g['axis']]}: {p['wall_s']:.1f} s" for p in g["points"])
            cap = f" (capped at {g['cap_hours']:g} h)" if g["capped"] else ""
            print(f"{key} {policy_name}: {exp}{cap}  [{pts}]")


if __name__ == "__main__":
    if os.environ.get("OMP_NUM_THREADS") is None:
        # numpy is loaded already with its thread pools sized; only a fresh process takes the limit.
        os.environ["OMP_NUM_THREADS"] = "1"
        os.execv(sys.executable, [sys.executable, *sys.argv])
    sys.exit(main())

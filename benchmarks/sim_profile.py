#!/usr/bin/env python3
"""Where a simulation's time goes (issue 38, step 1: measure first).

Usage: benchmarks/sim_profile.py [--json] [--quick] [--sizes w6-160x64,...] [--policies pollux,sia]
[--cap-hours H] [--cap-all] [--pollux-data DIR] [--sia-data DIR]

Runs whole simulations and splits each one's wall time into named phases, so that the later steps of
issue 38 know which part to make faster. Why not cProfile: it slows every Python call by a similar
amount, which inflates exactly the many-small-calls parts (the greedy fill, the engine's own loop) and
so distorts the split it is meant to measure. Instead the benchmark wraps a dozen functions, only
while it runs and only in this process (the library is not changed), with a wall-clock accumulator
that charges each call's time to its phase *exclusive* of the wrapped calls nested inside it: a refit
inside a job's advance counts as a refit, a greedy fill inside the local search as greedy fill. The
phases therefore add up to the measured wall time by construction, and the policy's phases are
checked against the engine's own ``decide`` timer (``SimResult.decide_time_s``), an independent
measurement. Each wrapper costs a few microseconds a call (measured at the start, on a no-op); the
calls and the estimate of their cost are reported.

Phases (seconds, per run):

* ``decide.speedup_tables`` — the Pollux policy's speedup tables (``SpeedupTables``; the cached
  tables are copied, the missing ones built: ``tables_built`` counts those);
* ``decide.greedy_fill`` — every greedy fill (``fill.greedy``), from the policy and from the local search;
* ``decide.local_search`` — the destroy-and-refill search, less its greedy fills;
* ``decide.genetic_search`` — the genetic search (small clusters only: ``dense_limit``);
* ``decide.placement`` — Pollux: placing a chosen growth on nodes (``fill.place_growth``) and the
  allocation of the chosen matrix; Sia: its per-type placement and fallbacks (``SiaPolicy._place``);
* ``decide.program_build``, ``decide.program_solve`` — Sia's configurations and costs, and the MILP;
* ``decide.other`` — the rest of ``decide`` (the problem's constraints, repair, evaluation, state);
* ``refits`` — the simulated agents' throughput fits actually made (``pollux.sim.fit_memo.fit_records``;
  a fit the simulation's memo already holds costs a lookup, charged to the phase that asked);
* ``job_views`` — building the ``JobView`` of every active job every round (their goodput models);
* ``job_apply`` — applying the round's allocation to the jobs (restart, batch choice);
* ``job_advance`` — advancing the jobs through the round, less their refits;
* ``engine_ticks`` — the rest of ``simulate``: the round loop, job creation, timeline, results;
* ``post_processing`` — the report: finish-time fairness (isolated JCTs) and the summary.

Sizes (``--sizes``; seed 0, 60 s rounds everywhere):

* ``w6-160x64`` — pollux-osdi21 workload-6 (160 jobs) on 16 × 4 GPUs, pollux-osdi21 profiles;
* ``philly-960x64t`` — 960 jobs from ``pollux workload generate --trace
  pollux-osdi21/traces/philly.csv --jobs 960 --seed 0`` on Sia's typed 64-GPU cluster
  ``aws:6x4,rtx:3x8,dgx-ext:2x8`` with the sia-sosp23 profiles, Sia's speed calibration and a 60
  GPU-second bootstrap (as ``benchmarks/heterogeneous.py``), for both policies;
* ``philly-960x512``, ``philly-2000x512``, ``philly-2000x4096`` — the generated workloads of 960 and
  2,000 jobs; Pollux on uniform N × 4 clusters (pollux-osdi21 profiles), Sia on Sia's mix scaled
  up (``aws:48x4,rtx:24x8,dgx-ext:16x8`` = 512 and ``aws:384x4,rtx:192x8,dgx-ext:128x8`` = 4,096 GPUs,
  sia-sosp23 profiles and calibration). These run only the first ``--cap-hours`` simulated hours
  (default 1): jobs submitted after the cap are left out of the workload and every job still running
  at the first round ending at or after the cap is stopped there (through the engine's round hook,
  so the engine runs unchanged). A cap keeps the per-round and per-refit costs, which are what this
  profile is for, but not the run's length; the output names the cap of every run. ``--cap-all``
  caps the first two sizes too (for a machine too loaded to run them whole in the time at hand).

``--quick`` runs every size with a cap of three rounds and keeps the profiles and the fairness memo
across runs (a smoke test, well under a minute on an idle 2-core machine).
JSON goes to stdout with ``--json``; progress lines always go to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import math
import os
import platform
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import pollux.policy.pollux.fill as fill_module
import pollux.policy.pollux.local as local_module
import pollux.policy.pollux.policy as pollux_policy_module
import pollux.policy.pollux.tables as tables_module
import pollux.policy.sia as sia_module
import pollux.sim.fairness as fairness_module
import pollux.sim.fit_memo as fit_memo_module
from pollux.policy.base import Cluster
from pollux.policy.clusterspec import format_cluster, parse_cluster
from pollux.policy.pollux.problem import PolluxProblem
from pollux.policy.registry import make_policy
from pollux.sim import defaults
from pollux.sim.engine import RoundActions, SimConfig, SimJob, SimResult, sia_slowdown, simulate
from pollux.sim.fairness import finish_time_fairness
from pollux.sim.hetero_report import typed_finish_time_fairness
from pollux.sim.profiles import load_profiles
from pollux.sim.report import summarize
from pollux.sim.runner import stdout_to_stderr
from pollux.sim.typed_profiles import load_typed_profiles
from pollux.sim.workload import WorkloadJob, read_workload
from pollux.sim.workload_gen import generate_workload, read_trace

REPO = Path(__file__).resolve().parent.parent
DEFAULT_POLLUX_DATA = REPO.parent / "shared" / "data" / "pollux-osdi21"
DEFAULT_SIA_DATA = REPO.parent / "shared" / "data" / "sia-sosp23"
POLICIES = ("pollux", "sia")
INTERVAL_S = 60.0
SEED = 0
BOOTSTRAP_S = 60.0
#: Sia's 64-GPU heterogeneous cluster, and its mix scaled up (the same shares of aws, rtx, dgx-ext GPUs).
SIA_MIX = {64: "aws:6x4,rtx:3x8,dgx-ext:2x8", 512: "aws:48x4,rtx:24x8,dgx-ext:16x8",
           4096: "aws:384x4,rtx:192x8,dgx-ext:128x8"}
#: Simulated hours the large sizes run (their per-round costs are the point, not their length).
DEFAULT_CAP_HOURS = 1.0
#: Simulated hours of every size under ``--quick`` (three rounds).
QUICK_CAP_HOURS = 0.05

PHASES = ("decide.speedup_tables", "decide.greedy_fill", "decide.local_search", "decide.genetic_search",
          "decide.placement", "decide.program_build", "decide.program_solve", "decide.other",
          "refits", "job_views", "job_apply", "job_advance", "engine_ticks", "post_processing")


@dataclass(frozen=True)
class Size:
    """One simulated setting: how many jobs from which workload on how many GPUs.

    ``typed``: both policies run on Sia's 64-GPU typed cluster (else Pollux runs on a uniform N × 4
    cluster and Sia on Sia's mix scaled to ``gpus``). ``capped``: the full run stops after
    ``--cap-hours`` simulated hours (the large sizes).
    """

    name: str
    jobs: int
    gpus: int
    typed: bool
    capped: bool

    @property
    def generated(self) -> bool:
        """Whether the workload comes from ``pollux workload generate`` (else workload-6)."""
        return self.name != "w6-160x64"


SIZES = {s.name: s for s in (
    Size("w6-160x64", 160, 64, typed=False, capped=False),
    Size("philly-960x64t", 960, 64, typed=True, capped=False),
    Size("philly-960x512", 960, 512, typed=False, capped=True),
    Size("philly-2000x512", 2000, 512, typed=False, capped=True),
    Size("philly-2000x4096", 2000, 4096, typed=False, capped=True),
)}


# --------------------------------------------------------------------------------------------
# The phase clock
# --------------------------------------------------------------------------------------------


class PhaseClock:
    """Exclusive wall time per phase of the wrapped functions, and how often each was called.

    A wrapped call's time goes to its phase less the time of the wrapped calls nested in it, which go
    to theirs; so the phases of one outermost call add up to its wall time (the wrappers' own cost
    lands in the caller's phase).
    """

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: Counter[str] = Counter()
        self.counts: Counter[str] = Counter()
        #: Per table of a round: (entries, jobs, node counts, replica counts) — Pollux and Sia.
        self.tables: list[tuple[int, ...]] = []
        self._nested: list[list[float]] = []

    def wrap(self, phase: str, fn: Callable[..., Any], count: str | None = None,
             observe: Callable[[tuple[Any, ...], Any], None] | None = None) -> Callable[..., Any]:
        """``fn`` timed into ``phase``; ``count`` names an extra counter of its calls; ``observe`` sees
        the call's arguments and result after the clock has stopped."""
        nested_stack = self._nested
        seconds, calls, counts = self.seconds, self.calls, self.counts
        clock = time.perf_counter

        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            inner = [0.0]
            nested_stack.append(inner)
            start = clock()
            try:
                result = fn(*args, **kwargs)
            finally:
                elapsed = clock() - start
                nested_stack.pop()
                seconds[phase] += elapsed - inner[0]
                calls[phase] += 1
                if nested_stack:
                    nested_stack[-1][0] += elapsed
            if count is not None:
                counts[count] += 1
            if observe is not None:
                observe(args, result)
            return result

        return timed

    def note_pollux_table(self, args: tuple[Any, ...], _result: Any) -> None:
        tables = args[0]
        self.tables.append((int(tables.table.size), *tables.table.shape))

    def note_sia_table(self, _args: tuple[Any, ...], table: Any) -> None:
        self.tables.append((int(table.size), len(table.job_ids)))


#: (owner, attribute, phase, extra counter): what is wrapped; owners are modules or classes.
PATCHES: tuple[tuple[Any, str, str, str | None], ...] = (
    (SimJob, "view", "job_views", None),
    (SimJob, "apply", "job_apply", None),
    (SimJob, "advance", "job_advance", None),
    (fit_memo_module, "fit_records", "refits", None),
    (pollux_policy_module.PolluxPolicy, "decide", "decide.other", None),
    (pollux_policy_module, "greedy", "decide.greedy_fill", "greedy_fills"),
    (local_module, "greedy", "decide.greedy_fill", "greedy_fills"),
    (pollux_policy_module, "local_search", "decide.local_search", None),
    (pollux_policy_module, "genetic_search", "decide.genetic_search", None),
    (fill_module, "place_growth", "decide.placement", None),
    (PolluxProblem, "to_allocation", "decide.placement", None),
    (tables_module, "speedup_table", "decide.speedup_tables", "tables_built"),
    (sia_module.SiaPolicy, "decide", "decide.other", None),
    (sia_module, "solve", "decide.program_solve", None),
    (sia_module.SiaPolicy, "_place", "decide.placement", None),
)


@contextlib.contextmanager
def instrumented(clock: PhaseClock) -> Iterator[None]:
    """Wrap :data:`PATCHES` (and the two table builders, which also record their size) with
    ``clock`` meanwhile; the originals are back afterwards, whatever happens."""
    patches = [(owner, attr, clock.wrap(phase, vars(owner)[attr], count)) for owner, attr, phase, count
               in PATCHES]
    patches.append((tables_module.SpeedupTables, "__init__",
                    clock.wrap("decide.speedup_tables", vars(tables_module.SpeedupTables)["__init__"],
                               observe=clock.note_pollux_table)))
    patches.append((sia_module.SiaPolicy, "table",
                    clock.wrap("decide.program_build", vars(sia_module.SiaPolicy)["table"],
                               observe=clock.note_sia_table)))
    saved = [(owner, attr, vars(owner)[attr]) for owner, attr, _ in patches]
    try:
        for owner, attr, wrapped in patches:
            setattr(owner, attr, wrapped)
        yield
    finally:
        for owner, attr, original in saved:
            setattr(owner, attr, original)


def wrapper_cost_s(calls: int = 200_000) -> float:
    """Seconds one wrapped call costs beyond the call itself (measured on a no-op, this machine)."""
    clock = PhaseClock()

    def noop() -> None:
        return None

    wrapped = clock.wrap("x", noop)
    start = time.perf_counter()
    for _ in range(calls):
        noop()
    bare = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(calls):
        wrapped()
    return max((time.perf_counter() - start - bare) / calls, 0.0)


# --------------------------------------------------------------------------------------------
# Round cap
# --------------------------------------------------------------------------------------------


class HoursCap:
    """A round hook that stops every job still running at the first round ending at or after
    ``limit_s``: a long simulation cut to its first hours without changing the engine."""

    def __init__(self, limit_s: float) -> None:
        self.limit_s = limit_s

    def after_round(self, start: float, end: float, jobs: Sequence[SimJob]) -> RoundActions:
        if end < self.limit_s:
            return RoundActions()
        return RoundActions(stop=tuple(j.name for j in jobs if j.completion is None))


# --------------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------------


@dataclass
class Inputs:
    """Data read once per benchmark run: the Philly trace and the generated workloads; profiles are
    loaded afresh for every run unless ``reuse_profiles`` (``--quick``: a smoke test, where the
    loading and the cold memos would be most of the time)."""

    pollux_data: Path
    sia_data: Path
    reuse_profiles: bool = False

    def __post_init__(self) -> None:
        self._workloads: dict[int, list[WorkloadJob]] = {}
        self._trace: list[Any] | None = None
        self._generator_profiles: Any = None
        self._loaded: dict[tuple[str, tuple[str, ...]], Any] = {}

    def load(self, root: Path, types: tuple[str, ...] = ()) -> Any:
        """The profiles under ``root``: of ``types`` when given, else the un-suffixed ones (none when
        a typed folder has no un-suffixed files, as :mod:`pollux.sim.runner` loads them)."""
        key = (str(root), types)
        if self.reuse_profiles and key in self._loaded:
            return self._loaded[key]
        if types:
            got = load_typed_profiles(root, types)
        else:
            try:
                got = load_profiles(root)
            except FileNotFoundError:
                got = {}
        self._loaded[key] = got
        return got

    def workload(self, size: Size) -> list[WorkloadJob]:
        """workload-6, or the jobs ``pollux workload generate --trace philly.csv --jobs N --seed 0``
        writes (the same function, with the command's default built-in profiles)."""
        if not size.generated:
            return read_workload(self.pollux_data / "workloads" / "workload-6.csv")
        if size.jobs not in self._workloads:
            if self._trace is None:
                self._trace = read_trace(self.pollux_data / "traces" / "philly.csv")
            if self._generator_profiles is None:
                self._generator_profiles = load_profiles(defaults.profiles_dir())
            self._workloads[size.jobs] = generate_workload(self._trace, self._generator_profiles,
                                                           num_jobs=size.jobs, seed=SEED)
        return self._workloads[size.jobs]


@dataclass
class Setting:
    """Where one run simulates: the cluster, the config and the profiles (freshly loaded)."""

    cluster: Cluster
    config: SimConfig
    root: Path
    profiles: dict[str, Any]
    typed: dict[str, Any] | None


def setting(size: Size, policy: str, inputs: Inputs) -> Setting:
    """The cluster, config and profiles of ``policy`` at ``size``.

    The profiles are loaded afresh for every run (but under ``--quick``): they memoise their lookups,
    and a run should pay for its own lookups as a ``pollux simulate`` process would, not find them
    warmed by the run before.
    """
    if size.typed or (policy == "sia" and size.generated):
        cluster = parse_cluster(SIA_MIX[size.gpus])
        root = inputs.sia_data / "traces"
        typed = inputs.load(root, cluster.type_names)
        config = SimConfig(interval=INTERVAL_S, seed=SEED, cluster=cluster,
                           slowdown=sia_slowdown(sorted(typed)), bootstrap_s=BOOTSTRAP_S)
        return Setting(cluster, config, root, inputs.load(root), typed)
    cluster = Cluster.uniform(size.gpus // 4, 4)
    config = SimConfig(interval=INTERVAL_S, seed=SEED, num_nodes=size.gpus // 4, gpus_per_node=4,
                       bootstrap_s=BOOTSTRAP_S)
    root = inputs.pollux_data / "traces"
    return Setting(cluster, config, root, inputs.load(root), None)


# --------------------------------------------------------------------------------------------
# One run
# --------------------------------------------------------------------------------------------


def profile_run(size: Size, policy_name: str, inputs: Inputs, cap_hours: float | None,
                call_cost_s: float) -> dict[str, Any]:
    """Simulate ``policy_name`` at ``size`` under the phase clock; its figures as a dict."""
    where = setting(size, policy_name, inputs)
    cluster, config, root, typed = where.cluster, where.config, where.root, where.typed is not None
    jobs = inputs.workload(size)
    hook = None
    if cap_hours is not None:
        limit = cap_hours * 3600.0
        jobs = [j for j in jobs if j.submit_time < limit]
        hook = HoursCap(limit)
    typed_profs, profiles = where.typed, where.profiles
    policy = make_policy(policy_name)
    if not inputs.reuse_profiles:
        # The fairness report memoises isolated JCTs per process: start cold, as a process would.
        fairness_module._ISO_CACHE.clear()
    name = f"{policy_name} {size.name}"

    def progress(message: str) -> None:
        print(f"  {size.name}: {message.strip()}", file=sys.stderr, flush=True)

    clock = PhaseClock()
    timed_simulate = clock.wrap("engine_ticks", simulate)
    cpu0 = time.process_time()
    start = time.perf_counter()
    with instrumented(clock), stdout_to_stderr():
        result: SimResult = timed_simulate(jobs, profiles, policy, config, workload_name=name,
                                           progress=progress, typed_profiles=typed_profs, hook=hook)
    post_start = time.perf_counter()
    if typed_profs is not None:
        typed_finish_time_fairness(result, typed_profs)
    else:
        finish_time_fairness(result, profiles, cluster.total_gpus)
    summary = summarize(result)
    end = time.perf_counter()
    cpu = time.process_time() - cpu0
    clock.seconds["post_processing"] += end - post_start
    wall = end - start

    phases = {p: float(clock.seconds.get(p, 0.0)) for p in PHASES}
    decide_phases = sum(v for p, v in phases.items() if p.startswith("decide."))
    active = np.asarray(result.timeline["active_jobs"], dtype=np.float64)
    wrapped_calls = int(sum(clock.calls.values()))
    refits = int(clock.calls["refits"])
    stopped = sum(1 for j in result.jobs if j.stopped)
    out: dict[str, Any] = {
        "policy": policy_name, "size": size.name, "jobs": len(jobs), "workload_jobs": size.jobs,
        "gpus": cluster.total_gpus, "cluster": format_cluster(cluster) if cluster.types else
        f"{cluster.num_nodes}x4 (untyped)", "profiles": str(root), "typed": typed,
        "cap_hours": cap_hours,
        "wall_s": wall, "cpu_s": cpu, "rounds": result.rounds,
        "simulated_hours": (result.timeline["time"][-1] + INTERVAL_S) / 3600.0 if result.rounds else 0.0,
        "active_jobs_mean": float(active.mean()) if active.size else 0.0,
        "active_jobs_max": int(active.max()) if active.size else 0,
        "completed": int(summary["completed"]) - stopped, "stopped_at_cap": stopped,
        "avg_jct_s": summary["avg_jct"],
        "refits": {"count": refits, "total_s": phases["refits"],
                   "mean_ms": 1e3 * phases["refits"] / refits if refits else None},
        "decide": {"engine_timer_s": result.decide_time_s, "phases_s": decide_phases,
                   "per_round_ms": 1e3 * result.decide_time_s / result.rounds if result.rounds else None},
        "phases_s": phases,
        "per_round_ms": {p: 1e3 * v / result.rounds if result.rounds else None for p, v in phases.items()},
        "phases_sum_s": float(sum(phases.values())),
        "calls": {p: int(clock.calls[p]) for p in PHASES if clock.calls[p]},
        "counts": dict(clock.counts),
        "wrapped_calls": wrapped_calls,
        "wrapper_overhead_estimate_s": wrapped_calls * call_cost_s,
    }
    out["table"] = table_figures(clock.tables, policy_name)
    return out


def table_figures(tables: list[tuple[int, ...]], policy: str) -> dict[str, Any]:
    """The per-round table sizes: Pollux's speedup tables (jobs × node counts × replica counts, as
    the policy builds them) or Sia's configuration table (one row per job, type and GPU count)."""
    if not tables:
        return {"kind": None, "rounds": 0}
    entries = np.asarray([t[0] for t in tables], dtype=np.float64)
    out: dict[str, Any] = {"rounds": len(tables), "entries_mean": float(entries.mean()),
                           "entries_max": int(entries.max())}
    if policy == "pollux":
        largest = max(tables)
        out.update(kind="speedup (jobs x (node counts + 1) x (replica counts + 1))",
                   largest_shape=list(largest[1:]),
                   node_counts_mean=float(np.mean([t[2] - 1 for t in tables])),
                   replica_counts_mean=float(np.mean([t[3] - 1 for t in tables])))
    else:
        out.update(kind="sia configurations (job, GPU type, GPU count)",
                   jobs_mean=float(np.mean([t[1] for t in tables])))
    return out


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------

SHORT = {"decide.speedup_tables": "tables", "decide.greedy_fill": "greedy", "decide.local_search": "local",
         "decide.genetic_search": "genetic", "decide.placement": "place", "decide.program_build": "build",
         "decide.program_solve": "solve", "decide.other": "dec.oth", "refits": "refits",
         "job_views": "views", "job_apply": "apply", "job_advance": "advance", "engine_ticks": "engine",
         "post_processing": "post"}


def print_table(runs: list[dict[str, Any]]) -> None:
    """A terminal table: counts, then each phase's share of the wall time."""
    header = ["policy", "size", "cap h", "wall s", "rounds", "active", "table", "refits", "refit ms",
              "decide ms/rd", *(SHORT[p] for p in PHASES)]
    rows = []
    for r in runs:
        wall = r["wall_s"]
        rows.append([r["policy"], r["size"], "-" if r["cap_hours"] is None else f"{r['cap_hours']:g}",
                     f"{wall:.1f}", str(r["rounds"]), f"{r['active_jobs_mean']:.0f}",
                     f"{r['table'].get('entries_mean', 0):.0f}", str(r["refits"]["count"]),
                     "-" if r["refits"]["mean_ms"] is None else f"{r['refits']['mean_ms']:.1f}",
                     "-" if r["decide"]["per_round_ms"] is None else f"{r['decide']['per_round_ms']:.1f}",
                     *(f"{100 * r['phases_s'][p] / wall:.0f}%" if wall else "-" for p in PHASES)])
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)))


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def parse_names(text: str, known: Sequence[str], option: str, parser: argparse.ArgumentParser) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        parser.error(f"{option}: unknown {', '.join(unknown) or '(empty)'}; choose from {', '.join(known)}")
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    parser.add_argument("--quick", action="store_true",
                        help=f"every size capped at {QUICK_CAP_HOURS:g} simulated hours (a smoke test)")
    parser.add_argument("--sizes", default=",".join(SIZES), help=f"comma-separated: {', '.join(SIZES)}")
    parser.add_argument("--policies", default=",".join(POLICIES), help="comma-separated: pollux, sia")
    parser.add_argument("--cap-hours", type=float, default=DEFAULT_CAP_HOURS,
                        help="simulated hours of the capped (large) sizes")
    parser.add_argument("--cap-all", action="store_true",
                        help="cap every size, workload-6 and the typed 960 jobs too (a loaded machine)")
    parser.add_argument("--pollux-data", type=Path, default=DEFAULT_POLLUX_DATA, help="pollux-osdi21 folder")
    parser.add_argument("--sia-data", type=Path, default=DEFAULT_SIA_DATA, help="sia-sosp23 folder")
    args = parser.parse_args(argv)
    sizes = [SIZES[n] for n in parse_names(args.sizes, list(SIZES), "--sizes", parser)]
    policies = parse_names(args.policies, POLICIES, "--policies", parser)
    if not (math.isfinite(args.cap_hours) and args.cap_hours > 0):
        parser.error(f"--cap-hours: must be a positive number, got {args.cap_hours}")
    if not (args.pollux_data / "traces" / "philly.csv").is_file():
        parser.error(f"--pollux-data {args.pollux_data}: no traces/philly.csv")
    if "sia" in policies or any(s.typed for s in sizes):
        if not (args.sia_data / "traces").is_dir():
            parser.error(f"--sia-data {args.sia_data}: no traces folder")

    started = time.perf_counter()
    inputs = Inputs(args.pollux_data, args.sia_data, reuse_profiles=args.quick)
    call_cost = wrapper_cost_s()
    runs = []
    for size in sizes:
        for policy in policies:
            cap = QUICK_CAP_HOURS if args.quick else (args.cap_hours if size.capped or args.cap_all else None)
            print(f"sim_profile: {policy} {size.name} (cap {'none' if cap is None else f'{cap:g} h'}) ...",
                  file=sys.stderr, flush=True)
            run = profile_run(size, policy, inputs, cap, call_cost)
            print(f"sim_profile: {policy} {size.name}: {run['wall_s']:.1f} s wall, {run['rounds']} rounds, "
                  f"{run['refits']['count']} refits", file=sys.stderr, flush=True)
            runs.append(run)
    load = os.getloadavg()
    report = {
        "runs": runs,
        "quick": args.quick,
        "cap_hours": QUICK_CAP_HOURS if args.quick else args.cap_hours,
        "capped_sizes": [s.name for s in sizes if args.quick or args.cap_all or s.capped],
        "interval_s": INTERVAL_S, "seed": SEED,
        "wrapper_cost_us": call_cost * 1e6,
        "elapsed_s": time.perf_counter() - started,
        "commit": git_commit(),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "numpy": np.__version__,
                    "processor": platform.machine(),
                    "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
                    "load_average_at_end": [round(x, 2) for x in load]},
    }
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print_table(runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())

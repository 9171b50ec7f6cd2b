"""The ``pollux`` commands that need no service: ``goodput`` (the goodput model of the example jobs),
``simulate`` (trace-driven simulation under scheduling policies) and ``workload generate``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

from pollux.cli.errors import CliError
from pollux.cli.formatting import goodput_text
from pollux.cli.parser import (
    _typed,
    add_policy_option,
    command,
    fraction,
    nonnegative_int,
    positive_float,
    positive_int,
)
from pollux.cli.terminal import ProgressBar, is_terminal

GPU_COUNTS = (1, 2, 4, 8, 16, 32, 64)
GPUS_PER_NODE = 4
#: ``--balance`` choices: LB-BSP batch balancing off, on, or each policy run both ways.
BALANCE_CHOICES = ("off", "on", "both")
#: GPU-seconds of the per-type bootstrap profile (one scheduling round's worth; an assumption).
DEFAULT_BOOTSTRAP_S = 60.0

nonnegative_float = _typed("number", float, lambda v: math.isfinite(v) and v >= 0, "a number >= 0")
speed_factor = _typed("speed factor", float, lambda v: math.isfinite(v) and 0 < v <= 1, "a number in (0, 1]")


def _goodput_rows(job: Any, phase: str) -> list[dict[str, float]]:
    """Best batch per GPU count (packed 4 per node), with speedup over one GPU."""
    model = job.model(phase)
    replicas = np.array(GPU_COUNTS)
    nodes = np.array([math.ceil(k / GPUS_PER_NODE) for k in GPU_COUNTS])
    plan = model.optimize(nodes, replicas, job.limits)
    base = float(plan.goodput[0])
    return [
        {"gpus": int(k), "nodes": int(n), "batch_size": int(plan.batch_size[i]),
         "local_bsz": int(plan.local_bsz[i]), "accum_steps": int(plan.accum_steps[i]),
         "efficiency": float(plan.efficiency[i]), "goodput": float(plan.goodput[i]),
         "speedup": float(plan.goodput[i] / base) if base > 0 else 0.0}
        for i, (k, n) in enumerate(zip(replicas, nodes, strict=True))
    ]


def cmd_goodput(args: argparse.Namespace) -> int:
    from pollux.goodput.examples import load_example_jobs

    jobs = load_example_jobs()
    names = args.job or sorted(jobs)
    unknown = [n for n in names if n not in jobs]
    if unknown:
        raise CliError(f"--job: unknown example job(s) {', '.join(unknown)}; "
                       f"choose from {', '.join(sorted(jobs))}", usage=True)
    out = {}
    for name in names:
        job = jobs[name]
        out[name] = {phase: {"epoch": job.grad[phase][0], "pgns": job.grad[phase][1].pgns(
            job.limits.init_batch_size), "rows": _goodput_rows(job, phase)} for phase in job.grad}
    if args.json:
        print(json.dumps(out))
    else:
        print(goodput_text(jobs, out, terminal=is_terminal(sys.stdout)))
    return 0


def _profiles_dir(arg: str | None) -> Path:
    from pollux.sim import defaults

    profiles_dir = Path(arg) if arg else defaults.profiles_dir()
    if not profiles_dir.is_dir():
        raise CliError(f"--profiles {profiles_dir}: no such folder")
    return profiles_dir


def _workload_files(arg: str) -> list[Path]:
    path = Path(arg)
    if path.is_dir():
        files = sorted(path.glob("*.csv"))
        if not files:
            raise CliError(f"--workload {arg}: folder holds no .csv workload")
        return files
    if not path.is_file():
        raise CliError(f"--workload {arg}: no such file or folder")
    return [path]


def cmd_simulate(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from pollux.policy.clusterspec import format_cluster
    from pollux.policy.registry import policy_names
    from pollux.sim import defaults
    from pollux.sim.balance import slow_node_speeds
    from pollux.sim.engine import SimConfig, sia_slowdown
    from pollux.sim.fairness import finish_time_fairness
    from pollux.sim.hetero_report import (
        add_type_json,
        format_type_table,
        typed_finish_time_fairness,
        write_type_plots,
    )
    from pollux.sim.plots import write_plots
    from pollux.sim.report import to_json
    from pollux.sim.runner import (
        RunSpec,
        _profiles,
        _profiles_or_empty,
        run_many,
        stdout_to_stderr,
        typed_profiles,
    )
    from pollux.sim.table import format_table
    from pollux.sim.workload import read_workload

    profiles_dir = _profiles_dir(args.profiles)
    workloads = _workload_files(args.workload) if args.workload else [defaults.workload_file()]
    policies = args.policy or list(policy_names(compare=True))
    cluster = _cluster_arg(args.cluster)
    typed = None
    try:
        base = SimConfig(interval=args.interval, interference=args.interference, seed=args.seed,
                         cluster=cluster, bootstrap_s=args.bootstrap_s)
        if args.slow_nodes > base.node_count:
            raise CliError(f"--slow-nodes: expected at most {base.node_count} (the cluster's nodes), "
                           f"got {args.slow_nodes}", usage=True)
        speeds = slow_node_speeds(base.node_count, args.slow_nodes, args.slow_factor)
        balances = {"off": [False], "on": [True], "both": [False, True]}[args.balance]
        if cluster is not None and cluster.types:
            typed = typed_profiles(profiles_dir, cluster.type_names)
            profiles = _profiles_or_empty(profiles_dir)
        else:
            profiles = _profiles(profiles_dir)
        known = set(profiles) | set(typed or {})
        if args.slowdown == "sia":
            base = replace(base, slowdown=sia_slowdown(sorted(known)))
        configs = [replace(base, node_speed=speeds, balance=b) for b in balances]
        for w in workloads:                      # validate every file before any long run starts
            read_workload(w, applications=known)
    except ValueError as exc:                    # a malformed profile or workload, named in the message
        raise CliError(str(exc)) from exc
    config = configs[0]
    specs = [RunSpec(w, name, c) for w in workloads for name in policies for c in configs]
    slow = (f", {args.slow_nodes} node(s) at speed {args.slow_factor:g}" if args.slow_nodes else "")
    shape = (format_cluster(cluster) if cluster is not None
             else f"{config.num_nodes} x {config.gpus_per_node} GPUs")
    print(f"simulating {len(workloads)} workload(s) x {len(policies)} policy(ies) "
          f"({len(specs)} runs) on {shape}{slow}, balancing {args.balance} ...", file=sys.stderr)
    # On a terminal a bar counts the runs; elsewhere each run prints its plain progress lines.
    bar = ProgressBar("runs", len(specs), sys.stderr, terminal=False if args.quiet else None, lazy=True)
    with stdout_to_stderr(), bar:           # a solver's C-level prints must not reach the report
        results = run_many(specs, profiles_dir, processes=args.processes,
                           progress=not (args.quiet or bar.shown), runs_done=bar.update)
    total = config.make_cluster().total_gpus
    for res in results:
        if typed is not None:
            typed_finish_time_fairness(res, typed)
        else:
            finish_time_fairness(res, profiles, total)
    terminal = is_terminal(sys.stdout)
    print(format_table(results, terminal))
    if typed is not None:
        print()
        print(format_type_table(results, terminal))
    if args.json:
        data = to_json(results)
        if typed is not None:
            add_type_json(data, results)
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(data, indent=1) + "\n")
        print(f"wrote {args.json}", file=sys.stderr)
    if args.plots:
        for path in write_plots(results, Path(args.plots)):
            print(f"wrote {path}", file=sys.stderr)
        for path in write_type_plots(results, Path(args.plots)):
            print(f"wrote {path}", file=sys.stderr)
    return 0


def _cluster_arg(arg: str | None) -> Any:
    """``--cluster``: a file naming the nodes, or a string like ``aws:6x4,rtx:3x8`` (None: default)."""
    if arg is None:
        return None
    from pollux.policy.clusterspec import load_cluster, parse_cluster

    try:
        return load_cluster(arg) if Path(arg).is_file() else parse_cluster(arg, where="--cluster")
    except ValueError as exc:
        raise CliError(str(exc), usage=not Path(arg).is_file()) from exc


def cmd_workload(args: argparse.Namespace) -> int:
    from collections import Counter

    from pollux.sim.profiles import load_profiles
    from pollux.sim.workload import write_workload
    from pollux.sim.workload_gen import generate_workload

    profiles_dir = _profiles_dir(args.profiles)
    try:
        jobs = generate_workload(Path(args.trace), load_profiles(profiles_dir), num_jobs=args.jobs,
                                 seed=args.seed)
    except ValueError as exc:                    # a malformed trace or profile, named in the message
        raise CliError(str(exc)) from exc
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_workload(out, jobs)
    apps = Counter(j.application for j in jobs)
    print(f"wrote {len(jobs)} jobs over {max(j.submit_time for j in jobs) / 3600:.2f} h to {out} "
          f"({', '.join(f'{a} {n}' for a, n in sorted(apps.items()))})", file=sys.stderr)
    return 0


def add_sim_commands(sub: Any) -> None:
    """Add ``goodput``, ``simulate`` and ``workload generate`` to the subcommands ``sub``."""
    p = sub.add_parser("goodput", help="walk through the goodput model of the example jobs",
                       description="Best batch size, accumulation, efficiency and speedup per GPU "
                                   "count, early and late in training, for the example jobs.")
    p.add_argument("--job", action="append", help="example job name (repeatable; default: all)")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    command(p, cmd_goodput)

    p = sub.add_parser("simulate", help="simulate workloads under scheduling policies",
                       description="Trace-driven simulation of a GPU cluster (16 x 4 GPUs) running "
                                   "workloads under one or more policies, on measured job profiles.")
    p.add_argument("--profiles", metavar="DIR",
                   help="application profiles in the Pollux OSDI'21 format (default: built-in)")
    p.add_argument("--workload", metavar="FILE_OR_DIR",
                   help="workload CSV, or a folder of them (default: built-in demo workload)")
    add_policy_option(p, action="append", metavar="NAME",
                      help="one of %(choices)s (repeatable; default: those the policy registry "
                           "compares by default)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--interval", type=positive_float, default=60.0,
                   help="scheduling interval, s (default 60)")
    p.add_argument("--interference", type=fraction, default=0.0,
                   help="slowdown of distributed jobs sharing a node, 0..1 (default 0)")
    p.add_argument("--slow-nodes", type=nonnegative_int, default=0, metavar="N",
                   help="the first N nodes run at --slow-factor of the profiles' speed (default 0)")
    p.add_argument("--slow-factor", type=speed_factor, default=0.5, metavar="F",
                   help="speed factor of the slow nodes, in (0, 1] (default 0.5)")
    p.add_argument("--balance", choices=BALANCE_CHOICES, default="off",
                   help="LB-BSP balancing of the jobs' local batches: off, on, or both (each policy "
                        "run without and with it; the balanced runs are labelled POLICY+lbbsp). "
                        "Default off")
    p.add_argument("--cluster", metavar="SPEC_OR_FILE",
                   help="GPU types and nodes, e.g. aws:6x4,rtx:3x8,dgx-ext:2x8 (or a file of such "
                        "entries); profiles are then read per type (placements-<type>.csv). "
                        "Default: 16 x 4 untyped GPUs")
    p.add_argument("--slowdown", choices=("none", "sia"), default="none",
                   help="speed calibration: 'sia' multiplies step times by Sia's per-application "
                        "factors (cifar10 1.8, ncf 1.5, gpt_pmp 1.0, others 1.2). Default none")
    p.add_argument("--bootstrap-s", type=nonnegative_float, default=DEFAULT_BOOTSTRAP_S, metavar="S",
                   help="GPU-seconds charged per GPU type for a job's 1-GPU bootstrap profile under a "
                        "type-aware policy on a typed cluster (default %(default)s)")
    p.add_argument("--processes", type=positive_int, default=None,
                   help="parallel processes (default: one per run, at most the CPU count)")
    p.add_argument("--json", metavar="OUT", help="write results as JSON to OUT")
    p.add_argument("--plots", metavar="DIR", help="write PNG plots into DIR")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    command(p, cmd_simulate)

    p = sub.add_parser("workload", help="generate workloads from a job trace",
                       description="Workload tools (SPEC §7 format: name,time,application,num_replicas,"
                                   "batch_size).")
    wsub = p.add_subparsers(dest="workload_command", required=True)
    g = wsub.add_parser("generate", help="sample a workload from a Philly-format trace",
                        description="Sample jobs submitted 02:00-10:00 from a Philly-format trace "
                                    "(timestamp,duration,num_gpus,gpu_time), map them to applications by "
                                    "GPU time and give each a TunedJobs (replicas, batch) configuration.")
    g.add_argument("--trace", required=True, metavar="FILE", help="Philly-format trace CSV")
    g.add_argument("--jobs", type=positive_int, default=160, help="number of jobs (default 160)")
    g.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    g.add_argument("--profiles", metavar="DIR",
                   help="application profiles for the TunedJobs configurations (default: built-in)")
    g.add_argument("--out", required=True, metavar="FILE", help="workload CSV to write")
    command(g, cmd_workload)

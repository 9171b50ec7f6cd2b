#!/usr/bin/env python3
"""Cloud autoscaling in the simulator (issue 36): the goodput rule against Or et al.'s throughput rule.

Usage:
    benchmarks/autoscale.py [--json] [--only one_job|workload|typed] [--typed] [--plots DIR] [--seed 0]
        [--data ../shared/data/pollux-osdi21] [--max-nodes 16] [--application imagenet]
        [--workload-jobs N] [--fixed 4,8,16] [--sia-data ../shared/data/sia-sosp23]
        [--typed-jobs N] [--typed-prices aws=3.912,dgx-ext=32.77]

Sections (each a function ``section_NAME(args, ...) -> dict`` registered in ``SECTIONS``):

* ``one_job``: one ImageNet job (``imagenet-0``, submitted at 0, batch 200) on a cloud of 1..16
  nodes × 4 GPUs that starts on 1 node and delivers a node 120 s after it is asked for; the
  scheduling policy is ``pollux`` in both arms. Arm ``goodput``: the goodput autoscaler and Pollux's
  adaptive jobs (goodput-optimal batch). Arm ``throughput`` (Or et al., MLSys'20): the throughput
  autoscaler and jobs that run their initial batch on every GPU (``SimConfig(batch_per_gpu=True)``).
  Reported per arm: node-hours, cost, completion (hours), restarts, the nodes held and the batch
  over time; then ``node_hours_reduction`` = 1 − goodput / throughput node-hours (target ≥ 0.25)
  and ``completion_ratio`` = goodput / throughput completion (target ≤ 1.06): the thesis's figures
  for this experiment (§3.5.4, Fig. 3.14). Plot ``one_job.png``: (a) nodes and batch size over
  time for both arms, (b) statistical efficiency over time.
* ``workload``: workload-6 (160 jobs) on an empty cloud (0..16 nodes × 4 GPUs, 120 s delay),
  scheduling policy ``pollux``, Pollux's adaptive jobs in every arm. Arms: the goodput and the
  throughput autoscaler, and fixed clusters of 4, 8 and 16 nodes (held, and billed, from the start
  to the last completion). Reported per arm: node-hours and average JCT; which arms are on the
  cost–JCT Pareto front (no other arm at most as costly and at most as slow, one of them strictly);
  ``goodput_cheaper_than_fixed16`` = 1 − goodput / fixed-16 node-hours (target ≥ 0.20),
  ``goodput_jct_over_fixed16`` = goodput / fixed-16 average JCT (target ≤ 1.15) and
  ``goodput_on_pareto_front``. A sensitivity arm is reported apart and takes no part in the front:
  the throughput autoscaler with Or et al.'s jobs (``batch_per_gpu=True``), i.e. the whole of Or et
  al.'s system rather than their rule alone. Plot ``workload.png``: node-hours against average JCT.

* ``typed`` (not run by default: ``--typed`` adds it, ``--only typed`` runs it alone; about 13
  minutes on the 2-core VM): GPU types and prices. Sia's Philly ``workload-1`` (``--sia-data``,
  loaded as ``benchmarks/heterogeneous.py`` loads it: typed profiles, Sia's speed calibration, a 60
  GPU-second bootstrap per type) on a cloud of ``aws`` nodes (4 × T4, at most 6) and ``dgx-ext``
  nodes (8 × A100 40 GB, at most 2), 120 s provisioning delay, scheduling policy ``sia``. Arm
  ``goodput``: the goodput rule sizing each type (empty at the start). Arm ``fixed``: the whole
  cloud (6 + 2 nodes) held from the start. Prices are assumptions: AWS's public on-demand list
  prices in us-east-1 (g4dn.12xlarge $3.912/h for an ``aws`` node, p4d.24xlarge $32.77/h for a
  ``dgx-ext`` node; ``--typed-prices aws=P,dgx-ext=P`` overrides them). Reported per arm: node-hours
  and cost per type and in total, average JCT, makespan; then ``cost_saving`` = 1 − goodput / fixed
  cost and ``jct_ratio`` = goodput / fixed average JCT. No target: the section never fails the run.

The arms run one after another in this process, as the other simulator benchmarks of this
repository do on the 2-core machine; progress lines (one per arm and the engine's hourly lines) go
to stderr. ``--json`` prints one JSON object on stdout. Toy runs for the tests: ``--max-nodes``,
``--application`` (a shorter job than ImageNet), ``--workload-jobs N`` (the workload's first N jobs)
and ``--fixed`` (the fixed sizes; the largest is the reference arm, ``fixed16`` by default).

Exit status: 0 when every target of the sections run is met, 1 when one is missed, 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pollux.policy.autoscale import NodePool, make_autoscaler
from pollux.policy.registry import make_policy
from pollux.sim.engine import SimConfig, SimResult, sia_slowdown, simulate
from pollux.sim.fleet import CloudConfig, CloudFleet, TypedCloudConfig
from pollux.sim.profiles import AppProfile, load_profiles
from pollux.sim.scaling_bound import bound_at, epoch_rates, epoch_work
from pollux.sim.typed_profiles import load_typed_profiles
from pollux.sim.workload import WorkloadJob, read_workload

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO.parent / "shared" / "data" / "pollux-osdi21"
DEFAULT_PLOTS = REPO / "out" / "autoscale"
DEFAULT_WORKLOAD = "workload-6"
POLICY = "pollux"
GPUS_PER_NODE = 4
PROVISION_DELAY_S = 120.0
PRICE_PER_NODE_HOUR = 1.0
#: The thesis's figures for one ImageNet job (§3.5.4): at least 25 % fewer node-hours than Or et
#: al.'s autoscaling, finishing at most 6 % later.
ONE_JOB_TARGETS = {"node_hours_reduction": 0.25, "completion_ratio": 1.06}
#: Issue 36's figures for a whole workload against the largest fixed cluster.
WORKLOAD_TARGETS = {"goodput_cheaper": 0.20, "goodput_jct_over": 1.15}
SENSITIVITY = "throughput_batch_per_gpu"
DEFAULT_SIA_DATA = REPO.parent / "shared" / "data" / "sia-sosp23"
TYPED_WORKLOAD = "workload-1"
TYPED_POLICY = "sia"
TYPED_BOOTSTRAP_S = 60.0
#: The typed cloud's pools: GPU type → (GPUs per node, most nodes, assumed price per node-hour in USD:
#: AWS on-demand list prices, us-east-1; g4dn.12xlarge has 4 T4s, p4d.24xlarge 8 A100 40 GB).
TYPED_POOLS: dict[str, tuple[int, int, float]] = {"aws": (4, 6, 3.912), "dgx-ext": (8, 2, 32.77)}


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------
# Running one arm
# --------------------------------------------------------------------------------------------


def run_arm(workload: Sequence[WorkloadJob], profiles: dict[str, AppProfile], cloud: CloudConfig,
            rule: str, rule_options: dict[str, Any], batch_per_gpu: bool, seed: int, name: str,
            progress: Callable[[str], None] | None = None) -> tuple[SimResult, CloudFleet, float]:
    """One simulation on a fresh fleet and a fresh policy; returns its result, fleet and wall time."""
    fleet = CloudFleet(cloud, make_autoscaler(rule, **rule_options))
    config = SimConfig(seed=seed, gpus_per_node=cloud.gpus_per_node, batch_per_gpu=batch_per_gpu)
    t0 = time.perf_counter()
    result = simulate(workload, profiles, make_policy(POLICY), config, name, progress=progress, fleet=fleet)
    return result, fleet, time.perf_counter() - t0


def change_points(times: Sequence[float], values: Sequence[float | int]) -> list[list[float]]:
    """``[hours, value]`` at the first time and wherever the value changes (a step series, compactly)."""
    out: list[list[float]] = []
    for t, v in zip(times, values, strict=True):
        if not out or out[-1][1] != v:
            out.append([round(float(t) / 3600.0, 4), v])
    return out


def cloud_dict(cloud: CloudConfig) -> dict[str, Any]:
    return {"min_nodes": cloud.min_nodes, "max_nodes": cloud.max_nodes, "initial_nodes": cloud.start_nodes,
            "gpus_per_node": cloud.gpus_per_node, "provision_delay_s": cloud.provision_delay_s,
            "price_per_node_hour": cloud.price_per_node_hour}


# --------------------------------------------------------------------------------------------
# Section one_job
# --------------------------------------------------------------------------------------------

#: arm → (autoscaler, Or et al.'s jobs?)
ONE_JOB_ARMS = {"goodput": ("goodput", False), "throughput": ("throughput", True)}


def section_one_job(args: argparse.Namespace, profiles: dict[str, AppProfile]) -> dict[str, Any]:
    app = args.application
    batch = profiles[app].meta.init_batch_size
    job = WorkloadJob(f"{app}-0", 0.0, app, 1, batch)
    cloud = CloudConfig(min_nodes=1, max_nodes=args.max_nodes, gpus_per_node=GPUS_PER_NODE,
                        provision_delay_s=PROVISION_DELAY_S, price_per_node_hour=PRICE_PER_NODE_HOUR,
                        initial_nodes=1)
    started = time.perf_counter()
    arms: dict[str, dict[str, Any]] = {}
    series: dict[str, dict[str, Any]] = {}
    for arm, (rule, per_gpu) in ONE_JOB_ARMS.items():
        say(f"one_job: arm {arm} (autoscaler {rule}, batch_per_gpu={per_gpu}) ...")
        result, fleet, wall = run_arm([job], profiles, cloud, rule, {}, per_gpu, args.seed,
                                      f"one-{app}/{arm}", progress=say)
        line = result.timeline
        batches = [(t, int(b)) for t, b in zip(line["time"], line["batch_size"], strict=True) if b > 0]
        res = result.jobs[0]
        rep = fleet.report
        assert res.completion is not None        # simulate returns only once every job has finished
        arms[arm] = {
            "autoscaler": rule, "batch_per_gpu": per_gpu,
            "node_hours": rep.node_hours, "cost": rep.cost,
            "completion_h": res.completion / 3600.0, "restarts": res.restarts, "gpu_hours": res.gpu_hours,
            "peak_nodes": max(rep.held), "batch_sizes": res.batch_sizes,
            "nodes_held": change_points(rep.time, rep.held),
            "nodes_ready": change_points(rep.time, rep.ready),
            "batch": change_points([t for t, _ in batches], [b for _, b in batches]),
            "rounds": result.rounds, "wall_s": round(wall, 1),
        }
        series[arm] = {"fleet_time": rep.time, "held": rep.held, "batch": batches,
                       "time": result.timeline["time"], "efficiency": result.timeline["efficiency"],
                       "completion": res.completion}
        say(f"one_job: {arm}: {rep.node_hours:.2f} node-hours, done at {res.completion / 3600:.2f} h, "
            f"{res.restarts} restarts ({wall:.0f} s)")
    g, t = arms["goodput"], arms["throughput"]
    reduction = 1.0 - g["node_hours"] / t["node_hours"]
    ratio = g["completion_h"] / t["completion_h"]
    out: dict[str, Any] = {
        "job": {"name": job.name, "application": app, "batch_size": batch}, "policy": POLICY,
        "cloud": cloud_dict(cloud), "arms": arms,
        "node_hours_reduction": reduction, "completion_ratio": ratio,
        "targets": dict(ONE_JOB_TARGETS),
        "ok_node_hours_reduction": bool(reduction >= ONE_JOB_TARGETS["node_hours_reduction"]),
        "ok_completion_ratio": bool(ratio <= ONE_JOB_TARGETS["completion_ratio"]),
    }
    out["ok"] = out["ok_node_hours_reduction"] and out["ok_completion_ratio"]
    out["clairvoyant"] = clairvoyant_figures(profiles[app], cloud, t)
    out["plot"] = str(plot_one_job(series, out["clairvoyant"], job, args.plots)) if args.plots else None
    out["seconds"] = round(time.perf_counter() - started, 1)
    return out


def clairvoyant_figures(profile: AppProfile, cloud: CloudConfig,
                        throughput: dict[str, Any]) -> dict[str, Any]:
    """The most any autoscaler could save on this job at the completion target: the node-hours no
    schedule finishing within ``completion_ratio`` × the throughput arm's completion can go below,
    for a job that knows its true profile (:mod:`pollux.sim.scaling_bound`), against the throughput
    arm's node-hours. Below the reduction target, no rule can meet both one-job targets."""
    limit_h = ONE_JOB_TARGETS["completion_ratio"] * throughput["completion_h"]
    rates = epoch_rates(profile, cloud.max_nodes, cloud.gpus_per_node)
    bound = bound_at(rates, epoch_work(profile), limit_h * 3600.0, start_nodes=cloud.start_nodes,
                     restart_s=SimConfig().restart_delay, provision_s=cloud.provision_delay_s)
    lower = bound.node_seconds_bound / 3600.0
    reduction = 1.0 - lower / throughput["node_hours"]
    best = bound.cheapest
    return {
        "completion_limit_h": limit_h, "node_hours_lower_bound": lower,
        "max_node_hours_reduction": reduction,
        "target_reachable": bool(reduction >= ONE_JOB_TARGETS["node_hours_reduction"]),
        "cheapest_schedule": None if best is None else {
            "node_hours": best.node_seconds / 3600.0, "completion_h": best.completion_s / 3600.0,
            "nodes_from_epoch": [list(p) for p in best.change_points()],
            "nodes_over_time": [[round(t / 3600.0, 4), n] for t, n in best.change_times()]},
    }


def plot_one_job(series: dict[str, dict[str, Any]], clairvoyant: dict[str, Any], job: WorkloadJob,
                 out_dir: Path) -> Path:
    """``one_job.png``, laid out as the thesis's Fig. 3.14: (a) nodes held (solid, left axis) and the
    global batch (dashed, right axis) over time for both arms, and the nodes of the cheapest
    clairvoyant schedule within the completion target (grey); (b) the job's statistical efficiency.
    The legend sits outside the axes: the curves fill both corners of panel (a)."""
    from matplotlib.figure import Figure

    out_dir.mkdir(parents=True, exist_ok=True)
    fig = Figure(figsize=(11, 6.5), dpi=110, layout="constrained")
    ax_nodes, ax_eff = fig.subplots(2, 1, sharex=True)
    ax_batch = ax_nodes.twinx()
    colours = {"goodput": "tab:blue", "throughput": "tab:orange"}
    labels = {"goodput": "goodput rule, Pollux's jobs", "throughput": "throughput rule, Or et al.'s jobs"}
    for arm, s in series.items():
        c, lab = colours.get(arm), labels.get(arm, arm)
        end = s["completion"] / 3600.0
        ft = np.append(np.asarray(s["fleet_time"], dtype=np.float64) / 3600.0, end)
        ax_nodes.step(ft, [*s["held"], s["held"][-1]], where="post", color=c, label=f"{lab}: nodes")
        bt = np.append(np.asarray([t for t, _ in s["batch"]], dtype=np.float64) / 3600.0, end)
        bv = [b for _, b in s["batch"]]
        ax_batch.step(bt, [*bv, bv[-1]], where="post", color=c, linestyle="--", label=f"{lab}: batch")
        ax_eff.step(np.asarray(s["time"], dtype=np.float64) / 3600.0, s["efficiency"], where="post",
                    color=c)
        for ax in (ax_nodes, ax_eff):
            ax.axvline(end, color=c, linestyle=":", linewidth=1)
    best = clairvoyant["cheapest_schedule"]
    if best is not None:
        times = [t for t, _ in best["nodes_over_time"]] + [best["completion_h"]]
        nodes = [n for _, n in best["nodes_over_time"]]
        ax_nodes.step(times, [*nodes, nodes[-1]], where="post", color="grey", linestyle="-.",
                      label=f"clairvoyant, cheapest within {clairvoyant['completion_limit_h']:.2f} h: nodes")
    ax_nodes.set_ylabel(f"nodes held ({GPUS_PER_NODE} GPUs each)")
    ax_batch.set_ylabel("global batch size (dashed)")
    ax_nodes.set_title(f"(a) one {job.application} job: nodes and batch size over time "
                       "(dotted: completion)")
    ax_nodes.grid(True, alpha=0.3)
    ax_eff.set_title("(b) statistical efficiency")
    ax_eff.set_ylabel("statistical efficiency")
    ax_eff.set_xlabel("time (h)")
    ax_eff.set_ylim(0, 1.05)
    ax_eff.grid(True, alpha=0.3)
    lines, names = ax_nodes.get_legend_handles_labels()
    more, more_names = ax_batch.get_legend_handles_labels()
    fig.legend(lines + more, names + more_names, loc="outside right upper", fontsize=8)
    path = out_dir / "one_job.png"
    fig.savefig(path)
    return path


# --------------------------------------------------------------------------------------------
# Section workload
# --------------------------------------------------------------------------------------------


def pareto(points: dict[str, tuple[float, float]]) -> dict[str, list[str]]:
    """For every arm, the arms that dominate it on (cost, JCT): at most as costly and at most as
    slow, and strictly better on one of the two. An arm nothing dominates is on the Pareto front."""
    out: dict[str, list[str]] = {}
    for a, (ca, ja) in points.items():
        out[a] = [b for b, (cb, jb) in points.items()
                  if b != a and cb <= ca and jb <= ja and (cb < ca or jb < ja)]
    return out


def workload_arm_figures(result: SimResult, fleet: CloudFleet, wall: float) -> dict[str, Any]:
    jobs = result.jobs
    jcts = [j.jct for j in jobs if j.jct is not None]
    done = [j.completion for j in jobs if j.completion is not None]
    rep = fleet.report
    return {
        "node_hours": rep.node_hours, "cost": rep.cost,
        "avg_jct_h": float(np.mean(jcts)) / 3600.0 if jcts else None,
        "makespan_h": (max(done) - min(j.submit for j in jobs)) / 3600.0 if done else None,
        "last_completion_h": max(done) / 3600.0 if done else None,
        "completed": len(jcts), "jobs": len(jobs),
        "gpu_hours": float(sum(j.gpu_hours for j in jobs)),
        "restarts_per_job": float(np.mean([j.restarts for j in jobs])),
        "peak_nodes": max(rep.held) if rep.held else 0,
        "mean_nodes_held": float(np.mean(rep.held)) if rep.held else 0.0,
        "nodes_held": change_points(rep.time, rep.held),
        "rounds": result.rounds, "wall_s": round(wall, 1),
    }


def section_workload(args: argparse.Namespace, profiles: dict[str, AppProfile]) -> dict[str, Any]:
    jobs = args.jobs
    name = args.workload.stem
    auto = CloudConfig(min_nodes=0, max_nodes=args.max_nodes, gpus_per_node=GPUS_PER_NODE,
                       provision_delay_s=PROVISION_DELAY_S, price_per_node_hour=PRICE_PER_NODE_HOUR,
                       initial_nodes=0)

    def fixed(n: int) -> CloudConfig:
        return CloudConfig(min_nodes=n, max_nodes=n, gpus_per_node=GPUS_PER_NODE,
                           provision_delay_s=PROVISION_DELAY_S, price_per_node_hour=PRICE_PER_NODE_HOUR,
                           initial_nodes=n)

    # arm → (cloud, autoscaler, its options, Or et al.'s jobs?)
    plan: dict[str, tuple[CloudConfig, str, dict[str, Any], bool]] = {
        "goodput": (auto, "goodput", {}, False),
        "throughput": (auto, "throughput", {}, False),
    }
    for n in args.fixed:
        plan[f"fixed{n}"] = (fixed(n), "fixed", {"nodes": n}, False)
    plan[SENSITIVITY] = (auto, "throughput", {}, True)
    reference = f"fixed{max(args.fixed)}"

    started = time.perf_counter()
    figures: dict[str, dict[str, Any]] = {}
    for i, (arm, (cloud, rule, options, per_gpu)) in enumerate(plan.items(), start=1):
        label = " (sensitivity arm)" if arm == SENSITIVITY else ""
        say(f"workload: arm {i}/{len(plan)} {arm}{label}: {len(jobs)} jobs of {name}, autoscaler {rule}, "
            f"{cloud.min_nodes}..{cloud.max_nodes} nodes, batch_per_gpu={per_gpu} ...")
        result, fleet, wall = run_arm(jobs, profiles, cloud, rule, options, per_gpu, args.seed,
                                      f"{name}/{arm}", progress=say)
        figures[arm] = {"autoscaler": rule, "batch_per_gpu": per_gpu, "cloud": cloud_dict(cloud),
                        **workload_arm_figures(result, fleet, wall)}
        f = figures[arm]
        say(f"workload: {arm}: {f['node_hours']:.1f} node-hours, average JCT {f['avg_jct_h']:.3f} h "
            f"({wall:.0f} s)")

    sensitivity = figures.pop(SENSITIVITY)
    points = {a: (f["node_hours"], f["avg_jct_h"]) for a, f in figures.items()}
    dominated = pareto(points)
    for arm, f in figures.items():
        f["dominated_by"] = dominated[arm]
        f["on_pareto_front"] = not dominated[arm]
    # The sensitivity arm is set against the main arms for information; it changes no main arm's flag.
    s_point = (sensitivity["node_hours"], sensitivity["avg_jct_h"])
    sensitivity["dominated_by"] = pareto({**points, SENSITIVITY: s_point})[SENSITIVITY]
    sensitivity["label"] = ("sensitivity arm: the throughput autoscaler with Or et al.'s jobs "
                            "(batch_per_gpu=True); not part of the Pareto front")
    g, ref = figures["goodput"], figures[reference]
    cheaper = 1.0 - g["node_hours"] / ref["node_hours"]
    jct_over = g["avg_jct_h"] / ref["avg_jct_h"]
    out: dict[str, Any] = {
        "workload": name, "jobs": len(jobs), "policy": POLICY, "arms": figures,
        "pareto_front": [a for a, f in figures.items() if f["on_pareto_front"]],
        "sensitivity": {SENSITIVITY: sensitivity},
        "reference_arm": reference,
        f"goodput_cheaper_than_{reference}": cheaper,
        f"goodput_jct_over_{reference}": jct_over,
        "goodput_on_pareto_front": g["on_pareto_front"],
        "targets": {f"goodput_cheaper_than_{reference}": WORKLOAD_TARGETS["goodput_cheaper"],
                    f"goodput_jct_over_{reference}": WORKLOAD_TARGETS["goodput_jct_over"],
                    "goodput_on_pareto_front": True},
        "ok_cheaper": bool(cheaper >= WORKLOAD_TARGETS["goodput_cheaper"]),
        "ok_jct": bool(jct_over <= WORKLOAD_TARGETS["goodput_jct_over"]),
        "ok_pareto": bool(g["on_pareto_front"]),
    }
    out["ok"] = out["ok_cheaper"] and out["ok_jct"] and out["ok_pareto"]
    out["plot"] = (str(plot_workload(figures, sensitivity, name, len(jobs), args.plots))
                   if args.plots else None)
    out["seconds"] = round(time.perf_counter() - started, 1)
    return out


def plot_workload(figures: dict[str, dict[str, Any]], sensitivity: dict[str, Any], name: str, jobs: int,
                  out_dir: Path) -> Path:
    """``workload.png``: node-hours against average JCT, one marker per arm named in the legend (arms
    may land on top of each other, which text labels would hide); the Pareto front joined by a dashed
    line, the sensitivity arm hollow."""
    from matplotlib.figure import Figure

    out_dir.mkdir(parents=True, exist_ok=True)
    fig = Figure(figsize=(10, 5.5), dpi=110, layout="constrained")
    ax = fig.add_subplot()
    markers = iter("osv^<>phH*")
    others = iter(["dimgrey", "tab:brown", "tab:purple", "black", "tab:olive", "tab:cyan", "tab:pink"])
    for arm, f in figures.items():
        colour = {"goodput": "tab:blue", "throughput": "tab:orange"}.get(arm) or next(others, "grey")
        where = "on the front" if f["on_pareto_front"] else f"dominated by {', '.join(f['dominated_by'])}"
        ax.scatter([f["node_hours"]], [f["avg_jct_h"]], marker=next(markers, "o"), s=60, zorder=3,
                   color=colour, alpha=0.85,
                   label=f"{arm}: {f['node_hours']:.1f} node-h, {f['avg_jct_h']:.2f} h ({where})")
    front = sorted((f["node_hours"], f["avg_jct_h"]) for f in figures.values() if f["on_pareto_front"])
    if len(front) > 1:
        ax.plot([p[0] for p in front], [p[1] for p in front], color="tab:green", linewidth=1,
                linestyle="--", label="Pareto front", zorder=2)
    ax.scatter([sensitivity["node_hours"]], [sensitivity["avg_jct_h"]], marker="D", s=60,
               facecolors="none", edgecolors="tab:red", zorder=3,
               label=f"sensitivity: throughput rule with Or et al.'s jobs: {sensitivity['node_hours']:.1f} "
                     f"node-h, {sensitivity['avg_jct_h']:.2f} h")
    ax.set_xlabel("node-hours (cost at 1 per node-hour)")
    ax.set_ylabel("average JCT (h)")
    ax.set_title(f"{name} ({jobs} jobs), policy {POLICY}: cost against JCT")
    ax.grid(True, alpha=0.3)
    fig.legend(loc="outside lower center", fontsize=8, ncols=1)
    path = out_dir / "workload.png"
    fig.savefig(path)
    return path


# --------------------------------------------------------------------------------------------
# Section typed: GPU types and prices
# --------------------------------------------------------------------------------------------


def typed_pools(prices: dict[str, float], *, fixed: bool) -> tuple[NodePool, ...]:
    """The typed cloud: empty and free to grow (``fixed=False``), or every node held from the start."""
    pools = []
    for gpu_type, (gpus, most, _) in TYPED_POOLS.items():
        low = most if fixed else 0
        pools.append(NodePool(gpu_type, gpus, min_nodes=low, max_nodes=most,
                              price_per_node_hour=prices[gpu_type], initial_nodes=low))
    return tuple(pools)


def typed_arm_figures(result: SimResult, fleet: CloudFleet, wall: float) -> dict[str, Any]:
    jobs = result.jobs
    jcts = [j.jct for j in jobs if j.jct is not None]
    done = [j.completion for j in jobs if j.completion is not None]
    rep = fleet.report
    types = list(rep.type_node_seconds)
    return {
        "node_hours": rep.node_hours, "cost": rep.cost,
        "node_hours_by_type": rep.type_node_hours, "cost_by_type": rep.type_cost,
        "avg_jct_h": float(np.mean(jcts)) / 3600.0 if jcts else None,
        "makespan_h": (max(done) - min(j.submit for j in jobs)) / 3600.0 if done else None,
        "completed": len(jcts), "jobs": len(jobs),
        "gpu_hours": float(sum(j.gpu_hours for j in jobs)),
        "restarts_per_job": float(np.mean([j.restarts for j in jobs])),
        "mean_nodes_held_by_type": {t: float(np.mean([h[t] for h in rep.held_by_type])) if rep.held_by_type
                                    else 0.0 for t in types},
        "nodes_held_by_type": {t: change_points(rep.time, [h[t] for h in rep.held_by_type]) for t in types},
        "rounds": result.rounds, "wall_s": round(wall, 1),
    }


def section_typed(args: argparse.Namespace, profiles: dict[str, AppProfile]) -> dict[str, Any]:
    """GPU types and prices: the goodput rule per type against the whole typed cloud (see the module
    docstring). ``profiles`` (Pollux's traces) are not used: Sia's data brings its own."""
    traces = args.sia_data / "traces"
    types = tuple(TYPED_POOLS)
    typed = load_typed_profiles(traces, types)
    try:
        untyped = load_profiles(traces)
    except FileNotFoundError:
        untyped = {}
    known = set(untyped) | set(typed)
    workload = args.sia_data / "workloads" / "philly" / f"{TYPED_WORKLOAD}.csv"
    jobs = read_workload(workload, applications=known)[:args.typed_jobs]
    config = SimConfig(interval=60.0, seed=args.seed, slowdown=sia_slowdown(sorted(typed)),
                       bootstrap_s=TYPED_BOOTSTRAP_S)
    plan = {"goodput": (typed_pools(args.typed_prices, fixed=False), "goodput", {}),
            "fixed": (typed_pools(args.typed_prices, fixed=True), "fixed",
                      {"nodes": sum(most for _, most, _ in TYPED_POOLS.values())})}
    started = time.perf_counter()
    arms: dict[str, dict[str, Any]] = {}
    for arm, (pools, rule, options) in plan.items():
        cloud = TypedCloudConfig(pools, provision_delay_s=PROVISION_DELAY_S)
        say(f"typed: arm {arm}: {len(jobs)} jobs of {TYPED_WORKLOAD}, autoscaler {rule}, "
            + ", ".join(f"{p.gpu_type} {p.min_nodes}..{p.max_nodes} x {p.gpus_per_node} GPUs at "
                        f"${p.price_per_node_hour}/h" for p in pools) + " ...")
        fleet = CloudFleet(cloud, make_autoscaler(rule, **options))
        t0 = time.perf_counter()
        result = simulate(jobs, untyped, make_policy(TYPED_POLICY), config, f"{TYPED_WORKLOAD}/{arm}",
                          progress=say, typed_profiles=typed, fleet=fleet)
        wall = time.perf_counter() - t0
        arms[arm] = {"autoscaler": rule,
                     "pools": [{"gpu_type": p.gpu_type, "gpus_per_node": p.gpus_per_node,
                                "min_nodes": p.min_nodes, "max_nodes": p.max_nodes,
                                "price_per_node_hour": p.price_per_node_hour} for p in pools],
                     **typed_arm_figures(result, fleet, wall)}
        f = arms[arm]
        say(f"typed: {arm}: ${f['cost']:.2f}, {f['node_hours']:.1f} node-hours, average JCT "
            f"{f['avg_jct_h']:.3f} h ({wall:.0f} s)")
    g, fixed = arms["goodput"], arms["fixed"]
    return {
        "workload": TYPED_WORKLOAD, "jobs": len(jobs), "policy": TYPED_POLICY,
        "provision_delay_s": PROVISION_DELAY_S, "bootstrap_s": TYPED_BOOTSTRAP_S,
        "prices": dict(args.typed_prices),
        "prices_note": "assumed: AWS on-demand list prices, us-east-1 (g4dn.12xlarge for aws, "
                       "p4d.24xlarge for dgx-ext)",
        "arms": arms,
        "cost_saving": 1.0 - g["cost"] / fixed["cost"] if fixed["cost"] > 0 else None,
        "node_hours_saving": 1.0 - g["node_hours"] / fixed["node_hours"] if fixed["node_hours"] > 0 else None,
        "jct_ratio": (g["avg_jct_h"] / fixed["avg_jct_h"]
                      if g["avg_jct_h"] is not None and fixed["avg_jct_h"] else None),
        "ok": True,                  # no target: the figures are reported as measured
        "seconds": round(time.perf_counter() - started, 1),
    }


# --------------------------------------------------------------------------------------------

SECTIONS: dict[str, Callable[[argparse.Namespace, dict[str, AppProfile]], dict[str, Any]]] = {
    "one_job": section_one_job,
    "workload": section_workload,
    "typed": section_typed,
}
#: The sections a run without ``--only`` runs (``--typed`` adds ``typed``: it takes minutes).
DEFAULT_SECTIONS = ("one_job", "workload")


def parse_prices(text: str) -> dict[str, float]:
    """``--typed-prices aws=3.912,dgx-ext=32.77`` → the price per node-hour of each type (types not
    named keep their default); ValueError naming the entry for a bad one."""
    prices = {t: price for t, (_, _, price) in TYPED_POOLS.items()}
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        gpu_type, sep, value = entry.partition("=")
        if not sep or gpu_type not in TYPED_POOLS:
            raise ValueError(f"{entry!r}: expected TYPE=PRICE with TYPE one of {', '.join(TYPED_POOLS)}")
        try:
            price = float(value)
        except ValueError:
            raise ValueError(f"{entry!r}: the price is not a number") from None
        if not (np.isfinite(price) and price >= 0):
            raise ValueError(f"{entry!r}: the price must be >= 0")
        prices[gpu_type] = price
    return prices


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    parser.add_argument("--only", choices=list(SECTIONS), action="append",
                        help="run only this section (repeatable; default: all)")
    parser.add_argument("--plots", type=Path, default=DEFAULT_PLOTS, metavar="DIR",
                        help=f"write one_job.png and workload.png here "
                             f"(default {DEFAULT_PLOTS.relative_to(REPO)})")
    parser.add_argument("--no-plots", action="store_true", help="write no plots")
    parser.add_argument("--seed", type=int, default=0, help="the simulations' seed (default 0)")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA,
                        help="the pollux-osdi21 data folder (traces/, workloads/)")
    parser.add_argument("--workload", type=Path, default=None,
                        help=f"workload CSV (default DATA/workloads/{DEFAULT_WORKLOAD}.csv)")
    parser.add_argument("--workload-jobs", type=int, default=None, metavar="N",
                        help="workload: only its first N jobs by submission (a toy run)")
    parser.add_argument("--max-nodes", type=int, default=16,
                        help="largest cloud of both sections, in nodes of 4 GPUs (default 16)")
    parser.add_argument("--fixed", default="4,8,16",
                        help="workload: sizes of the fixed clusters, in nodes (default 4,8,16; the largest "
                             "is the reference of the targets)")
    parser.add_argument("--typed", action="store_true",
                        help="also run the typed section (GPU types and prices; minutes)")
    parser.add_argument("--sia-data", type=Path, default=DEFAULT_SIA_DATA,
                        help="typed: the sia-sosp23 data folder (traces/, workloads/philly/)")
    parser.add_argument("--typed-jobs", type=int, default=None, metavar="N",
                        help=f"typed: only the first N jobs of {TYPED_WORKLOAD} (a toy run)")
    parser.add_argument("--typed-prices", default="",
                        help="typed: price per node-hour by type, e.g. aws=3.912,dgx-ext=32.77 (default: "
                             "AWS on-demand list prices, us-east-1)")
    parser.add_argument("--application", default="imagenet",
                        help="one_job: the job's application (default imagenet; its batch is the "
                             "application's initial batch)")
    args = parser.parse_args(argv)
    args.plots = None if args.no_plots else args.plots
    args.sections = args.only or [*DEFAULT_SECTIONS, *(["typed"] if args.typed else [])]
    try:
        args.typed_prices = parse_prices(args.typed_prices)
    except ValueError as e:
        parser.error(f"--typed-prices: {e}")
    if args.typed_jobs is not None and args.typed_jobs < 1:
        parser.error(f"--typed-jobs: must be at least 1, got {args.typed_jobs}")
    if "typed" in args.sections and not (args.sia_data / "workloads" / "philly").is_dir():
        parser.error(f"--sia-data {args.sia_data}: no workloads/philly/ folder")
    traces = args.data / "traces"
    if not traces.is_dir():
        parser.error(f"--data {args.data}: no traces/ folder")
    if args.workload is None:
        args.workload = args.data / "workloads" / f"{DEFAULT_WORKLOAD}.csv"
    if not args.workload.is_file():
        parser.error(f"--workload {args.workload}: no such file")
    if args.max_nodes < 1:
        parser.error(f"--max-nodes: must be at least 1, got {args.max_nodes}")
    if args.workload_jobs is not None and args.workload_jobs < 1:
        parser.error(f"--workload-jobs: must be at least 1, got {args.workload_jobs}")
    try:
        args.fixed = sorted({int(x) for x in args.fixed.split(",") if x.strip()})
    except ValueError:
        parser.error(f"--fixed {args.fixed!r}: expected comma-separated node counts")
    if not args.fixed or min(args.fixed) < 1:
        parser.error(f"--fixed: expected node counts of at least 1, got {args.fixed}")
    known = sorted(p.name for p in traces.iterdir() if p.is_dir())
    if args.application not in known:
        parser.error(f"--application {args.application!r}: no profile under {traces} "
                     f"(one of {', '.join(known)})")
    try:
        args.jobs = read_workload(args.workload, applications=known)[:args.workload_jobs]
    except ValueError as e:
        parser.error(f"--workload: {e}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    profiles = load_profiles(args.data / "traces")
    result: dict[str, Any] = {
        "benchmark": "autoscale", "seed": args.seed, "policy": POLICY,
        "data": str(args.data), "workload_file": str(args.workload),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "numpy": np.__version__},
    }
    sections = args.sections
    for name in sections:
        result[name] = SECTIONS[name](args, profiles)
    result["ok"] = all(result[name]["ok"] for name in sections)
    result["seconds"] = round(time.perf_counter() - started, 1)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print_summary(result, sections)
    return 0 if result["ok"] else 1


def print_summary(result: dict[str, Any], sections: Sequence[str]) -> None:
    if "one_job" in sections:
        s = result["one_job"]
        print(f"== one_job ({s['job']['name']}, {s['seconds']} s)")
        for arm, f in s["arms"].items():
            print(f"  {arm:10s} node-hours {f['node_hours']:7.2f}  completion {f['completion_h']:6.2f} h  "
                  f"restarts {f['restarts']}  peak nodes {f['peak_nodes']}")
        for key, sign, ok in (("node_hours_reduction", ">=", s["ok_node_hours_reduction"]),
                              ("completion_ratio", "<=", s["ok_completion_ratio"])):
            print(f"  {key:20s} {s[key]:.3f} (target {sign} {s['targets'][key]}): "
                  f"{'ok' if ok else 'MISSED'}")
        c = s["clairvoyant"]
        print(f"  clairvoyant bound: within {c['completion_limit_h']:.2f} h no schedule uses fewer than "
              f"{c['node_hours_lower_bound']:.2f} node-hours: a reduction of at most "
              f"{c['max_node_hours_reduction']:.3f}")
    if "workload" in sections:
        s = result["workload"]
        ref = s["reference_arm"]
        print(f"== workload ({s['workload']}, {s['jobs']} jobs, {s['seconds']} s)")
        rows = {**s["arms"], **{f"{k} (sensitivity)": v for k, v in s["sensitivity"].items()}}
        for arm, f in rows.items():
            front = "front" if f.get("on_pareto_front") else f"dominated by {','.join(f['dominated_by'])}"
            print(f"  {arm:36s} node-hours {f['node_hours']:8.1f}  avg JCT {f['avg_jct_h']:6.3f} h  {front}")
        for key, sign, ok in ((f"goodput_cheaper_than_{ref}", ">=", s["ok_cheaper"]),
                              (f"goodput_jct_over_{ref}", "<=", s["ok_jct"])):
            print(f"  {key} {s[key]:.3f} (target {sign} {s['targets'][key]}): {'ok' if ok else 'MISSED'}")
        print(f"  goodput_on_pareto_front {s['goodput_on_pareto_front']}")
    if "typed" in sections:
        s = result["typed"]
        print(f"== typed ({s['workload']}, {s['jobs']} jobs, policy {s['policy']}, {s['seconds']} s)")
        for arm, f in s["arms"].items():
            per_type = "  ".join(f"{t} {h:.1f} node-h ${f['cost_by_type'][t]:.2f}"
                                 for t, h in f["node_hours_by_type"].items())
            print(f"  {arm:8s} ${f['cost']:8.2f}  node-hours {f['node_hours']:7.1f}  ({per_type})  "
                  f"avg JCT {f['avg_jct_h']:.3f} h  makespan {f['makespan_h']:.2f} h")
        print(f"  cost_saving {s['cost_saving']:.3f}  jct_ratio {s['jct_ratio']:.3f} (no target)")


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Regenerate the simulator's built-in default profiles and demo workload from the shared measurements.

Usage: benchmarks/make_default_profiles.py --data ../shared/data/pollux-osdi21/traces

Writes ``src/pollux/sim/default_profiles/<app>/`` (placements.csv, scalability.csv, validation-<B>.csv
and a README.md) and ``src/pollux/sim/default_workload.csv``. No measured file is copied; every value is
synthesised:

* Throughput: the seven-parameter model of SPEC §3 is fitted (``pollux.goodput.fit_throughput``) to all
  placement and scalability rows of the application (optimiser-step time ``step_time`` and
  accumulation-step time ``step_time − sync_time``). For every measured placement and every measured
  (nodes, replicas) scalability key, the files hold the model's prediction at ``LBS_PER_KEY`` local batch
  sizes spanning that key's measured range (both ends kept, interior points evenly spaced in the sorted
  measured sizes): ``step_time = T_iter`` (no accumulation), ``sync_time = T_iter − T_grad``, rounded to
  ``DIGITS`` significant digits.
* Validation: every epoch row of every measured batch size is kept (the metadata's epoch counts stay
  right). ``metric``, ``grad_sqr`` and ``grad_var`` are smoothed by a centred running median of three
  epochs (first and last rows kept; a median of three leaves monotone stretches untouched and removes
  one-epoch spikes); ``progress`` and ``iteration`` (cumulative counters) are only rounded. All values
  are rounded to ``DIGITS`` significant digits (iterations to integers), with more digits where rounding
  would make progress non-increasing.
* Demo workload: :func:`pollux.sim.workload_gen.generate_workload` on ``<data>/philly.csv`` with the new
  default profiles (160 jobs), then trimmed by :func:`demo_workload`: drop imagenet jobs (days long),
  keep at most ``DEMO_MAX_YOLOV3`` yolov3 jobs (the earliest), keep the first ``DEMO_JOBS`` remaining
  jobs by submission time and renumber them ``<app>-<k>``. The seed is the smallest one ≥ 0 whose
  trimmed workload holds every application of ``DEMO_APPS`` (so the demo shows a mix).

The measurements are the Pollux OSDI'21 artifact's (AdaptDL, Apache-2.0, Copyright Petuum, Inc.).
"""

from __future__ import annotations

import argparse
import csv
import itertools
import math
import shutil
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np

from pollux.goodput import fit_throughput, t_grad, t_iter
from pollux.sim.profiles import AppProfile, load_profiles, placement_key
from pollux.sim.workload import WorkloadJob, write_workload
from pollux.sim.workload_gen import generate_workload, read_trace

APPLICATIONS = ("bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3")
LBS_PER_KEY = 5
DIGITS = 4
DEMO_APPS = ("bert", "cifar10", "deepspeech2", "ncf", "yolov3")
DEMO_JOBS = 28
DEMO_MAX_YOLOV3 = 2
DEMO_EXCLUDE = ("imagenet",)
ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "src/pollux/sim/default_profiles"
WORKLOAD_OUT = ROOT / "src/pollux/sim/default_workload.csv"


def sig(x: float, digits: int = DIGITS) -> str:
    """``x`` rounded to ``digits`` significant digits, as short text."""
    return format(float(x), f".{digits}g")


def grid(values: list[float], k: int = LBS_PER_KEY) -> list[float]:
    """At most ``k`` of the sorted distinct ``values``: both ends and evenly spaced interior ones."""
    vals = sorted(set(values))
    if len(vals) <= k:
        return vals
    idx = sorted({round(float(i)) for i in np.linspace(0, len(vals) - 1, k)})
    return [vals[i] for i in idx]


def read_rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8-sig") as fh:
        return list(csv.DictReader(fh))


def lbs_text(m: float) -> str:
    return str(int(m)) if float(m).is_integer() else sig(m, 6)


# --------------------------------------------------------------------------------------------------
# Throughput


def synth_throughput(app_dir: Path, profile: AppProfile, out_dir: Path) -> dict[str, object]:
    nodes, replicas, lbs, step, sync = profile.throughput_rows()
    fit = fit_throughput(nodes, replicas, lbs, step, step - sync)
    if not fit.ok:
        raise SystemExit(f"{profile.name}: throughput fit failed: {fit.message}")
    params = fit.params
    err = np.log(t_iter(params, nodes, replicas, lbs) / step)

    def predict(n: int, r: int, m: float) -> tuple[str, str]:
        st = float(t_iter(params, n, r, m))
        sy = max(st - float(t_grad(params, m)), 0.0)
        return sig(st), sig(sy)

    by_placement: dict[str, list[float]] = {}
    for row in read_rows(app_dir / "placements.csv"):
        by_placement.setdefault(placement_key(row["placement"].strip()), []).append(float(row["local_bsz"]))
    keys = sorted(by_placement, key=lambda k: (len(k), sum(map(int, k)), k))
    p_rows = []
    for key in keys:
        n, r = len(key), sum(map(int, key))
        for m in grid(by_placement[key]):
            p_rows.append([key, lbs_text(m), *predict(n, r, m)])
    with (out_dir / "placements.csv").open("w", newline="") as fh:
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(["placement", "local_bsz", "step_time", "sync_time"])
        w.writerows(p_rows)

    by_shape: dict[tuple[int, int], list[float]] = {}
    for row in read_rows(app_dir / "scalability.csv"):
        shape = (int(float(row["num_nodes"])), int(float(row["num_replicas"])))
        by_shape.setdefault(shape, []).append(float(row["local_bsz"]))
    s_rows = []
    for n, r in sorted(by_shape):
        for m in grid(by_shape[(n, r)]):
            s_rows.append([n, r, lbs_text(m), *predict(n, r, m)])
    with (out_dir / "scalability.csv").open("w", newline="") as fh:
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(["num_nodes", "num_replicas", "local_bsz", "step_time", "sync_time"])
        w.writerows(s_rows)
    return {"params": params, "rmsle": float(np.sqrt(np.mean(err * err))), "rows": int(step.size),
            "placement_rows": len(p_rows), "scalability_rows": len(s_rows)}


# --------------------------------------------------------------------------------------------------
# Validation


def median3(values: np.ndarray) -> np.ndarray:
    """Centred running median of three; the first and last values are kept."""
    out = values.copy()
    if values.size >= 3:
        out[1:-1] = np.median(np.stack([values[:-2], values[1:-1], values[2:]]), axis=0)
    return out


def rounded_increasing(values: np.ndarray) -> list[str]:
    """``values`` (strictly increasing) to DIGITS significant digits, more where needed to stay so."""
    for digits in range(DIGITS, 18):
        text = [sig(v, digits) for v in values]
        nums = [float(t) for t in text]
        if all(b > a for a, b in itertools.pairwise(nums)):
            return text
    return [repr(float(v)) for v in values]


def synth_validation(app_dir: Path, out_dir: Path) -> int:
    files = sorted(app_dir.glob("validation-*.csv"))
    for path in files:
        rows = read_rows(path)
        col = {c: np.array([float(r[c]) for r in rows]) for c in
               ("progress", "iteration", "metric", "grad_sqr", "grad_var")}
        progress = rounded_increasing(col["progress"])
        iteration = [str(int(float(sig(v)))) for v in col["iteration"]]
        smoothed = {c: [sig(v) for v in median3(col[c])] for c in ("metric", "grad_sqr", "grad_var")}
        with (out_dir / path.name).open("w", newline="") as fh:
            w = csv.writer(fh, lineterminator="\n")
            w.writerow(["progress", "iteration", "metric", "grad_sqr", "grad_var"])
            for i in range(len(rows)):
                w.writerow([progress[i], iteration[i], smoothed["metric"][i], smoothed["grad_sqr"][i],
                            smoothed["grad_var"][i]])
    return len(files)


# --------------------------------------------------------------------------------------------------
# Demo workload


def demo_workload(jobs: list[WorkloadJob], size: int = DEMO_JOBS, max_yolov3: int = DEMO_MAX_YOLOV3,
                  exclude: tuple[str, ...] = DEMO_EXCLUDE) -> list[WorkloadJob]:
    """Drop ``exclude`` applications, keep the earliest ``max_yolov3`` yolov3 jobs, keep the first
    ``size`` jobs by submission time, renumber ``<app>-<k>``."""
    kept: list[WorkloadJob] = []
    yolo = 0
    for job in sorted(jobs, key=lambda j: (j.submit_time, j.name)):
        if job.application in exclude:
            continue
        if job.application == "yolov3":
            if yolo >= max_yolov3:
                continue
            yolo += 1
        kept.append(job)
        if len(kept) == size:
            break
    return [replace(j, name=f"{j.application}-{k}") for k, j in enumerate(kept)]


# --------------------------------------------------------------------------------------------------
# README


def pick_demo(trace: Path, profiles: dict[str, AppProfile], max_seed: int = 1000
              ) -> tuple[int, list[WorkloadJob]]:
    """(seed, demo workload) for the smallest seed whose trimmed workload holds every DEMO_APPS app."""
    rows = read_trace(trace)
    for seed in range(max_seed):
        demo = demo_workload(generate_workload(rows, profiles, num_jobs=160, seed=seed))
        if set(DEMO_APPS) <= {j.application for j in demo}:
            return seed, demo
    raise SystemExit(f"no seed below {max_seed} gives a demo workload with {', '.join(DEMO_APPS)}")


def readme(stats: dict[str, dict[str, object]], demo: list[WorkloadJob], seed: int) -> str:
    lines = [
        "# Built-in default application profiles",
        "",
        "Small synthetic profiles, in the Pollux OSDI'21 artifact format (SPEC §7), that let "
        "`pollux simulate` run with no external data. They are **synthesised from models fitted to the "
        "measurements of the Pollux OSDI'21 artifact** (published with AdaptDL under the Apache License "
        "2.0, Copyright Petuum, Inc.; measured on 16 AWS g4dn.12xlarge nodes of 4 NVIDIA T4 GPUs); no "
        "measured file is copied here. The application constants (M0, batch limits, epochs) are those of "
        "`../applications.json`.",
        "",
        "What differs from the measurements:",
        "",
        f"* `placements.csv`, `scalability.csv`: the throughput model of SPEC §3 "
        f"(`pollux.goodput.fit_throughput`) is fitted to all measured rows of the application "
        f"(optimiser-step time and accumulation-step time = step − sync). Every measured placement and "
        f"every measured (nodes, replicas) key is kept, with at most {LBS_PER_KEY} local batch sizes "
        f"spanning its measured range (both ends kept): `step_time` is the model's optimiser-step time "
        f"T_iter and `sync_time` = T_iter − T_grad, rounded to {DIGITS} significant digits. Placements "
        "with the same number of nodes and GPUs therefore have the same times, and single-GPU rows have "
        "`sync_time` 0.",
        f"* `validation-<B>.csv`: every measured batch size and every epoch row is kept. `metric`, "
        f"`grad_sqr` and `grad_var` are smoothed by a centred running median of three epochs (first and "
        f"last rows unchanged: monotone stretches are kept, one-epoch spikes removed); `progress` and "
        f"`iteration` are only rounded. Values have {DIGITS} significant digits (iterations are "
        "integers; progress gets more digits only where rounding would break its increase).",
        "",
        "Fit per application (RMSLE of the fitted optimiser-step time against the measured rows):",
        "",
        "| app | measured rows | RMSLE | placement rows | scalability rows | α_grad | β_grad | α_local "
        "| β_local | α_node | β_node | γ |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for app, s in stats.items():
        p = s["params"]
        lines.append(
            f"| {app} | {s['rows']} | {s['rmsle']:.3f} | {s['placement_rows']} | {s['scalability_rows']} | "
            + " | ".join(sig(v, 3) for v in p.as_array()) + " |")
    apps = Counter(j.application for j in demo)
    lines += [
        "",
        "## The demo workload (`../default_workload.csv`)",
        "",
        f"{len(demo)} jobs submitted over {demo[-1].submit_time / 3600:.2f} h "
        f"({', '.join(f'{a} {n}' for a, n in sorted(apps.items()))}): "
        f"`pollux.sim.workload_gen.generate_workload` on the artifact's `philly.csv` with these profiles "
        f"(160 jobs, seed {seed}), then: imagenet jobs dropped, at most {DEMO_MAX_YOLOV3} yolov3 "
        f"jobs kept (the earliest), the first {DEMO_JOBS} remaining jobs by submission time kept and "
        f"renumbered `<app>-<k>`. Seed {seed} is the smallest whose trimmed workload holds each of "
        f"{', '.join(DEMO_APPS)}.",
        "",
        "## Regenerating",
        "",
        "```",
        "benchmarks/make_default_profiles.py --data ../shared/data/pollux-osdi21/traces",
        "```",
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True,
                        help="the artifact's traces folder (holds <app>/ and philly.csv)")
    parser.add_argument("--out", type=Path, default=OUT, help=f"profile folder (default {OUT})")
    parser.add_argument("--workload-out", type=Path, default=WORKLOAD_OUT,
                        help=f"demo workload file (default {WORKLOAD_OUT})")
    args = parser.parse_args()
    real = load_profiles(args.data, apps=APPLICATIONS)
    stats = {}
    for app in APPLICATIONS:
        out_dir = args.out / app
        if out_dir.exists():
            shutil.rmtree(out_dir)                 # only the folders this script writes
        out_dir.mkdir(parents=True)
        stats[app] = synth_throughput(args.data / app, real[app], out_dir)
        files = synth_validation(args.data / app, out_dir)
        print(f"{app}: fit RMSLE {stats[app]['rmsle']:.3f}, {stats[app]['placement_rows']} placement + "
              f"{stats[app]['scalability_rows']} scalability rows, {files} validation files", file=sys.stderr)
    synth = load_profiles(args.out)
    for app in APPLICATIONS:
        if synth[app].meta.epochs != len(synth[app].epoch_ends):
            raise SystemExit(f"{app}: epoch count mismatch")
    seed, demo = pick_demo(args.data / "philly.csv", synth)
    args.workload_out.parent.mkdir(parents=True, exist_ok=True)
    write_workload(args.workload_out, demo)
    (args.out / "README.md").write_text(readme(stats, demo, seed))
    size = sum(p.stat().st_size for p in args.out.rglob("*") if p.is_file())
    print(f"wrote {args.out} ({size / 1024:.0f} KiB) and {args.workload_out} ({len(demo)} jobs over "
          f"{demo[-1].submit_time / 3600:.2f} h, seed {seed})", file=sys.stderr)
    if not math.isfinite(size) or size > 300 * 1024:
        raise SystemExit(f"{args.out}: {size} bytes, over the 300 KB budget")
    return 0


if __name__ == "__main__":
    sys.exit(main())

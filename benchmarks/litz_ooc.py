#!/usr/bin/env python3
"""Out-of-core Litz (thesis §4.8, issue 39): mini-batch K-means under a memory budget.

Usage:
    benchmarks/litz_ooc.py [--json] [--quick] [--cpus 2] [--repeats 3] [--size KEY=N ...]

Starts an embedded Ray (``ray.init(num_cpus=--cpus)`` on 127.0.0.1), runs mini-batch K-means
(`pollux.litz.apps.kmeans`) on one worker three ways with the same seed, and prints one JSON object
(``--json``; progress goes to stderr):

- `in_memory`: no budget;
- `litz`: a per-worker budget of half the executors' bytes (their state is 2 × the budget), the
  thesis's policy: evict executors with no task queued first (most recently used first), then the
  one whose next task is furthest; load ahead the next queued executor that is missing;
- `lru` (the baseline): the same budget, the same spill files and I/O code, evicting the least
  recently used executor and loading on demand only — what a system that ignores the job's
  structure does.

Each configuration runs `--repeats` times, taking turns; its time is the median. A run's time is
"seconds of work": from the driver's report after the first iteration to its last report (the start
of the actors and the first placement of the executors, the same in every run, are left out). The
final centres of every run are compared bit for bit with the in-memory run's (one worker at
staleness 0 sums the updates in one order, so they must be identical).

Memory: `peak_accounted_bytes` is the largest sum of the resident executors' serialised bytes the
worker accounted (`RunSummary.ooc_peak_bytes`: what the budget bounds, and what the target is
checked on). The worker process's real memory is reported beside it: `worker_rss_steady_peak_mb`,
the largest VmRSS sampled every 10 ms from the first iteration's report to the last (the steady
part of the run), and `worker_rss_peak_mb`, VmHWM (the whole life of the process, with the
generation of every partition at the start), each beside an empty run's (executors of one
mini-batch: the process's own baseline); `rss_steady_above_empty_mb` is the difference. The I/O
goes to the local disk's page cache (the spill folder is under /tmp): on this VM
a read is a memory copy, not a disk access.

Targets (issue 39): identical results; litz within 2 × in-memory time (`vs_in_memory`); litz ≥ 3 ×
faster than lru (`speedup_vs_baseline`); peak accounted bytes ≤ budget + 10 %.

`speedup_ceiling`: the most any eviction policy could gain over lru in this run, with the same
spill code. Every iteration runs a task on each of the E executors and only B fit in the budget,
so every policy loads at least E − B executors an iteration (`fewest_loads_per_iteration`; Belady's
choice on this cyclic order). lru's loads (`lru_loads_per_iteration`) cost it `t_lru − t_in_memory`,
so E − B loads cost at least that time × (E − B) / lru's loads. A policy can at best overlap them
all with the computation, which takes at least the in-memory time. So no policy's time is below the
larger of the two, and the ceiling is `t_lru` over it: at most 3 when B = E / 2, and only when the
loads take exactly twice the computation.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np


def log(msg: str) -> None:
    print(f"[litz-ooc {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Sizes:
    """The K-means job: `executors` on one worker, each `points` points of `dim` features."""

    executors: int = 16
    points: int = 50_000
    dim: int = 64
    k: int = 64
    batch: int = 2000
    iterations: int = 40
    repeats: int = 3

    @staticmethod
    def quick() -> Sizes:
        return Sizes(executors=8, points=4000, dim=16, k=8, batch=200, iterations=5, repeats=1)

    def app_config(self) -> dict[str, Any]:
        return {"k": self.k, "dim": self.dim, "points_per_executor": self.points, "batch": self.batch,
                "iterations": self.iterations, "report_every": 1, "seed": 0}


def executor_bytes(sz: Sizes) -> int:
    """Serialised bytes of one executor: its points and its assignments (what the worker accounts)."""
    from pollux.litz.apps.kmeans import kmeans_app, partition
    from pollux.litz.spill import measure

    config = kmeans_app(**sz.app_config()).config
    return measure(partition(config, 0)) + measure({"assign": np.zeros(sz.points, dtype=np.int32)})


def _proc_mb(pid: int, field: str) -> float | None:
    """A memory field of /proc/PID/status (VmRSS, VmHWM), in MB (None where /proc cannot tell)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


class RssSampler:
    """The largest VmRSS of some processes, sampled every `period_s` on a thread between
    `start` and `stop` (the steady part of a run: after its first iteration, to its last)."""

    def __init__(self, period_s: float = 0.01) -> None:
        self.period_s = period_s
        self.peak: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, pids: list[int]) -> None:
        def loop() -> None:
            while not self._stop.is_set():
                for pid in pids:
                    mb = _proc_mb(pid, "VmRSS")
                    if mb is not None:
                        self.peak = mb if self.peak is None else max(self.peak, mb)
                self._stop.wait(self.period_s)

        self._thread = threading.Thread(target=loop, name="rss-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


def run_once(sz: Sizes, budget: int | None, policy: str) -> dict[str, Any]:
    """One K-means run; its time of work, final centres, out-of-core counters and peak RSS."""
    from pollux.litz.apps.kmeans import kmeans_app
    from pollux.litz.records import RuntimeConfig
    from pollux.litz.runtime import LitzRuntime

    app = kmeans_app(**sz.app_config())
    cfg = RuntimeConfig(num_executors=sz.executors, num_workers=1, num_shards=1,
                        memory_budget_bytes=budget, out_of_core_policy=policy)
    rt = LitzRuntime(app, cfg)
    hwm: list[float] = []
    sampler = RssSampler()

    def progress(rec: dict[str, Any]) -> None:
        if rec.get("iteration") == 1:
            sampler.start(list(rt.worker_pids().values()))
        if rec.get("iteration") == sz.iterations:  # the worker is still alive at the last report
            sampler.stop()
            hwm.extend(mb for pid in rt.worker_pids().values() if (mb := _proc_mb(pid, "VmHWM")))

    try:
        summary = rt.run(on_progress=progress)
    finally:
        sampler.stop()
    t = [m["t"] for m in summary.metrics]
    return {
        "work_s": t[-1] - t[0],
        "wall_s": summary.wall_s,
        "centres": np.asarray(summary.final["centres"]),
        "objective": summary.final["objective"],
        "evictions": summary.ooc_evictions,
        "reloads": summary.ooc_reloads,
        "prefetches": summary.ooc_prefetches,
        "bytes_written": summary.ooc_bytes_written,
        "bytes_read": summary.ooc_bytes_read,
        "wait_s": summary.ooc_wait_s,
        "peak_accounted_bytes": summary.ooc_peak_bytes,
        "worker_rss_peak_mb": max(hwm, default=None),
        "worker_rss_steady_peak_mb": sampler.peak,
    }


def benchmark(sz: Sizes) -> dict[str, Any]:
    per_executor = executor_bytes(sz)
    total = per_executor * sz.executors
    budget = total // 2
    log(f"{sz.executors} executors of {per_executor / 1e6:.1f} MB ({total / 1e6:.0f} MB), "
        f"budget {budget / 1e6:.0f} MB")
    plans: dict[str, tuple[int | None, str]] = {"in_memory": (None, "litz"), "litz": (budget, "litz"),
                                                "lru": (budget, "lru")}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in plans}
    for r in range(sz.repeats):
        for name, (b, policy) in plans.items():
            out = run_once(sz, b, policy)
            log(f"repeat {r}: {name}: {out['work_s']:.2f} s of work, {out['reloads']} reloads, "
                f"{out['prefetches']} ahead, waited {out['wait_s']:.2f} s")
            runs[name].append(out)
    tiny = Sizes(**{**vars(sz), "points": sz.batch, "iterations": 2, "repeats": 1})
    empty = run_once(tiny, None, "litz")
    reference = runs["in_memory"][0]["centres"]
    identical = all(np.array_equal(o["centres"], reference) for rs in runs.values() for o in rs)
    rows: dict[str, Any] = {}
    for name, rs in runs.items():
        rows[name] = {
            "work_s": statistics.median(o["work_s"] for o in rs),
            "work_s_each": [o["work_s"] for o in rs],
            **{k: v for k, v in rs[-1].items() if k not in ("centres", "work_s")},
        }
    t_mem, t_litz, t_lru = (rows[n]["work_s"] for n in ("in_memory", "litz", "lru"))
    vs_in_memory = t_litz / t_mem
    speedup = t_lru / t_litz
    peak = max(rows["litz"]["peak_accounted_bytes"], rows["lru"]["peak_accounted_bytes"])
    peak_ratio = peak / budget
    fewest_loads = sz.executors - budget // per_executor
    lru_loads = rows["lru"]["reloads"] / sz.iterations
    floor_s = max(t_mem, (t_lru - t_mem) * fewest_loads / lru_loads) if lru_loads > 0 else t_lru
    return {
        "sizes": vars(sz),
        "executor_bytes": per_executor,
        "state_bytes": total,
        "budget_bytes": budget,
        "state_over_budget": total / budget,
        "runs": rows,
        "empty_worker_rss_peak_mb": empty["worker_rss_peak_mb"],
        "empty_worker_rss_steady_peak_mb": empty["worker_rss_steady_peak_mb"],
        "rss_steady_above_empty_mb": {
            name: (None if row["worker_rss_steady_peak_mb"] is None
                   or empty["worker_rss_steady_peak_mb"] is None
                   else row["worker_rss_steady_peak_mb"] - empty["worker_rss_steady_peak_mb"])
            for name, row in rows.items()
        },
        "identical_results": identical,
        "vs_in_memory": vs_in_memory,
        "speedup_vs_baseline": speedup,
        "fewest_loads_per_iteration": fewest_loads,
        "lru_loads_per_iteration": lru_loads,
        "speedup_ceiling": t_lru / floor_s,
        "peak_accounted_over_budget": peak_ratio,
        "targets": {
            "identical_results": identical,
            "vs_in_memory_le_2": vs_in_memory <= 2.0,
            "speedup_vs_baseline_ge_3": speedup >= 3.0,
            "peak_within_budget_plus_10pct": peak_ratio <= 1.10,
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    parser.add_argument("--quick", action="store_true", help="small sizes (< 60 s), for the smoke test")
    parser.add_argument("--cpus", type=int, default=2, help="num_cpus of the embedded Ray")
    parser.add_argument("--repeats", type=int, default=None, help="runs of each configuration")
    parser.add_argument("--size", action="append", default=[], metavar="KEY=N",
                        help="change one of the sizes (executors, points, dim, k, batch, iterations)")
    args = parser.parse_args(argv)
    sz = Sizes.quick() if args.quick else Sizes()
    for item in args.size:
        key, _, value = item.partition("=")
        if key not in vars(sz) or key == "repeats" or not value.isdigit() or int(value) < 1:
            parser.error(f"--size {item!r}: expected KEY=N with N >= 1, KEY one of "
                         f"{', '.join(k for k in vars(sz) if k != 'repeats')}")
        sz = Sizes(**{**vars(sz), key: int(value)})
    if args.repeats is not None:
        if args.repeats < 1:
            parser.error("--repeats must be >= 1")
        sz = Sizes(**{**vars(sz), "repeats": args.repeats})

    from pollux import raylink

    os.environ.update(raylink.LOOPBACK_ENV)
    # one BLAS thread per process (the workers inherit it): on 2 cores a multi-threaded BLAS in
    # the worker only fights the I/O thread and the master for them
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    t_start = time.monotonic()
    ray = raylink.start_local(args.cpus)
    node = getattr(ray._private.worker, "_global_node", None)
    try:
        report: dict[str, Any] = {"benchmark": "litz_ooc", "quick": args.quick, "cores": os.cpu_count(),
                                  "ray_num_cpus": args.cpus, "omp_num_threads": os.environ["OMP_NUM_THREADS"],
                                  "ray_session": getattr(node, "session_name", None),
                                  **benchmark(sz)}
    finally:
        ray.shutdown()
    report["pass"] = all(report["targets"].values())
    report["wall_s"] = time.monotonic() - t_start
    log(f"done in {report['wall_s']:.0f} s; vs_in_memory {report['vs_in_memory']:.2f}, "
        f"speedup_vs_baseline {report['speedup_vs_baseline']:.2f} (ceiling {report['speedup_ceiling']:.2f}); "
        f"targets {report['targets']}")
    if args.json:
        print(json.dumps(report, indent=2, default=float))
    else:
        for k, v in report["targets"].items():
            print(f"{k}: {'pass' if v else 'FAIL'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

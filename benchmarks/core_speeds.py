#!/usr/bin/env python3
"""How fast is each core of this machine, second by second? (context for the LB-BSP figures)

Runs the same single-threaded numpy loop (a 64 × 64 matrix product, renormalised) on every core at
once, one process per core pinned with ``os.sched_setaffinity``, and counts the loop's iterations in
each of ``--seconds`` consecutive one-second windows. Prints JSON: the counts per core and, for the
first two cores, the per-window ratio core 0 / core 1 with its range.

Why: ``benchmarks/lbbsp.py`` pins its two replicas to two cores and checks that the balanced shares
land within ±5 % of 2 : 1. On a VM whose vCPUs share physical cores with other tenants, the cores'
relative speed moves from second to second, and with it the split at which two replicas finish
together; this script measures how much.

Usage: ``benchmarks/core_speeds.py [--seconds 20]``
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import time


def _count(core: int, seconds: int, start: float, out: mp.Queue) -> None:
    os.sched_setaffinity(0, {core})
    import numpy as np

    a = np.random.default_rng(core).standard_normal((64, 64))
    while time.time() < start:          # both processes begin their windows together
        time.sleep(0.001)
    counts = []
    for w in range(seconds):
        end = start + w + 1.0
        k = 0
        while time.time() < end:
            a = a @ a
            a /= np.abs(a).max()
            k += 1
        counts.append(k)
    out.put((core, counts))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=20, help="one-second windows (default 20)")
    args = parser.parse_args(argv)
    if args.seconds < 1:
        parser.error("--seconds: must be >= 1")
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = "1"                # one thread per process: one core each
    cores = sorted(os.sched_getaffinity(0))
    ctx = mp.get_context("spawn")
    out: mp.Queue = ctx.Queue()
    start = time.time() + 3.0                # time for the spawned processes to import numpy
    procs = [ctx.Process(target=_count, args=(c, args.seconds, start, out)) for c in cores]
    for p in procs:
        p.start()
    try:
        counts = dict(out.get(timeout=args.seconds + 60) for _ in procs)
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    report: dict = {"benchmark": "core_speeds", "cores": cores, "seconds": args.seconds,
                    "iterations_per_second": {str(c): counts[c] for c in cores}}
    if len(cores) >= 2:
        ratios = [x / y for x, y in zip(counts[cores[0]], counts[cores[1]], strict=True)]
        report["ratio_core0_over_core1"] = [round(r, 3) for r in ratios]
        report["ratio_range"] = [round(min(ratios), 3), round(max(ratios), 3)]
        report["ratio_mean"] = round(sum(ratios) / len(ratios), 3)
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

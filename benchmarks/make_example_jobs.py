#!/usr/bin/env python3
"""Regenerate src/pollux/goodput/example_jobs.json, the two jobs of the goodput walk-through.

Usage: benchmarks/make_example_jobs.py --data ../shared/data/pollux-osdi21/traces

The throughput parameters are fitted to all placement and scalability rows of the application's
measured profile; the gradient statistics are the first (early) and last (late) epoch rows of the
validation file at the initial batch size. The batch limits are the published application constants
(SPEC §7). Numbers are facts from the Pollux OSDI'21 artifact (Apache-2.0), recorded with provenance.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pollux.goodput import fit_throughput
from trace_rows import read_throughput_rows

JOBS = {
    "cifar10": {"description": "ResNet-18 on CIFAR-10, SGD", "init_batch_size": 128,
                "max_batch_size": 4096, "local_bsz_bounds": [32, 1024], "optimizer": "SGD"},
    "imagenet": {"description": "ResNet-50 on ImageNet, SGD", "init_batch_size": 200,
                 "max_batch_size": 12800, "local_bsz_bounds": [20, 200], "optimizer": "SGD"},
}
OUT = Path(__file__).resolve().parents[1] / "src/pollux/goodput/example_jobs.json"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True)
    args = parser.parse_args()
    jobs = {}
    for app, meta in JOBS.items():
        rows = read_throughput_rows(args.data / app)
        fit = fit_throughput(rows.nodes, rows.replicas, rows.local_bsz, rows.step_time,
                             rows.accum_time)
        if not fit.ok:
            raise SystemExit(f"{app}: {fit.message}")
        vfile = args.data / app / f"validation-{meta['init_batch_size']}.csv"
        with vfile.open(newline="") as fh:
            vrows = list(csv.DictReader(fh))
        early, late = vrows[0], vrows[-1]
        jobs[app] = {
            **meta,
            "throughput": {k: round(v, 10) for k, v in fit.params.to_dict().items()},
            "grad": {
                "early": {"epoch": 1, "sqr": float(early["grad_sqr"]), "var": float(early["grad_var"])},
                "late": {"epoch": len(vrows), "sqr": float(late["grad_sqr"]),
                         "var": float(late["grad_var"])},
            },
            "provenance": (
                f"Pollux OSDI'21 artifact (AdaptDL, Apache-2.0), 16 x 4 NVIDIA T4: throughput fitted "
                f"by pollux.goodput.fit_throughput to {rows.step_time.size} rows of "
                f"traces/{app}/placements.csv and scalability.csv; gradient statistics from the first "
                f"and last rows of traces/{app}/{vfile.name}; batch limits from SPEC §7."
            ),
        }
    OUT.write_text(json.dumps({"generated_by": "benchmarks/make_example_jobs.py", "jobs": jobs},
                              indent=2) + "\n")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

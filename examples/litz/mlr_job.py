#!/usr/bin/env python3
"""A Litz MLR job for the Pollux service: elastic, it follows its allocation without restarting.

Submit it as an elastic job (one master process; its workers go on the allocated nodes, one per GPU)::

    .venv/bin/pollux submit --kind elastic --max-replicas 4 examples/litz/mlr_job.py -- --iterations 400

When a scheduling round changes the job's allocation, the master moves its workers onto the new
nodes while it runs and tells the service (no restart is counted). On a CPU machine the speed of a
worker is emulated by padding every micro-task to ``--task-floor`` seconds (said in the log), so that
more workers really finish sooner. The last line on stdout is a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

from pollux.contract import LOG_FORMAT, PREEMPTED_EXIT_CODE
from pollux.litz.apps import mlr_app
from pollux.litz.records import RuntimeConfig
from pollux.litz.service import run_under_service

log = logging.getLogger("litz-mlr")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--iterations", type=int, default=400, help="SGD iterations (default 400)")
    p.add_argument("--executors", type=int, default=16, help="logical executors (default 16)")
    p.add_argument("--shards", type=int, default=2, help="parameter-server shards (default 2)")
    p.add_argument("--staleness", type=int, default=0, help="SSP staleness s (default 0)")
    p.add_argument("--task-floor", type=float, default=0.02,
                   help="emulated worker speed: a micro-task takes at least this long (s; default 0.02)")
    p.add_argument("--checkpoint-every", type=float, default=10.0,
                   help="seconds between checkpoints (default 10)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format=LOG_FORMAT)
    log.info("emulated node speed on CPU: every micro-task padded to %.3f s (--task-floor)", args.task_floor)
    app = mlr_app(iterations=args.iterations, staleness=args.staleness, seed=args.seed, report_every=20)
    cfg = RuntimeConfig(num_executors=args.executors, num_shards=args.shards, seed=args.seed,
                        task_floor_s=args.task_floor, checkpoint_every_s=args.checkpoint_every)
    summary = run_under_service(app, cfg)
    final = summary.get("final") or {}
    print(json.dumps({"objective": final.get("objective"), "iterations": final.get("iterations"),
                      "wall_s": summary.get("wall_s"), "tasks": summary.get("tasks_completed"),
                      "resizes_applied": summary.get("resizes_applied"),
                      "preempted": summary.get("preempted"), "workers": summary.get("num_workers")}),
          flush=True)
    return PREEMPTED_EXIT_CODE if summary.get("preempted") else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Live autoscaling beside the simulator's, for the same inputs (issue 36).

**Live**: ``pollux server start --autoscale 0:2`` on the embedded cluster (nodes of 2 GPU slots,
rounds every 2 s), the goodput rule with thresholds that make its decisions certain for one-replica
jobs (``--option`` to change them), and three digits jobs (``examples/digits/train.py``): ``short``
and ``long`` at once, then ``mover`` once both run. The rule should go 0 → 1 → 2 nodes, drain the
second node when ``short`` ends (``mover`` moves off it by checkpoint and restart), and go to 0 when
all are done. Reported: every decision (time from the start, target, reason, nodes ready, pending,
draining, leaving) and how long the nodes took to match it (**follow lag**; the target is 30 s).

**Simulated, same inputs**: the simulator's fleet (:class:`pollux.sim.fleet.CloudFleet`, with no
provisioning delay) is driven round by round by the inputs the live service recorded
(``DIR/fleet.jsonl``): the round times, the jobs, the GPUs in use per node and the rule's utility
per GPU at every size, through the same rule (:class:`ReplayRule`: the threshold rule reading the
recorded utility instead of computing it from models). Reported: its sequence of (target, ready,
held) beside the live one, and whether they agree round by round.

    .venv/bin/python benchmarks/autoscale_live.py --json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pollux.policy.autoscale.api import Fleet
from pollux.policy.autoscale.rules import ThresholdRule
from pollux.policy.base import JobView
from pollux.sim.fleet import CloudConfig, CloudFleet

ROOT = Path(__file__).resolve().parents[1]
DIGITS = ROOT / "examples" / "digits" / "train.py"
OPTIONS = ("grow_above=0.9", "grow_to=0.6", "shrink_below=0.6", "cooldown_s=0")
JOBS = (("short", 4), ("long", 9), ("mover", 9))
FOLLOW_TARGET_S = 30.0


def say(msg: str) -> None:
    print(f"[autoscale-live] {msg}", file=sys.stderr, flush=True)


def run_live(state: Path, options: Sequence[str], timeout_s: float) -> tuple[list[dict], list[dict], dict]:
    """The live scenario; returns the fleet record, the polled samples and the jobs' end states."""
    import httpx

    from pollux.cluster import server
    from pollux.cluster.control.fleet import FLEET_RECORD, read_record

    info = server.start(state, policy="pollux", interval_s=2.0, gpus_per_node=2, stop_grace_s=20.0,
                        timeout_s=150, autoscale=server.Autoscale("0:2", options=tuple(options)),
                        progress=say)
    samples: list[dict] = []
    try:
        auth = {"Authorization": f"Bearer {info.token}"}
        client = httpx.Client(base_url=info.url, timeout=30, headers=auth)

        def look() -> tuple[dict, dict]:
            fleet = client.get("/v1/cluster").json()["fleet"]
            jobs = {j["name"]: j for j in client.get("/v1/jobs").json()}
            samples.append({"time": time.time(), "fleet": fleet})
            return fleet, jobs

        def wait(ok: Any, what: str) -> None:
            deadline = time.monotonic() + timeout_s
            while not ok(*look()):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"timed out waiting for {what}")
                time.sleep(0.5)

        def submit(name: str, epochs: int) -> None:
            spec = {"entrypoint": str(DIGITS), "working_dir": str(ROOT), "args": ["--epochs", str(epochs)],
                    "init_batch_size": 16, "max_batch_size": 256, "local_bsz_bounds": [8, 128],
                    "max_replicas": 1}
            r = client.post("/v1/jobs", json={"name": name, "spec": spec})
            r.raise_for_status()
            say(f"submitted {name} ({epochs} epochs)")

        wait(lambda f, j: f["target"] is not None, "the first decision")
        for name, epochs in JOBS[:2]:
            submit(name, epochs)
        wait(lambda f, j: all(j[n]["state"] == "running" for n in ("short", "long")),
             "short and long running")
        submit(*JOBS[2])
        wait(lambda f, j: all(x["state"] in ("succeeded", "failed") for x in j.values()) and not f["ready"]
             and not f["leaving"] and f["pending"] == 0, "every job done and no node left")
        ends = {j["name"]: {"state": j["state"], "restarts": j["restarts"]}
                for j in client.get("/v1/jobs").json()}
    finally:
        server.stop(state, timeout_s=60)
    return read_record(state / FLEET_RECORD), samples, ends


def follow_lags(record: list[dict], samples: list[dict]) -> list[float | None]:
    """Per decision: seconds until the polled nodes matched its target (None: a newer decision came
    first)."""
    lags: list[float | None] = []
    for i, entry in enumerate(record):
        until = record[i + 1]["time"] if i + 1 < len(record) else float("inf")
        met = [s["time"] for s in samples if entry["time"] <= s["time"] < until and s["fleet"]["pending"] == 0
               and len(s["fleet"]["ready"]) + len(s["fleet"]["draining"]) == entry["target"]]
        lags.append(round(met[0] - entry["time"], 2) if met else None)
    return lags


class ReplayRule(ThresholdRule):
    """The threshold rule reading a recorded utility per GPU instead of computing it from models."""

    def __init__(self, utilities: list[list[float] | None], **options: float) -> None:
        super().__init__(**options)   # type: ignore[arg-type]
        self.utilities = list(utilities)

    def efficiency(self, jobs: Sequence[JobView], fleet: Fleet) -> np.ndarray:
        recorded = self.utilities.pop(0)
        return np.zeros(fleet.max_nodes + 1) if recorded is None else np.asarray(recorded, dtype=float)


def replay(record: list[dict], options: Sequence[str], max_nodes: int, gpus_per_node: int) -> list[dict]:
    """The simulator's fleet driven by the live record's inputs, one round per recorded entry."""
    from pollux.cluster.control.fleet import parse_options

    rule = ReplayRule([e.get("utility") for e in record], **parse_options(options))
    fleet = CloudFleet(CloudConfig(min_nodes=0, max_nodes=max_nodes, gpus_per_node=gpus_per_node,
                                   provision_delay_s=0.0, initial_nodes=0), rule)
    names = list(fleet.full.nodes)
    out = []
    for entry in record:
        now = float(entry["time"]) - float(record[0]["time"])
        fleet.offered(now)
        used = np.array([int(entry.get("busy", {}).get(n, 0)) for n in names])
        jobs: list[Any] = [None] * int(entry.get("jobs", 0))   # the rule reads only how many
        fleet.after_round(jobs, used, now)
        rep = fleet.report
        out.append({"time": round(now, 1), "target": rep.target[-1], "ready": rep.ready[-1],
                    "held": rep.held[-1]})
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    p.add_argument("--option", action="append", default=None, metavar="KEY=VALUE",
                   help=f"a rule option (default: {' '.join(OPTIONS)})")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for each phase")
    args = p.parse_args(argv)
    options = tuple(args.option) if args.option else OPTIONS
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="pollux-autoscale-live-"))
    try:
        record, samples, ends = run_live(work / "state", options, args.timeout)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    lags = follow_lags(record, samples)
    sim = replay(record, options, max_nodes=2, gpus_per_node=2)
    t0 = record[0]["time"]
    live = [{"time": round(e["time"] - t0, 1), "target": e["target"], "ready": len(e["ready"]),
             "held": len(e["ready"]) + e["pending"] + len(e["draining"]), "pending": e["pending"],
             "draining": e["draining"], "leaving": e["leaving"], "reason": e["reason"], "follow_lag_s": lag}
            for e, lag in zip(record, lags, strict=True)]
    agree = [(a["target"], a["held"]) == (b["target"], b["held"]) for a, b in zip(live, sim, strict=True)]
    measured = [x for x in lags if x is not None]
    result = {
        "benchmark": "autoscale_live", "options": list(options), "jobs": ends,
        "live": live, "simulated": sim,
        "rounds_agreeing": int(sum(agree)), "rounds": len(agree),
        "targets_live": [e["target"] for e in live], "targets_simulated": [e["target"] for e in sim],
        "max_follow_lag_s": max(measured) if measured else None, "follow_target_s": FOLLOW_TARGET_S,
        "followed": bool(measured) and max(measured) <= FOLLOW_TARGET_S,
        "wall_s": round(time.monotonic() - started, 1),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "python": platform.python_version()},
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for a, b in zip(live, sim, strict=True):
            print(f"{a['time']:7.1f} s  live target {a['target']} held {a['held']} ready {a['ready']}  |  "
                  f"sim target {b['target']} held {b['held']} ready {b['ready']}  lag {a['follow_lag_s']}  "
                  f"{a['reason']}")
        print(f"{result['rounds_agreeing']}/{result['rounds']} rounds agree; max follow lag "
              f"{result['max_follow_lag_s']} s; jobs {ends}")
    ok = result["followed"] and all(e["state"] == "succeeded" for e in ends.values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

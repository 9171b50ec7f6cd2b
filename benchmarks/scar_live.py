"""SCAR live on pollux.litz (thesis §5.5.5, Fig. 5.11): one of 4 PS shards killed after epoch 7.

    python benchmarks/scar_live.py --json [--quick]

MLR (scikit-learn's bundled digits, 64 pixels: the 65 rows of the weight table W are the blocks;
staleness 0, so a run is deterministic and equals plain numpy SGD) on an embedded Ray
(``ray.init(num_cpus=--cpus)`` on 127.0.0.1), 4 executors on 2 workers, 4 PS shards.
Three runs:

1. *unperturbed*: no failure; its objective after ``--judge`` epochs is the convergence threshold,
   and the first report at or below it the baseline count (thesis: judged at convergence).
2. *scar*: the SCAR controller saves the top 1/8 rows by distance every epoch (priority); shard 1 is
   SIGKILLed after epoch 7 (after that epoch's checkpoint, at the first report of epoch 8, 1/8
   epoch in); partial recovery reloads only its rows from the running checkpoint.
3. *traditional*: a full checkpoint every 8 epochs (at 0, 8, …); the same kill; full recovery puts
   every row and the driver back to the last checkpoint (epoch 0).

Why digits: on dense generated Gaussian features every row moves alike, so prioritising rows buys
little and the rework after losing a quarter of them stays above one epoch (1.3–1.75 epochs in a
numpy replay of this protocol); real pixels differ (border pixels never move, strokes move a lot),
like the sparse features of the thesis's Criteo MLR.

Rework = epochs computed until the objective reaches the threshold (work thrown away by a
rewind included) minus the unperturbed count; resolution 1/8 epoch (the report period). Bytes read
on recovery are the running checkpoint's data bytes read, against a full checkpoint's. Checkpoint
overhead = the mean pause of training per checkpoint (distances, selection, sending the in-memory
updates, plus any hold of the next commit until the shards' copies are taken; the disk write is
asynchronous) as a percentage of the unperturbed run's mean epoch time. Every task is
padded to ``--task-floor`` seconds (Litz's emulated node speed), so that an epoch costs what a
small cluster's would rather than what Ray's local round trips cost on two shared cores.

Targets (issue 15): SCAR rework < 1 epoch, traditional ≈ 7 epochs, bytes read ≈ 1/4 of a full
checkpoint, overhead ≤ 2 % of epoch time.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

KILL_EPOCH = 7
VICTIM = 1


def log(msg: str) -> None:
    print(f"[scar_live] {msg}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Sizes:
    n: int = 1797  # scikit-learn's bundled digits: 64 pixels + bias = 65 rows of W (10 classes)
    batch_size: int = 25
    lr: float = 0.3
    judge: int = 16  # epochs of the unperturbed run the threshold is taken at
    task_floor_s: float = 0.004
    executors: int = 4
    workers: int = 2
    shards: int = 4

    @classmethod
    def quick(cls) -> Sizes:
        return cls(judge=12)

    @property
    def iters_per_epoch(self) -> int:
        return math.ceil(self.n / (self.executors * self.batch_size))


def mlr_config(sz: Sizes, **over: Any) -> dict[str, Any]:
    ipe = sz.iters_per_epoch
    cfg = dict(
        dataset="digits",
        batch_size=sz.batch_size,
        lr=sz.lr,
        staleness=0,
        double_buffer=False,
        seed=0,
        report_every=max(1, ipe // 8),
        iterations=sz.judge * ipe,
    )
    cfg.update(over)
    return cfg


def run(sz: Sizes, mode: str, threshold: float | None, workdir: str) -> dict[str, Any]:
    from pollux.litz.apps.mlr import mlr_app
    from pollux.litz.records import RuntimeConfig
    from pollux.litz.runtime import LitzRuntime
    from pollux.scar.live.controller import ScarConfig, ScarController

    ipe = sz.iters_per_epoch
    tasks_per_epoch = ipe * sz.executors
    ctl = None
    if mode == "scar":
        ctl = ScarController(
            ScarConfig(
                directory=os.path.join(workdir, mode),
                strategy="priority",
                fraction=1 / 8,
                every_tasks=tasks_per_epoch,
                recovery="partial",
            )
        )
    elif mode == "traditional":
        ctl = ScarController(
            ScarConfig(
                directory=os.path.join(workdir, mode),
                strategy="full",
                fraction=1.0,
                every_tasks=8 * tasks_per_epoch,
                recovery="full",
            )
        )
    over: dict[str, Any] = {}
    if threshold is not None:
        over = {"target_loss": threshold, "iterations": 4 * sz.judge * ipe}
    app = mlr_app(**mlr_config(sz, **over))
    cfg = RuntimeConfig(
        num_executors=sz.executors,
        num_workers=sz.workers,
        num_shards=sz.shards,
        seed=0,
        task_floor_s=sz.task_floor_s,
        fault_tolerance=ctl,
        stall_timeout_s=120,
    )
    rt = LitzRuntime(app, cfg)
    killed: dict[str, Any] = {}
    report_every = mlr_config(sz)["report_every"]

    def on_progress(rec: dict[str, Any]) -> None:
        if ctl is not None and not killed and rec.get("iteration") == KILL_EPOCH * ipe + report_every:
            killed["pid"] = rt.shard_pids()[VICTIM]
            killed["t"] = rec["t"]
            os.kill(killed["pid"], signal.SIGKILL)

    summary = rt.run(on_progress=on_progress)
    out: dict[str, Any] = {
        "mode": mode,
        "wall_s": summary.wall_s,
        "final": summary.final,
        "recoveries": summary.recoveries,
        "curve": [(m["iteration"] / ipe, m["objective"]) for m in summary.metrics],
    }
    lost_iters = 0.0
    if ctl is not None:
        rep = ctl.report()
        out["checkpoints"] = len(rep["checkpoints"])
        cps = rep["checkpoints"][1:]  # not the initial save
        out["pause_s_mean"] = sum(c["pause_s"] + c["commit_wait_s"] for c in cps) / max(1, len(cps))
        out["commit_wait_s_mean"] = sum(c["commit_wait_s"] for c in cps) / max(1, len(cps))
        out["recovery"] = rep["recoveries"]
        out["bytes_written"] = ctl.store.bytes_written if ctl.store is not None else 0
        lost_iters = sum(r["tasks_before"] - r["tasks_after"] for r in rep["recoveries"]) / sz.executors
    done = float(summary.final.get("iterations", 0))
    out["epochs_computed"] = (done + lost_iters) / ipe
    out["reached"] = bool(summary.final.get("target_reached", threshold is None))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    ap.add_argument("--quick", action="store_true", help="smaller model and fewer epochs (tests)")
    ap.add_argument("--cpus", type=int, default=2, help="num_cpus of the embedded Ray")
    args = ap.parse_args(argv)
    sz = Sizes.quick() if args.quick else Sizes()

    from pollux import raylink

    t_start = time.monotonic()
    # Ray prints a notice for the killed shard on the driver's stdout: keep stdout for the JSON
    quiet = contextlib.redirect_stdout(sys.stderr)
    quiet.__enter__()
    ray = raylink.start_local(args.cpus)
    try:
        with tempfile.TemporaryDirectory(prefix="scar-live-") as work:
            log(f"unperturbed: {sz.judge} epochs")
            base = run(sz, "unperturbed", None, work)
            threshold = base["curve"][-1][1]
            baseline = next(e for e, obj in base["curve"] if obj <= threshold)
            runs = {"unperturbed": base}
            for mode in ("scar", "traditional"):
                log(f"{mode}: until objective <= {threshold:.6f}")
                runs[mode] = run(sz, mode, threshold, work)
    finally:
        ray.shutdown()
        quiet.__exit__(None, None, None)
    epoch_s = base["wall_s"] / sz.judge
    report: dict[str, Any] = {
        "benchmark": "scar_live",
        "quick": args.quick,
        "sizes": vars(sz) | {"iters_per_epoch": sz.iters_per_epoch},
        "kill_after_epoch": KILL_EPOCH,
        "threshold": threshold,
        "baseline_epochs": baseline,
        "unperturbed_epoch_s": epoch_s,
    }
    for mode in ("scar", "traditional"):
        r = runs[mode]
        rec = r["recovery"][0] if r["recovery"] else {}
        report[mode] = {
            "reached_threshold": r["reached"],
            "epochs_computed": r["epochs_computed"],
            "rework_epochs": r["epochs_computed"] - baseline,
            "recoveries": r["recoveries"],
            "recovery_kind": rec.get("kind"),
            "bytes_read": rec.get("bytes_read"),
            "full_checkpoint_bytes": rec.get("full_bytes"),
            "bytes_read_fraction": (rec["bytes_read"] / rec["full_bytes"]) if rec else None,
            "recovery_s": rec.get("duration_s"),
            "bytes_written": r["bytes_written"],  # saves plus the store's compactions
            "checkpoints": r["checkpoints"],
            "checkpoint_pause_ms": 1000 * r["pause_s_mean"],
            "of_which_commit_wait_ms": 1000 * r["commit_wait_s_mean"],
            "overhead_pct_of_epoch": 100 * r["pause_s_mean"] / epoch_s,  # per checkpoint
            "checkpoint_every_epochs": 1 if mode == "scar" else 8,
            "overhead_pct_amortised": 100 * r["pause_s_mean"] / epoch_s / (1 if mode == "scar" else 8),
            "wall_s": r["wall_s"],
        }
    report["unperturbed"] = {"wall_s": base["wall_s"], "epochs": sz.judge}
    s, t = report["scar"], report["traditional"]
    report["targets"] = {
        "scar_rework_lt_1_epoch": s["reached_threshold"] and s["rework_epochs"] < 1.0,
        "traditional_rework_about_7": t["reached_threshold"] and 6.0 <= t["rework_epochs"] <= 8.0,
        "bytes_read_about_quarter": s["bytes_read_fraction"] is not None
        and 0.15 <= s["bytes_read_fraction"] <= 0.35,
        "overhead_le_2pct": s["overhead_pct_of_epoch"] <= 2.0,
    }
    report["all_pass"] = all(report["targets"].values())
    report["wall_s"] = time.monotonic() - t_start
    log(f"done in {report['wall_s']:.0f} s; targets: {report['targets']}")
    if args.json:
        print(json.dumps(report, indent=2, default=float))
    else:
        for k in ("scar", "traditional"):
            r = report[k]
            print(
                f"{k}: rework {r['rework_epochs']:.2f} epochs, read {r['bytes_read_fraction']}, "
                f"overhead {r['overhead_pct_of_epoch']:.2f} %"
            )
        print(f"targets: {report['targets']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

#!/usr/bin/env python3
"""Does the adaptive batch size make training faster without hurting the model?

Usage:
    benchmarks/agent_decisions.py [--json]                 # 3 scripts × replicas {1, 2} × seeds {0, 1, 2}
    benchmarks/agent_decisions.py --quick --json           # smoke run: one seed, 1 replica, fewer epochs
    benchmarks/agent_decisions.py --scripts lenet --replicas 2 --seeds 0 1 --out out/ad-lenet

For each example script (``examples/digits``, ``examples/lenet``, ``examples/tabular``), each
starting replica count K and each seed, two jobs run one after the other on this machine:

* **adaptive**: the script as written (``autoscale_batch_size``, gradient accumulation on where the
  script enables it);
* **fixed**: the same script with ``--fixed`` (no ``autoscale_batch_size`` call; the global batch
  stays at M0).

Both get ``--seed S --threads 1`` and ``POLLUX_REFIT_INTERVAL_S=3``, ``OMP_NUM_THREADS=1``. Replicas
are started here, one process each, the way the Pollux service starts them: ``POLLUX_RANK``,
``POLLUX_NUM_REPLICAS``, ``POLLUX_MASTER_ADDR=127.0.0.1``, a fresh ``POLLUX_MASTER_PORT``,
``POLLUX_CHECKPOINT_DIR`` (one directory per job), ``PYTHONPATH=src``; every process is recorded by
PID, and any still alive at the end, on an error, on Ctrl-C or on SIGTERM is killed by PID.

**Preemption.** Each job is preempted once, as a scheduler would: SIGTERM to every replica at a
seeded random moment after a warm-up, then (after the exit with status 143 and a checkpoint) it is
resumed from the same checkpoint directory on the other replica count (1 → 2, 2 → 1) and runs until it
finishes (exit 0). The adaptive job is signalled a random 1–4 s after its first batch-size change
(a ``decision`` line whose reason is neither the start nor a replica change), but not before the
script's warm-up bound ``lo``; if no change comes before a seeded random moment in ``[lo, hi]``, at
that moment. **The fixed job then gets its SIGTERM the same number of seconds after its launch** (and
none if the adaptive job finished before being signalled): both jobs hold K replicas for the same
wall time and pay one checkpoint-restart, so neither is favoured by the schedule. The SIGTERM is held
back until rank 0 has logged its first optimiser step (the agent's handler is then installed), and
not sent once rank 0 has printed its final line (a job that ends first is simply not preempted; a
signal that lands during the shutdown after the final line counts as a finished run).

A script without a ``--fixed`` option is skipped (reported as such). A script that prints only a
legacy result line (``{"test_accuracy": ...}``, no epoch lines) gets its final accuracy from it but
no time to accuracy.

**Figures per (script, K, seed)**, from the scripts' JSON lines on stdout (rank 0) and the agent's log
on stderr (rank 0):

* ``acc_adaptive``, ``acc_fixed``: final validation accuracy of each job (its last run's
  ``{"event": "final"}`` line); criterion ``acc_adaptive ≥ acc_fixed − 0.01``.
* ``tta_adaptive_s``: wall time of the adaptive job until its first epoch line with
  ``val_acc ≥ acc_fixed``: launch → exit of each earlier run, plus launch → the epoch line's
  timestamp in the run that reached it (None if it never did); ``fixed_total_s``: the fixed job's
  wall time (launch → exit, summed over its runs); criterion ``tta_adaptive_s ≤ fixed_total_s``.
* ``reversals``: batch-size decisions (``decision {JSON}`` lines) whose change of the global batch
  ``K·m·(s+1)`` goes the other way from the previous decision's, counted over the job's decisions
  (all runs, in order) whose reason is neither ``start`` nor ``replicas A -> B``; decisions that keep
  the global batch are skipped; criterion ≤ 1.
* ``ratio_max`` = max predicted/measured step time and ``ratio_max_two_sided`` = max of
  max(pred/meas, meas/pred) over the job's ``step-time check {JSON}`` lines; criterion two-sided ≤
  1.5 (None when the agent logged no check).

Also reported, without a criterion: ``tta_fixed_s`` (the fixed job's own time to its final
accuracy), ``speedup_tta`` (``fixed_total_s / tta_adaptive_s``) and ``tta_adaptive_relaxed_s``, the
adaptive job's time to ``acc_fixed − 0.005``: both jobs plateau at accuracies that differ by a few
tenths of a point from seed to seed and between two runs of one seed, so reaching the fixed job's
final accuracy *exactly* is partly a coin toss even for an adaptive job that is as good; the relaxed
figure shows whether it got there up to that noise. Wall times include the other work on this
shared machine (``loadavg_*``: 1-minute load average at each launch and at the end).

A criterion is ``true``/``false`` per script when every job was evaluated, ``null`` if it could not be
evaluated anywhere (e.g. no step-time checks logged); ``overall`` is false if any criterion failed,
null if none failed but one was null, else true. Logs of every run stay in ``--out``
(``<script>/K<k>-s<seed>/<mode>/run<i>-rank<r>.{out,err}``), with ``result.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pollux import contract as C
from pollux.contract import EVENT_FIRST_STEP, PREEMPTED_EXIT_CODE

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
PREEMPT_EXIT = PREEMPTED_EXIT_CODE
REFIT_INTERVAL_S = 3.0
ACC_TOLERANCE = 0.01
MAX_REVERSALS = 1
MAX_RATIO = 1.5
#: Informational only: time to the fixed job's final accuracy minus this margin (see the docstring).
RELAXED_MARGIN = 0.005
TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_WORLD_SIZE", "LOCAL_RANK",
                 "GROUP_RANK")
#: rank 0 has trained: the agent's SIGTERM handler is installed.
TRAINING_MARKERS = (f'"event": "{EVENT_FIRST_STEP}"', "first optimizer step", '"event": "epoch"')
#: rank 0 has printed its result: the job is over, whatever its exit status.
FINAL_MARKERS = ('"event": "final"', '"test_accuracy"')
REPLICA_REASON = re.compile(r"^\s*replicas\s+\d+\s*->\s*\d+")
LEGACY_CHANGE = re.compile(r"batch size (\d+) -> (\d+) .*\[periodic refit\]")


@dataclass(frozen=True)
class Script:
    path: str
    args: tuple[str, ...]            # full run
    quick_args: tuple[str, ...]      # --quick
    window: tuple[float, float]      # seconds after launch: preemption not before lo, fallback in [lo, hi]
    quick_window: tuple[float, float]


SCRIPTS: dict[str, Script] = {
    "digits": Script("examples/digits/train.py", ("--epochs", "60", "--json-epochs"),
                     ("--epochs", "10", "--json-epochs"), (6.0, 12.0), (4.0, 7.0)),
    "lenet": Script("examples/lenet/train.py", (), ("--epochs", "4"), (10.0, 25.0), (5.0, 8.0)),
    "tabular": Script("examples/tabular/train.py", (), ("--epochs", "3"), (10.0, 20.0), (4.0, 5.5)),
}


# ---------------------------------------------------------------------------------------------
# Parsing (pure functions, tested in tests/test_examples_more.py)


def parse_marked(text: str, marker: str) -> list[dict[str, Any]]:
    """The JSON objects of the lines containing ``marker`` (the first ``{`` after it, to its match).

    The logging prefix before the marker may be anything; text after the object is ignored; lines
    whose JSON does not parse are skipped.
    """
    decoder = json.JSONDecoder()
    found = []
    for line in text.splitlines():
        at = line.find(marker)
        if at < 0:
            continue
        brace = line.find("{", at + len(marker.rstrip("{")))
        if brace < 0:
            continue
        try:
            obj, _ = decoder.raw_decode(line, brace)
        except ValueError:
            continue
        if isinstance(obj, dict):
            found.append(obj)
    return found


def parse_decisions(text: str) -> list[dict[str, Any]]:
    return parse_marked(text, "decision {")


def parse_step_checks(text: str) -> list[dict[str, Any]]:
    return parse_marked(text, "step-time check {")


def parse_events(stdout: str) -> list[dict[str, Any]]:
    """The script's JSON lines on stdout (``{"event": ...}``; a legacy final line has ``test_accuracy``)."""
    events = []
    for line in stdout.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict):
            if "event" not in obj and "test_accuracy" in obj:
                obj = {**obj, "event": "final", "val_acc": obj["test_accuracy"]}
            if "event" in obj:
                events.append(obj)
    return events


def batch_of(config: Any) -> int | None:
    """Global batch K·m·(s+1) of a ``[K, m, s]`` configuration (None if it is not one)."""
    if not isinstance(config, list | tuple) or len(config) != 3:
        return None
    try:
        k, m, s = (int(v) for v in config)
    except (TypeError, ValueError):
        return None
    return k * m * (s + 1)


def is_start(reason: Any) -> bool:
    return str(reason or "").strip().startswith("start")


def is_replica_change(reason: Any) -> bool:
    return bool(REPLICA_REASON.match(str(reason or "")))


def decision_direction(d: dict[str, Any]) -> int:
    """+1 if the decision grows the global batch, −1 if it shrinks it, 0 otherwise (or unknown)."""
    old, new = batch_of(d.get("from")), batch_of(d.get("to"))
    if old is None or new is None or old == new:
        return 0
    return 1 if new > old else -1


def is_change(d: dict[str, Any]) -> bool:
    """A batch-size change decided by the agent (not the start, not a replica change)."""
    reason = d.get("reason")
    return not is_start(reason) and not is_replica_change(reason) and decision_direction(d) != 0


def count_reversals(decisions: Iterable[dict[str, Any]]) -> int:
    """Decisions whose direction flips from the previous counted decision's.

    Only decisions whose reason is neither ``start…`` nor ``replicas A -> B…`` count, and of those
    only the ones that change the global batch.
    """
    reversals, previous = 0, 0
    for d in decisions:
        if is_start(d.get("reason")) or is_replica_change(d.get("reason")):
            continue
        direction = decision_direction(d)
        if direction == 0:
            continue
        if previous and direction != previous:
            reversals += 1
        previous = direction
    return reversals


def step_time_ratios(checks: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """max(pred/meas) and max(max(pred/meas, meas/pred)) over the checks (None without checks)."""
    ratios = []
    for c in checks:
        try:
            pred, meas = float(c["predicted_s"]), float(c["measured_s"])
        except (KeyError, TypeError, ValueError):
            continue
        if pred > 0 and meas > 0 and math.isfinite(pred) and math.isfinite(meas):
            ratios.append(pred / meas)
    if not ratios:
        return {"checks": 0, "ratio_max": None, "ratio_max_two_sided": None, "ratios": []}
    return {"checks": len(ratios), "ratio_max": max(ratios),
            "ratio_max_two_sided": max(max(r, 1 / r) for r in ratios), "ratios": ratios}


def time_to_accuracy(runs: list[dict[str, Any]], target: float) -> float | None:
    """Wall time of a job until its first epoch line with ``val_acc ≥ target``.

    ``runs``: the job's runs in order, each with ``launch`` and ``exit`` (wall-clock seconds) and
    ``epochs`` (epoch lines with ``time`` and ``val_acc``). Earlier runs count launch → exit; the run
    that reaches the target counts launch → that epoch line. None if no epoch reaches it.
    """
    elapsed = 0.0
    for run in runs:
        for e in run.get("epochs", []):
            acc = e.get("val_acc")
            if acc is not None and float(acc) >= target:
                return elapsed + max(float(e["time"]) - float(run["launch"]), 0.0)
        elapsed += float(run["exit"]) - float(run["launch"])
    return None


def first_change_seen(text: str) -> bool:
    """Whether rank 0's log shows a batch-size change by the agent (decision line or sentence)."""
    if any(is_change(d) for d in parse_decisions(text)):
        return True
    return any(int(a) != int(b) for a, b in LEGACY_CHANGE.findall(text))


# ---------------------------------------------------------------------------------------------
# Processes


_ALIVE: dict[int, subprocess.Popen] = {}


def kill_all() -> None:
    """SIGKILL every child still alive, by PID, and reap it."""
    for pid, proc in list(_ALIVE.items()):
        if proc.poll() is None:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover
            pass
        _ALIVE.pop(pid, None)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def child_env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLLUX_") and k not in TORCHRUN_VARS}
    env["PYTHONPATH"] = str(SRC) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


@dataclass
class Run:
    """One run of a job: ``replicas`` processes of the script, started together."""

    procs: list[subprocess.Popen] = field(default_factory=list)
    outs: list[Path] = field(default_factory=list)
    errs: list[Path] = field(default_factory=list)
    launch: float = 0.0


def start_run(script: Path, args: list[str], replicas: int, logdir: Path, tag: str, ckpt: Path,
              restarts: int, refit_interval: float) -> Run:
    port = free_port()
    run = Run()
    logdir.mkdir(parents=True, exist_ok=True)
    run.launch = time.time()
    for rank in range(replicas):
        env = child_env({
            C.ENV_RANK: str(rank), C.ENV_NUM_REPLICAS: str(replicas), C.ENV_NODE_RANK: "0",
            C.ENV_NUM_NODES: "1", C.ENV_MASTER_ADDR: "127.0.0.1", C.ENV_MASTER_PORT: str(port),
            C.ENV_CHECKPOINT_DIR: str(ckpt), C.ENV_RESTARTS: str(restarts),
            "POLLUX_REFIT_INTERVAL_S": str(refit_interval),     # the agent's own knob, not the contract's
        })
        out, err = logdir / f"{tag}-rank{rank}.out", logdir / f"{tag}-rank{rank}.err"
        with open(out, "wb") as fo, open(err, "wb") as fe:
            proc = subprocess.Popen([sys.executable, str(script), *args], env=env, cwd=str(ROOT),
                                    stdout=fo, stderr=fe, start_new_session=True)
        _ALIVE[proc.pid] = proc
        run.procs.append(proc)
        run.outs.append(out)
        run.errs.append(err)
    return run


class Tail:
    """Incremental reader of a growing log file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.pos = 0
        self.text = ""

    def poll(self) -> str:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.pos)
                chunk = f.read()
        except OSError:
            return self.text
        self.pos += len(chunk)
        self.text += chunk.decode("utf-8", errors="replace")
        return self.text


@dataclass
class Preemption:
    """When to send the job's SIGTERM (seconds after launch of its first run)."""

    mode: str                      # "after-change" (adaptive), "at" (fixed: a given time), "none"
    lo: float = 0.0
    fallback: float = 0.0          # adaptive: when to signal if no change came by then
    delay: float = 0.0             # adaptive: after the first change
    at: float | None = None        # fixed


def supervise(run: Run, preempt: Preemption | None, timeout: float) -> dict[str, Any]:
    """Wait for the run to end, sending the SIGTERM when due. Returns timings and exit codes."""
    tail = Tail(run.errs[0])
    out_tail = Tail(run.outs[0])
    sigterm_at: float | None = None
    planned: float | None = None
    change_at: float | None = None
    deadline = run.launch + timeout
    error = None
    first_exit: float | None = None
    while True:
        now = time.time()
        codes = [p.poll() for p in run.procs]
        if all(c is not None for c in codes):
            break
        if any(c is not None for c in codes) and first_exit is None:
            first_exit = now
        if first_exit is not None and now - first_exit > 60:
            error = "a replica exited and the others did not within 60 s"
            break
        if now > deadline:
            error = f"run did not finish within {timeout:.0f} s"
            break
        if sigterm_at is None and preempt is not None and preempt.mode != "none":
            text = tail.poll()
            elapsed = now - run.launch
            if preempt.mode == "after-change":
                if change_at is None and first_change_seen(text):
                    change_at = elapsed
                if planned is None:
                    if change_at is not None and change_at <= preempt.fallback:
                        planned = max(change_at + preempt.delay, preempt.lo)
                    elif elapsed >= preempt.fallback:
                        planned = preempt.fallback
            elif preempt.mode == "at":
                planned = preempt.at
            stdout = out_tail.poll()
            trained = any(m in text or m in stdout for m in TRAINING_MARKERS)
            if any(m in stdout for m in FINAL_MARKERS):
                preempt = None                # finished training: too late to preempt this job
            elif planned is not None and elapsed >= planned and trained:
                for p in run.procs:
                    if p.poll() is None:
                        os.kill(p.pid, signal.SIGTERM)
                sigterm_at = elapsed
        time.sleep(0.05)
    if error is not None:
        for p in run.procs:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGKILL)
    codes = []
    for p in run.procs:
        try:
            codes.append(p.wait(timeout=30))
        except subprocess.TimeoutExpired:  # pragma: no cover
            os.kill(p.pid, signal.SIGKILL)
            codes.append(p.wait())
        _ALIVE.pop(p.pid, None)
    exit_time = time.time()
    return {"codes": codes, "exit": exit_time, "sigterm_after_s": sigterm_at,
            "first_change_after_s": change_at, "error": error}


def run_job(name: str, script: Script, mode: str, replicas: int, seed: int, logdir: Path, quick: bool,
            preempt: Preemption, refit_interval: float, timeout: float, max_runs: int = 4) -> dict[str, Any]:
    """All runs of one job (a first run on ``replicas``, resumed on the other count after the SIGTERM)."""
    if logdir.exists():
        shutil.rmtree(logdir)
    ckpt = logdir / "ckpt"
    ckpt.mkdir(parents=True)
    args = [*(script.quick_args if quick else script.args), "--seed", str(seed), "--threads", "1"]
    if mode == "fixed":
        args.append("--fixed")
    runs: list[dict[str, Any]] = []
    k = replicas
    error = None
    for i in range(max_runs):
        load_start = loadavg()
        run = start_run(ROOT / script.path, args, k, logdir, f"run{i}", ckpt, i, refit_interval)
        info = supervise(run, preempt if i == 0 else None, timeout)
        stdout = run.outs[0].read_text(errors="replace")
        stderr = run.errs[0].read_text(errors="replace")
        events = parse_events(stdout)
        record = {
            "run": i, "replicas": k, "launch": run.launch, "exit": info["exit"],
            "wall_s": info["exit"] - run.launch, "codes": info["codes"],
            "sigterm_after_s": info["sigterm_after_s"], "first_change_after_s": info["first_change_after_s"],
            "epochs": [e for e in events if e.get("event") == "epoch"],
            "final": next((e for e in reversed(events) if e.get("event") == "final"), None),
            "decisions": parse_decisions(stderr), "step_checks": parse_step_checks(stderr),
            "loadavg_start": load_start, "loadavg_end": loadavg(),
        }
        runs.append(record)
        if info["error"] is not None:
            error = f"run {i}: {info['error']}"
            break
        codes = info["codes"]
        if all(c == 0 for c in codes):
            break
        if record["final"] is not None and all(c in (0, PREEMPT_EXIT, -signal.SIGTERM) for c in codes):
            break       # signalled while shutting down after its result: finished
        if all(c in (0, PREEMPT_EXIT) for c in codes) and PREEMPT_EXIT in codes:
            k = 2 if k == 1 else 1
            continue
        error = f"run {i}: exit codes {codes} (see {run.errs[0]})"
        break
    else:
        error = f"not finished after {max_runs} runs"
    final = runs[-1]["final"] if error is None else None
    decisions = [d for r in runs for d in r["decisions"]]
    checks = [c for r in runs for c in r["step_checks"]]
    batch_sizes = (final or {}).get("batch_sizes") or distinct(
        e.get("batch_size") for r in runs for e in r["epochs"])
    return {
        "mode": mode, "error": error, "runs": runs,
        "final_acc": None if final is None else final.get("val_acc"),
        "total_s": sum(r["wall_s"] for r in runs), "replica_sequence": [r["replicas"] for r in runs],
        "restarts": len(runs) - 1, "batch_sizes": batch_sizes, "decisions": decisions,
        "changes": sum(1 for d in decisions if is_change(d)), "reversals": count_reversals(decisions),
        "step_time": step_time_ratios(checks),
        "sigterm_after_s": runs[0]["sigterm_after_s"],
        "first_change_after_s": runs[0]["first_change_after_s"],
        "loadavg": [r["loadavg_start"] for r in runs] + [runs[-1]["loadavg_end"]],
    }


def loadavg() -> float | None:
    """The 1-minute load average (other work on this machine slows both jobs unevenly)."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def distinct(values: Iterable[Any]) -> list[Any]:
    out: list[Any] = []
    for v in values:
        if v is not None and (not out or out[-1] != v):
            out.append(v)
    return out


# ---------------------------------------------------------------------------------------------
# Comparison


def compare(adaptive: dict[str, Any], fixed: dict[str, Any]) -> dict[str, Any]:
    """The figures and criteria of one (script, K, seed)."""
    acc_a, acc_f = adaptive["final_acc"], fixed["final_acc"]
    tta = tta_relaxed = None
    if acc_f is not None and adaptive["error"] is None:
        tta = time_to_accuracy(adaptive["runs"], acc_f)
        tta_relaxed = time_to_accuracy(adaptive["runs"], acc_f - RELAXED_MARGIN)
    tta_fixed = time_to_accuracy(fixed["runs"], acc_f) if acc_f is not None else None
    st = adaptive["step_time"]
    ok_acc = None if acc_a is None or acc_f is None else acc_a >= acc_f - ACC_TOLERANCE
    if adaptive["error"] or fixed["error"]:
        ok_acc = False
    ok_tta = None if acc_f is None or fixed["error"] else (tta is not None and tta <= fixed["total_s"])
    ok_rev = None if adaptive["error"] else adaptive["reversals"] <= MAX_REVERSALS
    ok_ratio = None if st["ratio_max_two_sided"] is None else st["ratio_max_two_sided"] <= MAX_RATIO
    return {
        "acc_adaptive": acc_a, "acc_fixed": acc_f,
        "acc_diff": None if acc_a is None or acc_f is None else acc_a - acc_f,
        "tta_adaptive_s": tta, "fixed_total_s": fixed["total_s"], "adaptive_total_s": adaptive["total_s"],
        "tta_fixed_s": tta_fixed, "tta_adaptive_relaxed_s": tta_relaxed,
        "speedup_tta": None if not tta else fixed["total_s"] / tta,
        "reversals": adaptive["reversals"], "changes": adaptive["changes"],
        "ratio_max": st["ratio_max"], "ratio_max_two_sided": st["ratio_max_two_sided"],
        "step_time_checks": st["checks"],
        "batch_sizes_adaptive": adaptive["batch_sizes"], "batch_sizes_fixed": fixed["batch_sizes"],
        "runs_adaptive": len(adaptive["runs"]), "runs_fixed": len(fixed["runs"]),
        "replicas_adaptive": adaptive["replica_sequence"], "replicas_fixed": fixed["replica_sequence"],
        "sigterm_after_s": adaptive["sigterm_after_s"], "sigterm_after_s_fixed": fixed["sigterm_after_s"],
        "first_change_after_s": adaptive["first_change_after_s"],
        "loadavg_adaptive": adaptive["loadavg"], "loadavg_fixed": fixed["loadavg"],
        "errors": [e for e in (adaptive["error"], fixed["error"]) if e],
        "pass": {"accuracy": ok_acc, "time_to_accuracy": ok_tta, "reversals": ok_rev,
                 "step_time_ratio": ok_ratio},
    }


def combine(values: list[bool | None]) -> bool | None:
    """False if any is False; None if all are None; else True (a criterion not evaluated somewhere is
    ignored there, as long as it was evaluated somewhere)."""
    if any(v is False for v in values):
        return False
    if all(v is None for v in values):
        return None
    return True


def overall(values: list[bool | None]) -> bool | None:
    if any(v is False for v in values):
        return False
    if any(v is None for v in values):
        return None
    return True


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    crit = {c: combine([r["pass"][c] for r in rows]) for c in
            ("accuracy", "time_to_accuracy", "reversals", "step_time_ratio")}

    def values(key: str) -> list[float]:
        return [r[key] for r in rows if r.get(key) is not None]

    diffs, speed = values("acc_diff"), values("speedup_tta")
    ratios = values("ratio_max_two_sided")
    return {
        "jobs": len(rows),
        "min_acc_diff": min(diffs) if diffs else None,
        "mean_acc_diff": statistics.fmean(diffs) if diffs else None,
        "median_speedup_tta": statistics.median(speed) if speed else None,
        "max_reversals": max((r["reversals"] for r in rows), default=None),
        "max_ratio_two_sided": max(ratios) if ratios else None,
        "pass": crit, "overall": overall(list(crit.values())),
    }


# ---------------------------------------------------------------------------------------------
# Driver


def has_fixed_flag(script: Script) -> bool:
    try:
        return '"--fixed"' in (ROOT / script.path).read_text()
    except OSError:
        return False


def fmt(x: Any, spec: str = ".3f") -> str:
    return "-" if x is None else format(x, spec)


def progress(msg: str) -> None:
    print(f"[agent_decisions {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def job_line(name: str, k: int, seed: int, job: dict[str, Any]) -> str:
    return (f"{name} K={k} seed={seed} {job['mode']}: {job['total_s']:.1f} s, runs {job['replica_sequence']}"
            f", final acc {fmt(job['final_acc'], '.4f')}, batch {job['batch_sizes']}, "
            f"{len(job['decisions'])} decisions ({job['changes']} changes, {job['reversals']} reversals)"
            + (f", SIGTERM at {job['sigterm_after_s']:.1f} s" if job["sigterm_after_s"] is not None else "")
            + (f"; ERROR {job['error']}" if job["error"] else ""))


def strip_runs(job: dict[str, Any]) -> dict[str, Any]:
    """A job's record for the JSON document (epoch lines and decisions kept, made compact)."""
    runs = []
    for r in job["runs"]:
        runs.append({
            "replicas": r["replicas"], "wall_s": r["wall_s"], "codes": r["codes"],
            "sigterm_after_s": r["sigterm_after_s"],
            "epochs": [{"epoch": e.get("epoch"), "val_acc": e.get("val_acc"),
                        "batch_size": e.get("batch_size"),
                        "after_launch_s": float(e["time"]) - r["launch"] if "time" in e else None}
                       for e in r["epochs"]],
            "final": r["final"],
        })
    return {"final_acc": job["final_acc"], "total_s": job["total_s"], "error": job["error"],
            "batch_sizes": job["batch_sizes"], "decisions": job["decisions"],
            "step_time": job["step_time"], "runs": runs}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scripts", nargs="+", choices=tuple(SCRIPTS), default=list(SCRIPTS))
    p.add_argument("--replicas", nargs="+", type=int, choices=(1, 2), default=None,
                   help="replica counts the jobs start on (default 1 2; --quick: 1)")
    p.add_argument("--seeds", nargs="+", type=int, default=None, help="default 0 1 2 (--quick: 0)")
    p.add_argument("--out", type=Path, default=ROOT / "out" / "agent_decisions",
                   help="directory for logs and result.json (emptied per job; default out/agent_decisions)")
    p.add_argument("--quick", action="store_true", help="one seed, one replica count, fewer epochs")
    p.add_argument("--refit-interval", type=float, default=REFIT_INTERVAL_S,
                   help="POLLUX_REFIT_INTERVAL_S for every run (default 3)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per run before it is killed")
    p.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    args = p.parse_args(argv)
    replicas = args.replicas or ([1] if args.quick else [1, 2])
    seeds = args.seeds or ([0] if args.quick else [0, 1, 2])
    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)

    def on_signal(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_signal)
    started = time.time()
    doc: dict[str, Any] = {
        "settings": {"scripts": args.scripts, "replicas": replicas, "seeds": seeds, "quick": args.quick,
                     "refit_interval_s": args.refit_interval, "acc_tolerance": ACC_TOLERANCE,
                     "max_reversals": MAX_REVERSALS, "max_ratio": MAX_RATIO, "out": str(out)},
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "python": platform.python_version()},
        "scripts": {},
    }
    interrupted = False
    try:
        for name in args.scripts:
            script = SCRIPTS[name]
            if not has_fixed_flag(script):
                progress(f"{name}: skipped, {script.path} has no --fixed flag")
                doc["scripts"][name] = {"skipped": f"{script.path} has no --fixed flag"}
                continue
            rows: list[dict[str, Any]] = []
            jobs: dict[str, Any] = {}
            doc["scripts"][name] = {"runs": rows, "jobs": jobs}     # filled in as jobs finish
            for k in replicas:
                for seed in seeds:
                    rng = random.Random(f"{name}/{k}/{seed}")
                    lo, hi = script.quick_window if args.quick else script.window
                    plan = Preemption("after-change", lo=lo, fallback=rng.uniform(lo, hi),
                                      delay=rng.uniform(1, 4))
                    base = out / name / f"K{k}-s{seed}"
                    adaptive = run_job(name, script, "adaptive", k, seed, base / "adaptive", args.quick, plan,
                                       args.refit_interval, args.timeout)
                    progress(job_line(name, k, seed, adaptive))
                    when = adaptive["sigterm_after_s"]
                    fixed_plan = Preemption("none") if when is None else Preemption("at", at=when)
                    fixed = run_job(name, script, "fixed", k, seed, base / "fixed", args.quick, fixed_plan,
                                    args.refit_interval, args.timeout)
                    progress(job_line(name, k, seed, fixed))
                    row = {"replicas": k, "seed": seed, **compare(adaptive, fixed)}
                    rows.append(row)
                    jobs[f"K{k}-s{seed}"] = {"adaptive": strip_runs(adaptive), "fixed": strip_runs(fixed)}
                    progress(f"{name} K={k} seed={seed}: acc {fmt(row['acc_adaptive'], '.4f')} vs "
                             f"{fmt(row['acc_fixed'], '.4f')}, time to fixed's acc "
                             f"{fmt(row['tta_adaptive_s'], '.1f')} s vs {row['fixed_total_s']:.1f} s, "
                             f"reversals {row['reversals']}, "
                             f"max step-time ratio {fmt(row['ratio_max_two_sided'])}; pass {row['pass']}")
    except KeyboardInterrupt as exc:
        interrupted = True
        progress(f"interrupted ({exc}); killing the remaining processes")
    finally:
        kill_all()
    for entry in doc["scripts"].values():
        if "runs" in entry:
            entry["summary"] = summarise(entry["runs"])
    summaries = [s["summary"]["overall"] for s in doc["scripts"].values() if "summary" in s]
    doc["overall"] = None if interrupted or not summaries else overall(summaries)
    doc["interrupted"] = interrupted
    doc["elapsed_s"] = time.time() - started
    (out / "result.json").write_text(json.dumps(doc, indent=1))
    compact = {k: v for k, v in doc.items() if k != "scripts"}
    compact["scripts"] = {n: {k: v for k, v in s.items() if k != "jobs"} for n, s in doc["scripts"].items()}
    if args.json:
        print(json.dumps(compact))
    else:
        for name, s in doc["scripts"].items():
            if "skipped" in s:
                print(f"{name}: skipped ({s['skipped']})")
                continue
            print(f"{name}:")
            for r in s["runs"]:
                print(f"  K={r['replicas']} seed={r['seed']}: acc {fmt(r['acc_adaptive'], '.4f')} vs fixed "
                      f"{fmt(r['acc_fixed'], '.4f')}; to fixed's acc {fmt(r['tta_adaptive_s'], '.1f')} s vs "
                      f"{r['fixed_total_s']:.1f} s; reversals {r['reversals']}; step-time ratio "
                      f"{fmt(r['ratio_max_two_sided'])}; batch {r['batch_sizes_adaptive']}")
            print(f"  summary: {s['summary']}")
        print(f"overall: {doc['overall']}  (details in {out / 'result.json'})")
    return 130 if interrupted else 0


if __name__ == "__main__":
    sys.exit(main())

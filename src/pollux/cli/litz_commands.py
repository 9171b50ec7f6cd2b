"""``pollux litz run``: run a Litz application (``pollux.litz``) on this machine, with progress.

The command starts a private Ray cluster on loopback (one CPU per core, no dashboard), runs the
application with :class:`pollux.litz.runtime.LitzRuntime`, prints a progress line on stderr for every
report of the driver (iteration, objective, workers, tasks/s) and a summary on stdout (text, or one
JSON object with ``--json``), and shuts Ray down again, waiting until none of its processes is left.
``--local`` runs the sequential reference runtime (:func:`pollux.litz.local.run_local`) instead: no
Ray, deterministic. When the caller (Python code, a test) has already initialised Ray, the command
uses that cluster and leaves it running.

The application is ``mlr``, ``lda``, ``kmeans``, ``hdbscan`` or ``FILE.py:FACTORY`` / ``MODULE:FACTORY`` (a
function returning an :class:`~pollux.litz.api.Application`; ``docs/litz.md`` writes one).
``--set KEY=VALUE`` overrides one config key, typed from the key's default (for a factory: from its
keyword defaults); a key the application does not know, or a value of the wrong type, is a usage
error naming the key (exit 2).
``hdbscan`` clusters ``--data FILE`` (``.npy`` or ``.csv``) or a generated set (``--points``, ``--dims``,
``--clusters``, ``--noise``) and writes its labels to ``--out`` (``.npy``, or ``.csv`` one per line).
Which application and its config: :mod:`pollux.cli.litz_apps`. ``--memory-budget`` keeps each worker's
executors within a number of bytes, the rest on local disk (out-of-core execution, ``docs/litz.md``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

from pollux import raylink
from pollux.cli.errors import CliError
from pollux.cli.formatting import escape_lines
from pollux.cli.litz_apps import build_config, make_application, resolve_app
from pollux.cli.parser import _typed, command, nonnegative_int, positive_float, positive_int

# ------------------------------------------------------------------------------ progress

class Progress:
    """Prints one stderr line per driver report; remembers the last for tasks/s."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.last_t = 0.0
        self.last_version = 0
        self.lock = threading.Lock()

    def say(self, text: str) -> None:
        if not self.quiet:
            with self.lock:
                print(escape_lines(text), file=sys.stderr, flush=True)

    def __call__(self, row: Mapping[str, Any]) -> None:
        t, version = float(row.get("t", 0.0)), int(row.get("version", 0))
        dt = t - self.last_t
        rate = (version - self.last_version) / dt if dt > 0 else 0.0
        self.last_t, self.last_version = t, version
        extra = "".join(f"  {k} {_num(v)}" for k, v in row.items()
                        if k not in ("t", "version", "iteration", "objective", "workers", "shards"))
        self.say(f"[{t:7.2f}s] iteration {row.get('iteration', '?')}  objective "
                 f"{_num(row.get('objective'))}  workers {row.get('workers', 1)}  tasks/s {rate:.1f}{extra}")


def _num(v: Any) -> str:
    return f"{v:.6g}" if isinstance(v, float) else str(v)


def _parse_resize(text: str) -> tuple[float, int]:
    """``--resize-at T:N``: seconds after the start, and the new number of workers."""
    t, sep, n = text.partition(":")
    try:
        when, workers = float(t), int(n)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected SECONDS:WORKERS, got {text}") from None
    if not sep or not math.isfinite(when) or when < 0 or workers < 1:
        raise argparse.ArgumentTypeError(f"expected SECONDS >= 0 and WORKERS >= 1, got {text}")
    return when, workers


# ------------------------------------------------------------------------------ running

def run_on_ray(app: Any, args: argparse.Namespace, progress: Progress) -> Any:
    """Start (or join) Ray, run with `LitzRuntime`, resize on schedule; always stop what it started."""
    try:
        import ray
    except ImportError:
        raise CliError("Ray is not installed here; run with --local, or install ray") from None
    from pollux.litz.records import RuntimeConfig
    from pollux.litz.runtime import LitzRuntime

    try:
        cfg = RuntimeConfig(num_executors=args.executors, num_workers=args.workers, num_shards=args.shards,
                            seed=args.seed or 0, checkpoint_dir=args.checkpoint_dir,
                            checkpoint_every_s=args.checkpoint_every, task_floor_s=args.task_floor,
                            memory_budget_bytes=args.memory_budget, out_of_core_policy=args.ooc_policy,
                            spill_dir=args.spill_dir)
    except ValueError as exc:
        raise CliError(str(exc), usage=True) from exc
    owned = not _ray_running(ray)
    if owned:
        cpus = os.cpu_count() or 1
        progress.say(f"starting a local Ray cluster ({cpus} CPUs, loopback) ...")
        raylink.start_local(cpus)
    for name, module in list(sys.modules.items()):  # a user's file: workers cannot import it
        if name.startswith("pollux_litz_user_"):
            ray.cloudpickle.register_pickle_by_value(module)
    rt = LitzRuntime(app, cfg)
    watch = _Watch(rt, sorted(args.resize_at or []), progress)
    try:
        progress.say(f"running {app.name} on Ray: {cfg.num_workers} worker(s), {cfg.num_shards} shard(s), "
                     f"{cfg.num_executors} executors")
        watch.thread.start()
        summary = rt.run(on_progress=progress)
        watch.stop()
        watch.show(summary.resizes, final=True)  # those that ended after the last look, or never
        return summary
    finally:
        watch.stop()
        if owned:
            ray.shutdown()
            _wait_for_children()


def _ray_running(ray: Any) -> bool:
    """Whether the calling process has Ray initialised already (then the command leaves it be)."""
    return bool(ray.is_initialized())


class _Watch:
    """Asks for the ``--resize-at`` resizes on time, and prints a line when a resize completes (the
    driver's reports do not say). Its clock starts when the first micro-task has completed, so that
    the time Ray takes to start the actors (seconds on a busy machine) does not eat the schedule."""

    def __init__(self, rt: Any, schedule: list[tuple[float, int]], progress: Progress) -> None:
        self.rt, self.todo, self.progress = rt, list(schedule), progress
        self.seen = 0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._body, name="litz-cli-watch", daemon=True)

    def _body(self) -> None:
        start: float | None = None
        while not self.done.wait(0.05):
            status = self.rt.status()
            if not status.get("running") or not status.get("tasks_completed"):
                continue  # the clock starts at the first completed micro-task, after Ray's start-up
            now = time.monotonic()
            start = now if start is None else start
            while self.todo and now - start >= self.todo[0][0]:
                self.rt.resize(num_workers=self.todo.pop(0)[1])
            self.show(status.get("resizes", []))

    def show(self, resizes: list[dict[str, Any]], final: bool = False) -> None:
        finished = [r for r in resizes if final or r.get("t_done") is not None or r.get("error")]
        for r in finished[self.seen:]:
            self.progress.say(_resize_text(r))
        self.seen = max(self.seen, len(finished))

    def stop(self) -> None:
        self.done.set()
        if self.thread.is_alive():
            self.thread.join(5.0)


def _resize_text(r: Mapping[str, Any]) -> str:
    what = f"{r.get('kind', 'workers')} {r.get('from')} -> {r.get('to')}"
    if r.get("error"):
        return f"resize {what}: {r['error']}"
    t0 = float(r.get("t_trigger") or 0.0)
    if r.get("t_done") is None:
        return f"resize {what} asked at {t0:.2f}s: not complete when the run ended"
    t1 = float(r["t_done"])
    moved = f", moved {r['moved']}" if "moved" in r else ""
    return f"resize {what} at {t0:.2f}s, done in {t1 - t0:.2f}s{moved}"


def _wait_for_children(timeout_s: float = 20.0) -> None:
    """Wait until Ray's processes (children of this one) are gone, so none is left behind."""
    from pollux.cluster.backends.processes import descendants

    deadline = time.monotonic() + timeout_s
    while descendants(os.getpid()) and time.monotonic() < deadline:
        time.sleep(0.1)


def summary_dict(app: Any, args: argparse.Namespace, s: Any) -> dict[str, Any]:
    """The run as one JSON-able object (the fields listed in ``docs/cli.md``)."""
    hits, misses = int(s.cache_hits), int(s.cache_misses)
    final = dict(s.final)
    return _jsonable({
        "app": app.name,
        "runtime": "local" if args.local else "ray",
        "config": dict(app.config),
        "executors": args.executors,
        "workers": int(s.num_workers) if not args.local else 1,
        "shards": int(s.num_shards) if not args.local else 1,
        "wall_s": float(s.wall_s),
        "objective": final.get("objective"),
        "iterations": final.get("iterations"),
        "final": final,
        "tasks_completed": int(s.tasks_completed),
        "tasks_per_s": s.tasks_completed / s.wall_s if s.wall_s > 0 else 0.0,
        "resizes": list(s.resizes),
        "checkpoints": {"dir": args.checkpoint_dir, "saved": int(s.checkpoints_saved),
                        "loaded": int(s.checkpoints_loaded), "recoveries": int(s.recoveries)},
        "cache": {"hits": hits, "misses": misses,
                  "hit_rate": hits / (hits + misses) if hits + misses else None},
        "metrics": list(s.metrics),
        "out_of_core": {"budget_bytes": getattr(args, "memory_budget", None),
                        "evictions": int(s.ooc_evictions), "reloads": int(s.ooc_reloads),
                        "prefetches": int(s.ooc_prefetches), "bytes_written": int(s.ooc_bytes_written),
                        "bytes_read": int(s.ooc_bytes_read), "wait_s": float(s.ooc_wait_s),
                        "peak_bytes": int(s.ooc_peak_bytes)},
    })


def _jsonable(value: Any) -> Any:
    """Plain JSON: numpy scalars and arrays as numbers and lists, NaN and infinities as null."""
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "tolist"):
        return _jsonable(value.tolist())
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _out_of_core_text(ooc: Mapping[str, Any]) -> str:
    """One summary line of a run under a memory budget: what was evicted and read back."""
    return (f"out of core (budget {ooc['budget_bytes']} B a worker): {ooc['evictions']} evictions, "
            f"{ooc['reloads']} reloads ({ooc['prefetches']} ahead of their task), "
            f"{ooc['bytes_written']} B written, {ooc['bytes_read']} B read, peak {ooc['peak_bytes']} B")


def summary_text(d: Mapping[str, Any]) -> str:
    rate = d["cache"]["hit_rate"]
    lines = [
        f"{d['app']} ({d['runtime']}): objective {_num(d['objective'])} after {d['iterations']} "
        f"iteration(s) in {d['wall_s']:.2f} s",
        f"  workers {d['workers']}, shards {d['shards']}, executors {d['executors']}; "
        f"{d['tasks_completed']} tasks ({d['tasks_per_s']:.1f}/s)",
    ]
    lines += [f"  {_resize_text(r)}" for r in d["resizes"]]
    ck = d["checkpoints"]
    if ck["dir"] or ck["saved"] or ck["loaded"]:
        lines.append(f"  checkpoints saved {ck['saved']}, loaded {ck['loaded']}, recoveries "
                     f"{ck['recoveries']} ({ck['dir']})")
    if d["out_of_core"]["budget_bytes"] is not None:
        lines.append(f"  {_out_of_core_text(d['out_of_core'])}")
    lines.append(f"  parameter cache: {d['cache']['hits']} hits, {d['cache']['misses']} misses"
                 + (f" (hit rate {rate:.0%})" if rate is not None else ""))
    extra = {k: v for k, v in d["final"].items() if k not in ("objective", "iterations")}
    for k, v in extra.items():
        if isinstance(v, list) and v and all(isinstance(row, list) for row in v):  # LDA's top words
            lines.append(f"  {k}:")
            lines += [f"    {i}: {' '.join(_num(x) for x in row)}" for i, row in enumerate(v)]
        else:
            lines.append(f"  {k}: {_num(v) if not isinstance(v, list) else json.dumps(v)[:200]}")
    return "\n".join(lines)


def cmd_litz_run(args: argparse.Namespace) -> int:
    if args.local and (args.resize_at or args.checkpoint_dir or args.task_floor):
        raise CliError("--local runs in one process: --resize-at, --checkpoint-dir and --task-floor "
                       "need the Ray runtime", usage=True)
    if args.local and (args.memory_budget is not None or args.spill_dir):
        raise CliError("--local keeps every executor in memory: --memory-budget and --spill-dir need the "
                       "Ray runtime", usage=True)
    if args.checkpoint_every is not None and not args.checkpoint_dir:
        raise CliError("--checkpoint-every needs --checkpoint-dir", usage=True)
    choice = resolve_app(args.app)
    config = build_config(choice, args)
    if args.executors is None:
        args.executors = 4 * args.workers
    app = make_application(choice, config, args.executors)
    progress = Progress(args.quiet)
    from pollux.litz.api import LitzError

    try:
        if args.local:
            from pollux.litz.local import run_local

            progress.say(f"running {app.name} locally (sequential reference runtime), "
                         f"{args.executors} executors")
            summary = run_local(app, args.executors, seed=args.seed or 0, on_progress=progress)
        else:
            summary = run_on_ray(app, args, progress)
    except LitzError as exc:
        raise CliError(str(exc)) from exc
    if choice.name == "hdbscan":
        _write_labels(summary.final, args.out)
    data = summary_dict(app, args, summary)
    if args.json:
        print(json.dumps(data))
    else:
        print(summary_text(data))
    return 0


def _write_labels(final: dict[str, Any], out: str | None) -> None:
    """Take hdbscan's labels out of the summary (one per point: too long to print) and write them to
    ``out``: ``.csv`` as one label per line, anything else with numpy's ``.npy`` format."""
    import numpy as np

    labels = np.asarray(final.pop("labels", np.zeros(0, dtype=np.int64)), dtype=np.int64)
    if out is None:
        return
    try:
        if out.lower().endswith(".csv"):
            np.savetxt(out, labels, fmt="%d")
        else:
            with open(out, "wb") as fh:  # exactly this name (np.save would add .npy to another)
                np.save(fh, labels)
    except OSError as exc:
        raise CliError(f"--out {out}: cannot write the labels ({exc.strerror or exc})") from exc
    final["labels_file"] = out


#: The suffixes --memory-budget takes, as multiples of a byte.
BYTE_SUFFIXES = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def _byte_size(text: str) -> int:
    """``--memory-budget``: a positive number of bytes, optionally with a K, M or G suffix (powers of 2)."""
    body = text.strip().upper().removesuffix("B")
    suffix = body[-1:] if body[-1:] in BYTE_SUFFIXES else ""
    try:
        value = float(body[: len(body) - len(suffix)]) * BYTE_SUFFIXES[suffix]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a size like 500M or 2G, got {text!r}") from None
    if not math.isfinite(value) or value < 1:
        raise argparse.ArgumentTypeError(f"expected a size of at least one byte, got {text!r}")
    return int(value)


def add_litz_commands(sub: Any) -> None:
    """Add ``litz run`` to the subcommands ``sub``."""
    p = sub.add_parser("litz", help="run Litz applications (elastic parameter-server jobs)",
                       description="Litz: ML programs as micro-tasks on executors with a sharded "
                                   "parameter server, resizable while they run (docs/litz.md).")
    lsub = p.add_subparsers(dest="litz_command", required=True)
    r = lsub.add_parser("run", help="run mlr, lda, kmeans, hdbscan or your own application on this machine",
                        description="Run a Litz application on a private local Ray cluster (or with "
                                    "--local in this process), with progress on stderr and a summary.")
    r.add_argument("app", metavar="APP",
                   help="mlr, lda, kmeans, hdbscan, or FILE.py:FACTORY / MODULE:FACTORY (a function "
                        "returning an Application)")
    r.add_argument("--workers", type=positive_int, metavar="N", default=2, help="worker actors (default 2)")
    r.add_argument("--shards", type=positive_int, metavar="N", default=2,
                   help="parameter-server shards (default 2)")
    r.add_argument("--executors", type=positive_int, metavar="N", default=None,
                   help="logical executors (default 4 per worker)")
    r.add_argument("--staleness", type=nonnegative_int, default=None, metavar="S",
                   help="SSP staleness (config key 'staleness')")
    r.add_argument("--iterations", type=positive_int, default=None, metavar="N",
                   help="iterations (config 'iterations'; for lda its epochs)")
    r.add_argument("--epochs", type=positive_float, default=None, metavar="N",
                   help="passes over the data (config 'epochs')")
    r.add_argument("--seed", type=int, default=None, metavar="S",
                   help="seed of the data, the app and the layout (default 0)")
    r.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override one config key, typed from its default (repeatable)")
    r.add_argument("--local", action="store_true",
                   help="the sequential reference runtime in this process (no Ray)")
    r.add_argument("--checkpoint-dir", metavar="DIR", help="take consistent checkpoints into DIR")
    r.add_argument("--checkpoint-every", type=positive_float, default=None, metavar="S",
                   help="seconds between checkpoints (default: only the one at the start)")
    r.add_argument("--resize-at", type=_parse_resize, action="append", metavar="T:N",
                   help="resize to N workers T seconds after the first micro-task completed (repeatable)")
    r.add_argument("--task-floor", type=_typed("seconds", float, lambda v: math.isfinite(v) and v >= 0,
                                               "a number >= 0"),
                   default=0.0, metavar="S",
                   help="pad every micro-task to >= S seconds: an emulated node speed (default 0)")
    m = r.add_argument_group("out of core", "executors beyond a memory budget wait on local disk (Ray only)")
    m.add_argument("--memory-budget", type=_byte_size, default=None, metavar="SIZE",
                   help="bytes of executors each worker keeps in memory: a number, or with K, M or G "
                        "(default: no limit)")
    m.add_argument("--ooc-policy", choices=("litz", "lru"), default="litz",
                   help="which executor to evict: litz (none with queued tasks first, load ahead; the "
                        "default) or lru (least recently used, load on demand)")
    m.add_argument("--spill-dir", metavar="DIR", default=None,
                   help="where evicted executors go (default: the system's temporary folder)")
    h = r.add_argument_group("hdbscan", "the points to cluster and where the labels go (hdbscan only)")
    h.add_argument("--data", metavar="FILE", default=None,
                   help="cluster the vectors in FILE (.npy, or .csv: one point per line) instead of a "
                        "generated set")
    h.add_argument("--points", type=positive_int, default=None, metavar="N",
                   help="generated set: points (config 'n', default 10000)")
    h.add_argument("--dims", type=positive_int, default=None, metavar="D",
                   help="generated set: dimensions (config 'dim', default 10)")
    h.add_argument("--clusters", type=positive_int, default=None, metavar="C",
                   help="generated set: Gaussian clusters (config 'clusters', default 100)")
    h.add_argument("--noise", type=_typed("fraction", float, lambda v: 0.0 <= v < 1.0, "a number in [0, 1)"),
                   default=None, metavar="F", help="generated set: fraction of uniform noise (default 0.2)")
    h.add_argument("--out", metavar="FILE", default=None,
                   help="write the labels (-1 noise) to FILE: .npy, or .csv with one per line")
    r.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    r.add_argument("--quiet", action="store_true", help="no progress lines")
    command(r, cmd_litz_run)

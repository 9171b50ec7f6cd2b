"""``pollux litz run``: run a Litz application (``pollux.litz``) on this machine, with progress.

The command starts a private Ray cluster on loopback (one CPU per core, no dashboard), runs the
application with :class:`pollux.litz.runtime.LitzRuntime`, prints a progress line on stderr for every
report of the driver (iteration, objective, workers, tasks/s) and a summary on stdout (text, or one
JSON object with ``--json``), and shuts Ray down again, waiting until none of its processes is left.
``--local`` runs the sequential reference runtime (:func:`pollux.litz.local.run_local`) instead: no
Ray, deterministic. When the caller (Python code, a test) has already initialised Ray, the command
uses that cluster and leaves it running.

The application is ``mlr``, ``lda`` or ``FILE.py:FACTORY`` / ``MODULE:FACTORY`` (a function returning
an :class:`~pollux.litz.api.Application`; ``docs/litz.md`` writes one). ``--set KEY=VALUE`` overrides
one config key, typed from the key's default (for a factory: from its keyword defaults); a key the
application does not know, or a value of the wrong type, is a usage error naming the key (exit 2).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import json
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pollux import raylink
from pollux.cli.errors import CliError
from pollux.cli.formatting import escape_lines
from pollux.cli.parser import _typed, command, nonnegative_int, positive_float, positive_int

#: Config keys of the bundled applications and their defaults (from the apps' module docstrings).
#: A ``None`` default is given as its type: the key is off unless set.
MLR_KEYS: dict[str, Any] = {
    "dataset": "gaussian", "n": 4000, "d": 20, "classes": 5, "separation": 1.5, "seed": 0,
    "batch_size": 32, "lr": 0.5, "l2": 0.0, "staleness": 0, "iterations": 100, "epochs": float,
    "target_loss": float, "report_every": 10, "double_buffer": bool,
}
LDA_KEYS: dict[str, Any] = {
    "corpus": "synthetic", "num_docs": 600, "vocab_size": 200, "true_topics": 10, "doc_length": 80,
    "gen_alpha": 0.1, "gen_beta": 0.05, "max_vocab": 2000, "min_df": 5, "max_df": 0.1,
    "min_doc_tokens": 20, "max_files": int, "num_topics": 12, "alpha": 0.1, "beta": 0.01,
    "num_blocks": int, "epochs": 30, "seed": 0, "word_share": int, "top_words": 10,
}
#: Any type at all (a factory's keyword without a default, or with a ``None`` one).
ANY = object

#: The options that set a config key, and the key (LDA's iterations are its epochs).
OPTION_KEYS = {"iterations": "iterations", "epochs": "epochs", "staleness": "staleness", "seed": "seed"}


@dataclass
class AppChoice:
    """The application to run: its name, its factory and its config keys with defaults or types."""

    name: str
    factory: Callable[..., Any]
    keys: dict[str, Any]
    open_keys: bool = False  # the factory takes **config: unknown keys cannot be detected


# ------------------------------------------------------------------------------ the application

def resolve_app(spec: str) -> AppChoice:
    """``mlr``, ``lda``, ``path/to/file.py:factory`` or ``package.module:factory``."""
    if spec in ("mlr", "lda"):
        from pollux.litz.apps import APPS

        return AppChoice(spec, APPS[spec], dict(MLR_KEYS if spec == "mlr" else LDA_KEYS))
    where, sep, name = spec.rpartition(":")
    if not sep or not where or not name.isidentifier():
        raise CliError(f"application {spec!r}: expected mlr, lda, FILE.py:FACTORY or MODULE:FACTORY",
                       usage=True)
    module = _load_module(where)
    factory = getattr(module, name, None)
    if not callable(factory):
        raise CliError(f"application {spec!r}: {where} has no function {name!r}", usage=True)
    keys: dict[str, Any] = {}
    open_keys = False
    for p in inspect.signature(factory).parameters.values():
        if p.kind is inspect.Parameter.VAR_KEYWORD:
            open_keys = True
        elif p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY):
            keys[p.name] = ANY if p.default is inspect.Parameter.empty or p.default is None else p.default
    return AppChoice(name, factory, keys, open_keys)


def _load_module(where: str) -> Any:
    """Import a file (registered under a private name) or a module; Ray workers get it by value."""
    try:
        if where.endswith(".py"):
            path = Path(where)
            if not path.is_file():
                raise CliError(f"application file {where}: no such file", usage=True)
            mod_name = f"pollux_litz_user_{path.stem}"
            spec = importlib.util.spec_from_file_location(mod_name, path)
            if spec is None or spec.loader is None:
                raise CliError(f"application file {where}: cannot be imported", usage=True)
            module = importlib.util.module_from_spec(spec)
            sys.modules[mod_name] = module
            spec.loader.exec_module(module)
            return module
        return importlib.import_module(where)
    except ImportError as exc:
        raise CliError(f"application module {where}: {exc}", usage=True) from exc


def parse_value(key: str, text: str, default: Any) -> Any:
    """``text`` as the type of ``default`` (a value, a type, or :data:`ANY`); ``none`` turns an
    optional key off. A usage error names the key."""
    kind = default if isinstance(default, type) else type(default)
    optional = isinstance(default, type)
    low = text.strip().lower()
    if optional and low in ("none", "null", ""):
        return None
    try:
        if kind is bool:
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise ValueError(text)
        if kind is int:
            return int(text)
        if kind is float:
            value = float(text)
            if not math.isfinite(value):
                raise ValueError(text)
            return value
        if kind is str:
            return text
        return _guess(text)
    except ValueError:
        raise CliError(f"--set {key}={text}: expected {kind.__name__ if kind is not ANY else 'a value'}"
                       f"{' or none' if optional else ''}", usage=True) from None


def _guess(text: str) -> Any:
    """A value of a key whose type is unknown: int, float, bool, none, else the string."""
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    return text


def build_config(choice: AppChoice, args: argparse.Namespace) -> dict[str, Any]:
    """The config overrides from ``--set`` and the shortcut options, checked against the app's keys."""
    config: dict[str, Any] = {}
    for item in args.set or []:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise CliError(f"--set {item}: expected KEY=VALUE", usage=True)
        if key not in choice.keys and not choice.open_keys:
            raise CliError(f"--set {key}: unknown config key of {choice.name} (known: "
                           f"{', '.join(sorted(choice.keys))})", usage=True)
        config[key] = parse_value(key, text, choice.keys.get(key, ANY))
    if args.iterations is not None and args.epochs is not None:
        raise CliError("--iterations and --epochs: give one of them", usage=True)
    for option, key in OPTION_KEYS.items():
        value = getattr(args, option)
        if value is None:
            continue
        if choice.name == "lda" and option == "iterations":
            key = "epochs"  # an LDA iteration is an epoch of Gibbs sampling
        if key not in choice.keys and not choice.open_keys:
            raise CliError(f"--{option}: the {choice.name} application has no {key!r} setting", usage=True)
        if key in config:
            raise CliError(f"--{option} and --set {key}=...: give one of them", usage=True)
        default = choice.keys.get(key, ANY)
        if (default is int or type(default) is int) and isinstance(value, float):
            if not value.is_integer():
                raise CliError(f"--{option}: {choice.name}'s {key!r} is a whole number, got {value:g}",
                               usage=True)
            value = int(value)
        config[key] = value
    return config


def make_application(choice: AppChoice, config: Mapping[str, Any], num_executors: int) -> Any:
    """Build the app and its driver once (data and layout checks) before any Ray process starts."""
    from pollux.litz.api import Application

    try:
        app = choice.factory(**config)
        if not isinstance(app, Application):
            raise CliError(f"application {choice.name}: the factory returned {type(app).__name__}, "
                           "not a pollux.litz.api.Application", usage=True)
        app.driver(num_executors, app.config).tables()
    except (ValueError, TypeError, KeyError) as exc:
        text = str(exc)
        raise CliError(text if choice.name.lower() in text.lower() else f"{choice.name} config: {text}",
                       usage=True) from exc
    return app


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
                            checkpoint_every_s=args.checkpoint_every, task_floor_s=args.task_floor)
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
    data = summary_dict(app, args, summary)
    if args.json:
        print(json.dumps(data))
    else:
        print(summary_text(data))
    return 0


def add_litz_commands(sub: Any) -> None:
    """Add ``litz run`` to the subcommands ``sub``."""
    p = sub.add_parser("litz", help="run Litz applications (elastic parameter-server jobs)",
                       description="Litz: ML programs as micro-tasks on executors with a sharded "
                                   "parameter server, resizable while they run (docs/litz.md).")
    lsub = p.add_subparsers(dest="litz_command", required=True)
    r = lsub.add_parser("run", help="run mlr, lda or your own application on this machine",
                        description="Run a Litz application on a private local Ray cluster (or with "
                                    "--local in this process), with progress on stderr and a summary.")
    r.add_argument("app", metavar="APP",
                   help="mlr, lda, or FILE.py:FACTORY / MODULE:FACTORY (a function returning an Application)")
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
    r.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    r.add_argument("--quiet", action="store_true", help="no progress lines")
    command(r, cmd_litz_run)

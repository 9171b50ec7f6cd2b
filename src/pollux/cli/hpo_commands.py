"""``pollux hpo run`` and ``pollux hpo show``: an Optuna study whose trials are jobs on the live
service (``docs/hpo.md``).

``run`` builds the trials' job from its options as ``pollux submit`` does, makes or reopens the
study in its storage (``--storage``, by default ``./pollux-hpo.db``), and hands both to
:class:`pollux.hpo.runner.StudyRunner`; progress goes to stderr (a live view on a terminal, event
lines elsewhere), the final table of trials, best first, to stdout. Ctrl-C asks the driver to stop:
it cancels the running trials' jobs and queues their parameters again, prints the table, and exits
130; a second Ctrl-C stops at once (the study stays resumable either way). ``show`` prints the same
table for any study in a storage, running or not.

Optuna and the driver are imported only when a command runs, so the other ``pollux`` commands do
not pay for them.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pollux.cli.errors import EXIT_INTERRUPTED, CliError
from pollux.cli.formatting import duration, escape, escape_lines, table
from pollux.cli.parser import command, nonnegative_int, positive_float, positive_int
from pollux.cli.service_access import client_of, json_option, service_options
from pollux.cli.terminal import is_terminal

if TYPE_CHECKING:
    import optuna

__all__ = ["add_hpo_commands"]

#: Longest study name: its jobs are named ``<study>-t<number>`` and a job name may have 200 characters.
MAX_STUDY_CHARS = 180
TABLE_HEADERS = ["TRIAL", "STATE", "VALUE", "PARAMS", "JOB", "DURATION"]


def _study_name(args: argparse.Namespace) -> str:
    name = args.study if args.study is not None else Path(args.script).stem
    if not name or len(name) > MAX_STUDY_CHARS or not name.isprintable():
        raise CliError(f"--study: expected a name of 1 to {MAX_STUDY_CHARS} printable characters, "
                       f"got {name!r}", usage=True)
    return name


def _template(args: argparse.Namespace) -> dict[str, Any]:
    """The job spec every trial shares, from the options ``pollux submit`` also takes."""
    from pollux.cli.cluster_commands import script_spec

    return script_spec(args)


def _open(url: str, create: bool) -> Any:
    """The storage at ``url``; a missing SQLite file is an error unless ``create``."""
    from pollux.hpo.storage import SQLITE_PREFIX, open_storage

    if not create and url.startswith(SQLITE_PREFIX) and not Path(url[len(SQLITE_PREFIX):]).is_file():
        raise CliError(f"--storage: no study database at {url[len(SQLITE_PREFIX):]}")
    try:
        return open_storage(url)
    except Exception as exc:        # SQLAlchemy's and Optuna's errors: a bad URL, a missing driver
        raise CliError(f"--storage {url}: cannot open it: {' '.join(str(exc).split())[:300]}") from None


def _quiet_optuna() -> None:
    """Optuna logs every trial at INFO; the display says what matters."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)


def _rows_text(study: optuna.Study, terminal: bool) -> str:
    """The table of trials, best first, then one line per failed trial with its reason."""
    from optuna.study import StudyDirection

    from pollux.hpo.summary import format_params, trial_rows

    rows = trial_rows(study.get_trials(deepcopy=False), study.direction == StudyDirection.MAXIMIZE)
    if not rows:
        return "no trials"
    cells = [[row.number, row.state.lower() + (" (requeued)" if row.requeued else ""),
              "-" if row.value is None else f"{row.value:.6g}", format_params(row.params), row.job or "-",
              duration(row.duration_s)] for row in rows]
    lines = [table(TABLE_HEADERS, cells, right=(0, 2, 5), terminal=terminal)]
    lines += [f"trial {row.number}: {escape(row.failure)}" for row in rows if row.failure]
    return "\n".join(lines)


def _summary(study: optuna.Study, storage_url: str) -> dict[str, Any]:
    from optuna.study import StudyDirection

    from pollux.hpo.summary import best_trial, state_counts, trial_rows

    trials = study.get_trials(deepcopy=False)
    maximize = study.direction == StudyDirection.MAXIMIZE
    best = best_trial(trials, maximize)
    return {"study": study.study_name, "storage": storage_url, "direction": study.direction.name.lower(),
            "counts": asdict(state_counts(trials)),
            "best": None if best is None else {"number": best.number, "value": best.value,
                                               "params": best.params},
            "trials": [asdict(row) for row in trial_rows(trials, maximize)]}


def _print_study(study: optuna.Study, storage_url: str, as_json: bool) -> None:
    if as_json:
        print(json.dumps(_summary(study, storage_url)))
        return
    summary = _summary(study, storage_url)
    counts = summary["counts"]
    print(f"study {escape(study.study_name)} ({summary['direction']}) in {escape(storage_url)}: "
          f"{counts['complete']} complete, {counts['pruned']} pruned, {counts['failed']} failed, "
          f"{counts['running']} running" + (f", {counts['requeued']} requeued" if counts["requeued"] else ""))
    best = summary["best"]
    if best is not None:
        from pollux.hpo.summary import format_params

        params = escape(format_params(best["params"]))
        print(f"best: trial {best['number']}, value {best['value']:.6g}, {params}")
    print(_rows_text(study, is_terminal(sys.stdout)))


def cmd_hpo_run(args: argparse.Namespace) -> int:
    from pollux.hpo.display import StudyDisplay
    from pollux.hpo.runner import RunnerConfig, StudyRunner
    from pollux.hpo.space import SpaceError, load_space
    from pollux.hpo.storage import storage_url
    from pollux.hpo.study import StudyError, StudyOptions, open_study
    from pollux.hpo.trial_job import JobTemplate

    name = _study_name(args)
    template = JobTemplate(_template(args))
    try:
        space = load_space(args.space)
    except SpaceError as exc:
        raise CliError(str(exc)) from None
    url = storage_url(args.storage)
    options = StudyOptions(name=name, storage_url=url, direction=args.direction, sampler=args.sampler,
                           pruner=args.pruner, seed=args.seed, startup_trials=args.pruner_startup_trials,
                           warmup_steps=args.pruner_warmup_steps)
    _quiet_optuna()
    with client_of(args) as client:
        client.health()                 # no service: fail before a study file is made
        storage = _open(url, create=True)
        try:
            study = open_study(options, storage)
        except StudyError as exc:
            raise CliError(str(exc)) from None
        config = RunnerConfig(trials=args.trials, concurrent=args.concurrent, poll_s=args.poll)
        display = StudyDisplay(sys.stderr, terminal=is_terminal(sys.stderr) and not args.quiet,
                               escape=escape)
        runner = StudyRunner(study, storage, client, space, template, config, storage_url=url,
                             observer=display if not args.quiet else None)
        previous = _on_interrupt(runner.request_stop)
        try:
            with display:
                result = runner.run()
        except StudyError as exc:
            raise CliError(str(exc)) from None
        finally:
            _restore_interrupt(previous)
    _print_study(study, url, args.json)
    if result.interrupted:
        print(escape_lines(f"interrupted: the running trials were cancelled and queued again; run the "
                           f"same command to resume study {name}"), file=sys.stderr)
        return EXIT_INTERRUPTED
    return 0


def _on_interrupt(stop: Any) -> Any:
    """Make the first Ctrl-C ask the driver to stop, and the next one interrupt at once; the handler
    before (None when not on the main thread, where signals cannot be handled)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        print(file=sys.stderr)
        print("stopping: cancelling the running trials (Ctrl-C again to quit at once)", file=sys.stderr)
        stop()

    return signal.signal(signal.SIGINT, handler)


def _restore_interrupt(previous: Any) -> None:
    if previous is not None:
        signal.signal(signal.SIGINT, previous)


def cmd_hpo_show(args: argparse.Namespace) -> int:
    from pollux.hpo.storage import storage_url
    from pollux.hpo.study import StudyError, load_study

    _quiet_optuna()
    url = storage_url(args.storage)
    storage = _open(url, create=False)
    try:
        study = load_study(args.study, storage)
    except StudyError as exc:
        raise CliError(str(exc)) from None
    _print_study(study, url, args.json)
    return 0


def _storage_option(parser: argparse.ArgumentParser) -> None:
    from pollux.hpo.storage import DEFAULT_STORAGE

    parser.add_argument("--storage", metavar="URL", default=DEFAULT_STORAGE,
                        help="the study's Optuna storage: an SQLite file path or any database URL Optuna "
                             f"takes (default {DEFAULT_STORAGE} in the current folder)")


def add_hpo_commands(sub: Any) -> None:
    """Add ``hpo run`` and ``hpo show`` to ``sub``."""
    from pollux.hpo.study import PRUNERS, SAMPLERS

    common = service_options()
    as_json = json_option()
    p = sub.add_parser("hpo", help="hyper-parameter search: an Optuna study of jobs on the service",
                       description="Hyper-parameter search with Optuna; every trial is a job on the live "
                                   "service (docs/hpo.md).")
    hsub = p.add_subparsers(dest="hpo_command", required=True)
    r = hsub.add_parser("run", parents=[common, as_json], help="run (or resume) a study",
                        usage="pollux hpo run --space FILE --trials N [options] SCRIPT [ARGS ...]",
                        description="Run an Optuna study whose trials are jobs running SCRIPT on the "
                                    "service, at most --concurrent at once, until the study has --trials "
                                    "trials. Run again, it resumes the study. Options come before SCRIPT.")
    r.add_argument("--space", required=True, metavar="FILE", help="the search space (YAML)")
    r.add_argument("--trials", type=positive_int, required=True, metavar="N",
                   help="trials in the study, those of earlier runs included")
    r.add_argument("--concurrent", type=positive_int, default=1, metavar="K",
                   help="trials running at once (default 1)")
    r.add_argument("--direction", choices=("min", "max", "minimize", "maximize"), default="min",
                   help="minimise (default) or maximise the reported value")
    r.add_argument("--pruner", choices=PRUNERS, default="median", help="median (default), hyperband or none")
    r.add_argument("--pruner-startup-trials", type=nonnegative_int, default=5, metavar="N",
                   help="median pruner: finished trials before it prunes (default 5)")
    r.add_argument("--pruner-warmup-steps", type=nonnegative_int, default=0, metavar="N",
                   help="median pruner: steps a trial reports before it may be pruned (default 0)")
    r.add_argument("--sampler", choices=SAMPLERS, default="tpe", help="tpe (default), random or qmc")
    r.add_argument("--seed", type=int, default=0, help="the sampler's seed (default 0)")
    r.add_argument("--study", metavar="NAME", help="the study's name (default: the script's name)")
    _storage_option(r)
    r.add_argument("--poll", type=positive_float, default=1.0, metavar="S",
                   help="seconds between looks at the jobs and the values (default 1)")
    r.add_argument("--quiet", action="store_true", help="no progress on stderr")
    r.add_argument("--batch-size", type=int, required=True, metavar="M0",
                   help="each trial's initial (and minimum) global batch size (required)")
    r.add_argument("--max-batch-size", type=int, metavar="M", help="largest global batch (default: M0)")
    r.add_argument("--local-bsz-bounds", type=int, nargs=2, metavar=("LO", "HI"),
                   help="bounds of the per-GPU batch size")
    r.add_argument("--min-replicas", type=int, metavar="N", help="fewest replicas of a trial (default 0)")
    r.add_argument("--max-replicas", type=int, metavar="N",
                   help="most replicas of a trial (default: no limit)")
    r.add_argument("--gpus-per-replica", type=positive_int, default=1, metavar="G",
                   help="GPUs per replica (default 1)")
    r.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                   help="an environment variable of every trial (repeatable)")
    r.add_argument("--working-dir", metavar="DIR", help="folder the trials run in (default: the current one)")
    r.add_argument("script", metavar="SCRIPT", help="the training script of every trial")
    r.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS", help="arguments of the script")
    command(r, cmd_hpo_run)

    s = hsub.add_parser("show", parents=[as_json], help="show a study's trials",
                        description="A study's trials, best first: state, value, parameters, job and "
                                    "duration, and each failed trial's reason.")
    s.add_argument("study", metavar="STUDY", help="the study's name")
    _storage_option(s)
    command(s, cmd_hpo_show)

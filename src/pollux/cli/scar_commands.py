"""``pollux scar experiment``: SCAR's rework-cost experiments (``docs/scar.md``), pure numpy, no Ray.

One point by default — a model, a lost fraction, a recovery, and optionally a partial checkpoint
strategy and fraction — printed as one line (or JSON). ``--sweep`` runs every point of the thesis's
figures for each model named (or ``all``), checks the issue's acceptance figures, and with
``--plots DIR`` writes ``recovery.png`` and ``strategies.png``. Progress goes to stderr: a bar of
trials done on a terminal (with each sweep point's line above it), plain lines elsewhere.
"""

from __future__ import annotations

import argparse
import json
import sys
from fractions import Fraction
from typing import Any

from pollux.cli.errors import CliError
from pollux.cli.parser import _typed, command, nonnegative_int, positive_int
from pollux.cli.terminal import ProgressBar


def _parse_fraction(text: str) -> float:
    return float(Fraction(text.strip()))


#: "1/8", "0.125": a fraction in (0, 1].
unit_fraction = _typed("fraction", _parse_fraction, lambda v: 0 < v <= 1, "a number in (0, 1] such as 1/8")


def add_scar_commands(sub: Any) -> None:
    """Add ``scar experiment`` and ``scar models`` to the subcommands ``sub``."""
    from pollux.scar.api import STRATEGIES
    from pollux.scar.rework.models.registry import MODELS

    p = sub.add_parser(
        "scar", help="SCAR rework-cost experiments (partial recovery, prioritised checkpoints)",
        description="SCAR: partial recovery and prioritised partial checkpoints (docs/scar.md).")
    ssub = p.add_subparsers(dest="scar_command", required=True)
    m = ssub.add_parser("models", help="list the models of the experiments")
    command(m, _models)
    e = ssub.add_parser(
        "experiment", help="measure rework after a failure (seeded trials, 95 %% intervals)",
        description="Rework-cost experiments of thesis §5.5: trials fail at a geometric iteration and "
                    "lose a random fraction of the parameter blocks; rework = extra iterations to "
                    "reach the unperturbed run's convergence threshold.")
    e.add_argument("--model", action="append", metavar="NAME",
                   help=f"{', '.join(MODELS)} or all (repeatable; default mlr)")
    e.add_argument("--lost", type=unit_fraction, default=0.5, metavar="P",
                   help="fraction of parameter blocks lost (default 1/2)")
    e.add_argument("--recovery", choices=("partial", "full"), default="partial",
                   help="partial: only the lost blocks from the checkpoint; full: everything "
                        "(default partial)")
    e.add_argument("--strategy", choices=STRATEGIES, default="full",
                   help="checkpoint strategy (default full: everything every interval)")
    e.add_argument("--fraction", type=unit_fraction, default=None, metavar="R",
                   help="fraction saved per partial checkpoint, taken 1/R times as often (default 1, or 1/8 "
                        "for a partial strategy)")
    e.add_argument("--layout", default=None, metavar="NAME", help="block layout (default: the model's first)")
    e.add_argument("--trials", type=positive_int, default=100, metavar="N", help="trials (default 100)")
    e.add_argument("--seed", type=nonnegative_int, default=0, metavar="S", help="seed (default 0)")
    e.add_argument("--sweep", action="store_true",
                   help="every point of Figs. 5.7 and 5.9 and the acceptance checks, per model")
    e.add_argument("--plots", metavar="DIR", default=None, help="with --sweep: write PNG figures into DIR")
    e.add_argument("--json", action="store_true", help="print JSON on stdout")
    e.add_argument("--quiet", action="store_true", help="no progress on stderr")
    command(e, _experiment)


def _models(args: argparse.Namespace) -> int:
    from pollux.scar.rework.models.registry import MODELS

    for name, (_module, what) in MODELS.items():
        print(f"{name:<5} {what}")
    return 0


def _names(args: argparse.Namespace) -> list[str]:
    from pollux.scar.rework.models.registry import MODELS

    names = args.model or ["mlr"]
    if "all" in names:
        names = [n for n in MODELS if n != "qp"] if args.sweep else list(MODELS)
    for n in names:
        if n not in MODELS:
            raise CliError(f"--model: expected one of {', '.join(MODELS)} or all, got {n!r}", usage=True)
    return list(dict.fromkeys(names))


def _experiment(args: argparse.Namespace) -> int:
    from pollux.scar.api import ScarError
    from pollux.scar.rework.experiment import run_trials
    from pollux.scar.rework.models.registry import make_model

    names = _names(args)
    if args.plots and not args.sweep:
        raise CliError("--plots needs --sweep", usage=True)

    def say(msg: str) -> None:
        if not args.quiet:
            print(msg, file=sys.stderr, flush=True)

    quiet = False if args.quiet else None       # None: a bar when stderr is a terminal
    try:
        if args.sweep:
            models = [make_model(n) for n in names]
            total = sum(_sweep_points(m) for m in models) * args.trials
            with ProgressBar("trials", total, sys.stderr, terminal=quiet) as bar:
                sweeps = _sweep(args, models, say, bar)
            return _report_sweeps(args, sweeps)     # once the bar is gone: stdout may be its screen
        fraction = args.fraction if args.fraction is not None else (1.0 if args.strategy == "full" else 0.125)
        rows = []
        with ProgressBar("trials", len(names) * args.trials, sys.stderr, terminal=quiet) as bar:
            for name in names:
                model = make_model(name)
                res = run_trials(model, strategy=args.strategy, fraction=fraction, lost_fraction=args.lost,
                                 recovery=args.recovery, trials=args.trials, seed=args.seed,
                                 layout=args.layout)
                rows.append(res.to_dict())
                bar.advance(args.trials)
                if not bar.shown:
                    say(f"{name}: done")
    except ScarError as exc:
        raise CliError(str(exc), usage=True) from exc
    if args.json:
        print(json.dumps(rows if len(rows) > 1 else rows[0]))
    else:
        for r in rows:
            print(f"{r['model']} [{r['layout']}] {r['strategy']} r={r['fraction']:g}, "
                  f"{r['recovery']} recovery, lost {r['lost_fraction']:g}: "
                  f"rework {r['mean']:.2f} ± {r['ci95']:.2f} iterations "
                  f"({r['trials']} trials, baseline {r['baseline_iterations']} iterations"
                  + (f", {r['unconverged']} unconverged" if r["unconverged"] else "") + ")")
    return 0


def _sweep_points(model: Any) -> int:
    """The experiment points :func:`pollux.scar.rework.sweep.model_sweep` runs for ``model``: on its
    first layout full recovery, partial recovery at each lost fraction and each partial strategy at
    each fraction; on every other layout full and partial recovery and priority r = 1/8. (Only
    sizes the progress bar: a wrong count makes a wrong ETA, never a wrong result.)"""
    from pollux.scar.api import STRATEGIES
    from pollux.scar.rework.sweep import FRACTIONS, LOST

    partial_strategies = len([s for s in STRATEGIES if s != "full"])
    first = 1 + len(LOST) + partial_strategies * len(FRACTIONS)
    return first + (len(model.layouts) - 1) * (1 + len(LOST) + 1)


def _sweep(args: argparse.Namespace, models: list[Any], say: Any, bar: ProgressBar) -> list[dict[str, Any]]:
    """Every model's sweep; each point's line goes above the bar on a terminal, to ``say`` elsewhere."""
    from pollux.scar.rework.sweep import model_sweep

    def point_done(line: str) -> None:
        bar.advance(args.trials)
        if bar.shown:
            bar.note(line)
        else:
            say(line)

    return [model_sweep(m, trials=args.trials, seed=args.seed, progress=point_done) for m in models]


def _report_sweeps(args: argparse.Namespace, sweeps: list[dict[str, Any]]) -> int:
    """The plots (``--plots``) and the summary of the sweeps, as text or JSON."""
    paths = []
    if args.plots:
        from pollux.scar.rework.plots import write_plots

        paths = [str(p) for p in write_plots(sweeps, args.plots)]
    if args.json:
        print(json.dumps({"models": sweeps, "plots": paths}))
        return 0
    for sw in sweeps:
        entry = sw["layouts"][next(iter(sw["layouts"]))]
        red = entry["reduction"]
        c = sw["checks"]
        print(f"{sw['model']}: partial vs full recovery, reduction at 1/4 {100 * red['1/4']:.0f} %, "
              f"1/2 {100 * red['1/2']:.0f} %, 3/4 {100 * red['3/4']:.0f} %; priority 1/8 vs traditional "
              f"{100 * c['priority_1_8_reduction']:.0f} %; checks {'pass' if c['all'] else 'FAIL'} "
              f"({sw['seconds']:.0f} s)")
    for p in paths:
        print(f"wrote {p}")
    return 0

"""Making or reopening a study: its storage, direction, sampler and pruner.

The study is Optuna's own (``optuna.create_study(..., load_if_exists=True)`` on an RDB storage), so
running the same command again reopens it, and anything Optuna offers reads it back. The sampler and
the pruner are not stored by Optuna: they are the ones of the command that runs the study now.

From the command line a few are offered by name (:data:`SAMPLERS`, :data:`PRUNERS`); from Python
:class:`~pollux.hpo.runner.StudyRunner` takes any study, so any Optuna sampler and pruner work.
Every sampler is seeded: with ``--seed`` (default 0) plus the number of trials already in the study.
A fresh sampler given the same seed again would draw the same random start-up points as the run
before (TPE samples its first 10 trials at random), so a resumed study would repeat the trials it
has; with the offset, the same study history and seed still give the same suggestions. TPE keeps
Optuna's ``constant_liar`` (on by default in Optuna 5): with several trials running at once, it
treats the running ones as bad so it does not suggest the same region to all of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import optuna
    from optuna.pruners import BasePruner
    from optuna.samplers import BaseSampler
    from optuna.storages import BaseStorage

__all__ = ["DIRECTIONS", "PRUNERS", "SAMPLERS", "StudyError", "StudyOptions", "direction_of", "load_study",
           "make_pruner", "make_sampler", "open_study", "trial_id"]

#: ``--direction`` values and what Optuna calls them.
DIRECTIONS: dict[str, Literal["minimize", "maximize"]] = {
    "min": "minimize", "max": "maximize", "minimize": "minimize", "maximize": "maximize"}
#: ``--sampler`` names.
SAMPLERS = ("tpe", "random", "qmc")
#: ``--pruner`` names.
PRUNERS = ("median", "hyperband", "none")


class StudyError(Exception):
    """The study cannot go on (or start): a study of another direction, a refused submission, a
    service gone for too long. The study itself stays as it is, resumable."""


@dataclass(frozen=True)
class StudyOptions:
    """How to make or reopen a study (the ``pollux hpo run`` options that concern the study itself).

    ``startup_trials`` and ``warmup_steps`` are the median pruner's ``n_startup_trials`` (finished
    trials before it prunes at all) and ``n_warmup_steps`` (steps of a trial before it may be pruned),
    Optuna's defaults 5 and 0.
    """

    name: str
    storage_url: str
    direction: str = "minimize"
    sampler: str = "tpe"
    pruner: str = "median"
    seed: int = 0
    startup_trials: int = 5
    warmup_steps: int = 0


def direction_of(text: str) -> Literal["minimize", "maximize"]:
    """``min``/``max`` (or Optuna's own words) as Optuna's direction; ``ValueError`` otherwise."""
    try:
        return DIRECTIONS[text]
    except KeyError:
        raise ValueError(f"--direction: expected min or max, got {text!r}") from None


def make_sampler(name: str, seed: int) -> BaseSampler:
    """The sampler named ``name``, seeded."""
    import optuna

    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "qmc":
        return optuna.samplers.QMCSampler(seed=seed)
    raise ValueError(f"--sampler: expected one of {', '.join(SAMPLERS)}, got {name!r}")


def make_pruner(name: str, startup_trials: int = 5, warmup_steps: int = 0) -> BasePruner:
    """The pruner named ``name``: ``median`` (with its startup trials and warm-up steps),
    ``hyperband`` (Optuna's defaults: the steps a trial reports are its resource) or ``none``."""
    import optuna

    if name == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=startup_trials, n_warmup_steps=warmup_steps)
    if name == "hyperband":
        return optuna.pruners.HyperbandPruner()
    if name == "none":
        return optuna.pruners.NopPruner()
    raise ValueError(f"--pruner: expected one of {', '.join(PRUNERS)}, got {name!r}")


def open_study(options: StudyOptions, storage: BaseStorage) -> optuna.Study:
    """The study ``options.name`` in ``storage``, made if new, with its sampler seeded by ``--seed`` plus
    the trials it already has (see the module docstring); :class:`StudyError` if it exists with the
    other direction (telling a maximised study minimised values would corrupt it)."""
    import optuna

    direction = direction_of(options.direction)
    study = optuna.create_study(storage=storage, study_name=options.name, direction=direction,
                                sampler=optuna.samplers.RandomSampler(seed=options.seed),
                                pruner=make_pruner(options.pruner, options.startup_trials,
                                                   options.warmup_steps),
                                load_if_exists=True)
    known = len(study.get_trials(deepcopy=False))
    study.sampler = make_sampler(options.sampler, options.seed + known)
    if len(study.directions) != 1:
        raise StudyError(f"study {options.name!r} has {len(study.directions)} objectives; "
                         "pollux hpo runs single-objective studies")
    if study.direction.name.lower() != direction:
        raise StudyError(f"study {options.name!r} exists and is {study.direction.name.lower()}d; "
                         f"--direction {options.direction} does not match it")
    return study


def load_study(name: str, storage: BaseStorage) -> optuna.Study:
    """An existing study; :class:`StudyError` naming the studies there if there is none of ``name``."""
    import optuna

    names = [s.study_name for s in storage.get_all_studies()]
    if name not in names:
        known = ", ".join(sorted(names)) or "none"
        raise StudyError(f"no study {name!r} in this storage (studies there: {known})")
    return optuna.load_study(study_name=name, storage=storage)


def trial_id(storage: BaseStorage, study: optuna.Study, number: int) -> int:
    """The storage's id of trial ``number`` of ``study``, through the storage's public API (a trial's
    number is its place in the study; its id is what the storage and ``optuna.trial.Trial`` take)."""
    study_id = storage.get_study_id_from_name(study.study_name)
    return storage.get_trial_id_from_study_id_trial_number(study_id, number)

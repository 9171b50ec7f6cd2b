"""Hyper-parameter search on the live service, with Optuna (``docs/hpo.md``).

An Optuna study whose trials are Pollux jobs: ``pollux hpo run SCRIPT --space space.yaml`` asks the
study for parameters, submits one job per trial, prunes bad trials by cancelling their jobs (their
GPUs go to the others at the next round), and keeps everything in Optuna's own storage, so a study
survives its driver and is read back with Optuna's tools.

Inside a trial's script only two functions are needed, and both work when the script runs alone:

* :func:`report` — ``pollux.hpo.report(value, step)``: an intermediate value for the pruner; the
  last one reported is the trial's objective;
* :func:`params` — ``pollux.hpo.params(defaults)``: the trial's parameters (also in the environment,
  ``HPO_<NAME>``, and, if the space file asks, as command-line flags).

The parts, one concern each: :mod:`~pollux.hpo.space` (the space file), :mod:`~pollux.hpo.trial_env`
(what a trial's job is given), :mod:`~pollux.hpo.trial_report` (the two functions above),
:mod:`~pollux.hpo.storage` (where a study is kept), :mod:`~pollux.hpo.attrs` (what each trial
carries), :mod:`~pollux.hpo.study` (making the study: sampler, pruner, direction),
:mod:`~pollux.hpo.outcome` (a finished job as a trial's result), :mod:`~pollux.hpo.runner` (the
driver loop), :mod:`~pollux.hpo.summary` (a study as rows) and :mod:`~pollux.hpo.display` (the live
progress). This module imports none of the driver's parts, nor Optuna, so a script that only
reports pays for them only when it runs as a trial.
"""

from pollux.hpo.trial_report import params, report

__all__ = ["params", "report"]

"""Inside a trial: ``pollux.hpo.report(value, step)`` and ``pollux.hpo.params(defaults)``.

A trial is an ordinary training script run as a Pollux job; the driver gives it its parameters and
its identity in the environment (:mod:`pollux.hpo.trial_env`). ``report`` writes straight to the
study's storage, not through the driver, so a value is kept even while no driver runs (a driver
killed and started again finds it there):

* the value becomes the trial's intermediate value at ``step``
  (``storage.set_trial_intermediate_value``, Optuna's public storage API), which the driver's pruner
  reads about once a second;
* the value and step are also kept as the trial's *last report* (user attributes
  ``pollux_last_value``, ``pollux_last_step``): when the job succeeds, the **value of its last
  report is the trial's objective**. Last in time, not at the highest step: a job restarted from an
  older checkpoint reports its steps again, and what it reports at the end is what it reached.

Only rank 0 reports (``POLLUX_RANK``, else torchrun's ``RANK``, else 0): every replica of a
data-parallel job computes the same metric, and one writer is enough. Run alone (no ``HPO_*``
variables), ``report`` does nothing but warn once, so the script still runs as before.

A report after the trial has finished (the driver pruned it, and cancels its job) is dropped with
one log line; a storage that fails is retried a few times, then the error is raised — a trial whose
values cannot be kept would end with no objective, so it had better fail and be retried by the
service from its checkpoint.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pollux.contract import ENV_RANK
from pollux.hpo import attrs
from pollux.hpo.trial_env import TrialIdentity, read_identity, read_params

if TYPE_CHECKING:
    from optuna.storages import BaseStorage

__all__ = ["params", "report"]

log = logging.getLogger("pollux.hpo")

#: torchrun's rank variable, read when the service's is not set.
TORCHRUN_RANK = "RANK"
#: Tries of one report against a failing storage, and the pause after the first failure (doubling).
TRIES = 4
RETRY_PAUSE_S = 0.5


def _rank(environ: Mapping[str, str]) -> int:
    for name in (ENV_RANK, TORCHRUN_RANK):
        raw = environ.get(name)
        if raw:
            try:
                return int(raw)
            except ValueError:
                return 0
    return 0


class Reporter:
    """What one process reports: its trial, the storage (opened once, at the first report) and whether
    it has warned. The module keeps one (:data:`REPORTER`); tests make their own, and may hand it an
    open ``storage`` (one that holds the trial's study) instead of having it open ``HPO_STORAGE``."""

    def __init__(self, environ: Mapping[str, str] | None = None, pause: Any = time.sleep,
                 storage: BaseStorage | None = None) -> None:
        self._environ = environ if environ is not None else os.environ
        self._pause = pause
        self._given = storage
        self._storage: BaseStorage | None = None
        self._identity: TrialIdentity | None = None
        self._warned: set[str] = set()

    def _warn_once(self, key: str, message: str, *args: Any) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(message, *args)

    def _open(self, identity: TrialIdentity) -> BaseStorage:
        if self._given is not None:
            return self._given
        if self._storage is None or self._identity != identity:
            from pollux.hpo.storage import open_storage

            self._storage = open_storage(identity.storage_url)
            self._identity = identity
        return self._storage

    def report(self, value: float, step: int) -> bool:
        """Record ``value`` at ``step`` for this trial; True if it was written (see the module)."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            try:
                value = float(value)             # a 0-d tensor or numpy scalar
            except (TypeError, ValueError):
                raise TypeError(f"pollux.hpo.report: value must be a number, got {value!r}") from None
        value = float(value)
        if not math.isfinite(value):
            raise ValueError(f"pollux.hpo.report: value must be finite, got {value}")
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"pollux.hpo.report: step must be an integer >= 0, got {step!r}")
        identity = read_identity(self._environ)
        if identity is None:
            self._warn_once("alone", "pollux.hpo.report: not running as a trial of a study (HPO_STORAGE "
                                     "and HPO_TRIAL_ID are unset); values are not recorded")
            return False
        if _rank(self._environ) != 0:
            return False
        from optuna.exceptions import UpdateFinishedTrialError

        pause = RETRY_PAUSE_S
        for attempt in range(1, TRIES + 1):
            try:
                storage = self._open(identity)
                storage.set_trial_intermediate_value(identity.trial_id, step, value)
                storage.set_trial_user_attr(identity.trial_id, attrs.LAST_VALUE, value)
                storage.set_trial_user_attr(identity.trial_id, attrs.LAST_STEP, step)
                return True
            except UpdateFinishedTrialError:
                self._warn_once("finished", "pollux.hpo.report: trial %d has already finished (pruned?); "
                                            "step %d and later are not recorded", identity.trial_id, step)
                return False
            except Exception as exc:
                if attempt == TRIES:
                    raise
                log.warning("pollux.hpo.report: storing step %d failed (%s); trying again in %.1f s",
                            step, exc, pause)
                self._storage = None
                self._pause(pause)
                pause *= 2
        return False

    def params(self, defaults: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The trial's parameters over ``defaults``; ``defaults`` alone when not a trial."""
        out = dict(defaults or {})
        trial = read_params(self._environ)
        if trial is not None:
            out.update(trial)
        return out


#: The reporter of this process.
REPORTER = Reporter()


def report(value: float, step: int) -> bool:
    """Report the trial's metric ``value`` at ``step`` (e.g. the validation accuracy after an epoch).

    Written to the study's storage for the pruner; the last value reported is the trial's objective.
    Rank 0 only; a warning (once) and nothing else when the script does not run as a trial. Returns
    whether the value was recorded.
    """
    return REPORTER.report(value, step)


def params(defaults: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """This trial's parameters (from ``HPO_PARAMS``) over ``defaults``; a copy of ``defaults`` when the
    script does not run as a trial, so it runs alone with its usual values."""
    return REPORTER.params(defaults)

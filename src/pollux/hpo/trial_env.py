"""The environment a trial's job gets from the driver: its parameters and where to report.

Written by the driver into the job spec's ``env`` (the service passes it to every replica), read by
:mod:`pollux.hpo.trial_report` inside the training script:

============================  =================================================================
variable                      holds
============================  =================================================================
``HPO_PARAMS``                every parameter of the trial, as one JSON object
``HPO_<NAME>``                one parameter (its name upper-cased), as text: ``HPO_LR=0.0123``
``HPO_STORAGE``               the study's Optuna storage URL, where the trial reports
``HPO_TRIAL_ID``              Optuna's id of the trial in that storage (not its number)
``HPO_TRIAL_NUMBER``          the trial's number in its study (for the script's own logs)
``HPO_STUDY``                 the study's name
============================  =================================================================

The names start with ``HPO_`` rather than ``POLLUX_``: the service refuses job variables named
like its own (``POLLUX_*``, ``RAY_*``), which it sets and which always win.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["ENV_PARAMS", "ENV_STORAGE", "ENV_STUDY", "ENV_TRIAL_ID", "ENV_TRIAL_NUMBER", "TrialIdentity",
           "param_variable", "read_identity", "read_params", "trial_env", "value_text"]

ENV_PARAMS = "HPO_PARAMS"
ENV_STORAGE = "HPO_STORAGE"
ENV_TRIAL_ID = "HPO_TRIAL_ID"
ENV_TRIAL_NUMBER = "HPO_TRIAL_NUMBER"
ENV_STUDY = "HPO_STUDY"
#: The prefix of one parameter's own variable.
PARAM_PREFIX = "HPO_"


@dataclass(frozen=True)
class TrialIdentity:
    """Which trial this process is, and where its study is stored."""

    storage_url: str
    trial_id: int


def value_text(value: Any) -> str:
    """A parameter's value as the trial reads it from a flag or a variable.

    ``repr`` of a float keeps every digit, so the script trains with exactly the value the study
    records; an integral float stays a float (``1.0``), as the distribution says.
    """
    if isinstance(value, float):
        return repr(value)
    return str(value)


def param_variable(name: str) -> str:
    """The variable of one parameter: ``lr`` → ``HPO_LR``."""
    return PARAM_PREFIX + name.upper()


def _json_value(value: Any) -> Any:
    """A parameter as JSON can hold it (a non-finite float cannot; no distribution gives one)."""
    if isinstance(value, float) and not math.isfinite(value):
        return value_text(value)
    return value


def trial_env(params: Mapping[str, Any], *, storage_url: str, trial_id: int, number: int,
              study: str) -> dict[str, str]:
    """The variables of one trial's job (see the module docstring)."""
    env = {param_variable(name): value_text(value) for name, value in params.items()}
    env[ENV_PARAMS] = json.dumps({name: _json_value(v) for name, v in params.items()}, sort_keys=True)
    env[ENV_STORAGE] = storage_url
    env[ENV_TRIAL_ID] = str(int(trial_id))
    env[ENV_TRIAL_NUMBER] = str(int(number))
    env[ENV_STUDY] = study
    return env


def read_identity(environ: Mapping[str, str]) -> TrialIdentity | None:
    """The trial this process is (None: it runs alone); a malformed variable is a ``ValueError``."""
    url = environ.get(ENV_STORAGE, "")
    raw_id = environ.get(ENV_TRIAL_ID, "")
    if not url and not raw_id:
        return None
    if not url or not raw_id:
        missing = ENV_STORAGE if not url else ENV_TRIAL_ID
        raise ValueError(f"{missing} is not set while {ENV_TRIAL_ID if not raw_id else ENV_STORAGE} is: "
                         "a trial needs both")
    try:
        trial_id = int(raw_id)
    except ValueError:
        raise ValueError(f"{ENV_TRIAL_ID}: expected an integer, got {raw_id!r}") from None
    return TrialIdentity(url, trial_id)


def read_params(environ: Mapping[str, str]) -> dict[str, Any] | None:
    """The trial's parameters from ``HPO_PARAMS`` (None: not set, the script runs alone)."""
    raw = environ.get(ENV_PARAMS)
    if raw is None:
        return None
    try:
        params = json.loads(raw)
    except ValueError:
        raise ValueError(f"{ENV_PARAMS}: not valid JSON: {raw[:200]!r}") from None
    if not isinstance(params, dict):
        raise ValueError(f"{ENV_PARAMS}: expected a JSON object, got {raw[:200]!r}")
    return params

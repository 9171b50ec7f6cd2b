"""The search space of a study, read from a YAML file (``pollux hpo run --space space.yaml``).

One entry per hyper-parameter, each becoming an Optuna distribution::

    lr: {type: float, low: 1.0e-3, high: 0.3, log: true}
    momentum: {type: float, low: 0.5, high: 0.99}
    width: {type: int, low: 1, high: 4}
    optimizer: {type: categorical, choices: [sgd, adam]}
    args: true            # optional: also pass every parameter as --name VALUE

A parameter reaches its trial in the environment always (``HPO_PARAMS``, ``HPO_<NAME>``: see
:mod:`pollux.hpo.trial_env`), and on the command line when the file says so: ``args: true`` at the
top passes every parameter as ``--name VALUE`` (underscores become dashes: ``weight_decay`` →
``--weight-decay``), and a parameter's own ``flag: --lr`` passes that one under that flag (``flag:
false`` keeps it off the command line under ``args: true``). Flags are appended after the script's
own arguments, so a script with argparse takes the trial's value over a default given there.

The file is checked as a whole before a trial is asked: every error names the file and the
parameter. Names are environment-variable friendly (a letter or ``_``, then letters, digits or
``_``) and unique once upper-cased, because each becomes ``HPO_<NAME>``.

PyYAML reads ``1e-3`` (no dot) as a string, a YAML 1.1 rule that surprises everyone; a float
parameter's bound given as such a string is taken as the number it spells.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

from pollux.hpo.trial_env import value_text

__all__ = ["Parameter", "SearchSpace", "SpaceError", "load_space", "parse_space"]

#: A parameter's name: it becomes part of an environment variable, ``HPO_<NAME>``.
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,99}\Z")
#: Upper-cased names taken by the trial's own variables (``HPO_PARAMS``, ``HPO_STORAGE``, ...).
RESERVED = frozenset({"PARAMS", "STORAGE", "TRIAL_ID", "TRIAL_NUMBER", "STUDY"})
#: The top-level key that passes every parameter as a command-line flag.
ARGS_KEY = "args"
#: The keys each parameter type takes (``type`` itself and ``flag`` besides).
KEYS = {
    "float": {"low", "high", "log", "step"},
    "int": {"low", "high", "log", "step"},
    "categorical": {"choices"},
}
#: A command-line flag: dashes, then a name.
FLAG = re.compile(r"--?[A-Za-z0-9][A-Za-z0-9_.-]*\Z")


class SpaceError(ValueError):
    """A search-space file that cannot be used; the message names the file and the parameter."""


@dataclass(frozen=True)
class Parameter:
    """One hyper-parameter: its Optuna distribution and the flag that passes it to the script, if any."""

    name: str
    distribution: BaseDistribution
    flag: str | None = None


@dataclass(frozen=True)
class SearchSpace:
    """The parameters of a study, in the file's order; ``source`` names the file in messages."""

    parameters: tuple[Parameter, ...]
    source: str = "<space>"

    def distributions(self) -> dict[str, BaseDistribution]:
        """What ``study.ask`` is given: every parameter's distribution, by name."""
        return {p.name: p.distribution for p in self.parameters}

    def args_of(self, params: Mapping[str, Any]) -> list[str]:
        """The flags appended to the script's arguments for a trial's ``params``."""
        out: list[str] = []
        for p in self.parameters:
            if p.flag is not None and p.name in params:
                out += [p.flag, value_text(params[p.name])]
        return out


def _number(value: Any, where: str, integer: bool) -> float | int:
    """A bound: an int for an ``int`` parameter, a finite number (or a numeric string) for a float."""
    if isinstance(value, bool):
        raise SpaceError(f"{where}: expected a number, got {value!r}")
    if integer:
        if not isinstance(value, int):
            raise SpaceError(f"{where}: expected an integer, got {value!r}")
        return value
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise SpaceError(f"{where}: expected a number, got {value!r}") from None
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        raise SpaceError(f"{where}: expected a finite number, got {value!r}")
    return float(value)


def _flag(entry: Mapping[str, Any], name: str, all_args: bool, where: str) -> str | None:
    """The parameter's flag: its own ``flag``, else ``--name`` under ``args: true``, else none."""
    flag = entry.get("flag", None)
    if flag is False:
        return None
    if flag is None or flag is True:
        return "--" + name.replace("_", "-") if (all_args or flag is True) else None
    if not isinstance(flag, str) or not FLAG.fullmatch(flag):
        raise SpaceError(f"{where}: flag: expected a flag such as --lr, got {flag!r}")
    return flag


def _distribution(entry: Mapping[str, Any], where: str) -> BaseDistribution:
    kind = entry.get("type")
    if kind not in KEYS:
        raise SpaceError(f"{where}: type: expected one of {', '.join(KEYS)}, got {kind!r}")
    unknown = sorted(set(entry) - KEYS[kind] - {"type", "flag"})
    if unknown:
        allowed = ", ".join(sorted(KEYS[kind] | {"type", "flag"}))
        raise SpaceError(f"{where}: unknown key(s) {', '.join(unknown)} for type {kind} (allowed: {allowed})")
    try:
        if kind == "categorical":
            choices = entry.get("choices")
            if not isinstance(choices, list) or not choices:
                raise SpaceError(f"{where}: choices: expected a non-empty list, got {choices!r}")
            for choice in choices:
                if choice is not None and not isinstance(choice, (bool, int, float, str)):
                    raise SpaceError(f"{where}: choices: expected numbers, strings, booleans or null, "
                                     f"got {choice!r}")
            return CategoricalDistribution(choices)
        for key in ("low", "high"):
            if key not in entry:
                raise SpaceError(f"{where}: {key}: missing (a {kind} parameter needs low and high)")
        integer = kind == "int"
        low = _number(entry["low"], f"{where}: low", integer)
        high = _number(entry["high"], f"{where}: high", integer)
        log = entry.get("log", False)
        if not isinstance(log, bool):
            raise SpaceError(f"{where}: log: expected true or false, got {log!r}")
        step = entry.get("step")
        if step is not None:
            step = _number(step, f"{where}: step", integer)
        if integer:
            return IntDistribution(int(low), int(high), log=log, step=int(step) if step is not None else 1)
        return FloatDistribution(float(low), float(high), log=log, step=step)
    except SpaceError:
        raise
    except ValueError as exc:       # Optuna's own checks: low > high, log with low <= 0, log with step
        raise SpaceError(f"{where}: {exc}") from None


def parse_space(data: Any, source: str = "<space>") -> SearchSpace:
    """A :class:`SearchSpace` from the loaded YAML ``data``; :class:`SpaceError` names ``source``."""
    if not isinstance(data, Mapping) or not data:
        raise SpaceError(f"{source}: expected a mapping of parameter names to their ranges, "
                         f"got {type(data).__name__ if data is not None else 'an empty file'}")
    all_args = data.get(ARGS_KEY, False)
    if not isinstance(all_args, bool):
        raise SpaceError(f"{source}: {ARGS_KEY}: expected true or false, got {all_args!r}")
    parameters: list[Parameter] = []
    seen: dict[str, str] = {}
    flags: dict[str, str] = {}
    for name, entry in data.items():
        if name == ARGS_KEY:
            continue
        where = f"{source}: parameter {name!r}"
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise SpaceError(f"{where}: expected a name of a letter or _, then letters, digits or _ "
                             "(it becomes the variable HPO_<NAME>)")
        upper = name.upper()
        if upper in RESERVED:
            raise SpaceError(f"{where}: HPO_{upper} is one of the trial's own variables; rename it")
        if upper in seen:
            raise SpaceError(f"{where}: clashes with {seen[upper]!r} (both become HPO_{upper})")
        seen[upper] = name
        if not isinstance(entry, Mapping):
            raise SpaceError(f"{where}: expected a mapping such as {{type: float, low: 0.001, high: 0.1}}, "
                             f"got {entry!r}")
        flag = _flag(entry, name, all_args, where)
        if flag is not None:
            if flag in flags:
                raise SpaceError(f"{where}: flag {flag} is also {flags[flag]!r}'s")
            flags[flag] = name
        parameters.append(Parameter(name, _distribution(entry, where), flag))
    if not parameters:
        raise SpaceError(f"{source}: no parameters")
    return SearchSpace(tuple(parameters), source)


def load_space(path: Path | str) -> SearchSpace:
    """Read and check the space file at ``path``; every error is a :class:`SpaceError` naming it."""
    import yaml

    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise SpaceError(f"{source}: cannot read the search space: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise SpaceError(f"{source}: not a text file (UTF-8)") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SpaceError(f"{source}: not valid YAML: {' '.join(str(exc).split())}") from None
    return parse_space(data, source)

"""Which application ``pollux litz run`` runs, and its config from the command's options.

The bundled applications ``mlr``, ``lda`` and ``hdbscan`` come with a table of their config keys and
defaults (their factories take ``**config``); ``kmeans`` and a user's ``FILE.py:FACTORY`` or
``MODULE:FACTORY`` get theirs from the factory's keyword defaults. ``--set KEY=VALUE`` and the
shortcut options (``--iterations``, ``--epochs``, ``--staleness``, ``--seed``, hdbscan's data options)
are checked against that table, typed from the defaults, and a key the application does not know, or
a value of the wrong type, is a usage error naming the key. Kept apart from the command itself
(``pollux.cli.litz_commands``), which runs the application and reports on it.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import math
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pollux.cli.errors import CliError

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
HDBSCAN_KEYS: dict[str, Any] = {
    "data": str, "n": 10000, "dim": 10, "clusters": 100, "noise": 0.2, "seed": 0, "k": 10,
    "min_samples": int, "min_cluster_size": 5, "sample_rate": 0.5, "delta": 0.001, "max_iterations": 30,
    "broadcast": True, "metric": "euclidean", "link_hops": 2,
}
#: The bundled applications and their key tables.
BUNDLED: dict[str, dict[str, Any]] = {"mlr": MLR_KEYS, "lda": LDA_KEYS, "hdbscan": HDBSCAN_KEYS}
#: Bundled applications whose factory names its keywords (``kmeans_app``): the keys are read from it.
BUNDLED_SIGNED = ("kmeans",)
#: hdbscan's own options and the keys they set.
HDBSCAN_OPTIONS = {"data": "data", "points": "n", "dims": "dim", "clusters": "clusters", "noise": "noise"}
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
    """A bundled application's name, ``path/to/file.py:factory`` or ``package.module:factory``."""
    if spec in BUNDLED or spec in BUNDLED_SIGNED:
        from pollux.litz.apps import APPS

        if spec in BUNDLED:
            return AppChoice(spec, APPS[spec], dict(BUNDLED[spec]))
        return _signature_choice(spec, APPS[spec])
    where, sep, name = spec.rpartition(":")
    if not sep or not where or not name.isidentifier():
        raise CliError(f"application {spec!r}: expected mlr, lda, FILE.py:FACTORY or MODULE:FACTORY, "
                       "or kmeans, hdbscan", usage=True)
    module = _load_module(where)
    factory = getattr(module, name, None)
    if not callable(factory):
        raise CliError(f"application {spec!r}: {where} has no function {name!r}", usage=True)
    return _signature_choice(name, factory)


def _signature_choice(name: str, factory: Callable[..., Any]) -> AppChoice:
    """The application with its config keys read from the factory's keyword defaults."""
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
    options = dict(OPTION_KEYS)
    if choice.name == "hdbscan":
        options.update(HDBSCAN_OPTIONS)
    else:
        for option in [*HDBSCAN_OPTIONS, "out"]:
            if getattr(args, option, None) is not None:
                raise CliError(f"--{option}: only the hdbscan application takes it", usage=True)
    for option, key in options.items():
        value = getattr(args, option)
        if value is None:
            continue
        if choice.name == "lda" and option == "iterations":
            key = "epochs"  # an LDA iteration is an epoch of Gibbs sampling
        if choice.name == "hdbscan" and option == "iterations":
            key = "max_iterations"  # at most this many NN-Descent iterations
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

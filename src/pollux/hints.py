"""The hints contract between the agent (``pollux.torch``) and the scheduler service (SPEC §8).

A running job tells the service what only it knows — its fitted throughput model, its gradient
statistics and its batch limits — by ``PUT {POLLUX_SCHEDULER_URL}/v1/jobs/{job_id}/hints`` with a JSON
body. Both sides use this module: the agent builds the body with :func:`build_hints`, the service checks
it with :func:`validate_hints` (answering 422 on :class:`HintsError`) and turns it into the goodput
model a policy needs with :func:`hints_to_model`.

The body is described by a JSON Schema kept in the package, ``schemas/hints-v3.json`` (draft
2020-12). Version 2 added the GPU type the job runs on (``gpu_type``) and its model on every type it
has run on (``types``), for heterogeneous clusters (SPEC §10); version 3 adds ``current``, the batch
configuration the job runs now and its measured step time there, so that the service can set what
the job measured beside what its model predicts (the web view's job charts). Version-1 and version-2
bodies (``hints-v1.json``, ``hints-v2.json``) are still accepted and normalised to version 3 without
the fields they lack. What a schema cannot express is checked here: every number finite (Python's
``json`` accepts ``NaN`` and ``Infinity``), ``local_bsz_bounds[0] <= local_bsz_bounds[1]``,
``max_batch_size >= init_batch_size``, in the optional ``balance`` object (LB-BSP, SPEC §10) one
step time per share and straggler ranks below the number of shares, and in ``current`` a
``batch_size`` equal to ``replicas × local_bsz × (accum_steps + 1)``.

This module must not import torch: the service imports it.
"""

from __future__ import annotations

import functools
import json
import math
import numbers
import urllib.parse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError, best_match

from pollux.contract import PREEMPTED_EXIT_CODE  # noqa: F401  (re-exported: older import path)
from pollux.goodput.model import BatchLimits, GoodputModel
from pollux.goodput.records import GradStats, ThroughputParams

#: Version of the hints body this module writes (it also reads versions 1 and 2).
HINTS_VERSION = 3
#: The JSON Schemas of the hints body by version, shipped as package data.
SCHEMA_PATHS: dict[int, Path] = {v: Path(__file__).resolve().parent / "schemas" / f"hints-v{v}.json"
                                 for v in (1, 2, 3)}
#: The schema of the current version.
SCHEMA_PATH: Path = SCHEMA_PATHS[HINTS_VERSION]
#: Path of the hints endpoint under the service URL; format with a URL-quoted job id.
HINTS_ENDPOINT = "/v1/jobs/{job_id}/hints"

_INTEGER_FIELDS = ("init_batch_size", "max_batch_size", "max_replicas_seen", "epoch")
_THROUGHPUT_FIELDS = ("alpha_grad", "beta_grad", "alpha_local", "beta_local", "alpha_node", "beta_node",
                      "gamma")


class HintsError(ValueError):
    """A hints body that breaks the contract; the service answers it with HTTP 422.

    ``field`` is the path of the offending value, dotted (``"throughput.gamma"``,
    ``"local_bsz_bounds.1"``), or ``""`` for the body as a whole. The message starts with it.
    """

    status_code = 422

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.detail = message
        super().__init__(f"{field or 'hints'}: {message}")


def hints_path(job_id: str) -> str:
    """``/v1/jobs/{job_id}/hints`` with the job id URL-quoted (no ``/`` may slip through)."""
    return HINTS_ENDPOINT.format(job_id=urllib.parse.quote(str(job_id), safe=""))


@functools.cache
def _schema_text(version: int = HINTS_VERSION) -> str:
    return SCHEMA_PATHS[version].read_text(encoding="utf-8")


def load_schema(version: int = HINTS_VERSION) -> dict[str, Any]:
    """The hints JSON Schema of ``version`` as a fresh dict (callers may mutate it)."""
    return json.loads(_schema_text(version))


@functools.cache
def _validator(version: int = HINTS_VERSION) -> Draft202012Validator:
    schema = load_schema(version)
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


def _join(path: str, key: str | int) -> str:
    return f"{path}.{key}" if path else str(key)


def _plain(value: Any, path: str) -> Any:
    """Copy ``value`` into plain JSON types, rejecting non-finite numbers.

    numpy scalars become ``int``/``float``/``bool``, tuples become lists; anything else is left for
    the schema to reject with a type error.
    """
    if isinstance(value, bool | np.bool_):
        return bool(value)
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise HintsError(path, f"object keys must be strings, got {key!r}")
            out[key] = _plain(item, _join(path, key))
        return out
    if isinstance(value, list | tuple):
        return [_plain(item, _join(path, i)) for i, item in enumerate(value)]
    if isinstance(value, numbers.Integral):
        number: int | float = int(value)
        try:
            float(number)
        except OverflowError:
            raise HintsError(path, f"number too large ({str(number)[:20]}...)") from None
        return number
    if isinstance(value, numbers.Real):
        number = float(value)
        if not math.isfinite(number):
            raise HintsError(path, f"must be a finite number, got {number!r}")
        return number
    return value


def _error_field(error: ValidationError, version: int = HINTS_VERSION) -> tuple[str, str]:
    """(field, message) of a schema error, naming the missing or extra property itself."""
    path = ".".join(str(p) for p in error.absolute_path)
    instance = error.instance
    if error.validator == "required" and isinstance(instance, dict):
        missing = [name for name in error.validator_value if name not in instance]
        if missing:
            return _join(path, missing[0]), "required field is missing"
    if error.validator == "dependentRequired" and isinstance(instance, dict):
        for present, needed in error.validator_value.items():
            absent = [name for name in needed if present in instance and name not in instance]
            if absent:
                return _join(path, absent[0]), f"required with {present}"
    if error.validator == "additionalProperties" and isinstance(instance, dict):
        known = error.schema.get("properties", {})
        extra = sorted(k for k in instance if k not in known)
        if extra:
            return _join(path, extra[0]), f"unknown field (not in hints schema v{version})"
    message = error.message
    if len(message) > 200:
        message = message[:197] + "..."
    return path, message


def validate_hints(obj: Any) -> dict[str, Any]:
    """Check a hints body against the contract and return it normalised.

    The result is a new dict of plain JSON types: integers as ``int`` (``32.0`` becomes ``32``),
    every other number as ``float``, ``local_bsz_bounds`` as a two-item list. Raises
    :class:`HintsError` naming the field for a schema violation (missing or unknown field, wrong
    type, out of range), a non-finite number, an unsupported version, ``lo > hi``,
    ``max_batch_size < init_batch_size`` or a ``current.batch_size`` that is not its configuration's.
    A version-1 or version-2 body comes back as version 3, without the fields it could not have.
    """
    if not isinstance(obj, Mapping):
        raise HintsError("", f"expected a JSON object, got {type(obj).__name__}")
    data = _plain(obj, "")
    version = data.get("version", HINTS_VERSION)      # missing: the schema names it
    if isinstance(version, bool) or not isinstance(version, int | float) or version not in SCHEMA_PATHS:
        raise HintsError("version", f"unsupported hints version {version!r} "
                                    f"(expected one of {', '.join(map(str, SCHEMA_PATHS))})")
    version = int(version)
    if "version" in data:
        data["version"] = version

    error = best_match(_validator(version).iter_errors(data))
    if error is not None:
        raise HintsError(*_error_field(error, version))

    lo, hi = data["local_bsz_bounds"]
    if lo > hi:
        raise HintsError("local_bsz_bounds", f"lower bound {lo} exceeds upper bound {hi}")
    if data["max_batch_size"] < data["init_batch_size"]:
        raise HintsError("max_batch_size", f"{data['max_batch_size']} is below init_batch_size "
                                           f"{data['init_batch_size']}")

    out: dict[str, Any] = {
        "version": HINTS_VERSION,
        "throughput": {name: float(data["throughput"][name]) for name in _THROUGHPUT_FIELDS},
        "grad": {"sqr": float(data["grad"]["sqr"]), "var": float(data["grad"]["var"])},
        "local_bsz_bounds": [int(lo), int(hi)],
        "accumulation": bool(data["accumulation"]),
        "progress": float(data["progress"]),
    }
    for name in _INTEGER_FIELDS:
        out[name] = int(data[name])
    if "balance" in data:
        out["balance"] = _check_balance(data["balance"])
    if "gpu_type" in data:
        out["gpu_type"] = str(data["gpu_type"])
    if "types" in data:
        out["types"] = {}
        for name, entry in data["types"].items():
            t_lo, t_hi = entry["local_bsz_bounds"]
            if t_lo > t_hi:
                raise HintsError(f"types.{name}.local_bsz_bounds",
                                 f"lower bound {t_lo} exceeds upper bound {t_hi}")
            out["types"][str(name)] = {
                "throughput": {k: float(entry["throughput"][k]) for k in _THROUGHPUT_FIELDS},
                "local_bsz_bounds": [int(t_lo), int(t_hi)]}
    if "current" in data:
        out["current"] = _check_current(data["current"])
    return out


def _check_current(current: Mapping[str, Any]) -> dict[str, Any]:
    """The ``current`` object normalised, after the product check the schema cannot make: a batch
    size that disagrees with its own configuration would put a measured point at the wrong batch."""
    out: dict[str, Any] = {name: int(current[name])
                           for name in ("replicas", "local_bsz", "accum_steps", "batch_size")}
    product = out["replicas"] * out["local_bsz"] * (out["accum_steps"] + 1)
    if out["batch_size"] != product:
        raise HintsError("current.batch_size", f"{out['batch_size']} is not replicas x local_bsz x "
                                               f"(accum_steps + 1) = {product}")
    if "step_time" in current:
        out["step_time"] = float(current["step_time"])
        out["steps"] = int(current["steps"])
    return out


def _check_balance(balance: Mapping[str, Any]) -> dict[str, Any]:
    """The ``balance`` object normalised, after the cross-field checks the schema cannot make."""
    shares = [int(x) for x in balance["shares"]]
    times = [float(x) for x in balance["step_times"]]
    if len(times) != len(shares):
        raise HintsError("balance.step_times", f"has {len(times)} entries for {len(shares)} shares "
                                               "(one per rank)")
    stragglers = [int(x) for x in balance["stragglers"]]
    for i, rank in enumerate(stragglers):
        if rank >= len(shares):
            raise HintsError(f"balance.stragglers.{i}", f"rank {rank} is not below the {len(shares)} "
                                                        "ranks of shares")
    return {"mode": str(balance["mode"]), "shares": shares, "step_times": times,
            "predicted_step_time": float(balance["predicted_step_time"]), "stragglers": stragglers}


def build_hints(
    params: ThroughputParams | Mapping[str, float],
    grad: GradStats | Mapping[str, float],
    init_batch_size: int,
    max_batch_size: int | None,
    local_bsz_bounds: Sequence[int | None] | None,
    accumulation: bool,
    max_replicas_seen: int,
    progress: float,
    epoch: int,
    balance: Mapping[str, Any] | None = None,
    gpu_type: str | None = None,
    types: Mapping[str, Mapping[str, Any]] | None = None,
    current: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The hints body of a job, validated (see :func:`validate_hints`).

    ``max_batch_size`` None means a fixed batch (``init_batch_size``). ``local_bsz_bounds`` None, or
    a None bound, means no bound: the lower defaults to 1, the upper to ``max_batch_size``.
    ``balance`` (optional) is the LB-BSP state: ``{"mode", "shares", "step_times",
    "predicted_step_time", "stragglers"}``; None leaves the field out. ``gpu_type`` is the GPU type
    the replicas run on and ``types`` the model per type the job has run on
    (``{type: {"throughput": params, "local_bsz_bounds": [lo, hi]}}``); None leaves them out.
    ``current`` is the configuration the job runs now and what it measured there: ``{"replicas",
    "local_bsz", "accum_steps", "batch_size"}`` and, once timed, ``"step_time"`` (mean seconds per
    optimiser step on the current allocation) with ``"steps"`` (how many); None leaves it out.
    """
    throughput = params.to_dict() if isinstance(params, ThroughputParams) else dict(params)
    stats = grad.to_dict() if isinstance(grad, GradStats) else dict(grad)
    max_bsz = init_batch_size if max_batch_size is None else max_batch_size
    lo, hi = (None, None) if local_bsz_bounds is None else tuple(local_bsz_bounds)
    body = {
        "version": HINTS_VERSION,
        "throughput": throughput,
        "grad": stats,
        "init_batch_size": init_batch_size,
        "max_batch_size": max_bsz,
        "local_bsz_bounds": [1 if lo is None else lo, max_bsz if hi is None else hi],
        "accumulation": accumulation,
        "max_replicas_seen": max_replicas_seen,
        "progress": progress,
        "epoch": epoch,
    }
    if balance is not None:
        body["balance"] = dict(balance)
    if gpu_type is not None:
        body["gpu_type"] = gpu_type
    if types is not None:
        body["types"] = {str(t): {"throughput": (v["throughput"].to_dict()
                                                 if isinstance(v["throughput"], ThroughputParams)
                                                 else dict(v["throughput"])),
                                  "local_bsz_bounds": list(v["local_bsz_bounds"])}
                         for t, v in types.items()}
    if current is not None:
        body["current"] = dict(current)
    return validate_hints(body)


def hints_to_model(hints: Mapping[str, Any]) -> tuple[GoodputModel, BatchLimits, int]:
    """What a policy needs from a job's hints: its goodput model, batch limits and max replicas seen.

    The hints are validated first (raises :class:`HintsError`).
    """
    data = validate_hints(hints)
    try:
        params = ThroughputParams.from_dict(data["throughput"], where="throughput")
        stats = GradStats.from_dict(data["grad"], where="grad")
        lo, hi = data["local_bsz_bounds"]
        limits = BatchLimits(
            init_batch_size=data["init_batch_size"],
            max_batch_size=data["max_batch_size"],
            min_local_bsz=lo,
            max_local_bsz=hi,
            accumulation=data["accumulation"],
        )
        model = GoodputModel(params, stats, data["init_batch_size"])
    except ValueError as exc:  # pragma: no cover - validate_hints already enforces these
        text = str(exc)
        raise HintsError(text.split(":", 1)[0], text.split(":", 1)[-1].strip()) from None
    return model, limits, data["max_replicas_seen"]


def hints_to_type_models(hints: Mapping[str, Any]) -> tuple[dict[str, GoodputModel], dict[str, BatchLimits]]:
    """Per GPU type, the job's goodput model and batch limits (``JobView.type_models`` /
    ``type_limits``), from a body's ``types`` and ``gpu_type`` (version 2 on); empty for a body without
    them. The gradient statistics and the global batch limits are the job's, whatever the type."""
    data = validate_hints(hints)
    stats = GradStats.from_dict(data["grad"], where="grad")
    entries: dict[str, dict[str, Any]] = dict(data.get("types", {}))
    if "gpu_type" in data:
        entries[data["gpu_type"]] = {"throughput": data["throughput"],
                                     "local_bsz_bounds": data["local_bsz_bounds"]}
    models: dict[str, GoodputModel] = {}
    limits: dict[str, BatchLimits] = {}
    for name, entry in entries.items():
        params = ThroughputParams.from_dict(entry["throughput"], where=f"types.{name}.throughput")
        lo, hi = entry["local_bsz_bounds"]
        models[name] = GoodputModel(params, stats, data["init_batch_size"])
        limits[name] = BatchLimits(init_batch_size=data["init_batch_size"],
                                   max_batch_size=data["max_batch_size"], min_local_bsz=lo,
                                   max_local_bsz=hi, accumulation=data["accumulation"])
    return models, limits


def merge_type_profiles(previous: Mapping[str, Any] | None, new: Mapping[str, Any]) -> dict[str, Any]:
    """``new`` (validated), its ``types`` extended by ``previous``'s profiles of GPU types it does not name.

    The service keeps the last known profile of a job on every type: the agent reports all types it
    has run on (they travel in its checkpoints), but a profile can also come from elsewhere — a short
    bootstrap run on another type (Sia), or an operator — and must not vanish when the running job
    next reports only what it has measured itself. Both bodies are as :func:`validate_hints` returns
    them (a version-1 body has become version 3 without types there); ``previous`` None keeps nothing.
    """
    data = dict(new)
    if previous is None:
        return data
    known = dict(previous.get("types", {}))
    if "gpu_type" in previous:
        known[previous["gpu_type"]] = {"throughput": previous["throughput"],
                                       "local_bsz_bounds": previous["local_bsz_bounds"]}
    named = set(data.get("types", {})) | ({data["gpu_type"]} if "gpu_type" in data else set())
    kept = {t: e for t, e in known.items() if t not in named}
    if kept:
        data["types"] = {**kept, **dict(data.get("types", {}))}
    return data

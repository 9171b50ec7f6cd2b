"""Application metadata for measured job profiles (SPEC §7): :class:`AppMeta` and ``applications.json``.

The application constants (M0, batch limits, epochs, optimiser) are not in the profile CSVs; they live
in ``applications.json`` beside this module (:func:`default_metadata`), which an override file may
replace. Re-exported by :mod:`pollux.sim.profiles`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from pollux.goodput import BatchLimits, ScalingRule, scaling_rule_for
from pollux.goodput.records import check_fields

__all__ = ["AppMeta", "default_metadata"]

METADATA_FILE = Path(__file__).with_name("applications.json")
OPTIMIZERS = ("sgd", "adam")


@dataclass(frozen=True, slots=True)
class AppMeta:
    """Per-application constants used with a profile (SPEC §7); none of them is in the CSVs."""

    name: str
    init_batch_size: int  # M0
    max_batch_size: int
    min_local_bsz: int
    max_local_bsz: int
    epochs: int  # epochs to completion
    optimizer: str  # "sgd" or "adam"
    metric_higher_is_better: bool

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"name: expected a non-empty string, got {self.name!r}")
        for field in ("init_batch_size", "max_batch_size", "min_local_bsz", "max_local_bsz", "epochs"):
            object.__setattr__(self, field, _positive_int(field, getattr(self, field)))
        if self.max_batch_size < self.init_batch_size:
            raise ValueError(
                f"max_batch_size: {self.max_batch_size} is below init_batch_size {self.init_batch_size}"
            )
        if self.max_local_bsz < self.min_local_bsz:
            raise ValueError(
                f"max_local_bsz: {self.max_local_bsz} is below min_local_bsz {self.min_local_bsz}"
            )
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer: expected one of {', '.join(OPTIMIZERS)}, got {self.optimizer!r}")
        if not isinstance(self.metric_higher_is_better, bool):
            raise ValueError(
                f"metric_higher_is_better: expected true or false, got {self.metric_higher_is_better!r}"
            )

    def limits(self, accumulation: bool = True) -> BatchLimits:
        """The batch limits the goodput optimiser works within for this application."""
        return BatchLimits(
            init_batch_size=self.init_batch_size,
            max_batch_size=self.max_batch_size,
            min_local_bsz=self.min_local_bsz,
            max_local_bsz=self.max_local_bsz,
            accumulation=accumulation,
        )

    def scaling_rule(self) -> ScalingRule:
        """The default LR scaling rule: AdaScale for SGD, square-root for Adam."""
        return scaling_rule_for(self.optimizer)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "name"}


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise ValueError(f"{name}: expected a positive integer, got {value!r}")
    if not math.isfinite(value) or value != int(value) or value < 1:
        raise ValueError(f"{name}: expected a positive integer, got {value!r}")
    return int(value)


_META_FIELDS = tuple(f.name for f in fields(AppMeta) if f.name != "name")


def default_metadata(path: Path | None = None) -> dict[str, AppMeta]:
    """Application metadata from ``applications.json`` beside this module, or from an override file.

    The file is ``{"provenance": "...", "applications": {name: {field: value, ...}, ...}}`` with every
    field of :class:`AppMeta` but ``name``. Errors are ``ValueError`` naming the file and the field.
    """
    return dict(_load_metadata(Path(path) if path is not None else METADATA_FILE))


@lru_cache(maxsize=8)
def _load_metadata_cached(path: Path, mtime_ns: int) -> tuple[tuple[str, AppMeta], ...]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: metadata file not found") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not UTF-8 text") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}, line {exc.lineno}: invalid JSON: {exc.msg}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object with an 'applications' object")
    unknown = sorted(set(data) - {"provenance", "applications"})
    if unknown:
        raise ValueError(f"{path}: unknown top-level field(s) {', '.join(unknown)}")
    if "provenance" in data and not isinstance(data["provenance"], str):
        raise ValueError(f"{path}: provenance: expected a string")
    apps = data.get("applications")
    if not isinstance(apps, dict):
        raise ValueError(f"{path}: applications: expected an object mapping names to metadata")
    out = []
    for name, entry in apps.items():
        where = f"applications.{name}"
        check_fields(f"{path}: {where}", entry, _META_FIELDS, "an object")
        try:
            meta = AppMeta(name=name, **{f: entry[f] for f in _META_FIELDS})
        except ValueError as exc:
            raise ValueError(f"{path}: {where}.{exc}") from None
        out.append((name, meta))
    return tuple(out)


def _load_metadata(path: Path) -> tuple[tuple[str, AppMeta], ...]:
    try:
        mtime = path.stat().st_mtime_ns
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: metadata file not found") from None
    return _load_metadata_cached(path.resolve(), mtime)

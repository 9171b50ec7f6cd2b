"""Per-GPU-type profiles in the Sia (SOSP'23) artifact format (issue 13).

An application directory may hold one pair of throughput files per GPU type,
``placements-<type>.csv`` and ``scalability-<type>.csv`` (columns read by header name, in any order),
beside the validation files, which every type shares (gradient statistics do not depend on the GPU).
The un-suffixed ``placements.csv``/``scalability.csv`` are the T4 (``aws``) measurements of the Pollux
artifact and are also what the untyped ``"gpu"`` type of a homogeneous cluster reads
(:func:`pollux.sim.profile_files.throughput_files`).

:func:`load_typed_profiles` returns ``{app: {type: AppProfile}}``. An application without a type's
files has no profile for that type (a job of it cannot run there); a type that no application has is
an error, as is a missing column (the message names the file and the field).

Metadata per type: the application's metadata (its entry, else inferred from the un-suffixed files or
the first type that has files) with the largest local batch adjusted to the type's memory: a type
whose measured local batches reach further than the un-suffixed T4 files' may use its own measured
maximum (an A100 holds more than a T4), one whose measurements stop earlier is capped there; otherwise
the metadata's value is kept, so ``aws`` and ``gpu`` keep exactly the metadata of the untyped loader.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from pollux.sim.profile_files import (
    PLACEMENTS_FILE,
    UNSUFFIXED_TYPE,
    UNTYPED,
    _infer,
    _read_app,
    _read_throughput,
    _read_validation,
    throughput_files,
)
from pollux.sim.profile_meta import AppMeta, default_metadata
from pollux.sim.profiles import AppProfile, _build

__all__ = ["TypedProfiles", "available_types", "load_typed_profiles", "typed_meta"]

#: ``{application: {GPU type: profile}}``.
TypedProfiles = dict[str, dict[str, AppProfile]]


def available_types(app_dir: Path) -> tuple[str, ...]:
    """The GPU types an application directory has throughput files for (sorted; ``aws`` when only the
    un-suffixed files exist)."""
    app_dir = Path(app_dir)
    names = {p.name[len("placements-"):-len(".csv")] for p in app_dir.glob("placements-*.csv")}
    if (app_dir / PLACEMENTS_FILE).is_file():
        names.add(UNSUFFIXED_TYPE)
    return tuple(sorted(n for n in names if n))


def _has_type(app_dir: Path, gpu_type: str) -> bool:
    return throughput_files(app_dir, gpu_type)[0].is_file()


def typed_meta(base: AppMeta, type_max_lbs: float, reference_max_lbs: float | None) -> AppMeta:
    """``base`` with ``max_local_bsz`` fitted to a type whose measured local batches reach
    ``type_max_lbs`` (the un-suffixed files reach ``reference_max_lbs``; see the module docstring)."""
    top = max(1, math.floor(type_max_lbs))
    if reference_max_lbs is None or type_max_lbs > reference_max_lbs:
        new_max = top
    else:
        new_max = min(base.max_local_bsz, top)
    new_max = max(new_max, base.min_local_bsz)
    return base if new_max == base.max_local_bsz else replace(base, max_local_bsz=new_max)


def _app_names(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir()
                  if p.is_dir() and (any(p.glob("placements-*.csv")) or (p / PLACEMENTS_FILE).is_file()))


def load_typed_profiles(
    root: Path,
    types: Iterable[str],
    apps: Sequence[str] | None = None,
    metadata: dict[str, AppMeta] | None = None,
) -> TypedProfiles:
    """``{app: {type: AppProfile}}`` for the GPU ``types`` a cluster needs.

    ``apps`` defaults to every sub-directory of ``root`` with throughput files; ``metadata`` to
    :func:`pollux.sim.profile_meta.default_metadata` (apps missing from it are inferred). The untyped
    type ``"gpu"`` reads the un-suffixed files and gives exactly the profiles of
    :func:`pollux.sim.profiles.load_profiles`. ``ValueError`` for a type no application has (naming
    the files looked for) and for bad files (naming the file, line and field).
    """
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: profile root directory not found")
    wanted = list(dict.fromkeys(types))
    if not wanted:
        raise ValueError("types: no GPU type given")
    names = list(apps) if apps is not None else _app_names(root)
    if not names:
        raise FileNotFoundError(f"{root}: no application directories (with placements files)")
    if metadata is None:
        metadata = default_metadata()
    present = {t: [a for a in names if _has_type(root / a, t)] for t in wanted}
    unknown = [t for t, found in present.items() if not found]
    if unknown:
        t = unknown[0]
        expected, _ = throughput_files(root / names[0], t)
        raise ValueError(f"{root}: GPU type {t!r}: no application has its throughput file "
                         f"({expected.name}, field placement/local_bsz/step_time/sync_time); "
                         f"types found: {', '.join(_all_types(root, names)) or 'none'}")
    out: TypedProfiles = {}
    for app in names:
        app_dir = root / app
        have = [t for t in wanted if app in present[t]]
        if not have:
            out[app] = {}
            continue
        vals = _read_validation(app_dir)
        reference: dict[str, Any] | None = None
        if (app_dir / PLACEMENTS_FILE).is_file():
            reference = _read_app(app_dir, UNTYPED, vals)
        base = metadata.get(app)
        if base is None:
            base = _infer(app, reference if reference is not None else _read_app(app_dir, have[0], vals))
        ref_max = max(reference["placements"]["local_bsz"]) if reference is not None else None
        per_type: dict[str, AppProfile] = {}
        for t in have:
            raw: dict[str, Any]
            if t == UNTYPED and reference is not None:
                raw = reference
            else:
                pl, sc = _read_throughput(*throughput_files(app_dir, t))
                raw = {"dir": app_dir, "placements": pl, "scalability": sc, "validation": vals}
            meta = base if t == UNTYPED else typed_meta(base, max(raw["placements"]["local_bsz"]), ref_max)
            per_type[t] = _build(app, raw, meta, gpu_type=t)
        out[app] = per_type
    return out


def _all_types(root: Path, names: Sequence[str]) -> list[str]:
    found: set[str] = set()
    for a in names:
        found.update(available_types(root / a))
    return sorted(found)

"""Reading an application directory of measured profile CSVs (SPEC §7).

The file formats are described in :mod:`pollux.sim.profiles`, which re-exports :func:`infer_metadata`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pollux.sim.csvrows import read_rows
from pollux.sim.profile_meta import AppMeta

__all__ = ["infer_metadata", "throughput_files"]

PLACEMENTS_FILE = "placements.csv"
SCALABILITY_FILE = "scalability.csv"
PLACEMENT_COLUMNS = ("placement", "local_bsz", "step_time", "sync_time")
SCALABILITY_COLUMNS = ("num_nodes", "num_replicas", "local_bsz", "step_time", "sync_time")
VALIDATION_COLUMNS = ("progress", "iteration", "metric", "grad_sqr", "grad_var")

_VALIDATION_NAME = re.compile(r"validation-(.+)\.csv")
_PLACEMENT_STRING = re.compile(r"[0-9]+")
#: The GPU type of an untyped cluster (``pollux.policy.base.DEFAULT_GPU_TYPE``): un-suffixed files.
UNTYPED = "gpu"
#: The GPU type the un-suffixed files were measured on (T4, AWS g4dn).
UNSUFFIXED_TYPE = "aws"


def _number(
    path: Path,
    line: int,
    field: str,
    text: str,
    *,
    integer: bool = False,
    positive: bool = False,
    signed: bool = False,
) -> float:
    where = f"{path}, line {line}, field {field}"
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{where}: not a number: {text.strip()!r}") from None
    if not math.isfinite(value):
        raise ValueError(f"{where}: must be finite, got {text.strip()!r}")
    if not signed and value < 0:
        raise ValueError(f"{where}: must be non-negative, got {value!r}")
    if positive and value <= 0:
        raise ValueError(f"{where}: must be positive, got {value!r}")
    if integer and value != int(value):
        raise ValueError(f"{where}: must be an integer, got {value!r}")
    return value


def _columns(path: Path, columns: Sequence[str], specs: dict[str, dict]) -> dict[str, list]:
    index, rows = read_rows(path, columns, kind="profile", loc=lambda n: f"{path}, line {n}",
                            missing_message="profile file not found")
    out: dict[str, list] = {c: [] for c in columns}
    out["_line"] = []
    for line, row in rows:
        out["_line"].append(line)
        for c in columns:
            text = row[index[c]]
            if c == "placement":
                s = text.strip()
                if not _PLACEMENT_STRING.fullmatch(s) or not s.strip("0"):
                    raise ValueError(
                        f"{path}, line {line}, field placement: bad placement string {text!r} "
                        "(expected digits: GPUs per node)"
                    )
                out[c].append(s)
            else:
                out[c].append(_number(path, line, c, text, **specs.get(c, {})))
    return out


def throughput_files(app_dir: Path, gpu_type: str | None = None) -> tuple[Path, Path]:
    """(placements, scalability) files of ``gpu_type`` in ``app_dir``.

    ``None`` or the untyped ``"gpu"`` type reads the un-suffixed files (the T4 profiles of the Pollux
    artifact); ``"aws"`` reads ``placements-aws.csv`` when present, else the un-suffixed files (they are
    the same T4 measurements); any other type reads ``placements-<type>.csv``/``scalability-<type>.csv``.
    """
    app_dir = Path(app_dir)
    if gpu_type is None or gpu_type == UNTYPED:
        return app_dir / PLACEMENTS_FILE, app_dir / SCALABILITY_FILE
    typed = app_dir / f"placements-{gpu_type}.csv", app_dir / f"scalability-{gpu_type}.csv"
    if gpu_type == UNSUFFIXED_TYPE and not typed[0].is_file():
        return app_dir / PLACEMENTS_FILE, app_dir / SCALABILITY_FILE
    return typed


def _read_throughput(pl_path: Path, sc_path: Path) -> tuple[dict[str, list], dict[str, list]]:
    """The placement and scalability columns (read by header name), checked row by row."""
    pl = _columns(pl_path, PLACEMENT_COLUMNS, {"local_bsz": {"positive": True}})
    sc = _columns(
        sc_path,
        SCALABILITY_COLUMNS,
        {
            "num_nodes": {"integer": True, "positive": True},
            "num_replicas": {"integer": True, "positive": True},
            "local_bsz": {"positive": True},
        },
    )
    for line, n, r in zip(sc["_line"], sc["num_nodes"], sc["num_replicas"], strict=True):
        if r < n:
            raise ValueError(f"{sc_path}, line {line}, field num_replicas: {r:g} replicas on {n:g} nodes")
    return pl, sc


def _read_validation(app_dir: Path) -> list[tuple[int, Path, dict[str, list]]]:
    """The validation files of an application, sorted by batch size (shared by every GPU type)."""
    val_files = []
    for p in sorted(app_dir.glob("validation-*.csv")):
        match = _VALIDATION_NAME.fullmatch(p.name)
        b_text = match.group(1) if match else ""
        if not b_text.isdigit() or int(b_text) < 1:
            raise ValueError(
                f"{p}: bad validation file name (expected validation-<B>.csv, B a positive integer)"
            )
        val_files.append((int(b_text), p))
    if not val_files:
        raise FileNotFoundError(f"{app_dir}: no validation-<B>.csv files")
    val_files.sort()
    vals = []
    for b, p in val_files:
        v = _columns(
            p,
            VALIDATION_COLUMNS,
            {"iteration": {"integer": True}, "metric": {"signed": True}},
        )
        prog = v["progress"]
        for i in range(1, len(prog)):
            if prog[i] <= prog[i - 1]:
                raise ValueError(
                    f"{p}, line {v['_line'][i]}, field progress: {prog[i]!r} does not increase "
                    f"(previous row {prog[i - 1]!r})"
                )
        vals.append((b, p, v))
    n_rows = {len(v["progress"]) for _, _, v in vals}
    if len(n_rows) > 1:
        counts = ", ".join(f"{p} ({len(v['progress'])})" for _, p, v in vals)
        raise ValueError(f"{app_dir}: validation files differ in row count (one row per epoch): {counts}")
    return vals


def _read_app(app_dir: Path, gpu_type: str | None = None,
              validation: list[tuple[int, Path, dict[str, list]]] | None = None) -> dict[str, Any]:
    """An application's files: the throughput files of ``gpu_type`` (:func:`throughput_files`) and
    the validation files (``validation`` when already read for another type)."""
    app_dir = Path(app_dir)
    if not app_dir.is_dir():
        raise FileNotFoundError(f"{app_dir}: profile directory not found")
    pl, sc = _read_throughput(*throughput_files(app_dir, gpu_type))
    vals = validation if validation is not None else _read_validation(app_dir)
    return {
        "dir": app_dir,
        "placements": pl,
        "scalability": sc,
        "validation": vals,
    }


def _infer(name: str, raw: dict[str, Any]) -> AppMeta:
    bs = [b for b, _, _ in raw["validation"]]
    lbs = raw["placements"]["local_bsz"]
    return AppMeta(
        name=name,
        init_batch_size=min(bs),
        max_batch_size=max(bs),
        min_local_bsz=max(1, math.ceil(min(lbs))),
        max_local_bsz=max(1, math.floor(max(lbs))),
        epochs=len(raw["validation"][0][2]["progress"]),
        optimizer="sgd",
        metric_higher_is_better=True,
    )


def infer_metadata(app_dir: Path) -> AppMeta:
    """Metadata read off an application's files (used for applications with no metadata entry):
    M0 / max batch = smallest / largest validated B, local bounds = min / max placement local batch,
    epochs = validation rows, SGD, higher-is-better metric."""
    return _infer(Path(app_dir).name, _read_app(Path(app_dir)))

"""Read the throughput rows of a Pollux OSDI'21 profile folder (SPEC §7) for the benchmarks.

Every row of ``placements.csv`` and ``scalability.csv`` becomes one record of (nodes, replicas,
local_bsz, step_time, sync_time). Errors name the file and line.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

APPLICATIONS = ("bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3")


@dataclass(frozen=True)
class ThroughputRows:
    nodes: np.ndarray
    replicas: np.ndarray
    local_bsz: np.ndarray
    step_time: np.ndarray
    sync_time: np.ndarray

    @property
    def accum_time(self) -> np.ndarray:
        """Time of an accumulation step: the pass without the exposed synchronisation."""
        return self.step_time - self.sync_time


def _number(path: Path, line: int, field: str, text: str) -> float:
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise ValueError(f"{path}:{line}: field {field!r}: not a number: {text!r}") from None
    if not np.isfinite(value) or value < 0:
        raise ValueError(f"{path}:{line}: field {field!r}: must be finite and >= 0, got {text!r}")
    return value


def _rows(path: Path, fields: tuple[str, ...]) -> list[tuple[int, dict[str, str]]]:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        missing = [f for f in fields if f not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{path}:1: missing column(s) {', '.join(missing)}")
        return [(i + 2, row) for i, row in enumerate(reader)]


def read_throughput_rows(app_dir: Path) -> ThroughputRows:
    cols: dict[str, list[float]] = {k: [] for k in ("n", "r", "m", "t", "s")}
    path = app_dir / "placements.csv"
    for line, row in _rows(path, ("placement", "local_bsz", "step_time", "sync_time")):
        text = (row["placement"] or "").strip()
        if not text.isdigit():
            raise ValueError(f"{path}:{line}: field 'placement': expected digits, got {text!r}")
        gpus = [int(c) for c in text if c != "0"]
        if not gpus:
            raise ValueError(f"{path}:{line}: field 'placement': no GPUs in {text!r}")
        cols["n"].append(len(gpus))
        cols["r"].append(sum(gpus))
        cols["m"].append(_number(path, line, "local_bsz", row["local_bsz"]))
        cols["t"].append(_number(path, line, "step_time", row["step_time"]))
        cols["s"].append(_number(path, line, "sync_time", row["sync_time"]))
    path = app_dir / "scalability.csv"
    fields = ("num_nodes", "num_replicas", "local_bsz", "step_time", "sync_time")
    for line, row in _rows(path, fields):
        cols["n"].append(_number(path, line, "num_nodes", row["num_nodes"]))
        cols["r"].append(_number(path, line, "num_replicas", row["num_replicas"]))
        cols["m"].append(_number(path, line, "local_bsz", row["local_bsz"]))
        cols["t"].append(_number(path, line, "step_time", row["step_time"]))
        cols["s"].append(_number(path, line, "sync_time", row["sync_time"]))
    arr = {k: np.asarray(v, dtype=np.float64) for k, v in cols.items()}
    return ThroughputRows(arr["n"], arr["r"], arr["m"], arr["t"], arr["s"])

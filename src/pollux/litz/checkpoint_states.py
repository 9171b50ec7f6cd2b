"""The application states of a Litz checkpoint step: one pickled segment per part in ``states.bin``.

What is not a PS table (the driver's state, the checkpoint's `meta`, and per executor its state and
its buffered micro-tasks) is pickled by us, as Ray pickles it anyway. Each part is its own segment,
recorded in the manifest with its offset, length and CRC-32, so a reader seeks to the parts it asks
for — one executor's state, say — and neither reads nor unpickles the others. Kept apart from the
store because the segment names (``driver``, ``meta``, ``executor/<id>``, ``buffered/<id>``) are
this file's format, and writing and reading them must agree.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pollux.litz.checkpoint_tables import CheckpointError, crc32

__all__ = ["ApplicationStates", "read_states", "write_states"]


@dataclass
class ApplicationStates:
    """The non-array part of a `LitzCheckpoint`, as stored in ``states.bin``.

    After `read_states`, `driver_state` is None unless the driver was asked for, and the executor
    dicts hold only the executors asked for.
    """

    driver_state: Any = None
    meta: dict[str, Any] = field(default_factory=dict)
    executor_states: dict[int, Any] = field(default_factory=dict)
    buffered_tasks: dict[int, list[Any]] = field(default_factory=dict)


def write_states(path: Path, states: ApplicationStates) -> tuple[dict[str, list[int]], int]:
    """Pickle `states` into `path` (fsynced), one segment per part; return (segments, bytes).

    `segments` maps each segment's name to ``[offset, length, crc32]`` for the manifest. An
    executor's state is followed by its buffered tasks, executors in ascending id order.
    """
    parts: list[tuple[str, Any]] = [("driver", states.driver_state), ("meta", states.meta)]
    executor_states = {int(k): v for k, v in states.executor_states.items()}
    buffered = {int(k): list(v) for k, v in states.buffered_tasks.items()}
    for eid in sorted(executor_states.keys() | buffered.keys()):
        if eid in executor_states:
            parts.append((f"executor/{eid}", executor_states[eid]))
        if eid in buffered:
            parts.append((f"buffered/{eid}", buffered[eid]))
    segments: dict[str, list[int]] = {}
    offset = 0
    with open(path, "wb") as f:
        for name, obj in parts:
            try:
                data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
            except Exception as exc:
                raise CheckpointError(f"LitzCheckpoint {name}: not picklable ({exc})") from exc
            f.write(data)
            segments[name] = [offset, len(data), crc32(data)]
            offset += len(data)
        f.flush()
        os.fsync(f.fileno())
    return segments, offset


def read_states(
    path: Path,
    segments: Mapping[str, list[int]],
    *,
    driver: bool,
    executors: Iterable[int] | None,
) -> tuple[ApplicationStates, int]:
    """Read `meta`, the driver state if `driver`, and the states and buffered tasks of `executors`
    (None = all) from `path`; return them and the bytes read. Only those segments are read."""
    wanted = ["meta"] + (["driver"] if driver else [])
    ids = sorted({int(k.split("/")[1]) for k in segments if "/" in k})
    for eid in ids if executors is None else sorted({int(e) for e in executors}):
        wanted += [k for k in (f"executor/{eid}", f"buffered/{eid}") if k in segments]
    values, nbytes = _read_segments(path, segments, wanted)
    out = ApplicationStates(driver_state=values.get("driver"), meta=values["meta"])
    for k, v in values.items():
        kind, _, ident = k.partition("/")
        if kind == "executor":
            out.executor_states[int(ident)] = v
        elif kind == "buffered":
            out.buffered_tasks[int(ident)] = v
    return out, nbytes


def _read_segments(
    path: Path, segments: Mapping[str, list[int]], wanted: list[str]
) -> tuple[dict[str, Any], int]:
    """Unpickle the `wanted` segments, each checked against its length and CRC-32."""
    values: dict[str, Any] = {}
    nbytes = 0
    try:
        with open(path, "rb") as f:
            for name in wanted:
                offset, length, crc = segments[name]
                f.seek(offset)
                data = f.read(length)
                nbytes += len(data)
                if len(data) != length or crc32(data) != crc:
                    raise CheckpointError(f"{path}: segment {name!r} is truncated or corrupt")
                values[name] = pickle.loads(data)
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read application states ({exc})") from exc
    except (pickle.UnpicklingError, EOFError, AttributeError, ImportError) as exc:
        raise CheckpointError(f"{path}: cannot unpickle a segment ({exc})") from exc
    return values, nbytes

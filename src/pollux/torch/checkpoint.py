"""Atomic checkpoints of named states, and the registry that saves and restores them (SPEC §8).

Layout inside the checkpoint directory::

    checkpoint-00000007/          the newest complete checkpoint (older ones are deleted)
        manifest.json             {"version": 1, "seq": 7, "states": {name: file}, ...}
        state-000.pt ...          one torch.save file per registered state
    .tmp-checkpoint-00000008-...  a save in progress (or killed mid-way): never loaded

A save writes every file into a fresh temporary directory inside the checkpoint directory, fsyncs the
files and the directory, and renames it to ``checkpoint-<seq>`` (``rename`` is atomic within one file
system), then fsyncs the parent. Only then are older checkpoints removed: each is first renamed to a
``.trash-`` name (so a ``checkpoint-*`` directory is always complete) and then deleted. A process killed
at any moment therefore leaves the newest complete checkpoint loadable; leftovers are cleaned up by the
next save or start. Checkpoint files are the job's own: they are loaded with full unpickling.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import shutil
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch

from pollux.durable import fsync_dir, write_durable

logger = logging.getLogger("pollux.torch")

CHECKPOINT_PREFIX = "checkpoint-"
TMP_PREFIX = ".tmp-checkpoint-"
TRASH_PREFIX = ".trash-checkpoint-"
MANIFEST = "manifest.json"
FORMAT_VERSION = 1
_NAME_RE = re.compile(r"^checkpoint-(\d{8,})$")


@runtime_checkable
class Stateful(Protocol):
    """Anything with ``state_dict()`` and ``load_state_dict(state)`` (modules, optimisers, ...)."""

    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any) -> Any: ...


class CheckpointStore:
    """The files of a checkpoint directory: atomic save, newest-complete lookup, load, cleanup."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def _complete(self) -> list[tuple[int, Path]]:
        if not self.root.is_dir():
            return []
        found = []
        for entry in self.root.iterdir():
            match = _NAME_RE.match(entry.name)
            if match and entry.is_dir() and (entry / MANIFEST).is_file():
                found.append((int(match.group(1)), entry))
        found.sort()
        return found

    def latest(self) -> Path | None:
        """The newest complete checkpoint directory, or None."""
        for _, path in reversed(self._complete()):
            try:
                self.manifest(path)
            except (OSError, ValueError) as exc:  # pragma: no cover - rename makes this unreachable
                logger.warning("ignoring unreadable checkpoint %s: %s", path, exc)
                continue
            return path
        return None

    @staticmethod
    def manifest(path: Path) -> dict[str, Any]:
        data = json.loads((Path(path) / MANIFEST).read_text(encoding="utf-8"))
        if not isinstance(data, dict) or data.get("version") != FORMAT_VERSION:
            raise ValueError(f"{path}: unsupported checkpoint manifest")
        return data

    def load(self, path: Path, name: str) -> Any:
        """The saved state ``name`` of checkpoint ``path`` (KeyError if it holds none)."""
        files = self.manifest(path)["states"]
        return torch.load(Path(path) / files[name], map_location="cpu", weights_only=False)

    def names(self, path: Path) -> list[str]:
        return list(self.manifest(path)["states"])

    def cleanup(self) -> None:
        """Remove leftovers of interrupted saves and deletions (never a complete checkpoint)."""
        if not self.root.is_dir():
            return
        for entry in self.root.iterdir():
            if entry.name.startswith((TMP_PREFIX, TRASH_PREFIX)):
                shutil.rmtree(entry, ignore_errors=True)

    def save(self, states: Mapping[str, Any], meta: Mapping[str, Any] | None = None) -> Path:
        """Write ``states`` (name → picklable state) as the new newest checkpoint; return its path."""
        self.root.mkdir(parents=True, exist_ok=True)
        complete = self._complete()
        seq = (complete[-1][0] if complete else 0) + 1
        tmp = self.root / f"{TMP_PREFIX}{seq:08d}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        files: dict[str, str] = {}
        for i, (name, state) in enumerate(states.items()):
            fname = f"state-{i:03d}.pt"
            write_durable(tmp / fname, functools.partial(torch.save, state))
            files[name] = fname
        manifest = {"version": FORMAT_VERSION, "seq": seq, "time": time.time(), "states": files,
                    "meta": dict(meta or {})}
        text = json.dumps(manifest, indent=1, sort_keys=True).encode("utf-8")
        write_durable(tmp / MANIFEST, text)
        fsync_dir(tmp)
        final = self.root / f"{CHECKPOINT_PREFIX}{seq:08d}"
        os.rename(tmp, final)
        fsync_dir(self.root)
        for old_seq, old in complete:
            trash = self.root / f"{TRASH_PREFIX}{old_seq:08d}-{uuid.uuid4().hex[:8]}"
            try:
                os.rename(old, trash)
            except OSError:  # pragma: no cover - removed concurrently
                continue
            shutil.rmtree(trash, ignore_errors=True)
        for entry in self.root.iterdir():  # leftovers of saves or deletions that were killed
            if entry.name.startswith((TMP_PREFIX, TRASH_PREFIX)):
                shutil.rmtree(entry, ignore_errors=True)
        return final


class StateRegistry:
    """Named states that make up a job's checkpoint.

    ``register(name, obj)`` adds a state; if the checkpoint this run was restored from holds
    ``name``, it is loaded into ``obj`` right away, so objects created after the start (a loader, an
    optimiser) are restored when they are registered. Without a store (no checkpoint directory)
    nothing is saved or restored.
    """

    def __init__(self, store: CheckpointStore | None, *, clean: bool = True) -> None:
        self.store = store
        self._objects: dict[str, Stateful] = {}
        self.restored_from: Path | None = None
        self._restored_names: set[str] = set()
        if store is not None:
            if clean:
                store.cleanup()
            self.restored_from = store.latest()
            if self.restored_from is not None:
                self._available = set(store.names(self.restored_from))
                logger.info("restoring from checkpoint %s", self.restored_from)
            else:
                self._available = set()
        else:
            self._available = set()

    @property
    def enabled(self) -> bool:
        return self.store is not None

    def __contains__(self, name: str) -> bool:
        return name in self._objects

    def names(self) -> list[str]:
        return list(self._objects)

    def register(self, name: str, obj: Stateful, *, restore: bool = True) -> bool:
        """Register ``obj`` under ``name``; return True if it was restored from the checkpoint."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"name: expected a non-empty string, got {name!r}")
        if name in self._objects and self._objects[name] is not obj:
            raise ValueError(f"name: a state named {name!r} is already registered")
        if not callable(getattr(obj, "state_dict", None)) or not callable(
                getattr(obj, "load_state_dict", None)):
            raise TypeError(f"{name}: a registered state needs state_dict() and load_state_dict()")
        self._objects[name] = obj
        if restore and name in self._available and name not in self._restored_names:
            assert self.store is not None and self.restored_from is not None
            obj.load_state_dict(self.store.load(self.restored_from, name))
            self._restored_names.add(name)
            return True
        return False

    def save(self, meta: Mapping[str, Any] | None = None) -> Path | None:
        """Save every registered state atomically; None when checkpointing is off."""
        if self.store is None:
            return None
        states = {name: obj.state_dict() for name, obj in self._objects.items()}
        path = self.store.save(states, meta)
        logger.info("saved checkpoint %s (%d states)", path, len(states))
        return path

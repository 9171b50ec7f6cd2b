"""Atomic checkpoints: newest complete one wins, leftovers are ignored, SIGKILL never corrupts."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from pollux.torch.checkpoint import CheckpointStore, StateRegistry


class Box:
    """A registrable state holding a value."""

    def __init__(self, value: object = None) -> None:
        self.value = value

    def state_dict(self) -> dict:
        return {"value": self.value}

    def load_state_dict(self, state: dict) -> None:
        self.value = state["value"]


def test_save_and_restore_through_the_registry(tmp_path: Path) -> None:
    reg = StateRegistry(CheckpointStore(tmp_path))
    assert reg.restored_from is None
    a, b = Box(1), Box(torch.arange(4))
    assert reg.register("a", a) is False and reg.register("b", b) is False
    first = reg.save()
    a.value = 2
    second = reg.save()
    assert first is not None and second is not None and second.name > first.name
    assert not first.exists()                          # older complete checkpoints are removed
    assert sorted(p.name for p in tmp_path.iterdir()) == [second.name]

    reg2 = StateRegistry(CheckpointStore(tmp_path))
    assert reg2.restored_from == second
    a2, b2, c2 = Box(), Box(), Box("untouched")
    assert reg2.register("a", a2) is True and reg2.register("b", b2) is True
    assert reg2.register("c", c2) is False
    assert a2.value == 2 and torch.equal(b2.value, torch.arange(4)) and c2.value == "untouched"


def test_leftovers_are_ignored_and_cleaned(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    good = store.save({"x": 1})
    (tmp_path / ".tmp-checkpoint-00000009-1-abc").mkdir()           # a save killed mid-way
    (tmp_path / ".tmp-checkpoint-00000009-1-abc" / "state-000.pt").write_bytes(b"garbage")
    (tmp_path / "checkpoint-00000010").mkdir()                       # no manifest: never complete
    (tmp_path / ".trash-checkpoint-00000001-x").mkdir()               # a deletion killed mid-way
    assert store.latest() == good
    assert store.load(good, "x") == 1
    StateRegistry(store)                                             # a new run cleans up
    assert not (tmp_path / ".tmp-checkpoint-00000009-1-abc").exists()
    assert not (tmp_path / ".trash-checkpoint-00000001-x").exists()
    assert store.latest() == good


def test_registry_errors(tmp_path: Path) -> None:
    reg = StateRegistry(None)
    assert not reg.enabled and reg.save() is None
    reg.register("a", Box())
    with pytest.raises(ValueError, match="already registered"):
        reg.register("a", Box())
    with pytest.raises(TypeError, match="state_dict"):
        reg.register("b", object())  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        reg.register("", Box())


def _saver(root: str, ready: multiprocessing.synchronize.Event) -> None:
    """Save checkpoints in a loop, each a consistent version of three states."""
    store = CheckpointStore(root)
    latest = store.latest()
    version = 0 if latest is None else int(store.load(latest, "meta")["version"])
    ready.set()
    while True:
        version += 1
        # numpy builds the payload: a forked child must not run torch's intra-op thread pool.
        weights = torch.from_numpy(np.full(150_000, float(version), dtype=np.float32))
        store.save({"meta": {"version": version}, "weights": weights,
                    "extra": {"version": version, "blob": bytes(50_000)}})


def test_sigkill_during_saves_never_leaves_an_unloadable_checkpoint(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    rng = np.random.default_rng(2024)
    store = CheckpointStore(tmp_path)
    last_version = 0
    for _ in range(20):
        ready = ctx.Event()
        proc = ctx.Process(target=_saver, args=(str(tmp_path), ready), daemon=True)
        proc.start()
        try:
            assert ready.wait(30)
            time.sleep(float(rng.uniform(0.0, 0.08)))
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.join(10)
        assert proc.exitcode == -signal.SIGKILL
        latest = store.latest()
        if latest is None:          # killed before the first save of the first run completed
            assert last_version == 0
            continue
        version = store.load(latest, "meta")["version"]
        assert torch.equal(store.load(latest, "weights"), torch.full((150_000,), float(version)))
        assert store.load(latest, "extra")["version"] == version
        assert version >= last_version
        last_version = version
    assert last_version > 0
    complete = [p for p in tmp_path.iterdir() if p.name.startswith("checkpoint-")]
    assert len(complete) <= 2       # the newest, plus an older one if killed just before pruning

"""The on-disk running checkpoint: merged saves, row-group reads, and crashes during saves.

The crash test runs a child process that queues saves asynchronously (each a seeded 1/8 of the
rows set to the save's number) and SIGKILLs it at seeded random moments; whatever the moment, the
store must load, and what it loads must equal the merge of some prefix 0..j of the saves — never a
mix with an incomplete save.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from pollux.scar.api import ScarError
from pollux.scar.live.store import RunningStore, TableInfo

SHAPES = {"a": (3000, 24), "b": (400, 3)}
SAVES = 40


def _tables(seed: int = 0) -> dict[str, TableInfo]:
    rng = np.random.default_rng(seed)
    return {t: TableInfo(s, "float64", rng.integers(0, 4, s[0])) for t, s in SHAPES.items()}


def _save_rows(i: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Save i: everything at i = 0, else a seeded eighth of the rows, every value = i."""
    out = {}
    for t, s in SHAPES.items():
        rows = (
            np.arange(s[0])
            if i == 0
            else np.random.default_rng([i, len(t)]).choice(s[0], s[0] // 8, replace=False)
        )
        out[t] = (rows, np.full((rows.size, *s[1:]), float(i)))
    return out


def _prefixes() -> list[dict[str, np.ndarray]]:
    """The running checkpoint after saves 0..j, for every j."""
    cur = {t: np.full(s, np.nan) for t, s in SHAPES.items()}
    out = []
    for i in range(SAVES):
        for t, (rows, vals) in _save_rows(i).items():
            cur[t][rows] = vals
        out.append({t: v.copy() for t, v in cur.items()})
    return out


CHILD = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {tests!r})
    import test_scar_store as T
    from pollux.scar.live.store import RunningStore
    store = RunningStore(sys.argv[1], T._tables(), compact_every=3)
    print("ready", flush=True)
    for i in range(T.SAVES):
        store.save_async(T._save_rows(i))
    store.close()
    print("done", flush=True)
    """
)


def test_merge_subset_reads_and_errors(tmp_path):
    tables = _tables()
    store = RunningStore(tmp_path, tables, compact_every=2)
    assert store.load().seq == -1
    for i in range(5):
        store.save_async(_save_rows(i))
    store.flush()
    full = store.load()
    ref = _prefixes()[4]
    assert full.seq == 4
    for t in SHAPES:
        np.testing.assert_array_equal(full.values[t], ref[t][full.rows[t]])
        assert full.rows[t].size == SHAPES[t][0]
    # the rows of one group (a lost shard) read about that group's share of the bytes
    lost = {t: np.flatnonzero(info.groups == 2) for t, info in tables.items()}
    part = store.load(lost)
    for t in SHAPES:
        np.testing.assert_array_equal(part.rows[t], lost[t])
        np.testing.assert_array_equal(part.values[t], ref[t][lost[t]])
    share = part.bytes_read / full.bytes_read
    assert 0.15 < share < 0.4, share
    # a single row reads only its group's files
    one = store.load({"a": np.array([7])})
    assert one.rows["a"].tolist() == [7] and "b" not in one.rows
    assert one.bytes_read < full.bytes_read / 3
    with pytest.raises(ScarError, match="no table 'zz'"):
        store.save({"zz": (np.array([0]), np.zeros((1, 1)))})
    with pytest.raises(ScarError, match="table 'a'"):
        store.save({"a": (np.array([0]), np.zeros((1, 5)))})
    store.close()


def test_sigkill_during_async_saves_leaves_a_committed_prefix(tmp_path):
    prefixes = _prefixes()
    rng = np.random.default_rng(15)
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    code = CHILD.format(tests=tests_dir)
    seen = set()
    for trial in range(12):
        d = tmp_path / f"run{trial}"
        proc = subprocess.Popen([sys.executable, "-c", code, str(d)], stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(float(rng.uniform(0.0, 0.25)))
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        proc.stdout.close()
        got = RunningStore(d, _tables()).load()  # a new store also clears the crash's temp folders
        assert not [p for p in d.iterdir() if p.name.startswith(".tmp-")]
        if got.seq < 0:
            assert all(r.size == 0 for r in got.rows.values())
            seen.add(-1)
            continue
        ref = prefixes[got.seq]
        for t in SHAPES:
            assert got.rows[t].size == SHAPES[t][0]  # save 0 holds every row
            np.testing.assert_array_equal(got.values[t], ref[t])
        seen.add(got.seq)
    assert len(seen) >= 3, f"kills should land at different moments, saw {sorted(seen)}"

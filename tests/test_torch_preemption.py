"""SIGTERM at any moment, resumed on another replica count (real gloo processes, SPEC §8).

Fifteen seeded scenarios cover each kind of moment — inside a step, during a checkpoint save, right
after a batch-size change, during the step that ends an epoch, during a refit — on a move from 1 to
2 replicas, from 2 to 1, and from 2 to 3 or 3 to 1, delivered by the agent's fault points (a real
SIGTERM sent by the process to itself at that moment), on a random rank where the moment exists on
every rank. Each job runs a script written the way people write them (momentum, weight decay, a
parameter group per parameter, a step schedule, adaptive batch with accumulation, its own all-reduce
at every epoch end, an ``Accumulator`` of examples kept in a checkpointed history), is preempted
(every replica exits 143), and resumes with the other replica count to the end. Then:

* every pass of the sample stream is trained on at most once per example (a pass may skip the fewer
  than K examples that cannot be shared equally at a rescale or a pass end, see ``ElasticSampler``);
* every epoch's end-of-epoch code ran exactly once, with at least one step behind it in that run
  (no epoch yielded again empty after a preemption on its last step), and the replicas had run the
  same number of steps in it (the script's own MAX/MIN all-reduce agrees);
* the script's own count of each epoch's examples (``Accumulator`` summed at the epoch's end into its
  checkpointed history, the pattern of the digits example) equals the number of dataset indices its
  steps logged in that epoch, over both runs: nothing counted twice or lost across the restart;
* no collective mismatch: a mismatch would hang or fail the replicas, and the runs must exit cleanly.

(An epoch is measured in progress: once the batch has grown, an epoch trains more than N examples,
so the counts are checked against the indices, not against epochs × N.)

Each replica is its own process, forked from a server that has already imported torch
(``torch_workers/forkserver.py``): the imports, not the training, were most of a run's time.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pytest

from torch_workers.forkserver import ForkServer
from torch_workers.launch import WORKERS

WORKER = WORKERS / "preempt_worker.py"
N, M0, EPOCHS = 384, 8, 3
KINDS = ("step", "save", "change", "epoch_end", "refit")
#: Every kind of moment on each of these moves, and on one of the three-replica ones.
MOVES = ((1, 2), (2, 1))
THREE = ((2, 3), (3, 1))


def scenarios() -> list[tuple[str, int, int, tuple[int, int]]]:
    rng = np.random.default_rng(2026)
    out = []
    plan = [(kind, seq) for kind in KINDS for seq in MOVES]
    plan += [(kind, THREE[i % len(THREE)]) for i, kind in enumerate(KINDS)]
    for kind, seq in plan:
        if kind == "change" and seq[0] == 1:
            seq = (3, 2)          # one replica with accumulation forced does not grow here (per-pass cost)
        count = {"step": int(rng.integers(5, 80)), "save": int(rng.integers(1, 3)),
                 "change": int(rng.integers(1, 3)), "epoch_end": int(rng.integers(1, 3)),
                 "refit": int(rng.integers(1, 5))}[kind]
        if kind == "change":
            count = 1             # a second change depends on the machine's timings; the first does not
        rank = 0 if kind in ("save", "refit") else int(rng.integers(0, seq[0]))   # rank-0-only moments
        out.append((kind, count, rank, seq))
    return out


def read_jsonl(paths: list[Path]) -> list[dict]:
    return [json.loads(line) for p in paths if p.exists() for line in p.read_text().splitlines()
            if line.strip()]


@pytest.mark.parametrize(("kind", "count", "rank", "seq"), scenarios(),
                         ids=[f"{k}{c}-rank{r}-{a}to{b}" for k, c, r, (a, b) in scenarios()])
def test_sigterm_at_any_moment_then_resume_on_another_replica_count(
        tmp_path: Path, forks: ForkServer, kind: str, count: int, rank: int, seq: tuple[int, int]) -> None:
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    common = {"TEST_OUT_DIR": str(out), "TEST_N": str(N), "TEST_M0": str(M0), "TEST_EPOCHS": str(EPOCHS),
              "TEST_AUTOSCALE": "64,2,16", "TEST_STEP_SLEEP": "0.003", "POLLUX_REFIT_INTERVAL_S": "0.2"}
    first = forks.launch(WORKER, seq[0], out, checkpoint_dir=ckpt, tag="p1",
                         env={**common, "TEST_TAG": "p1", "POLLUX_FAULT_SIGTERM": f"{kind}:{count}",
                              "POLLUX_FAULT_SIGTERM_RANK": str(rank)})
    try:
        codes = first.wait(150)
        assert codes == [143] * seq[0], first.output()
    finally:
        first.kill()
    log = (out / f"p1-rank{rank}.log").read_text()
    assert f"fault injection: SIGTERM at {kind} #{count}" in log, first.output()
    second = forks.launch(WORKER, seq[1], out, checkpoint_dir=ckpt, tag="p2",
                          env={**common, "TEST_TAG": "p2"})
    try:
        codes = second.wait(150)
        assert codes == [0] * seq[1], second.output()
    finally:
        second.kill()

    # Every epoch's end ran once, after at least one step in that run, with equal steps on all replicas.
    epochs = read_jsonl([out / "epochs-p1.jsonl", out / "epochs-p2.jsonl"])
    assert [e["epoch"] for e in epochs] == list(range(EPOCHS)), epochs
    for e in epochs:
        assert e["steps_min"] == e["steps_max"] >= 1, e

    # Each pass of the sample stream: no example twice; at most a few skipped at rescales/pass ends.
    visits = read_jsonl(sorted(out.glob("visits-*.jsonl")))
    by_pass: dict[int, Counter] = defaultdict(Counter)
    for v in visits:
        by_pass[v["pass"]].update(v["idx"])
    last = max(by_pass)
    for p, seen in by_pass.items():
        twice = [i for i, c in seen.items() if c > 1]
        assert not twice, f"pass {p}: examples trained twice: {twice}"
        assert min(seen) >= 0 and max(seen) < N
        if p < last:
            assert N - len(seen) <= 4, f"pass {p}: {N - len(seen)} examples skipped"
    # The script's own counters, kept across the restart: each epoch's examples as its steps logged them.
    final = json.loads((out / "final-p2.json").read_text())
    assert final["runs"] == 2 and final["replicas"] == seq[1], final
    logged = Counter(v["epoch"] for v in visits for _ in v["idx"])
    assert final["per_epoch"] == [logged[e] for e in range(EPOCHS)], (final, logged)
    assert sum(final["per_epoch"]) <= final["position"] <= sum(final["per_epoch"]) + 4 * (last + 1), final
    # The job did adapt its batch somewhere (the moments of a change and a refit exist at all).
    assert {v["batch"] for v in visits} != {M0} or kind not in ("change",)

"""LB-BSP in the agent: weighted aggregation through the DDP hook equals the single-process gradient
of the whole global batch (real gloo replicas on loopback); the compute times ride in the packet.

The replicas are processes forked from a server that has already imported torch
(``torch_workers/forkserver.py``), which saves each the seconds of its imports."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from torch_workers.forkserver import ForkServer
from torch_workers.launch import WORKERS


def run_worker(forks: ForkServer, tmp_path: Path, shares: tuple[int, ...], micro: int, weighted: bool,
               tail: bool = False) -> list[dict]:
    tag = f"s{'-'.join(map(str, shares))}-m{micro}-w{int(weighted)}-t{int(tail)}"
    outs = [tmp_path / f"{tag}-{r}.json" for r in range(len(shares))]
    group = forks.launch(WORKERS / "balance_worker.py", len(shares), tmp_path, tag=tag,
                         args=[",".join(map(str, shares)), str(micro), "1" if weighted else "0",
                               str(tmp_path / f"{tag}-RANK.json"), "1" if tail else "0"])
    codes = group.wait(120)
    assert codes == [0] * len(shares), group.output()
    return [json.loads(p.read_text()) for p in outs]


@pytest.mark.parametrize(("shares", "micro"), [((3, 13), 1), ((5, 7, 20), 1), ((3, 13), 2)])
def test_weighted_gradient_equals_single_process_gradient(tmp_path: Path, forks: ForkServer,
                                                           shares: tuple[int, ...], micro: int) -> None:
    results = run_worker(forks, tmp_path, shares, micro, weighted=True)
    for r in results:
        assert r["rel_error"] < 1e-5, results
    # every replica received every replica's compute time of the previous step, by rank
    for r in results:
        assert r["step_times"] == [0.5 + i for i in range(len(shares))] + [0.0] * len(shares)


def test_a_tail_step_with_shares_is_weighted_too(tmp_path: Path, forks: ForkServer) -> None:
    """An epoch's tail step split unequally (the sampler does so since the tail no longer waits for
    the straggler) is weighted by its shares although it is not a full step."""
    for r in run_worker(forks, tmp_path, (2, 7), 1, weighted=True, tail=True):
        assert r["rel_error"] < 1e-5, r


@pytest.mark.parametrize("shares", [(3, 13), (5, 7, 20)])
def test_without_weights_the_gradient_differs(tmp_path: Path, forks: ForkServer,
                                              shares: tuple[int, ...]) -> None:
    results = run_worker(forks, tmp_path, shares, 1, weighted=False)
    for r in results:
        assert r["rel_error"] > 1e-2, results


# ---------------------------------------------------------------- the loader with balancing on

TRAIN = WORKERS / "train_worker.py"


def records(out: Path, tag: str) -> dict[int, list[dict]]:
    by_rank = {}
    for path in sorted(out.glob(f"visits-{tag}-rank*.jsonl")):
        rank = int(path.stem.rsplit("rank", 1)[1])
        by_rank[rank] = [json.loads(line) for line in path.read_text().splitlines()]
    return by_rank


def exactly_once(out: Path, n: int, epochs: int) -> None:
    seen: dict[int, Counter] = defaultdict(Counter)
    for path in out.glob("visits-*.jsonl"):
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            assert rec["applied"]
            seen[rec["epoch"]].update(rec["idx"])
    assert sorted(seen) == list(range(epochs))
    for epoch, visits in seen.items():
        assert max(visits.values()) == 1, epoch
        assert n - len(visits) < 3, (epoch, n - len(visits))     # only a tail remainder is skipped


def test_cpu_balancer_splits_two_to_one_and_keeps_exactly_once(tmp_path: Path, forks: ForkServer) -> None:
    n, m0, epochs = 480, 24, 2
    env = {"TEST_OUT_DIR": str(tmp_path), "TEST_TAG": "bal", "TEST_N": str(n), "TEST_M0": str(m0),
           "TEST_EPOCHS": str(epochs), "TEST_BALANCE": "cpu", "TEST_SLOW": "0:0.001,1:0.002"}
    group = forks.launch(TRAIN, 2, tmp_path, env=env, tag="bal")
    try:
        assert group.wait(180) == [0, 0], group.output()
    finally:
        group.kill()
    exactly_once(tmp_path, n, epochs)
    recs = records(tmp_path, "bal")
    # Both replicas see the same shares; by the end they are close to 2 : 1 (16 : 8 of 24).
    assert [r["shares"] for r in recs[0]] == [r["shares"] for r in recs[1]]
    last = recs[0][-1]["shares"]
    assert abs(last[0] - 16) <= 2 and sum(last) == m0, last
    # each replica trained on its share (the last full step's micro-batch sizes)
    full = [(a, b) for a, b in zip(recs[0], recs[1], strict=True) if len(a["idx"]) + len(b["idx"]) == m0]
    assert full and (len(full[-1][0]["idx"]), len(full[-1][1]["idx"])) == tuple(full[-2][0]["shares"])
    log = (tmp_path / "bal-rank0.log").read_text()
    assert "balance {" in log and "batch shares [12, 12] ->" in log


def test_restart_two_to_three_replicas_with_balancing(tmp_path: Path, forks: ForkServer) -> None:
    n, m0, epochs = 360, 12, 2
    ckpt = tmp_path / "ckpt"
    common = {"TEST_OUT_DIR": str(tmp_path), "TEST_N": str(n), "TEST_M0": str(m0),
              "TEST_EPOCHS": str(epochs), "TEST_BALANCE": "cpu", "TEST_SLOW": "1:0.002"}
    first = forks.launch(TRAIN, 2, tmp_path, checkpoint_dir=ckpt, tag="p1",
                         env={**common, "TEST_TAG": "p1", "TEST_SIGTERM_AT_STEP": "12"})
    try:
        assert first.wait(180) == [143, 143], first.output()
    finally:
        first.kill()
    recs = records(tmp_path, "p1")
    assert recs[0][-1]["shares"][0] > recs[0][-1]["shares"][1]       # balanced before the stop
    second = forks.launch(TRAIN, 3, tmp_path, checkpoint_dir=ckpt, tag="p2",
                          env={**common, "TEST_TAG": "p2"})
    try:
        assert second.wait(180) == [0, 0, 0], second.output()
    finally:
        second.kill()
    exactly_once(tmp_path, n, epochs)
    resumed = records(tmp_path, "p2")[0]
    assert resumed[0]["shares"] in ([], [4, 4, 4])        # a new replica count starts from equal shares


def test_pgns_with_unequal_shares_within_15_percent(tmp_path: Path, forks: ForkServer) -> None:
    """Balancing on, one replica slowed: most steps run with unequal shares, and the size-weighted
    estimator (``goodput.efficiency.estimate_unequal``) still measures the known noise scale."""
    out = tmp_path / "pgns.json"
    group = forks.launch(WORKERS / "pgns_worker.py", 2, tmp_path, args=[str(out), "sgd", "800", "48"],
                         tag="pgns", env={"PGNS_BALANCE": "cpu", "PGNS_SLOW": "1:0.0002"})
    try:
        assert group.wait(180) == [0, 0], group.output()
    finally:
        group.kill()
    res = json.loads(out.read_text())
    assert res["unequal_steps"] > 700 and not res["biased"]
    assert res["pgns"] == pytest.approx(res["true_pgns"], rel=0.15)
    assert res["var"] == pytest.approx(res["true_var"], rel=0.15)
    assert res["sqr"] == pytest.approx(res["true_sqr"], rel=0.15)


def test_digits_example_balances_a_slowed_replica(tmp_path: Path, forks: ForkServer) -> None:
    """examples/digits/train.py --balance cpu with replica 1 slowed 3×: the shares move towards
    replica 0 (logged, and printed at the end) and the model still learns."""
    script = WORKERS.parents[1] / "examples" / "digits" / "train.py"
    group = forks.launch(script, 2, tmp_path, tag="digits",
                         args=["--epochs", "6", "--balance", "cpu", "--slow-rank", "1", "--slow-factor", "3",
                               "--local-bsz-bounds", "2", "256"])
    try:
        assert group.wait(240) == [0, 0], group.output()
    finally:
        group.kill()
    log = (tmp_path / "digits-rank0.log").read_text()
    result = json.loads([line for line in log.splitlines() if line.startswith("{")][-1])
    assert result["test_accuracy"] >= 0.9
    assert "batch shares [8, 8] ->" in log and "balance {" in log
    shares = result["shares"]
    assert len(shares) == 2 and shares[0] > shares[1], shares

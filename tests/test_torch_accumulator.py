"""``pollux.torch.Accumulator``: local adds, the collective sum, checkpoints across replica counts.

Fast tests in one process (a world of one over gloo), then a real job of gloo replicas on loopback:
2 replicas stopped by SIGTERM mid-epoch (exit 143), resumed on 3 from the checkpoint; every epoch's
totals, the interrupted one included, are exact.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist

import pollux.torch as ptorch
from pollux.torch.accumulator import _union_keys
from pollux.torch.context import get_context, reset_context
from torch_workers.forkserver import ForkServer
from torch_workers.launch import WORKERS

WORKER = WORKERS / "accum_worker.py"


# --------------------------------------------------------------------------------------------
# Local operations and the sum in one process
# --------------------------------------------------------------------------------------------


def test_local_adds_update_and_sum(agent) -> None:
    acc = ptorch.Accumulator()
    assert acc["loss_sum"] == 0 and "loss_sum" not in acc and len(acc) == 0   # missing reads as 0
    acc["loss_sum"] += torch.tensor(1.5, requires_grad=True) * 2
    acc["count"] += 3
    acc["count"] += torch.tensor([4])                    # a one-element tensor
    acc["hits"] += (torch.tensor([1, 2, 3]) > 1).sum()   # an int tensor stays an int
    acc.update({"count": np.int64(1), "hits": True}, loss_sum=np.float32(0.5))   # update adds
    acc["gauge"] = 7.0                                   # plain assignment sets
    assert acc.local() == {"loss_sum": 3.5, "count": 8, "hits": 3, "gauge": 7.0}
    assert type(acc["count"]) is int and type(acc["hits"]) is int and type(acc["loss_sum"]) is float
    assert sorted(acc) == ["count", "gauge", "hits", "loss_sum"] and len(acc) == 4 and "hits" in acc
    totals = acc.sum()
    assert totals == {"count": 8, "gauge": 7.0, "hits": 3, "loss_sum": 3.5}
    assert list(totals) == sorted(totals) and type(totals["count"]) is int
    totals["count"] = 0                                  # a new dict: the accumulator is unchanged
    assert acc["count"] == 8 and "Accumulator('pollux_accumulator0'" in repr(acc)


def test_sum_reset_and_clear(agent) -> None:
    acc = ptorch.Accumulator()
    acc.update(a=1, b=2.0)
    assert acc.sum(reset=True) == {"a": 1, "b": 2.0}
    assert acc.local() == {} and acc.sum() == {}
    acc["a"] += 5
    acc.reset()
    assert acc.local() == {}
    acc["a"] += 5
    acc.clear()
    assert acc.sum() == {}


def test_single_process_sum_needs_no_collective(agent) -> None:
    acc = ptorch.Accumulator()
    acc["x"] += 1

    def forbidden(*args, **kwargs):
        raise AssertionError("no collective in a world of one")

    agent.setattr(dist, "all_reduce", forbidden)
    agent.setattr(dist, "all_gather_object", forbidden)
    assert acc.sum() == {"x": 1}


def test_errors_name_the_accumulator_and_the_key(agent) -> None:
    acc = ptorch.Accumulator("metrics")
    with pytest.raises(TypeError, match=r"'metrics'.*'loss'.*str"):
        acc["loss"] = "0.5"
    with pytest.raises(TypeError, match=r"'loss'.*NoneType"):
        acc["loss"] = None
    with pytest.raises(ValueError, match=r"'loss'.*not finite \(nan\)"):
        acc["loss"] += float("nan")
    with pytest.raises(ValueError, match=r"'loss'.*not finite \(inf\)"):
        acc["loss"] += torch.tensor(math.inf)
    with pytest.raises(ValueError, match=r"'loss'.*one-element tensor.*\(3,\)"):
        acc["loss"] += torch.ones(3)
    with pytest.raises(TypeError, match=r"'loss'.*complex"):
        acc["loss"] += 1j
    with pytest.raises(TypeError, match="keys must be strings"):
        acc[3] = 1
    with pytest.raises(ValueError, match="'bad'"):
        acc.update({"good": 1, "bad": float("inf")})
    assert acc.local() == {}                             # nothing was added by the failed update


def test_names_are_stable_and_unique(agent) -> None:
    first, second = ptorch.Accumulator(), ptorch.Accumulator()
    named = ptorch.Accumulator("train_metrics")
    assert (first.name, second.name, named.name) == ("pollux_accumulator0", "pollux_accumulator1",
                                                     "train_metrics")
    assert ptorch.Accumulator().name == "pollux_accumulator2"
    with pytest.raises(ValueError, match="'train_metrics' is already used"):
        ptorch.Accumulator("train_metrics")
    with pytest.raises(ValueError, match="'pollux_epoch' is already used"):
        ptorch.Accumulator("pollux_epoch")
    with pytest.raises(ValueError, match="non-empty string"):
        ptorch.Accumulator("")
    names = get_context().registry.names()
    assert {"pollux_accumulator0", "pollux_accumulator1", "train_metrics"} <= set(names)


def test_state_dict_round_trip_and_bad_states(agent) -> None:
    acc = ptorch.Accumulator()
    acc.update(count=3, loss=1.25)
    state = acc.state_dict()
    other = ptorch.Accumulator()
    other.load_state_dict(state)
    assert other.local() == {"count": 3, "loss": 1.25} and type(other["count"]) is int
    acc["count"] += 1
    assert other["count"] == 3 and state["values"]["count"] == 3      # the state is a copy
    with pytest.raises(ValueError, match="not an Accumulator state"):
        other.load_state_dict({"count": 3})
    with pytest.raises(ValueError, match="version"):
        other.load_state_dict({"version": 99, "values": {}})


def test_union_of_keys_across_replicas() -> None:
    merged = _union_keys([[("a", True), ("c", False)], [("a", False), ("b", True)], []])
    assert merged == [("a", False), ("b", True), ("c", False)]
    assert _union_keys([[], []]) == []


def test_other_ranks_fold_into_rank_0_and_restore_nothing(agent) -> None:
    """What a replica other than rank 0 does (rank faked): the fold drops its values, a load ignores them."""
    acc = ptorch.Accumulator()
    acc["x"] += 2
    saved = acc.state_dict()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(type(get_context()), "rank", property(lambda self: 1))
        acc._fold_into_rank0()
        assert acc.local() == {}
        acc.load_state_dict(saved)
        assert acc.local() == {}
    acc.load_state_dict(saved)                             # rank 0 again
    assert acc.local() == {"x": 2}


def test_checkpoint_and_restore_in_one_process(agent, tmp_path: Path) -> None:
    agent.setenv("POLLUX_CHECKPOINT_DIR", str(tmp_path))
    ptorch.init_process_group("gloo")
    auto, named = ptorch.Accumulator(), ptorch.Accumulator("whole_run")
    assert not auto.restored and not named.restored
    auto.update(count=4, loss=0.5)
    named["count"] += 10
    calls = []
    get_context().before_save.append(lambda: calls.append(auto.local()))
    get_context().save_checkpoint("test")
    assert calls == [{"count": 4, "loss": 0.5}]           # the hooks run before the save
    reset_context()
    auto, named = ptorch.Accumulator(), ptorch.Accumulator("whole_run")
    assert auto.restored and named.restored
    assert auto.local() == {"count": 4, "loss": 0.5} and named.local() == {"count": 10}
    assert auto.sum() == {"count": 4, "loss": 0.5}


def test_without_checkpointing_nothing_is_folded_or_restored(agent) -> None:
    acc = ptorch.Accumulator()
    acc["x"] += 1
    agent.setattr(acc, "_fold_into_rank0", lambda: pytest.fail("no fold without checkpointing"))
    get_context().save_checkpoint("epoch")
    reset_context()
    again = ptorch.Accumulator()
    assert not again.restored and again.local() == {}


def _train(epochs: int, stop_at_step: int | None = None) -> list[dict]:
    """One replica, 40 examples, M0 = 8 (5 steps per epoch): per-epoch examples and index sums."""
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ds = torch.utils.data.TensorDataset(torch.arange(40), torch.randn(40, 2), torch.randn(40))
    adp = ptorch.AdaptiveDataParallel(model, opt)
    loader = ptorch.AdaptiveDataLoader(ds, batch_size=8, shuffle=True, seed=1)
    metrics = ptorch.Accumulator()
    logged = []
    for epoch in ptorch.remaining_epochs_until(epochs):
        for idx, x, y in loader:
            opt.zero_grad()
            torch.nn.functional.mse_loss(adp(x).squeeze(1), y).backward()
            opt.step()
            metrics["examples"] += len(idx)
            metrics["index_sum"] += idx.sum()
            if adp.steps == stop_at_step:
                get_context().sigterm_requested = True     # what the SIGTERM handler does
        logged.append({"epoch": epoch, **metrics.sum(reset=True)})
    return logged


def test_per_epoch_totals_survive_a_preemption_mid_epoch(agent, tmp_path: Path) -> None:
    agent.setenv("POLLUX_CHECKPOINT_DIR", str(tmp_path))
    with pytest.raises(SystemExit) as exc:
        _train(3, stop_at_step=7)                          # preempted at step 8, inside epoch 1
    assert exc.value.code == 143
    reset_context()
    logged = _train(3)
    exact = {"examples": 40, "index_sum": 40 * 39 // 2}
    assert logged == [{"epoch": 1, **exact}, {"epoch": 2, **exact}]


# --------------------------------------------------------------------------------------------
# Real replicas: 2 → SIGTERM mid-epoch → 3
# --------------------------------------------------------------------------------------------

N, M0, EPOCHS, STOP_AT = 360, 12, 3, 40       # 30 steps per epoch; the stop lands at step 41
STEPS = N // M0


def read_totals(out: Path, tag: str, replicas: int) -> list[dict]:
    """The per-epoch totals every replica of a run read; they must be the same on all of them."""
    per_rank = [[json.loads(line) for line in (out / f"totals-{tag}-rank{r}.jsonl").read_text().splitlines()]
                for r in range(replicas)]
    assert all(records == per_rank[0] for records in per_rank), per_rank
    return per_rank[0]


def test_totals_are_exact_across_a_restart_from_2_to_3_replicas(tmp_path: Path, forks: ForkServer) -> None:
    out, ckpt = tmp_path / "job", tmp_path / "ckpt"
    common = {"TEST_N": str(N), "TEST_M0": str(M0), "TEST_EPOCHS": str(EPOCHS)}
    phase1 = forks.launch(WORKER, 2, out, checkpoint_dir=ckpt, tag="p1",
                          env={**common, "TEST_OUT_DIR": str(out), "TEST_TAG": "p1",
                               "TEST_SIGTERM_AT_STEP": str(STOP_AT)})
    try:
        assert phase1.wait(120) == [143, 143], phase1.output()
    finally:
        phase1.kill()
    stopped = int((out / "steps-p1.txt").read_text())
    assert stopped == STOP_AT + 1                      # the flag travels with the next step
    done_in_epoch = stopped - STEPS                    # steps of epoch 1 done before the stop

    phase2 = forks.launch(WORKER, 3, out, checkpoint_dir=ckpt, tag="p2",
                          env={**common, "TEST_OUT_DIR": str(out), "TEST_TAG": "p2"})
    try:
        assert phase2.wait(120) == [0, 0, 0], phase2.output()
    finally:
        phase2.kill()

    # Right after the restart rank 0 holds the saved global totals and the new replicas nothing.
    restored = [json.loads((out / f"restored-p2-rank{r}.json").read_text()) for r in range(3)]
    assert restored[0]["name"] == "pollux_accumulator0" and restored[0]["restored"] == [True, True]
    per_epoch = restored[0]["per_epoch"]
    assert per_epoch["examples"] == done_in_epoch * M0
    assert per_epoch["steps_rank0"] == per_epoch["steps_rank1"] == done_in_epoch
    assert restored[0]["whole_run"] == {"examples": stopped * M0}
    assert all(r["per_epoch"] == {} and r["whole_run"] == {} for r in restored[1:])

    p1, p2 = read_totals(out, "p1", 2), read_totals(out, "p2", 3)
    assert [r["epoch"] for r in p1] == [0] and [r["epoch"] for r in p2] == [1, 2]
    exact = {"examples": N, "index_sum": N * (N - 1) // 2}
    steps_by_epoch = [{"steps_rank0": STEPS, "steps_rank1": STEPS},
                      {"steps_rank0": STEPS, "steps_rank1": STEPS, "steps_rank2": STEPS - done_in_epoch},
                      {"steps_rank0": STEPS, "steps_rank1": STEPS, "steps_rank2": STEPS}]
    sqrt_sum = math.fsum(math.sqrt(i) for i in range(N))
    for record, steps in zip(p1 + p2, steps_by_epoch, strict=True):
        totals = record["totals"]
        loss_sum, sqrt_index_sum = totals.pop("loss_sum"), totals.pop("sqrt_index_sum")
        assert totals == {**exact, **steps}, (record["epoch"], totals)
        assert all(record["types"][key] == "int" for key in totals)
        assert record["types"]["loss_sum"] == record["types"]["sqrt_index_sum"] == "float"
        assert sqrt_index_sum == pytest.approx(sqrt_sum, rel=1e-12)
        assert math.isfinite(loss_sum) and loss_sum > 0

    finals = [json.loads((out / f"final-p2-rank{r}.json").read_text()) for r in range(3)]
    assert all(f == {"whole_run": {"examples": EPOCHS * N}, "steps": EPOCHS * STEPS, "epoch": EPOCHS}
               for f in finals), finals

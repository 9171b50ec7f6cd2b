"""The shared SCAR base: block layouts, restoring chosen blocks, and the one top-r selection."""

from __future__ import annotations

import numpy as np
import pytest

from pollux.scar.api import (
    BlockLayout,
    Protocol,
    ReworkModel,
    ScarError,
    SelectionState,
    State,
    apply_blocks,
    select_blocks,
)


class _Rows(ReworkModel):
    """Six rows in three blocks, with a moment tensor that shares its parameter's block ids."""

    distance_tensors = ("w",)

    def __init__(self) -> None:
        ids = np.array([0, 0, 1, 1, 2, 2])
        self.layouts = {"rows": BlockLayout({"w": ids, "m": ids}, 3)}

    def init_state(self, trials: int) -> State:
        return {"w": np.zeros((trials, 6, 2)), "m": np.zeros((trials, 6, 2)), "t": np.zeros((trials, 1))}

    def step(self, state: State, iteration: int) -> State:
        return {k: v + 1.0 for k, v in state.items()}

    def loss(self, state: State) -> np.ndarray:
        return np.asarray(state["w"].sum(axis=(1, 2)))


def test_priority_picks_exactly_the_top_r_blocks() -> None:
    rng = np.random.default_rng(7)
    for _ in range(50):
        n = int(rng.integers(2, 200))
        d = rng.random((3, n))
        frac = float(rng.uniform(0.01, 1.0))
        chosen = select_blocks(d, frac, "priority", SelectionState())
        k = min(n, int(np.ceil(frac * n - 1e-9)))
        assert (chosen.sum(axis=1) == k).all()
        for row, mask in zip(d, chosen, strict=True):
            # every chosen distance >= every unchosen one: the top k, nothing else
            if 0 < k < n:
                assert row[mask].min() >= row[~mask].max()


def test_priority_ties_go_to_the_lower_block_id() -> None:
    chosen = select_blocks(np.array([1.0, 2.0, 2.0, 2.0, 0.0]), 0.4, "priority", SelectionState())
    assert chosen.tolist() == [False, True, True, False, False]


def test_round_robin_covers_every_block_once_per_cycle() -> None:
    st = SelectionState()
    seen = np.zeros(10, dtype=int)
    for _ in range(5):
        seen += select_blocks(np.zeros(10), 0.2, "round", st)
    assert (seen == 1).all()
    assert st.cursor == 0


def test_random_is_seeded_and_full_takes_all() -> None:
    a = select_blocks(np.zeros((4, 32)), 0.25, "random", SelectionState(rng=np.random.default_rng(3)))
    b = select_blocks(np.zeros((4, 32)), 0.25, "random", SelectionState(rng=np.random.default_rng(3)))
    assert (a == b).all() and (a.sum(axis=1) == 8).all()
    assert not (a[0] == a[1]).all()  # each trial draws its own blocks
    assert select_blocks(np.zeros(5), 0.2, "full", SelectionState()).all()


@pytest.mark.parametrize(
    ("strategy", "fraction", "field"),
    [("best", 0.5, "strategy"), ("priority", 0.0, "fraction"), ("priority", 1.5, "fraction")],
)
def test_bad_selection_names_the_field(strategy: str, fraction: float, field: str) -> None:
    with pytest.raises(ScarError, match=field):
        select_blocks(np.zeros(4), fraction, strategy, SelectionState())


def test_apply_blocks_restores_only_the_chosen_blocks_with_their_moments() -> None:
    model = _Rows()
    lay = model.layouts["rows"]
    saved = model.init_state(2)
    current = model.step(model.step(saved, 0), 1)
    lost = np.array([[False, True, False], [True, False, True]])
    out = apply_blocks(current, saved, lay, lost)
    for name in ("w", "m"):
        rows_lost = lost[:, lay.rows[name]]
        assert (out[name][rows_lost] == 0.0).all()
        assert (out[name][~rows_lost] == 2.0).all()
    assert (out["t"] == 2.0).all()  # no block: never restored
    assert (current["w"] == 2.0).all()  # the input is not modified


def test_block_distance_is_l2_over_the_distance_tensors_only() -> None:
    model = _Rows()
    lay = model.layouts["rows"]
    saved = model.init_state(1)
    current = {k: v.copy() for k, v in saved.items()}
    current["w"][0, 2:4] = 3.0  # block 1: four entries of 3 -> sqrt(36) = 6
    current["m"][0, 0] = 100.0  # moments do not count
    assert np.allclose(model.block_distance(current, saved, lay), [[0.0, 6.0, 0.0]])


def test_bad_layout_and_protocol_name_the_field() -> None:
    with pytest.raises(ScarError, match="rows\\['w'\\]"):
        BlockLayout({"w": np.array([0, 3])}, 3)
    with pytest.raises(ScarError, match="num_blocks"):
        BlockLayout({}, 0)
    with pytest.raises(ScarError, match="checkpoint_interval"):
        Protocol(checkpoint_interval=0)
    with pytest.raises(ScarError, match="failure_mean"):
        Protocol(failure_mean=1.0)

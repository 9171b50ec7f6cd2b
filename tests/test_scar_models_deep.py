"""The deep-ish models of the SCAR rework experiments: LDA (CVB0) and a small CNN with Adam."""

from __future__ import annotations

import numpy as np
import pytest

from pollux.scar.api import Protocol, ReworkModel, ScarError, State, apply_blocks
from pollux.scar.rework.experiment import recovery_trials, unperturbed
from pollux.scar.rework.models import cnn, lda
from pollux.scar.rework.models.registry import make_model


@pytest.fixture(scope="module")
def small_lda() -> lda.LatentDirichletAllocation:
    return lda.make(docs=48, vocab=60, topics=4, median_length=20.0, blocks=12)


@pytest.fixture(scope="module")
def small_cnn() -> cnn.ConvNet:
    return cnn.make(samples=96, batch=32, channels=4, hidden=8, shards=8, burn_in=0)


def _run(model: ReworkModel, state: State, steps: int) -> tuple[State, np.ndarray]:
    losses = [model.loss(state)]
    for t in range(steps):
        state = model.step(state, t)
        losses.append(model.loss(state))
    return state, np.array(losses)


# -- LDA --------------------------------------------------------------------------------------------


def test_lda_loss_decreases_and_counts_agree(small_lda: lda.LatentDirichletAllocation) -> None:
    state, losses = _run(small_lda, small_lda.init_state(2), 15)
    assert losses[-1, 0] < losses[0, 0] - 0.1
    # every document's topic counts sum to its length, and ndk is the sum of its pairs' assignments
    np.testing.assert_allclose(state["ndk"].sum(axis=2), np.tile(small_lda.doc_length, (2, 1)), rtol=1e-4)
    g = state["gamma"] * small_lda.count[None, :, None]
    per_doc = np.zeros_like(state["ndk"])
    np.add.at(per_doc.transpose(1, 0, 2), small_lda.doc, g.transpose(1, 0, 2))
    np.testing.assert_allclose(per_doc, state["ndk"], rtol=1e-4, atol=1e-4)


def test_lda_step_deterministic_and_identical_across_trials(
    small_lda: lda.LatentDirichletAllocation,
) -> None:
    s0 = small_lda.init_state(3)
    a, b = small_lda.step(s0, 0), small_lda.step(s0, 0)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
        np.testing.assert_allclose(a[k], np.broadcast_to(a[k][:1], a[k].shape), rtol=1e-6, atol=1e-7)


def test_lda_layout_covers_every_row_and_keeps_documents_whole(
    small_lda: lda.LatentDirichletAllocation,
) -> None:
    lay = small_lda.layouts["docs"]
    state = small_lda.init_state(1)
    assert set(lay.rows) == set(state)
    for name, ids in lay.rows.items():
        assert ids.shape == (state[name].shape[1],)
    assert set(np.unique(lay.rows["ndk"])) == set(range(lay.num_blocks))
    # a pair's assignments live in its document's block
    np.testing.assert_array_equal(lay.rows["gamma"], lay.rows["ndk"][small_lda.doc])


def test_lda_distance_is_total_variation_times_length(small_lda: lda.LatentDirichletAllocation) -> None:
    lay = small_lda.layouts["docs"]
    saved = small_lda.init_state(2)
    current = small_lda.step(small_lda.step(saved, 0), 1)
    dist = small_lda.block_distance(current, saved, lay)
    n = small_lda.doc_length
    theta_now = current["ndk"] / n[None, :, None]
    theta_then = saved["ndk"] / n[None, :, None]
    tv = 0.5 * np.abs(theta_now - theta_then).sum(axis=2) * n[None, :]
    expected = np.zeros_like(dist)
    for d, block in enumerate(lay.rows["ndk"]):
        expected[:, block] += tv[:, d]
    np.testing.assert_allclose(dist, expected, rtol=1e-4, atol=1e-5)
    assert dist.shape == (2, lay.num_blocks) and (dist > 0).any()


def test_lda_partial_recovery_keeps_the_counts_consistent(
    small_lda: lda.LatentDirichletAllocation,
) -> None:
    lay = small_lda.layouts["docs"]
    old = small_lda.step(small_lda.init_state(1), 0)
    new, _ = _run(small_lda, old, 5)
    lost = np.zeros((1, lay.num_blocks), dtype=bool)
    lost[0, :3] = True
    mixed = apply_blocks(new, old, lay, lost)
    rows = lay.row_mask("ndk", lost)[0]
    np.testing.assert_array_equal(mixed["ndk"][0, rows], old["ndk"][0, rows])
    np.testing.assert_array_equal(mixed["ndk"][0, ~rows], new["ndk"][0, ~rows])
    nxt = small_lda.step(mixed, 6)
    np.testing.assert_allclose(nxt["ndk"].sum(axis=2)[0], small_lda.doc_length, rtol=1e-4)


def test_lda_rejects_bad_settings() -> None:
    with pytest.raises(ScarError, match="blocks"):
        lda.make(docs=10, blocks=11)
    with pytest.raises(ScarError, match="damping"):
        lda.make(docs=10, blocks=2, damping=0.0)


# -- CNN --------------------------------------------------------------------------------------------


def test_cnn_gradients_match_finite_differences() -> None:
    model = cnn.make(samples=32, batch=32, channels=3, hidden=5, dtype="float64", burn_in=0)
    state = model.init_state(1)
    rng = np.random.default_rng(1)
    for k in cnn._PARAMS:
        state[k] = state[k] + 0.1 * rng.normal(size=state[k].shape)
    grads = model._gradients(state, np.arange(32))
    for k in cnn._PARAMS:
        idx = (0, *(int(rng.integers(n)) for n in state[k].shape[1:]))
        up = {**state, k: state[k].copy()}
        down = {**state, k: state[k].copy()}
        up[k][idx] += 1e-6
        down[k][idx] -= 1e-6
        numeric = (model.loss(up)[0] - model.loss(down)[0]) / 2e-6
        assert numeric == pytest.approx(grads[k][idx], rel=1e-4, abs=1e-7), k


def test_cnn_loss_decreases(small_cnn: cnn.ConvNet) -> None:
    _, losses = _run(small_cnn, small_cnn.init_state(1), 30)
    assert losses[-1, 0] < 0.7 * losses[0, 0]


def test_cnn_step_deterministic_and_identical_across_trials(small_cnn: cnn.ConvNet) -> None:
    s0 = small_cnn.step(small_cnn.init_state(3), 0)
    a, b = small_cnn.step(s0, 1), small_cnn.step(s0, 1)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
        # trials agree to rounding (a BLAS kernel's summation order may depend on alignment)
        np.testing.assert_allclose(a[k], np.broadcast_to(a[k][:1], a[k].shape), rtol=1e-4, atol=1e-6)
    # the minibatch schedule is fixed by the iteration number
    np.testing.assert_array_equal(small_cnn._minibatch(7), small_cnn._minibatch(7))
    assert not np.array_equal(small_cnn._minibatch(0), small_cnn._minibatch(1))


@pytest.mark.parametrize("layout", ["shard", "layer"])
def test_cnn_layouts_cover_every_row_and_moments_follow(small_cnn: cnn.ConvNet, layout: str) -> None:
    lay = small_cnn.layouts[layout]
    state = small_cnn.init_state(1)
    assert set(lay.rows) == set(state) - {"adam_step"}
    seen: set[int] = set()
    for name, ids in lay.rows.items():
        assert ids.shape == (state[name].shape[1],)
        seen |= set(ids.tolist())
    assert seen == set(range(lay.num_blocks))
    for k in cnn._PARAMS:
        np.testing.assert_array_equal(lay.rows[f"m:{k}"], lay.rows[k])
        np.testing.assert_array_equal(lay.rows[f"v:{k}"], lay.rows[k])
    if layout == "layer":
        assert lay.num_blocks == len(cnn._PARAMS)
        assert all(np.unique(lay.rows[k]).size == 1 for k in cnn._PARAMS)


def test_cnn_restoring_a_block_restores_its_moments(small_cnn: cnn.ConvNet) -> None:
    lay = small_cnn.layouts["shard"]
    old = small_cnn.step(small_cnn.init_state(1), 0)
    new = small_cnn.step(small_cnn.step(old, 1), 2)
    lost = np.zeros((1, lay.num_blocks), dtype=bool)
    lost[0, 1] = True
    mixed = apply_blocks(new, old, lay, lost)
    for k in cnn._PARAMS:
        rows = lay.row_mask(k, lost)[0]
        for name in (k, f"m:{k}", f"v:{k}"):
            np.testing.assert_array_equal(mixed[name][0, rows], old[name][0, rows])
            np.testing.assert_array_equal(mixed[name][0, ~rows], new[name][0, ~rows])
    np.testing.assert_array_equal(mixed["adam_step"], new["adam_step"])  # never lost


def test_cnn_rejects_bad_settings() -> None:
    with pytest.raises(ScarError, match="layout"):
        cnn.make(layout="rows")
    with pytest.raises(ScarError, match="shards"):
        cnn.make(shards=0)


# -- the registry's defaults -------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["lda", "cnn"])
def test_registry_defaults_converge_monotonically(name: str) -> None:
    model = make_model(name)
    assert model.name == name and isinstance(model, (lda.LatentDirichletAllocation, cnn.ConvNet))
    base = unperturbed(model)
    # the threshold test is sharp: the unperturbed loss falls at every step up to the threshold
    assert base.iterations == model.protocol.converge_iterations
    assert np.all(np.diff(base.losses) < 0)


def test_lda_default_documents_have_equal_lengths() -> None:
    plain = lda.make(docs=40, vocab=50, topics=4, blocks=10)
    np.testing.assert_array_equal(plain.doc_length, np.full(40, 30.0))
    spread = lda.make(docs=40, vocab=50, topics=4, blocks=10, length_spread=1.5).doc_length
    assert spread.min() < 15 and spread.max() > 60  # log-normal lengths around the same median
    with pytest.raises(ScarError, match="lda length_spread"):
        lda.make(docs=10, blocks=2, length_spread=-0.5)


def test_cnn_default_burn_in_is_adams_first_moment_window() -> None:
    assert cnn.BURN_IN == round(1 / (1 - cnn.BETA1)) == 10
    model = cnn.make(samples=32, batch=32, channels=2, hidden=4)
    assert model.burn_in == cnn.BURN_IN and model.beta1 == cnn.BETA1
    # the experiments start from the burnt-in network: Adam has taken exactly `burn_in` steps
    assert model.init_state(2)["adam_step"].tolist() == [cnn.BURN_IN] * 2


def test_plain_settings_are_the_registry_defaults() -> None:
    from pollux.scar.rework.models import mf
    from pollux.scar.rework.sensitivity import PLAIN, SENSITIVITY

    assert set(PLAIN) == set(SENSITIVITY)
    small = {"mlr": {"samples": 100}, "mf": {"users": 12, "items": 10}, "lda": {"docs": 24, "blocks": 6},
             "cnn": {"samples": 32, "batch": 32, "channels": 2, "hidden": 4}, "qp": {"dim": 8, "blocks": 4}}
    for name, setting in PLAIN.items():
        default = make_model(name, **small[name])
        named = make_model(name, **{**small[name], **setting.kwargs})
        assert default.protocol == named.protocol, name
        # the same start and the same data: one step from the start agrees bit for bit
        a, b = default.step(default.init_state(1), 0), named.step(named.init_state(1), 0)
        assert all(np.array_equal(a[k], b[k]) for k in a), name
        # no sensitivity setting repeats the plain one
        for other in SENSITIVITY[name]:
            assert other.label != setting.label
    former = [s.label for name in PLAIN for s in (PLAIN[name], *SENSITIVITY[name]) if s.former_default]
    assert sorted(former) == ["burn_in=10", "feature_spread=2.5", "length_spread=1.5", "protocol=30/10/12"]
    assert PLAIN["mf"].kwargs["protocol"] == mf.THESIS_PROTOCOL


def test_cnn_default_layout_is_first() -> None:
    assert list(cnn.make().layouts) == ["layer", "shard"]
    assert list(cnn.make(layout="shard").layouts) == ["shard", "layer"]


# -- one small recovery experiment per model --------------------------------------------------------


@pytest.mark.parametrize("name", ["lda", "cnn"])
def test_partial_recovery_beats_full(name: str) -> None:
    model: ReworkModel
    if name == "lda":
        model = lda.make(docs=64, vocab=80, topics=4, median_length=20.0, blocks=16, damping=0.5)
    else:
        model = cnn.make(samples=96, batch=32, channels=4, hidden=8, shards=8, burn_in=10)
    model.protocol = Protocol(converge_iterations=30, checkpoint_interval=10, failure_mean=12.0)
    full = recovery_trials(model, lost_fraction=0.25, recovery="full", trials=12, seed=0)
    part = recovery_trials(model, lost_fraction=0.25, recovery="partial", trials=12, seed=0)
    assert full.mean > 0
    assert part.mean < 0.6 * full.mean  # measured ~0.3 for both models at seeds 0-2

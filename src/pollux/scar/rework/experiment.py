"""The rework-cost experiments of thesis §5.5: N seeded trials of one failure each, in lock-step.

Every trial trains the same model from the same start; a trial differs from the others only in
*when* it fails (a geometric draw) and *which* blocks it loses (exactly ``round(p · blocks)``,
drawn uniformly). The rework of a trial is how many more iterations it needs than the unperturbed
run to reach the convergence threshold (the unperturbed loss after ``converge_iterations``).

Order of events after ``t + 1`` steps, for every trial at once: the failure (trials whose failure
iteration is ``t + 1``), then the checkpoint (when ``t + 1`` is a multiple of the period), then the
convergence check. A failure therefore strikes before that iteration's checkpoint is taken. The
iteration number handed to `ReworkModel.step` keeps counting through a failure: a recovered run
goes on with the minibatches of later iterations rather than replaying old ones.

Trials are vectorised: one `step` call advances the whole population, so 100 trials cost little
more than one for models whose step is a few matrix products.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pollux.scar.api import (
    STRATEGIES,
    BlockLayout,
    ReworkModel,
    ScarError,
    SelectionState,
    State,
    apply_blocks,
    select_blocks,
)

RECOVERIES = ("partial", "full")


@dataclass(frozen=True)
class Baseline:
    """The unperturbed run: its loss threshold and the step count at which it first reaches it."""

    threshold: float
    iterations: int
    losses: np.ndarray  # (converge_iterations + 1,), losses[t] after t steps


@dataclass
class ReworkResult:
    """Rework of one experiment point: per trial, and its mean with a 95 % confidence interval."""

    model: str
    layout: str
    recovery: str
    strategy: str
    fraction: float
    lost_fraction: float
    trials: int
    seed: int
    rework: np.ndarray  # (trials,) extra iterations; `cap` for trials that never converged
    failure_iteration: np.ndarray  # (trials,)
    baseline_iterations: int
    threshold: float
    cap: int
    unconverged: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    #: (trials,) ‖δ‖, the size of the jump the recovery made (L2 over the distance tensors): what
    #: Theorems 5.3.1 and 5.4.2 are stated in (`pollux.scar.rework.prediction` uses it)
    perturbation: np.ndarray = field(default_factory=lambda: np.zeros(0))

    @property
    def mean(self) -> float:
        return float(self.rework.mean())

    @property
    def ci95(self) -> float:
        """Half-width of the 95 % confidence interval of the mean (Student t)."""
        n = self.rework.size
        if n < 2:
            return float("nan")
        from scipy.stats import t as student_t

        return float(student_t.ppf(0.975, n - 1) * self.rework.std(ddof=1) / np.sqrt(n))

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "layout": self.layout,
            "recovery": self.recovery,
            "strategy": self.strategy,
            "fraction": self.fraction,
            "lost_fraction": self.lost_fraction,
            "trials": self.trials,
            "seed": self.seed,
            "mean": round(self.mean, 4),
            "ci95": round(self.ci95, 4),
            "unconverged": self.unconverged,
            "perturbation_mean": (
                round(float(self.perturbation.mean()), 6) if self.perturbation.size else None
            ),
            "baseline_iterations": self.baseline_iterations,
            "threshold": self.threshold,
        }


def _layout(model: ReworkModel, layout: str | None) -> tuple[str, BlockLayout]:
    if not model.layouts:
        raise ScarError(f"{model.name}: model has no block layouts")
    name = layout if layout is not None else next(iter(model.layouts))
    if name not in model.layouts:
        raise ScarError(f"layout: {model.name} has {', '.join(model.layouts)}, got {name!r}")
    return name, model.layouts[name]


_BASELINES: weakref.WeakKeyDictionary[ReworkModel, dict[int, Baseline]] = weakref.WeakKeyDictionary()


def unperturbed(model: ReworkModel) -> Baseline:
    """The unperturbed run of `model` (one trial; memoised per model object and protocol)."""
    memo = _BASELINES.setdefault(model, {})
    n = model.protocol.converge_iterations
    if n in memo:
        return memo[n]
    state = model.init_state(1)
    losses = [float(model.loss(state)[0])]
    for t in range(n):
        state = model.step(state, t)
        losses.append(float(model.loss(state)[0]))
    arr = np.asarray(losses)
    if not np.all(np.isfinite(arr)):
        raise ScarError(f"{model.name}: the unperturbed run's loss is not finite")
    threshold = float(arr[n])
    first = int(np.argmax(arr <= threshold))
    memo[n] = Baseline(threshold, first, arr)
    return memo[n]


def failure_iterations(rng: np.random.Generator, trials: int, mean: float, upper: int) -> np.ndarray:
    """Geometric draws of mean `mean` (support 1, 2, …) truncated to [1, upper], by inverse CDF."""
    if upper < 1:
        raise ScarError("Protocol.converge_iterations: must be >= 2 for a failure before convergence")
    q = 1.0 - 1.0 / mean  # survival per iteration
    top = 1.0 - q**upper  # P(F <= upper)
    u = rng.random(trials) * top
    f = np.ceil(np.log1p(-u) / np.log(q)).astype(np.int64)
    return np.clip(f, 1, upper)


def lost_blocks(rng: np.random.Generator, trials: int, num_blocks: int, fraction: float) -> np.ndarray:
    """(trials, num_blocks) bool: exactly round(fraction · num_blocks) blocks per trial (>= 1)."""
    if not 0.0 < fraction <= 1.0:
        raise ScarError(f"lost_fraction: must be in (0, 1], got {fraction}")
    k = max(1, round(fraction * num_blocks))
    order = np.argsort(rng.random((trials, num_blocks)), axis=1)[:, :k]
    out = np.zeros((trials, num_blocks), dtype=bool)
    np.put_along_axis(out, order, True, axis=1)
    return out


def jump_norm(model: ReworkModel, layout: BlockLayout, a: State, b: State) -> np.ndarray:
    """(trials,) ‖a − b‖: L2 over the tensors the model's distances rank (default: every blocked one)."""
    names = model.distance_tensors or tuple(layout.rows)
    trials = a[names[0]].shape[0]
    total = np.zeros(trials)
    for name in names:
        diff = (a[name] - b[name]).reshape(trials, -1).astype(np.float64)
        total += np.einsum("tk,tk->t", diff, diff)
    return np.sqrt(total)


def _where(mask: np.ndarray, a: State, b: State) -> State:
    """Per trial: `a` where mask (trials,) else `b`."""
    out = {}
    for k, v in a.items():
        m = mask.reshape((-1,) + (1,) * (v.ndim - 1))
        out[k] = np.where(m, v, b[k])
    return out


def run_trials(
    model: ReworkModel,
    *,
    strategy: str = "full",
    fraction: float = 1.0,
    lost_fraction: float = 0.5,
    recovery: str = "partial",
    trials: int = 100,
    seed: int = 0,
    layout: str | None = None,
    max_rework_factor: float = 4.0,
) -> ReworkResult:
    """One experiment point: `trials` runs with one failure each, checkpoints of `fraction` of the
    blocks by `strategy` every ``max(1, round(fraction · interval))`` iterations."""
    if recovery not in RECOVERIES:
        raise ScarError(f"recovery: expected one of {', '.join(RECOVERIES)}, got {recovery!r}")
    if strategy not in STRATEGIES:
        raise ScarError(f"strategy: expected one of {', '.join(STRATEGIES)}, got {strategy!r}")
    if not 0.0 < fraction <= 1.0:
        raise ScarError(f"fraction: must be in (0, 1], got {fraction}")
    if trials < 1:
        raise ScarError(f"trials: must be >= 1, got {trials}")
    lname, lay = _layout(model, layout)
    proto = model.protocol
    base = unperturbed(model)
    period = max(1, round(fraction * proto.checkpoint_interval))
    rng = np.random.default_rng(seed)
    fail_at = failure_iterations(rng, trials, proto.failure_mean, proto.converge_iterations - 1)
    lost = lost_blocks(rng, trials, lay.num_blocks, lost_fraction)
    selection = SelectionState(rng=np.random.default_rng([seed, 1]))
    cap_steps = int(np.ceil(base.iterations + max_rework_factor * proto.converge_iterations)) + 1

    # A population computes in other BLAS blocks than the one-trial baseline: allow last-bit noise.
    tolerance = base.threshold + 1e-9 * abs(base.threshold) + 1e-12
    state = model.init_state(trials)
    ckpt = {k: v.copy() for k, v in state.items()}
    blocked = set(lay.rows)
    reached = np.full(trials, -1, dtype=np.int64)
    jump = np.zeros(trials)
    for t in range(cap_steps):
        state = model.step(state, t)
        steps = t + 1
        failing = fail_at == steps
        if failing.any():
            if recovery == "partial":
                restored = apply_blocks(state, ckpt, lay, lost)
            else:
                restored = ckpt
            jump[failing] = jump_norm(model, lay, restored, state)[failing]
            state = _where(failing, restored, state)
        if steps % period == 0:
            if strategy == "full":
                ckpt = {k: v.copy() for k, v in state.items()}
            else:
                dist = model.block_distance(state, ckpt, lay)
                chosen = select_blocks(dist, fraction, strategy, selection)
                ckpt = apply_blocks(ckpt, state, lay, chosen)
                for k in state:
                    if k not in blocked:
                        ckpt[k] = state[k].copy()
        open_ = (reached < 0) & (steps >= fail_at)
        if open_.any():
            loss = model.loss(state)
            hit = open_ & (loss <= tolerance)
            reached[hit] = steps
        if (reached >= 0).all():
            break
    unconverged = int((reached < 0).sum())
    reached = np.where(reached < 0, cap_steps, reached)
    return ReworkResult(
        model=model.name,
        layout=lname,
        recovery=recovery,
        strategy=strategy,
        fraction=float(fraction),
        lost_fraction=float(lost_fraction),
        trials=trials,
        seed=seed,
        rework=(reached - base.iterations).astype(float),
        failure_iteration=fail_at,
        baseline_iterations=base.iterations,
        threshold=base.threshold,
        cap=cap_steps - base.iterations,
        unconverged=unconverged,
        perturbation=jump,
    )


def recovery_trials(
    model: ReworkModel,
    lost_fraction: float = 0.5,
    recovery: str = "partial",
    trials: int = 100,
    seed: int = 0,
    layout: str | None = None,
) -> ReworkResult:
    """Partial or full recovery from traditional checkpoints (everything every interval)."""
    return run_trials(
        model,
        strategy="full",
        fraction=1.0,
        lost_fraction=lost_fraction,
        recovery=recovery,
        trials=trials,
        seed=seed,
        layout=layout,
    )


def checkpoint_trials(
    model: ReworkModel,
    strategy: str = "priority",
    fraction: float = 1 / 8,
    lost_fraction: float = 0.5,
    recovery: str = "partial",
    trials: int = 100,
    seed: int = 0,
    layout: str | None = None,
) -> ReworkResult:
    """Partial checkpoints of `fraction` of the blocks, `1/fraction` times as often (same bytes)."""
    return run_trials(
        model,
        strategy=strategy,
        fraction=fraction,
        lost_fraction=lost_fraction,
        recovery=recovery,
        trials=trials,
        seed=seed,
        layout=layout,
    )


def reduction(result: ReworkResult, baseline: ReworkResult) -> float:
    """1 − mean(result) / mean(baseline): the share of the baseline's rework saved."""
    if baseline.mean <= 0:
        return float("nan")
    return 1.0 - result.mean / baseline.mean

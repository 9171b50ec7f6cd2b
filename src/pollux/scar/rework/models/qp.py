"""A strongly convex quadratic program trained by gradient descent (thesis §5.3, Fig. 5.3).

The objective is ``0.5 (w − w*)ᵀ A (w − w*)`` with A symmetric positive definite. Gradient descent
with step `lr` maps the error ``e = w − w*`` to ``(I − lr·A) e``, whose spectral norm is the known
contraction factor ``c = max |1 − lr·λ|`` over the eigenvalues λ of A. Both assumptions of Theorem
5.3.1 — (5.3) for the unperturbed run and (5.5) for any perturbed iterate — therefore hold with that
`c` exactly and deterministically, which is why `pollux.scar.rework.theory` checks the bound on this model.

It doubles as the simplest rework-experiment model: the blocks are coordinates (rows of ``w``),
randomly partitioned as a parameter server would, and a lost block falls back to its checkpointed
coordinates, which gradient descent then pulls back to w*.

Defaults (the benchmark model): 128 coordinates in 64 random blocks, eigenvalues log-spaced in
[0.03, 0.1] with ``lr = 1`` (per-coordinate rates 0.9–0.97, c = 0.97), and a start whose
per-coordinate errors have log-normal magnitudes (``spread = 2``): a few coordinates start far off
and carry most of the later movement, as the rows of a real model do, which is what prioritised
checkpoints exploit (with ``spread = 0`` priority only saves about 60 % of the rework). Protocol:
the threshold is the loss after 100 iterations, full checkpoints every 20, failures after about
40 iterations on average. The full sweep takes about 2 s.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pollux.scar.api import BlockLayout, Protocol, ReworkModel, ScarError, State

STARTS = ("random", "slowest")


class QuadraticProgram(ReworkModel):
    """Gradient descent on ``0.5 (w − w*)ᵀ A (w − w*)``; state ``{"w": (trials, dim)}``.

    `start="slowest"` puts ``w0 − w*`` on an eigenvector of the slowest rate, so that the
    unperturbed error shrinks by exactly `contraction` every step — (5.3) cannot be improved, the
    case in which the thesis calls Theorem 5.3.1 tight.
    """

    name = "qp"
    protocol = Protocol(converge_iterations=100, checkpoint_interval=20, failure_mean=40.0)

    def __init__(
        self,
        dim: int = 128,
        blocks: int = 64,
        min_eig: float = 0.03,
        max_eig: float = 0.1,
        lr: float = 1.0,
        rotate: bool = False,
        start: str = "random",
        start_scale: float = 1.0,
        spread: float = 2.0,
        seed: int = 0,
    ) -> None:
        if dim < 1:
            raise ScarError(f"qp dim: must be >= 1, got {dim}")
        if not 1 <= blocks <= dim:
            raise ScarError(f"qp blocks: must be in [1, dim={dim}], got {blocks}")
        if not 0 < min_eig <= max_eig:
            raise ScarError(f"qp min_eig/max_eig: need 0 < min_eig <= max_eig, got {min_eig}, {max_eig}")
        if start not in STARTS:
            raise ScarError(f"qp start: expected one of {', '.join(STARTS)}, got {start!r}")
        rng = np.random.default_rng([seed, 0x5150])
        self.eigenvalues = np.geomspace(min_eig, max_eig, dim) if dim > 1 else np.array([max_eig])
        if rotate:
            q, r = np.linalg.qr(rng.normal(size=(dim, dim)))
            self.eigenvectors = q * np.sign(np.diag(r))
        else:
            self.eigenvectors = np.eye(dim)
        self.A = (self.eigenvectors * self.eigenvalues) @ self.eigenvectors.T
        self.lr = float(lr)
        if self.lr <= 0:
            raise ScarError(f"qp lr: must be > 0, got {self.lr}")
        rates = np.abs(1.0 - self.lr * self.eigenvalues)
        self.contraction = float(rates.max())
        if not self.contraction < 1.0:
            raise ScarError(f"qp lr: {self.lr} does not contract (c = {self.contraction:.4g} >= 1)")
        self.w_star = rng.normal(size=dim)
        if start == "slowest":
            direction = self.eigenvectors[:, int(np.argmax(rates))]
        else:
            # log-normal magnitudes: a few coordinates start far off, most close (as in real models)
            direction = rng.normal(size=dim) * np.exp(spread * rng.normal(size=dim))
            direction /= np.linalg.norm(direction)
        self.w0 = self.w_star + start_scale * np.sqrt(dim) * direction
        self._step_matrix = np.eye(dim) - self.lr * self.A
        self.layouts = {"rows": BlockLayout({"w": rng.permutation(np.arange(dim) % blocks)}, blocks)}

    @property
    def dim(self) -> int:
        return int(self.w_star.size)

    def init_state(self, trials: int) -> State:
        return {"w": np.tile(self.w0, (trials, 1))}

    def step(self, state: State, iteration: int) -> State:
        # w* + (I − lr·A)(w − w*): a stacked matmul, so that each trial's product is computed the
        # same way whatever the population size (bit-identical to a one-trial run)
        e = (state["w"] - self.w_star)[:, None, :]
        return {"w": self.w_star + np.matmul(e, self._step_matrix)[:, 0, :]}

    def loss(self, state: State) -> np.ndarray:
        e = (state["w"] - self.w_star)[:, None, :]
        return 0.5 * (np.matmul(e, self.A) * e)[:, 0, :].sum(axis=1)

    def distance(self, w: np.ndarray) -> np.ndarray:
        """‖w − w*‖ over the last axis: the error Theorem 5.3.1 is stated in."""
        return np.linalg.norm(np.asarray(w) - self.w_star, axis=-1)


def make(**kw: Any) -> QuadraticProgram:
    """The registry's factory: a 64-coordinate QP in 32 blocks unless `kw` says otherwise."""
    return QuadraticProgram(**kw)

"""Latent Dirichlet allocation by deterministic collapsed variational inference (thesis §5.5.1, LDA).

The thesis trains LDA with collapsed Gibbs sampling; here the sampler is replaced by its
deterministic counterpart, zero-order collapsed variational Bayes (CVB0) over the distinct
(document, word) pairs, so that a trial's rework comes only from its failure (`ReworkModel` asks
for steps that draw no randomness). The latent state plays the role of the token-topic
assignments: ``gamma[d, w]`` is the topic distribution shared by the ``c_dw`` tokens of word ``w``
in document ``d``. One iteration updates every pair at once (a batch, Jacobi-style CVB0 sweep),
damped by `damping` (new = damping · update + (1 − damping) · old)::

    update[d, w, k] ∝ (n_dk − c_dw γ + α) · (n_wk − c_dw γ + β) / (n_k − c_dw γ + V β)

where the counts ``n_dk``, ``n_wk``, ``n_k`` are sums of ``c_dw · gamma`` over the pairs and the
subtracted term removes the pair's own contribution (the "collapsed" part). α = β = 1 as in the
thesis.

State and blocks, as the thesis places them on a parameter server: a document's topic counts
``ndk[d]`` live with the document, and so do its pairs' assignments ``gamma[d, ·]``; both carry the
document's block id (documents randomly partitioned into `blocks` groups; by default one document
per block), so a failure loses and a recovery restores them together. The word-topic counts are
*derived*: every step recomputes ``n_wk``, ``n_k`` and ``n_dk`` from ``gamma``, so after a partial
recovery the count tables agree with each other by construction (docs/scar.md: coupled counts must
stay consistent). As in the thesis, word-topic rows are never lost — they are regenerated from the
assignments.

Distance (`block_distance`): the total variation between a document's current and saved topic
distributions, scaled by its length — i.e. half the L1 distance of the count rows — summed over the
documents of a block. Loss: the negative log-likelihood per token under the point estimates
θ = (n_dk + α)/(N_d + Kα), φ = (n_wk + β)/(n_k + Vβ).

Data: a corpus drawn from a known LDA (seeded): 8 topics ~ Dir(0.05) over 200 words, mixtures ~
Dir(0.1), 256 documents of 30 tokens each by default (``length_spread=0``, the plainest setting and
the benchmark's headline). ``length_spread`` > 0 draws log-normal lengths of median 30 instead (at
1.5: from 2 to hundreds of tokens), a sensitivity setting: real corpora mix notes and long
articles, a few long documents then hold many tokens and move most, which is what prioritised
checkpoints by TV × length exploit. ``benchmarks/scar.py`` reports both.

Burn-in: the assignments start from one seeded, nearly hard random draw (like a Gibbs sampler's
random topics), followed by `burn_in` = 8 iterations computed once; the experiments start there.
In the first iterations the topics are still being told apart, and a failure there can send a run
to another labelling of the topics (measured without a burn-in: reworks from −10 to +57
iterations, noise rather than rework). After the burn-in CVB0 contracts geometrically towards
one fixed point.

Protocol: threshold = the loss 40 iterations after the burn-in (the thesis's LDA converges in about
60), full checkpoints every 20, failures after 20 iterations on average. The figures at each
setting are in docs/benchmarks.md (``benchmarks/scar.py``); the sweep takes about 50 s on one core.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

from pollux.scar.api import BlockLayout, Protocol, ReworkModel, ScarError, State


def lda_corpus(
    docs: int, vocab: int, topics: int, median_length: float, length_spread: float, seed: int,
    alpha: float = 0.1, beta: float = 0.05,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Distinct (doc, word, count) triples of a corpus drawn from LDA, sorted by document.

    Lengths are log-normal with median `median_length` (at least 2 tokens); small `alpha`/`beta`
    make sparse, well separated topics.
    """
    rng = np.random.default_rng([seed, 0x4C4441])
    phi = rng.dirichlet(np.full(vocab, beta), size=topics)
    theta = rng.dirichlet(np.full(topics, alpha), size=docs)
    lengths = np.maximum(2, np.round(median_length * np.exp(length_spread * rng.normal(size=docs))))
    # counts per document: a multinomial draw from its word distribution θ_d φ
    pw = theta @ phi
    counts = np.stack([rng.multinomial(int(n), p / p.sum()) for n, p in zip(lengths, pw, strict=True)])
    d, w = np.nonzero(counts)
    return d.astype(np.int64), w.astype(np.int64), counts[d, w].astype(np.float64)


class LatentDirichletAllocation(ReworkModel):
    """CVB0 LDA; state ``{"gamma": (trials, pairs, K), "ndk": (trials, docs, K)}`` (see the module
    docstring for the protocol and why)."""

    name = "lda"
    protocol = Protocol(converge_iterations=40, checkpoint_interval=20, failure_mean=20.0)
    distance_tensors = ("ndk",)

    def __init__(
        self,
        docs: int = 256,
        vocab: int = 200,
        topics: int = 8,
        median_length: float = 30.0,
        length_spread: float = 0.0,
        blocks: int = 256,
        alpha: float = 1.0,
        beta: float = 1.0,
        damping: float = 0.5,
        init_concentration: float = 0.2,
        burn_in: int = 8,
        seed: int = 0,
    ) -> None:
        if docs < 1 or vocab < 2 or topics < 2:
            raise ScarError(f"lda docs/vocab/topics: need >= 1, 2, 2, got {docs}, {vocab}, {topics}")
        if not 1 <= blocks <= docs:
            raise ScarError(f"lda blocks: must be in [1, docs={docs}], got {blocks}")
        if length_spread < 0:
            raise ScarError(f"lda length_spread: must be >= 0, got {length_spread}")
        if not 0.0 < damping <= 1.0:
            raise ScarError(f"lda damping: must be in (0, 1], got {damping}")
        if alpha <= 0 or beta <= 0 or init_concentration <= 0:
            raise ScarError(
                f"lda alpha/beta/init_concentration: must be > 0, got {alpha}, {beta}, "
                f"{init_concentration}"
            )
        d, w, c = lda_corpus(docs, vocab, topics, median_length, length_spread, seed)
        present = np.unique(d)
        if present.size != docs:
            raise ScarError("lda corpus: every document needs a token (raise median_length)")
        self.docs, self.vocab, self.topics = docs, vocab, topics
        self.alpha, self.beta = float(alpha), float(beta)
        self.doc, self.word = d, w
        self.dtype = np.dtype(np.float32)
        self.damping = float(damping)
        self.count = c.astype(self.dtype)
        self.tokens = float(c.sum())
        self.doc_length = np.bincount(d, weights=c, minlength=docs)
        # sparse (docs × pairs) and (words × pairs) indicator matrices: the count sums are products
        ones = np.ones(d.size, dtype=self.dtype)
        pairs = np.arange(d.size)
        self._doc_sum = sp.csr_matrix((ones, (d, pairs)), shape=(docs, d.size))
        self._word_sum = sp.csr_matrix((ones, (w, pairs)), shape=(vocab, d.size))
        rng = np.random.default_rng([seed, 0x47414D])
        # random, nearly hard starting assignments (like a Gibbs sampler's random topics): a
        # near-uniform start sits on a saddle that perturbations let a run skip
        g0 = rng.dirichlet(np.full(topics, init_concentration), size=d.size) + 1e-3
        self._gamma0 = (g0 / g0.sum(axis=1, keepdims=True)).astype(self.dtype)
        if burn_in < 0:
            raise ScarError(f"lda burn_in: must be >= 0, got {burn_in}")
        self.burn_in = int(burn_in)
        if burn_in:
            # start where the topics have formed: see the module docstring
            state = self.init_state(1)
            for t in range(burn_in):
                state = self.step(state, t)
            self._gamma0 = np.ascontiguousarray(state["gamma"][0])
        block_of_doc = rng.permutation(np.arange(docs) % blocks)
        self.layouts = {
            "docs": BlockLayout({"gamma": block_of_doc[d], "ndk": block_of_doc}, blocks)
        }

    # -- counts derived from the assignments ---------------------------------------------------
    # Internally the pairs are the leading axis, (pairs, trials · K), so that the sums over a
    # document's or a word's pairs are one sparse product each; the state keeps the API's
    # (trials, rows, K) shape as a transposed view of it.
    def _pairs(self, gamma: np.ndarray) -> np.ndarray:
        """gamma (trials, pairs, K) as a contiguous (pairs, trials · K) array."""
        g = np.ascontiguousarray(gamma.transpose(1, 0, 2), dtype=self.dtype)
        return g.reshape(g.shape[0], -1)

    def _counts(self, g: np.ndarray) -> tuple[np.ndarray, ...]:
        """(c·gamma, n_dk, n_wk, n_k) from g (pairs, trials · K), all with trials · K columns."""
        cg = g * self.count[:, None]
        ndk = np.asarray(self._doc_sum @ cg)
        nwk = np.asarray(self._word_sum @ cg)
        return cg, ndk, nwk, ndk.sum(axis=0)

    def _as_state(self, x: np.ndarray, trials: int) -> np.ndarray:
        """(rows, trials · K) -> the API's (trials, rows, K) view."""
        return x.reshape(x.shape[0], trials, self.topics).transpose(1, 0, 2)

    def init_state(self, trials: int) -> State:
        g = np.tile(self._gamma0, (1, trials))
        return {"gamma": self._as_state(g, trials),
                "ndk": self._as_state(self._counts(g)[1], trials)}

    def step(self, state: State, iteration: int) -> State:
        trials = state["gamma"].shape[0]
        g = self._pairs(state["gamma"])
        cg, ndk, nwk, nk = self._counts(g)
        # the pair's own contribution is excluded from the counts it is updated from (CVB0);
        # alpha, beta > 0 keep every factor positive. In place: these are the hot arrays.
        new = ndk[self.doc]
        new -= cg
        new += self.alpha
        b = nwk[self.word]
        b -= cg
        b += self.beta
        new *= b
        z = np.subtract((nk + self.vocab * self.beta)[None, :], cg, out=b)
        new /= z
        new3 = new.reshape(new.shape[0], trials, self.topics)
        new3 /= new3.sum(axis=2, keepdims=True)
        if self.damping < 1.0:
            new *= self.damping
            new += (1.0 - self.damping) * g
        ndk_new = np.asarray(self._doc_sum @ (new * self.count[:, None]))
        return {"gamma": self._as_state(new, trials), "ndk": self._as_state(ndk_new, trials)}

    def loss(self, state: State) -> np.ndarray:
        trials = state["gamma"].shape[0]
        _, ndk, nwk, nk = self._counts(self._pairs(state["gamma"]))
        theta = (ndk + self.alpha) / (self.doc_length[:, None] + self.topics * self.alpha)
        phi = (nwk + self.beta) / (nk + self.vocab * self.beta)[None, :]
        prod = (theta[self.doc] * phi[self.word]).reshape(self.count.size, trials, self.topics)
        p = prod.sum(axis=2, dtype=np.float64)
        return -(self.count.astype(np.float64) @ np.log(p)) / self.tokens

    def block_distance(self, current: State, saved: State, layout: BlockLayout) -> np.ndarray:
        """(trials, blocks): Σ over a block's documents of N_d · TV(θ_d, θ'_d) = ½‖n_d − n'_d‖₁."""
        tv = 0.5 * np.abs(current["ndk"] - saved["ndk"]).sum(axis=2)  # (trials, docs)
        out = np.zeros((tv.shape[0], layout.num_blocks))
        np.add.at(out.T, layout.rows["ndk"], tv.T)
        return out


def make(**kw: Any) -> LatentDirichletAllocation:
    """The registry's factory: 256 generated documents of 30 tokens, 8 topics, a block each."""
    return LatentDirichletAllocation(**kw)

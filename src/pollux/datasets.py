"""Input data of the Litz applications and of SCAR's experiments: generated or bundled, seeded,
never downloaded.

A neutral module that both use (:mod:`pollux.litz.apps`, :mod:`pollux.scar.rework.models`). A Litz
executor's `load_input` calls these functions to "read its partition from storage": the data are a
deterministic function of the configuration, so re-loading after a scale-in (or in another process)
gives the same bytes. Whole data sets are cached per process (`functools.lru_cache`), so many executors
in one worker build them once.

- Classification (MLR): `gaussian_mixture` (one Gaussian blob per class) or scikit-learn's bundled
  `digits` (1,797 8×8 images shipped inside the scikit-learn wheel; needs scikit-learn installed).
- Topic modelling (LDA): `synthetic_lda_corpus` draws documents from a known LDA model, so recovered
  topics can be checked against the true ones; the real-text corpus lives in `apps/corpus.py`.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Dataset:
    """A labelled data set: `X` (n, d) features, `y` (n,) integer labels in [0, classes)."""

    name: str
    X: np.ndarray
    y: np.ndarray
    classes: int


@dataclass(frozen=True)
class Corpus:
    """Documents as one concatenated word-id array: document i is `words[doc_ptr[i]:doc_ptr[i + 1]]`.

    `topics` (K, V) holds the generating topic-word distributions when the corpus was drawn from a
    known model (None for real text); `vocab` the words (synthetic corpora name them w0, w1, …).
    """

    name: str
    doc_ptr: np.ndarray
    words: np.ndarray
    vocab: tuple[str, ...]
    topics: np.ndarray | None = None

    @property
    def num_docs(self) -> int:
        return int(self.doc_ptr.shape[0] - 1)

    @property
    def num_tokens(self) -> int:
        return int(self.words.shape[0])

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)


def partition(n: int, num_parts: int, part: int) -> np.ndarray:
    """Indices of part `part` of `num_parts` (strided, so parts differ in size by at most one)."""
    if not 0 <= part < num_parts:
        raise ValueError(f"partition: part {part} not in [0, {num_parts})")
    return np.arange(part, n, num_parts, dtype=np.int64)


def gaussian_mixture(n: int, d: int, classes: int, seed: int, separation: float = 1.5) -> Dataset:
    """`n` points in `d` dimensions, one isotropic unit-variance Gaussian per class; class means drawn
    with norm about `separation`, so the classes overlap a little and the loss has a nonzero floor."""
    if n < 1 or d < 1 or classes < 2:
        raise ValueError(f"gaussian_mixture: need n >= 1, d >= 1, classes >= 2 (got {n}, {d}, {classes})")
    rng = np.random.default_rng([seed, 0x4D4C52])
    means = rng.normal(size=(classes, d)) * (separation / np.sqrt(d))
    y = rng.integers(classes, size=n)
    X = means[y] + rng.normal(size=(n, d))
    return Dataset(f"gaussian(n={n},d={d},classes={classes},seed={seed})", X, y.astype(np.int64), classes)


def digits() -> Dataset:
    """scikit-learn's bundled handwritten digits (1,797 × 64 pixels in 0..16, scaled to [0, 1])."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise RuntimeError(
            "dataset 'digits' needs scikit-learn (pip install 'pollux[examples]'); use dataset='gaussian'"
        ) from exc
    bunch = load_digits()
    return Dataset("sklearn-digits", np.asarray(bunch.data, dtype=np.float64) / 16.0,
                   np.asarray(bunch.target, dtype=np.int64), 10)


@functools.lru_cache(maxsize=8)
def _classification(dataset: str, n: int, d: int, classes: int, seed: int, separation: float) -> Dataset:
    if dataset == "gaussian":
        return gaussian_mixture(n, d, classes, seed, separation)
    if dataset == "digits":
        return digits()
    raise ValueError(f"config 'dataset': unknown {dataset!r} (known: 'gaussian', 'digits')")


def load_classification(config: Mapping[str, Any]) -> Dataset:
    """The MLR data set named by `config` (keys dataset, n, d, classes, seed, separation)."""
    return _classification(
        str(config.get("dataset", "gaussian")),
        int(config.get("n", 4000)),
        int(config.get("d", 20)),
        int(config.get("classes", 5)),
        int(config.get("seed", 0)),
        float(config.get("separation", 1.5)),
    )


def synthetic_lda_corpus(
    num_docs: int,
    vocab_size: int,
    num_topics: int,
    doc_length: int,
    seed: int,
    alpha: float = 0.1,
    beta: float = 0.05,
) -> Corpus:
    """A corpus drawn from LDA itself: topics φ_k ~ Dir(beta) over the vocabulary, document mixtures
    θ_d ~ Dir(alpha), lengths ~ 1 + Poisson(doc_length - 1), each token's topic from θ_d and its word
    from that topic. Small `alpha`, `beta` make sparse, well-separated topics that Gibbs can recover."""
    if num_docs < 1 or vocab_size < 2 or num_topics < 1 or doc_length < 1:
        raise ValueError(
            "synthetic_lda_corpus: need num_docs >= 1, vocab_size >= 2, num_topics >= 1, doc_length >= 1"
        )
    rng = np.random.default_rng([seed, 0x4C4441])
    topics = rng.dirichlet(np.full(vocab_size, beta), size=num_topics)
    theta = rng.dirichlet(np.full(num_topics, alpha), size=num_docs)
    lengths = 1 + rng.poisson(doc_length - 1, size=num_docs)
    doc_ptr = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    doc_of_token = np.repeat(np.arange(num_docs), lengths)
    # Topic of each token by inverse-CDF sampling on its document's mixture, then its word likewise.
    z = _sample_rows(np.cumsum(theta, axis=1)[doc_of_token], rng)
    words = _sample_rows(np.cumsum(topics, axis=1)[z], rng)
    vocab = tuple(f"w{i}" for i in range(vocab_size))
    name = f"synthetic-lda(D={num_docs},V={vocab_size},K={num_topics},L={doc_length},seed={seed})"
    return Corpus(name, doc_ptr, words.astype(np.int64), vocab, topics)


def _sample_rows(cdf: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One categorical draw per row of `cdf` (row-wise cumulative probabilities)."""
    u = rng.random(cdf.shape[0]) * cdf[:, -1]
    return np.minimum((cdf < u[:, None]).sum(axis=1), cdf.shape[1] - 1)


@functools.lru_cache(maxsize=4)
def cached_synthetic_corpus(
    num_docs: int, vocab_size: int, num_topics: int, doc_length: int, seed: int, alpha: float, beta: float
) -> Corpus:
    """`synthetic_lda_corpus`, built once per process for all the executors living there."""
    return synthetic_lda_corpus(num_docs, vocab_size, num_topics, doc_length, seed, alpha, beta)

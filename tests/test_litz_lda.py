"""LDA on Litz (pollux.litz.apps.lda): topic recovery, model scheduling, stateful executors."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from pollux.datasets import synthetic_lda_corpus
from pollux.litz.api import Application, DriverContext, TaskResult
from pollux.litz.apps.corpus import STOP_WORDS, load_offline_corpus
from pollux.litz.apps.lda import (
    LDADriver,
    LDAExecutor,
    conflict_free_batches,
    lda_app,
    load_corpus,
    topic_match_cosine,
)
from pollux.litz.local import run_local

RECOVER = {"num_topics": 12, "true_topics": 10, "num_docs": 600, "epochs": 30, "seed": 0}
SMALL = {"num_topics": 5, "true_topics": 5, "num_docs": 120, "vocab_size": 60, "doc_length": 40,
         "epochs": 4, "seed": 1}


CAPTURED: list[dict[str, np.ndarray]] = []


class RecordingDriver(LDADriver):
    """Keeps the PS tables at finish (for invariants the summary does not carry)."""

    def handle_task_completion(self, ctx: DriverContext, result: TaskResult) -> None:
        super().handle_task_completion(ctx, result)
        if self.finished:
            CAPTURED.append({name: ctx.ps_get(name) for name in ("word_topic", "topic_totals")})


@pytest.mark.parametrize("options", [{}, {"reads": "dispatch", "staleness_order": "random", "seed": 5}])
def test_recovers_the_generating_topics(options: dict[str, Any]) -> None:
    """4 executors, 12 model topics for 10 true ones (the spare topics keep Gibbs out of merged-topic
    local modes); with snapshot reads the topic totals are really stale, the word blocks never."""
    summary = run_local(lda_app(**RECOVER), num_executors=4, **options)
    final = summary.final
    assert final is not None and final["iterations"] == 30
    assert final["topic_cosine"] >= 0.9
    objectives = [m["objective"] for m in summary.metrics]
    assert [m["iteration"] for m in summary.metrics] == list(range(31))
    assert objectives[-1] > objectives[0] + 1.0  # log-likelihood per token rises from random init
    assert len(final["top_words"]) == 12 and len(final["top_words"][0]) == 10


def test_counts_stay_consistent_and_state_migrates() -> None:
    app = Application("lda", RecordingDriver, LDAExecutor, lda_app(**SMALL).config)
    corpus = load_corpus(SMALL)
    CAPTURED.clear()
    base = run_local(app, num_executors=3)
    (tables,) = CAPTURED
    nwk = tables["word_topic"]
    assert nwk.min() >= 0 and nwk.sum() == corpus.num_tokens
    np.testing.assert_array_equal(nwk.sum(axis=0), tables["topic_totals"])
    np.testing.assert_array_equal(nwk.sum(axis=1), np.bincount(corpus.words, minlength=corpus.vocab_size))
    # Executors moved (state pickled, input re-loaded) and the driver rebuilt after every 2 tasks:
    # the same run, bit for bit.
    moved = run_local(app, num_executors=3, migrate_every=2)
    assert moved.migrations > 10
    assert [m["objective"] for m in moved.metrics] == [m["objective"] for m in base.metrics]
    np.testing.assert_array_equal(CAPTURED[1]["word_topic"], nwk)


def test_concurrent_tasks_touch_disjoint_blocks() -> None:
    """Drive the scheduler with completions in a random order: at every moment the in-flight tasks
    sample distinct word blocks, and each block sees its rounds in increasing order."""

    class Ctx:
        def __init__(self, n: int) -> None:
            self.num_executors, self.version, self.queue = n, 0, []

        def dispatch(self, executor_id: int, args: Any) -> None:
            self.queue.append((executor_id, args))

        def ps_get(self, table: str, rows: Any = None) -> np.ndarray:
            return np.ones((60, 5)) if table == "word_topic" else np.ones(5)

        def report(self, **metrics: float) -> None: ...

        def finish(self, result: Any = None) -> None:
            self.finished = True

    for e_count, blocks in [(3, 3), (3, 5), (4, 4)]:
        cfg = {**SMALL, "num_blocks": blocks, "epochs": 3}
        driver = LDADriver(e_count, cfg)
        ctx = Ctx(e_count)
        rng = np.random.default_rng(e_count * 10 + blocks)
        driver.dispatch_initial_tasks(ctx)  # type: ignore[arg-type]
        in_flight: list[tuple[int, dict[str, Any]]] = []
        last_round = {b: -1 for b in range(blocks)}
        done = 0
        while ctx.queue or in_flight:
            in_flight += ctx.queue
            ctx.queue = []
            sampling = [(e, a["round"]) for e, a in in_flight if a["kind"] == "sample"]
            busy = [(e + r) % blocks for e, r in sampling]
            assert len(busy) == len(set(busy)), f"two tasks on one block: {sampling}"
            e, args = in_flight.pop(int(rng.integers(len(in_flight))))
            if args["kind"] == "sample":
                b = (e + args["round"]) % blocks
                assert args["round"] > last_round[b]
                last_round[b] = args["round"]
            value = {"kind": args["kind"], "round": args.get("round", 0), "doc_ll": 0.0, "tokens": 0}
            driver.handle_task_completion(ctx, TaskResult(e, args, value, 0))  # type: ignore[arg-type]
            done += 1
        assert done == e_count * (1 + 3 * blocks) and ctx.finished


def test_conflict_free_batches() -> None:
    rng = np.random.default_rng(0)
    docs = rng.integers(20, size=500)
    words = rng.integers(15, size=500)
    for share in (1, 3, None):
        batches = conflict_free_batches(docs, words, share)
        assert sorted(np.concatenate(batches).tolist()) == list(range(500))
        for b in batches:
            assert len(set(docs[b].tolist())) == b.size
            if share is not None:
                assert np.bincount(words[b]).max() <= share
    assert len(conflict_free_batches(docs, words, None)) == np.bincount(docs).max()


def test_exact_word_batches_also_learn() -> None:
    summary = run_local(lda_app(**{**SMALL, "word_share": 1, "epochs": 8}), num_executors=2)
    assert summary.final is not None
    assert summary.metrics[-1]["objective"] > summary.metrics[0]["objective"] + 0.3
    assert summary.final["topic_cosine"] > 0.8


def test_topic_match_cosine_and_corpus() -> None:
    corpus = synthetic_lda_corpus(50, 30, 4, 20, seed=3)
    assert corpus.num_tokens == corpus.doc_ptr[-1] and corpus.words.max() < 30
    assert corpus.topics is not None
    assert topic_match_cosine(corpus.topics, corpus.topics[::-1]) == pytest.approx(1.0)
    uniform = np.full((4, 30), 1 / 30)
    assert topic_match_cosine(corpus.topics, uniform) < 0.9


def test_offline_corpus_reads_stdlib_docstrings() -> None:
    corpus = load_offline_corpus(max_vocab=300, min_df=2, max_df=0.5, min_doc_tokens=5, max_files=40)
    assert corpus.name.startswith("python-stdlib-docstrings")
    assert corpus.num_docs > 20 and corpus.vocab_size <= 300
    assert not STOP_WORDS.intersection(corpus.vocab)
    counts = np.bincount(corpus.words, minlength=corpus.vocab_size)
    assert np.all(np.diff(counts) <= 0)  # vocabulary sorted by decreasing frequency
    assert np.all(np.diff(corpus.doc_ptr) >= 5)


def test_bad_config_names_the_key() -> None:
    with pytest.raises(ValueError, match="num_blocks"):
        run_local(lda_app(**SMALL, num_blocks=2), num_executors=3)
    with pytest.raises(ValueError, match="corpus"):
        load_corpus({"corpus": "20newsgroups"})
    with pytest.raises(ValueError, match="word_share"):
        lda_app(word_share=0)

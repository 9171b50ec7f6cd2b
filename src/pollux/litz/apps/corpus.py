"""A real text corpus that every machine with Python has offline: the standard library's docstrings.

`load_offline_corpus()` reads every `*.py` file under the running interpreter's standard library
directory (`sysconfig.get_paths()["stdlib"]`, e.g. /usr/lib/python3.11), skipping the `test`/`tests`,
`idlelib`, `lib2to3` and `site-packages` folders, parses each with `ast` (no code is executed) and takes
the docstring of every module, class and function as one document, without its doctest examples.
Text is lower-cased and cut into alphabetic words of 3+ letters; English and docstring stop words are
dropped; the vocabulary keeps words found in at least `min_df` documents and at most a fraction
`max_df` of them, the `max_vocab` most frequent; documents with fewer than `min_doc_tokens` remaining
words are dropped. The result is deterministic for a given Python version (files sorted by path), so
executors can re-read it at will.

Why this corpus: it is real English prose about many distinct subjects (files, sockets, e-mail,
dates, threads, compression, XML, …), it ships with the interpreter itself, and nothing is downloaded.
"""

from __future__ import annotations

import ast
import functools
import os
import re
import sysconfig
from collections import Counter
from pathlib import Path

import numpy as np

from pollux.datasets import Corpus

SKIP_DIRS = frozenset({"test", "tests", "idlelib", "lib2to3", "site-packages", "__pycache__"})
_WORD = re.compile(r"[a-z]{3,}")
STOP_WORDS = frozenset(
    """
    about above after again against all also although always among and another any are aren't
    around because been before being below between both but can cannot could did does doing done
    down during each either else etc even ever every few for from further given had has have having
    here how however into its itself just least less like made make makes many may might more most
    much must neither never new next nor not now off once one only onto other others otherwise our
    out over own per rather same should since some such than that the their them then there these
    they this those though through thus too two under until upon use used uses using very via was
    way well were what when where whether which while who whom whose why will with within without
    would yet you your
    arg args argument arguments attribute bool call called calls class default defaults def false
    function functions instance int keyword kwargs list method methods none object objects optional
    param parameter parameters raise raised raises return returned returns self str true type value
    values var see note example examples e.g i.e
    """.split()
)


def stdlib_dir() -> Path:
    """The standard library folder of the running interpreter (where the documents come from)."""
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_sources(max_files: int | None = None) -> list[Path]:
    """The `*.py` files the corpus reads, sorted by path (see the module docstring for what is skipped)."""
    root = stdlib_dir()
    files: list[Path] = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS]  # prune: site-packages can be huge
        files += [Path(folder) / n for n in names if n.endswith(".py")]
    files.sort()
    return files[:max_files] if max_files is not None else files


def docstrings(path: Path) -> list[str]:
    """Docstrings of the module, classes and functions in `path` (empty if the file does not parse)."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"), filename=str(path))
    except (SyntaxError, ValueError):
        return []
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            text = ast.get_docstring(node, clean=False)
            if text:
                out.append(prose(text))
    return out


def prose(text: str) -> str:
    """`text` without its doctest examples (a `>>>` line and what follows up to the next blank line):
    they are code and printed values, not words about the subject."""
    keep: list[str] = []
    in_example = False
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith(">>>"):
            in_example = True
        elif not stripped:
            in_example = False
        if not in_example:
            keep.append(line)
    return "\n".join(keep)


def tokenize(text: str) -> list[str]:
    return [w for w in _WORD.findall(text.lower()) if w not in STOP_WORDS]


def load_offline_corpus(
    max_vocab: int = 2000,
    min_df: int = 5,
    max_df: float = 0.1,
    min_doc_tokens: int = 20,
    max_files: int | None = None,
) -> Corpus:
    """The standard-library docstring corpus (see the module docstring); vocabulary sorted by
    decreasing frequency, so word id modulo the number of LDA blocks balances the blocks."""
    docs = [tokenize(text) for path in stdlib_sources(max_files) for text in docstrings(path)]
    docs = [d for d in docs if d]
    if not docs:
        raise RuntimeError(f"offline corpus: no docstrings found under {stdlib_dir()}")
    df = Counter(w for d in docs for w in set(d))
    limit = max_df * len(docs)
    keep = {w for w, c in df.items() if min_df <= c <= limit}
    freq = Counter(w for d in docs for w in d if w in keep)
    vocab = tuple(w for w, _ in sorted(freq.items(), key=lambda kv: (-kv[1], kv[0]))[:max_vocab])
    index = {w: i for i, w in enumerate(vocab)}
    kept = [[index[w] for w in d if w in index] for d in docs]
    kept = [d for d in kept if len(d) >= min_doc_tokens]
    if not kept:
        raise RuntimeError(
            f"offline corpus: no document has >= {min_doc_tokens} words after filtering "
            f"(min_df={min_df}, max_df={max_df}, max_vocab={max_vocab})"
        )
    lengths = np.array([len(d) for d in kept], dtype=np.int64)
    doc_ptr = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    words = np.fromiter((w for d in kept for w in d), dtype=np.int64, count=int(lengths.sum()))
    # Renumber by frequency in the documents kept (short ones dropped), most frequent first.
    order = np.argsort(-np.bincount(words, minlength=len(vocab)), kind="stable")
    new_id = np.empty_like(order)
    new_id[order] = np.arange(order.shape[0])
    words = new_id[words]
    vocab = tuple(vocab[i] for i in order)
    name = f"python-stdlib-docstrings({stdlib_dir()}, {len(kept)} docs)"
    return Corpus(name, doc_ptr, words, vocab, None)


@functools.lru_cache(maxsize=2)
def cached_offline_corpus(
    max_vocab: int, min_df: int, max_df: float, min_doc_tokens: int, max_files: int | None
) -> Corpus:
    """`load_offline_corpus`, built once per process for all the executors living there."""
    return load_offline_corpus(max_vocab, min_df, max_df, min_doc_tokens, max_files)

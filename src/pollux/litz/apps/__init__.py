"""Litz applications: real algorithms written against `pollux.litz.api` only.

- `mlr_app(**config)`: multinomial logistic regression, mini-batch SGD with SSP staleness
  (`apps/mlr.py`; `numpy_sgd_reference` is the plain loop it is tested against);
- `lda_app(**config)`: LDA by collapsed Gibbs sampling with word-block model scheduling and stateful
  executors (`apps/lda.py`; corpora in `pollux.datasets` and `apps/corpus.py`);
- `kmeans_app(**config)`: mini-batch K-means with centres as additive sums in the PS and large
  stateful executors, the app that shows out-of-core execution (`apps/kmeans.py`);
- `hdbscan_app(**config)`: approximate HDBSCAN, an NN-Descent kNN graph built by executors that own
  blocks of points, then HDBSCAN on its edges (`apps/hdbscan.py`, `nn_descent.py`, `hdbscan_tree.py`).

`APPS` maps the names the CLI and benchmarks use to the factories.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pollux.litz.api import Application
from pollux.litz.apps.hdbscan import hdbscan_app
from pollux.litz.apps.kmeans import kmeans_app
from pollux.litz.apps.lda import lda_app
from pollux.litz.apps.mlr import mlr_app, numpy_sgd_reference

APPS: dict[str, Callable[..., Application]] = {"mlr": mlr_app, "lda": lda_app, "kmeans": kmeans_app,
                                               "hdbscan": hdbscan_app}


def make_app(name: str, **config: Any) -> Application:
    """The application `name` (a key of `APPS`) with `config`."""
    try:
        factory = APPS[name]
    except KeyError:
        raise ValueError(f"unknown Litz application {name!r} (known: {sorted(APPS)})") from None
    return factory(**config)


__all__ = ["APPS", "hdbscan_app", "kmeans_app", "lda_app", "make_app", "mlr_app", "numpy_sgd_reference"]

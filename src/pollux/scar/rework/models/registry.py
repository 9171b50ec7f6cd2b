"""The models of the rework experiments by name; each module is imported only when asked for."""

from __future__ import annotations

import importlib
from typing import Any

from pollux.scar.api import ReworkModel, ScarError

#: name -> (module under pollux.scar.rework.models, one line on what it is)
MODELS: dict[str, tuple[str, str]] = {
    "mlr": ("mlr", "multinomial logistic regression with L2, gradient descent; blocks = feature rows"),
    "mf": ("mf", "matrix factorisation by alternating least squares; blocks = user and item rows"),
    "lda": ("lda", "latent Dirichlet allocation; blocks = documents' topic rows (TV x length)"),
    "cnn": ("cnn", "a small CNN trained with Adam; moments fail with their parameters"),
    "qp": ("qp", "a strongly convex quadratic program, gradient descent (Theorem 5.3.1)"),
}


def make_model(name: str, **kw: Any) -> ReworkModel:
    """A fresh model by registry name (`kw` go to the module's ``make``)."""
    if name not in MODELS:
        raise ScarError(f"model: expected one of {', '.join(MODELS)}, got {name!r}")
    module = importlib.import_module(f"pollux.scar.rework.models.{MODELS[name][0]}")
    model = module.make(**kw)
    if not isinstance(model, ReworkModel):
        raise ScarError(f"model {name!r}: make() returned {type(model).__name__}, not a ReworkModel")
    return model

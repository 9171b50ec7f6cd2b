"""The plain settings of each rework model and the named settings its figures are tested against.

Each model of the experiments has one knob of its data or protocol that changes how much the
prioritised checkpoints can save (issue 39): MLR's feature scales, MF's protocol, LDA's document
lengths, the CNN's burn-in. The headline figures are those of the *plain* setting — standardised
features, the thesis-like protocol, equal lengths, a burn-in stated from the thesis's Adam
settings — which are the models' defaults; the other values, among them the defaults before issue
39, are *sensitivity* settings, run at the headline points only (full recovery, partial recovery
at 1/4, 1/2, 3/4 lost, priority 1/8 with half lost) with Theorem 5.3.1's prediction beside them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pollux.scar.api import ReworkModel
from pollux.scar.rework.experiment import ReworkResult
from pollux.scar.rework.models import mf
from pollux.scar.rework.models.registry import make_model
from pollux.scar.rework.prediction import predict
from pollux.scar.rework.sweep import LOST, PRIORITY_TARGET, RANGES, checkpoint, key, recover, reduction


@dataclass(frozen=True)
class Setting:
    """One value of a model's knob: the keyword arguments that build the model with it."""

    model: str
    knob: str
    value: float | str
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    former_default: bool = False  # the default before issue 39
    note: str = ""

    @property
    def label(self) -> str:
        return f"{self.knob}={self.value}"

    def build(self) -> ReworkModel:
        return make_model(self.model, **self.kwargs)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "knob": self.knob,
            "value": self.value,
            "label": self.label,
            "former_default": self.former_default,
            "note": self.note,
        }


def _protocol_label(p: Any) -> str:
    return f"{p.converge_iterations}/{p.checkpoint_interval}/{p.failure_mean:g}"


#: The headline settings: each model's defaults, named.
PLAIN: dict[str, Setting] = {
    "mlr": Setting("mlr", "feature_spread", 0.0, {"feature_spread": 0.0},
                   note="standardised features, no rescaling"),
    "mf": Setting("mf", "protocol", _protocol_label(mf.THESIS_PROTOCOL), {"protocol": mf.THESIS_PROTOCOL},
                  note="threshold after 60 sweeps (thesis §5.5.1), checkpoints every 20, failures after 25"),
    "lda": Setting("lda", "length_spread", 0.0, {"length_spread": 0.0}, note="every document 30 tokens"),
    "cnn": Setting("cnn", "burn_in", 10, {"burn_in": 10}, former_default=True,
                   note="1/(1 − β₁) with the thesis's β₁ = 0.9"),
    "qp": Setting("qp", "spread", 2.0, {"spread": 2.0}, note="the test model; not a headline"),
}

#: The other values of each knob (the former defaults among them), run beside the plain figures.
SENSITIVITY: dict[str, tuple[Setting, ...]] = {
    "mlr": (
        Setting("mlr", "feature_spread", 1.0, {"feature_spread": 1.0}),
        Setting("mlr", "feature_spread", 2.5, {"feature_spread": 2.5}, former_default=True),
    ),
    "mf": (
        Setting("mf", "protocol", _protocol_label(mf.SHORT_PROTOCOL), {"protocol": mf.SHORT_PROTOCOL},
                former_default=True, note="every time scale of the thesis-like protocol halved"),
        Setting("mf", "scale_spread", 0.0, {"scale_spread": 0.0},
                note="equal row scales of the true factors (default 0.5), thesis-like protocol"),
    ),
    "lda": (
        Setting("lda", "length_spread", 1.0, {"length_spread": 1.0}),
        Setting("lda", "length_spread", 1.5, {"length_spread": 1.5}, former_default=True),
    ),
    "cnn": (
        Setting("cnn", "burn_in", 0, {"burn_in": 0}, note="from the He initialisation"),
        Setting("cnn", "burn_in", 20, {"burn_in": 20}),
        Setting("cnn", "burn_in", 40, {"burn_in": 40}),
    ),
    "qp": (Setting("qp", "spread", 0.0, {"spread": 0.0}, note="every coordinate starts equally far off"),),
}


def sensitivity_point(
    setting: Setting,
    trials: int = 100,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """The headline points of one setting: full recovery, partial at each lost fraction and priority
    1/8 (half lost), their reductions, the checks those points decide, and Theorem 5.3.1's
    prediction for each."""
    say = progress or (lambda _msg: None)
    t0 = time.perf_counter()
    model = setting.build()
    layout = next(iter(model.layouts))
    full = recover(model, 0.5, "full", layout, trials=trials, seed=seed)
    part = {p: recover(model, p, "partial", layout, trials=trials, seed=seed) for p in LOST}
    prio = checkpoint(model, "priority", 0.125, layout, trials=trials, seed=seed)
    named: dict[str, ReworkResult] = {"full": full, **{f"partial {key(p)}": r for p, r in part.items()}}
    named["priority 1/8"] = prio
    red = {key(p): reduction(r, full) for p, r in part.items()}
    prio_red = reduction(prio, full)
    out = {
        "setting": setting.to_dict(),
        "protocol": vars(model.protocol),
        "full": full.to_dict(),
        "partial": {key(p): r.to_dict() for p, r in part.items()},
        "priority_1_8": prio.to_dict(),
        "reduction": red,
        "priority_1_8_reduction": prio_red,
        "reduction_in_range": {key(p): bool(RANGES[p][0] <= red[key(p)] <= RANGES[p][1]) for p in LOST},
        "priority_1_8_ok": bool(prio_red >= PRIORITY_TARGET),
        "theory": predict(model, named, layout=layout),
        "seconds": round(time.perf_counter() - t0, 2),
    }
    say(f"{setting.model:>4} {setting.label:<22} reduction {100 * red['1/4']:.0f} · {100 * red['1/2']:.0f} · "
        f"{100 * red['3/4']:.0f} %, priority 1/8 {100 * prio_red:.0f} %  ({out['seconds']:.1f} s)")
    return out


def model_sensitivity(
    name: str,
    trials: int = 100,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """Every sensitivity setting of model `name` (none for a model without any)."""
    return [sensitivity_point(s, trials, seed, progress) for s in SENSITIVITY.get(name, ())]

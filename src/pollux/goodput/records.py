"""Typed records of the goodput core: throughput parameters and gradient statistics.

Everything that crosses a boundary (a hint from an agent, a checkpoint, a simulator job) is one of
these records, validated on construction so that a NaN or a negative time can never reach the
optimiser and silently turn every goodput into NaN.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any


def check_number(name: str, value: Any, *, minimum: float = 0.0, maximum: float = math.inf) -> float:
    """Return ``value`` as a float, or raise ``ValueError`` naming the field.

    Rejects non-numbers, NaN, infinities and values outside ``[minimum, maximum]``.
    """
    if isinstance(value, bool):
        raise ValueError(f"{name}: expected a number, got a boolean ({value!r})")
    if isinstance(value, str | bytes | bytearray):
        raise ValueError(f"{name}: expected a number, got a string ({value!r})")
    try:
        number = float(value)
    except OverflowError:
        raise ValueError(f"{name}: number too large ({str(value)[:20]}...)") from None
    except (TypeError, ValueError):
        raise ValueError(f"{name}: expected a number, got {value!r}") from None
    if not math.isfinite(number):
        raise ValueError(f"{name}: must be finite, got {number!r}")
    if number < minimum:
        raise ValueError(f"{name}: must be >= {minimum:g}, got {number!r}")
    if number > maximum:
        raise ValueError(f"{name}: must be <= {maximum:g}, got {number!r}")
    return number


def check_fields(where: str, data: Any, names: Sequence[str], expected: str) -> None:
    """Raise ``ValueError`` unless ``data`` is a dict with exactly the keys ``names``.

    The message starts with ``where``; ``expected`` says what the object should have been. One rule
    for every JSON object a user or an agent hands in: a missing field and an unknown (misspelt) one
    are both errors.
    """
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected {expected}")
    missing = [n for n in names if n not in data]
    if missing:
        raise ValueError(f"{where}: missing field(s) {', '.join(missing)}")
    extra = sorted(set(data) - set(names))
    if extra:
        raise ValueError(f"{where}: unknown field(s) {', '.join(extra)}")


@dataclass(frozen=True, slots=True)
class ThroughputParams:
    """The seven parameters of the throughput model (SPEC §3), all times in seconds.

    ``T_grad(m) = alpha_grad + beta_grad·m``; ``T_sync`` is ``alpha_local + beta_local·(K−2)`` on one
    node and ``alpha_node + beta_node·(K−2)`` across nodes (zero for one replica); ``gamma`` in
    [1, 10] blends computation and synchronisation: 1 means no overlap, large means full overlap.
    """

    alpha_grad: float
    beta_grad: float
    alpha_local: float
    beta_local: float
    alpha_node: float
    beta_node: float
    gamma: float

    def __post_init__(self) -> None:
        for f in fields(self):
            if f.name == "gamma":
                value = check_number("gamma", self.gamma, minimum=1.0, maximum=10.0)
            else:
                value = check_number(f.name, getattr(self, f.name))
            object.__setattr__(self, f.name, value)

    def to_dict(self) -> dict[str, float]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, where: str = "throughput") -> ThroughputParams:
        """Build from a mapping; errors name the missing or bad field as ``where.field``."""
        names = [f.name for f in fields(cls)]
        check_fields(where, data, names, "an object with the 7 throughput parameters")
        try:
            return cls(**{n: data[n] for n in names})
        except ValueError as exc:
            raise ValueError(f"{where}.{exc}") from None

    def as_array(self) -> tuple[float, ...]:
        return tuple(getattr(self, f.name) for f in fields(self))


@dataclass(frozen=True, slots=True)
class GradStats:
    """Gradient statistics behind the noise scale (SPEC §2).

    ``sqr`` is ``|P g|²`` (squared norm of the pre-conditioned true gradient) and ``var`` is
    ``tr(P Σ Pᵀ) / M0``: the gradient variance of a batch of the initial size M0. Their ratio,
    scaled by M0, is the pre-conditioned gradient noise scale.
    """

    sqr: float
    var: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "sqr", check_number("sqr", self.sqr))
        object.__setattr__(self, "var", check_number("var", self.var))

    def pgns(self, init_batch_size: float) -> float:
        """The pre-conditioned gradient noise scale ``φ = var·M0 / sqr`` (inf when sqr is 0)."""
        if self.sqr == 0.0:
            return math.inf
        return self.var * float(init_batch_size) / self.sqr

    def to_dict(self) -> dict[str, float]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, where: str = "grad") -> GradStats:
        check_fields(where, data, ("sqr", "var"), "an object with fields sqr and var")
        try:
            return cls(sqr=data["sqr"], var=data["var"])
        except ValueError as exc:
            raise ValueError(f"{where}.{exc}") from None

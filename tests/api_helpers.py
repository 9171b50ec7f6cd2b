"""Helpers shared by the tests of the service's API and CLI: a bearer header and a valid hints body."""

from __future__ import annotations

from pollux.goodput import GradStats, ThroughputParams
from pollux.hints import build_hints


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def sample_hints(init_batch_size: int = 128) -> dict:
    """Hints as a running job would send them (a fitted model of a real profile, 4 replicas seen)."""
    return build_hints(params=ThroughputParams(0.0177, 0.000697, 0.0342, 0.00165, 0.128, 0.0026, 2.23),
                       grad=GradStats(sqr=8.95, var=5.07), init_batch_size=init_batch_size,
                       max_batch_size=4096, local_bsz_bounds=(32, 1024), accumulation=True,
                       max_replicas_seen=4, progress=12345.5, epoch=3)

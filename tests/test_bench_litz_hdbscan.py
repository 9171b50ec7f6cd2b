"""``benchmarks/litz_hdbscan.py --quick --json`` runs end to end and reports every part.

The quick mode is small and local (no Ray); its figures say little about the targets, which the
full run reports (``docs/benchmarks.md``). Checked here: the JSON names the lead reads (``fm_index``
per dimension, cluster counts, the speed-up at the largest exact size, the power-law exponent, the
d_max broadcast's saving), sane values, and that the broadcast changed the traffic but not the labels.
"""

from __future__ import annotations

import math

import pytest

from bench_scripts import BENCHMARKS, run_quick_json

pytest.importorskip("sklearn")


def test_quick_run_reports_every_part():
    rep, _ = run_quick_json(BENCHMARKS / "litz_hdbscan.py", timeout_s=300)
    assert rep["benchmark"] == "litz_hdbscan" and rep["quick"] is True
    assert set(rep["fm_index"]) == set(rep["clusters"]) == set(rep["fm"]) and rep["fm_index"]
    for dim, fm in rep["fm_index"].items():
        assert 0.0 <= fm <= 1.0, dim
        counts = rep["clusters"][dim]
        assert counts["exact"] >= 1 and counts["approx"] >= 1
        assert 0.0 <= rep["fm"][dim]["k20"]["fm_index"] <= 1.0
        assert rep["fm"][dim]["no_links"]["links"] == 0 <= rep["fm"][dim]["default"]["links"]
    speed = rep["speed"]
    assert len(speed["runs"]) >= 3 and all(r["approx_s"] > 0 for r in speed["runs"])
    assert speed["largest_exact_n"] in [r["n"] for r in speed["runs"]]
    assert speed["speedup_at_largest_exact"] > 0 and math.isfinite(speed["power_law_exponent"])
    bcast = rep["broadcast"]
    assert bcast["same_labels"] is True
    assert 0 < bcast["proposals_sent_on"] < bcast["proposals_sent_off"]
    assert -1.0 < bcast["saving"] < 1.0
    assert set(rep["passed"]) == {"fm_index_ge_0_90", "clusters_within_2pct", "speedup_ge_10",
                                  "broadcast_saves_time", "broadcast_same_labels"}

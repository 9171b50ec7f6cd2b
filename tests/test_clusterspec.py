"""GPU types in the policy core: the Cluster record's types and the cluster-string parser."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pollux.goodput import BatchLimits, GoodputModel, GradStats
from pollux.goodput.records import ThroughputParams
from pollux.policy.base import DEFAULT_GPU_TYPE, Cluster, JobView
from pollux.policy.clusterspec import format_cluster, load_cluster, parse_cluster


def test_parse_the_sia_cluster() -> None:
    c = parse_cluster("aws:6x4, rtx:3x8 ,dgx-ext:2x8")
    assert c.nodes[:2] == ("aws-0", "aws-1") and c.nodes[6] == "rtx-0" and c.nodes[-1] == "dgx-ext-1"
    assert c.type_names == ("aws", "rtx", "dgx-ext") and c.heterogeneous
    assert c.type_capacity() == {"aws": 24, "rtx": 24, "dgx-ext": 16} and c.total_gpus == 64
    assert c.type_index().tolist() == [0] * 6 + [1] * 3 + [2] * 2
    assert c.nodes_of_type("rtx").tolist() == [6, 7, 8] and c.nodes_of_type("v100").size == 0
    assert format_cluster(c) == "aws:6x4,rtx:3x8,dgx-ext:2x8"
    assert parse_cluster("a:12x1").nodes[:2] == ("a-00", "a-01")     # zero-padded per type


def test_untyped_cluster_is_one_default_type() -> None:
    c = Cluster.uniform(16, 4)
    assert c.types == () and c.node_types == (DEFAULT_GPU_TYPE,) * 16
    assert c.type_names == (DEFAULT_GPU_TYPE,) and not c.heterogeneous
    assert c.type_capacity() == {DEFAULT_GPU_TYPE: 64}
    typed = Cluster.uniform(2, 4, gpu_type="aws")
    assert typed.node_types == ("aws", "aws") and typed.nodes == ("node-0", "node-1")
    assert Cluster(("a", "b"), (4, 8), ("t4", "a100")).type_capacity() == {"t4": 4, "a100": 8}


@pytest.mark.parametrize(("text", "message"), [
    ("aws:0x4", "must be >= 1"), ("aws6x4", "expected TYPE:NODESxGPUS"), ("aws:2x2,aws:1x1", "twice"),
    ("", "empty cluster"), ("aws:2x", "expected TYPE:NODESxGPUS"), (":2x4", "expected TYPE"),
])
def test_bad_cluster_strings_name_the_entry(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_cluster(text, where="--cluster")


def test_bad_types_in_the_record() -> None:
    with pytest.raises(ValueError, match="types"):
        Cluster(("a", "b"), (4, 4), ("t4",))
    with pytest.raises(ValueError, match="types"):
        Cluster(("a",), (4,), ("",))


def test_cluster_file(tmp_path: Path) -> None:
    path = tmp_path / "cluster.txt"
    path.write_text("# the Sia cluster\naws:6x4   # T4\nrtx:3x8, dgx-ext:2x8\n")
    assert load_cluster(path) == parse_cluster("aws:6x4,rtx:3x8,dgx-ext:2x8")
    path.write_text("aws:6x4\nrtx:3y8\n")
    with pytest.raises(ValueError, match=r"cluster\.txt, line 2: cluster entry 'rtx:3y8'"):
        load_cluster(path)
    with pytest.raises(ValueError, match="cannot read"):
        load_cluster(tmp_path / "missing.txt")


def test_job_view_models_per_type() -> None:
    params = ThroughputParams(0.1, 0.01, 0.0, 0.0, 0.0, 0.0, 1.0)
    fast = ThroughputParams(0.05, 0.005, 0.0, 0.0, 0.0, 0.0, 1.0)
    stats = GradStats(1.0, 1.0)
    base = GoodputModel(params, stats, 32)
    a100 = GoodputModel(fast, stats, 32)
    limits = BatchLimits(32, 1024, 8, 128)
    view = JobView("j", 0.0, model=base, limits=limits, type_models={"a100": a100},
                   type_limits={"a100": BatchLimits(32, 1024, 8, 256)})
    assert view.model_for("a100") is a100 and view.model_for("t4") is base
    assert view.limits_for("a100").max_local_bsz == 256 and view.limits_for("t4") is limits
    plain = JobView("k", 0.0, model=base, limits=limits)
    assert plain.model_for("anything") is base and plain.limits_for("anything") is limits
    assert np.isfinite(float(a100.throughput(1, 1, 32, 0)))

"""The node provider on Ray's own autoscaler (issue 36): unit tests with a recorder in place of
``ray.autoscaler.sdk.request_resources``, and checks of the fake cluster's config against Ray's.

Ray's real autoscaler (v1, with its fake multi-node provider, ``ray_fake_autoscaler``) is exercised
end to end by ``tests/test_cluster_autoscale_live.py``, where the service, a process of its own, is
the Ray driver. A live test here made the pytest process itself a Ray driver with token
authentication off; that setting stays with the process and broke the in-process Ray clusters of
later test files (their GCS started with a token), so it was removed.
"""

from __future__ import annotations

from typing import Any

import pytest

from pollux.cluster.backends.nodes_api import NodeProvider, ProviderError
from pollux.cluster.backends.ray_autoscaler_nodes import (
    FAKE_NODE_TYPE,
    OBJECT_STORE_BYTES,
    RayAutoscalerNodes,
    fake_cluster_config,
)
from ray_fake_autoscaler import (
    autoscaling_config,
)

# ------------------------------------------------------------------------------- unit tests


class Recorder:
    """Stands in for ``request_resources``: records each call's keyword arguments, or raises."""

    def __init__(self, fail: Exception | None = None) -> None:
        self.calls: list[dict[str, Any]] = []
        self.fail = fail

    def __call__(self, **kwargs: Any) -> None:
        if self.fail is not None:
            raise self.fail
        self.calls.append(kwargs)

    def counts(self) -> list[int]:
        """How many bundles each call asked for."""
        return [len(call["bundles"]) for call in self.calls]


def test_is_a_node_provider_of_its_own_kind() -> None:
    nodes = RayAutoscalerNodes(2, request=Recorder())
    assert isinstance(nodes, NodeProvider)
    assert nodes.kind == "ray-autoscaler"
    assert nodes.gpus_per_node == 2


def test_gpus_per_node_must_be_positive() -> None:
    with pytest.raises(ValueError, match="gpus_per_node"):
        RayAutoscalerNodes(0, request=Recorder())


def test_hold_asks_for_one_gpu_bundle_per_node_kept_or_new() -> None:
    rec = Recorder()
    nodes = RayAutoscalerNodes(4, request=rec)
    nodes.hold(["a", "b"], 1)
    assert rec.calls == [{"bundles": [{"GPU": 4}, {"GPU": 4}, {"GPU": 4}]}]
    assert nodes.asked == 3


def test_the_sdk_is_called_only_when_the_count_changes() -> None:
    rec = Recorder()
    nodes = RayAutoscalerNodes(1, request=rec)
    nodes.hold(["a", "b"], 1)
    nodes.hold(["a"], 2)          # other names, same count: nothing to tell Ray
    nodes.hold([], 3)
    nodes.hold(["a", "b", "c"], 0, alive=["a", "b", "c"])   # the fleet also passes the alive nodes
    assert rec.counts() == [3]
    nodes.hold(["a"], 0)
    nodes.hold(["b"], 0)
    nodes.hold(["a"], 2)
    assert rec.counts() == [3, 1, 3]


def test_zero_nodes_withdraws_the_request_with_no_bundles() -> None:
    rec = Recorder()
    nodes = RayAutoscalerNodes(1, request=rec)
    nodes.hold([], 2)
    nodes.hold([], 0)
    assert rec.calls[-1] == {"bundles": []}
    nodes.hold([], 0)
    assert rec.counts() == [2, 0]
    assert nodes.asked == 0


def test_the_first_hold_always_calls_so_a_floor_left_by_an_earlier_service_is_replaced() -> None:
    rec = Recorder()
    RayAutoscalerNodes(1, request=rec).hold([], 0)
    assert rec.calls == [{"bundles": []}]


def test_a_negative_new_count_asks_for_no_extra_node() -> None:
    rec = Recorder()
    nodes = RayAutoscalerNodes(1, request=rec)
    nodes.hold(["a"], -2)
    assert rec.counts() == [1]


def test_pending_is_what_was_asked_for_beyond_the_alive_nodes() -> None:
    nodes = RayAutoscalerNodes(1, request=Recorder())
    assert nodes.pending([]) == 0
    assert nodes.pending(["a"]) == 0
    nodes.hold([], 3)
    assert nodes.pending([]) == 3
    assert nodes.pending(["a"]) == 2
    assert nodes.pending(["a", "b", "c"]) == 0
    assert nodes.pending(["a", "b", "c", "d", "e"]) == 0
    nodes.hold(["a"], 0)
    assert nodes.pending(["a", "b"]) == 0
    assert nodes.pending([]) == 1


def test_an_sdk_failure_is_a_provider_error_naming_the_call_and_is_retried() -> None:
    rec = Recorder(fail=RuntimeError("Ray is not initialized yet"))
    nodes = RayAutoscalerNodes(2, request=rec)
    with pytest.raises(ProviderError, match=r"request_resources\(bundles=3 x \{'GPU': 2\}\) failed") as info:
        nodes.hold(["a"], 2)
    assert "RuntimeError: Ray is not initialized yet" in str(info.value)
    assert isinstance(info.value.__cause__, RuntimeError)
    assert nodes.asked == 0 and nodes.pending([]) == 0     # nothing was asked for
    with pytest.raises(ProviderError, match=r"bundles=none \(withdraw\)"):
        nodes.hold([], 0)
    rec.fail = None
    nodes.hold(["a"], 2)                                    # the same count again: it is asked now
    assert rec.counts() == [3]


def test_close_withdraws_nothing() -> None:
    rec = Recorder()
    nodes = RayAutoscalerNodes(1, request=rec)
    nodes.hold([], 2)
    nodes.close()
    assert rec.counts() == [2]
    assert nodes.pending([]) == 2


def test_fake_cluster_config_has_a_gpu_less_head_and_one_gpu_node_type() -> None:
    args = fake_cluster_config(max_nodes=3, gpus_per_node=2, idle_timeout_minutes=0.1)
    assert args["head_resources"] == {"CPU": 0, "GPU": 0, "object_store_memory": OBJECT_STORE_BYTES}
    assert args["worker_node_types"] == {
        FAKE_NODE_TYPE: {"resources": {"CPU": 0, "GPU": 2, "object_store_memory": OBJECT_STORE_BYTES},
                         "node_config": {}, "min_workers": 0, "max_workers": 3}}
    assert args["idle_timeout_minutes"] == 0.1
    assert args["max_workers"] == 3
    with pytest.raises(ValueError):
        fake_cluster_config(max_nodes=0, gpus_per_node=1, idle_timeout_minutes=0.1)
    with pytest.raises(ValueError):
        fake_cluster_config(max_nodes=1, gpus_per_node=1, idle_timeout_minutes=-1)


# ------------------------------------------------------------------------------- Ray's side


def test_fake_cluster_config_fits_autoscaling_cluster_and_ray_s_config_schema() -> None:
    pytest.importorskip("ray")
    import inspect

    from ray.autoscaler._private.util import validate_config
    from ray.cluster_utils import AutoscalingCluster

    args = fake_cluster_config(max_nodes=2, gpus_per_node=1, idle_timeout_minutes=0.05)
    inspect.signature(AutoscalingCluster).bind(**args)
    validate_config(autoscaling_config(args, "127.0.0.1:6379"))


def test_without_a_ray_connection_the_real_sdk_fails_as_a_provider_error() -> None:
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        pytest.skip("this process is a Ray driver already: the call would reach that cluster")
    with pytest.raises(ProviderError, match="Ray is not initialized"):
        RayAutoscalerNodes(1).hold([], 1)


# ------------------------------------------------------------------------------- live

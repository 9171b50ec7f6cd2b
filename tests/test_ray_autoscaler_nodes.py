"""The node provider on Ray's own autoscaler (issue 36): unit tests, and one live run of Ray's real
autoscaler with its fake multi-node provider on this machine.

The unit tests put a recorder in place of ``ray.autoscaler.sdk.request_resources``. The live test
starts a head whose autoscaler launches fake GPU nodes (each a raylet of its own on 127.0.0.1),
asks for two through :class:`RayAutoscalerNodes`, makes one busy with a 1-GPU actor, lowers the
floor to that one and checks that Ray removes the idle node and keeps the busy one, even once the
request is withdrawn; then that the last node goes when its actor is released.

Why the live test does not call ``AutoscalingCluster.start``/``shutdown``: both run
``ray stop --force``, which kills every Ray process on the machine (other tests' clusters too), and
the Ray wheel does not ship the ``example.yaml`` that ``AutoscalingCluster`` builds its config from.
So the test builds the same config from :func:`fake_cluster_config` (the arguments it would pass to
``AutoscalingCluster``), starts the head with the ``ray start`` command and environment that
``AutoscalingCluster.start`` uses (plus ``--block``, free ports and a temp folder of its own), and
stops only the processes it started. The missing file also keeps Ray's v2 autoscaler (the one
KubeRay turns on by default) from loading a ``fake_multinode``
config at all (its monitor fills in the provider's defaults from that file), so the live test runs
the v1 autoscaler, ``AutoscalingCluster``'s default; both honour ``request_resources`` and remove
only idle nodes the request does not need. About 30 s on two cores, most of it starting the head
and the fake nodes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
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
    IDLE_TIMEOUT_MIN,
    UPDATE_INTERVAL_S,
    FakeCluster,
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

def test_live_ray_autoscaler_adds_nodes_and_removes_only_idle_ones(fake_cluster: FakeCluster) -> None:
    import ray

    from pollux.cluster.backends.ray_backend import RayBackend

    started = time.monotonic()
    timeline: list[str] = []

    def mark(what: str) -> None:
        timeline.append(f"{time.monotonic() - started:5.1f}s {what}")

    def wait_for(ok: Callable[[], bool], timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not ok():
            fake_cluster.check_alive()
            assert time.monotonic() < deadline, f"timed out waiting for {what}:\n" + "\n".join(timeline)
            time.sleep(0.2)
        mark(what)

    backend = RayBackend(fake_cluster.address)
    mark("connected")

    def gpu_nodes() -> dict[str, str]:
        """Alive GPU nodes, node id -> the service's name for it. Keyed by id: the fake provider's
        node ids all start with ``ffffffff``, so the service's ``<address>-<id[:8]>`` names of its
        nodes are all the same (real node ids are random)."""
        return {n.node_id: n.name for n in backend.nodes()}

    assert gpu_nodes() == {}, "the head must have no GPUs"
    nodes = RayAutoscalerNodes(1)
    nodes.hold([], 2)
    assert nodes.pending([]) == 2
    wait_for(lambda: len(gpu_nodes()) == 2, 90, "two GPU nodes")
    first = gpu_nodes()
    assert nodes.pending(list(first.values())) == 0
    # The fake provider's nodes are raylets of their own, each with the node type's resources.
    states = {n["NodeID"]: n for n in ray.nodes() if n["Alive"]}
    for node_id in first:
        assert states[node_id]["Resources"].get("GPU") == 1
        assert not states[node_id]["Resources"].get("CPU")
    assert all(states[i]["NodeManagerAddress"] == "127.0.0.1" for i in states)
    assert len({states[i]["NodeManagerPort"] for i in states}) == len(states) == 3

    @ray.remote(num_gpus=1, num_cpus=0)
    class Replica:
        def node(self) -> str:
            return ray.get_runtime_context().get_node_id()

    replica = Replica.remote()  # type: ignore[attr-defined]
    busy = ray.get(replica.node.remote(), timeout=60)
    assert busy in first
    mark("a 1-GPU actor runs on one node")

    def stays(what: str) -> None:
        """The busy node alone, for longer than the idle timeout and a few autoscaler updates (a
        node launched in one such window shows up by the end of the next: starting one takes about
        3 s)."""
        until = time.monotonic() + IDLE_TIMEOUT_MIN * 60 + 3 * UPDATE_INTERVAL_S
        while time.monotonic() < until:
            fake_cluster.check_alive()
            now = gpu_nodes()
            assert list(now) == [busy], f"{what}: {now}, busy {busy}\n" + "\n".join(timeline)
            time.sleep(0.2)
        mark(what)

    # The service drained and emptied the other node: it keeps the busy one and asks for no more.
    nodes.hold([first[busy]], 0)
    assert nodes.pending([first[busy]]) == 0
    wait_for(lambda: list(gpu_nodes()) == [busy], 60, "the idle node removed, the busy one kept")
    # The one-bundle floor is met by the busy node although its only GPU is in use: Ray counts a
    # request against the cluster's total resources, so it launches nothing for it.
    stays("no node launched for a floor the busy node meets")

    # With no floor at all the busy node still stays: Ray removes only idle nodes.
    nodes.hold([], 0)
    stays("the busy node outlived the idle timeout with no request")

    ray.kill(replica)
    nodes.hold([], 0)
    wait_for(lambda: gpu_nodes() == {}, 60, "no GPU node once the actor is gone")
    backend.shutdown()
    print("\n".join(timeline))

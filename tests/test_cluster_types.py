"""GPU types in the live service (issue 13, item 5): nodes carry their type from the backend into
the scheduler's cluster, every replica asks for (and lands on) a node of its allocation's type, and
``pollux ls`` / ``describe`` / ``nodes`` and the REST API show the types.

The fast tests run the production controller and scheduling round against the in-memory fake
backend (``tests/fake_backend.py``); one end-to-end test (at the bottom, 12-26 s on two cores)
starts an embedded Ray cluster of two typed virtual nodes with ``pollux.cluster.server.start``, and
checks through Ray's own state which node hosts each job's replicas.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from api_helpers import serve_on_loopback, write_state
from fake_backend import FakeBackend, FakeClock
from pollux.cli import main
from pollux.cli.formatting import describe_text, nodes_text
from pollux.cluster.backends import gputypes as gt
from pollux.cluster.backends.api import NodeInfo, ReplicaLaunch
from pollux.cluster.backends.rayhost import node_args, node_specs
from pollux.cluster.control.controller import Controller, ControllerConfig
from pollux.cluster.control.scheduler import Scheduler
from pollux.cluster.state.store import JobStore
from pollux.policy.base import Cluster

TYPED = {"t4-0": 2, "t4-1": 2, "a100-0": 2}
TYPES = {"t4-0": "t4", "t4-1": "t4", "a100-0": "a100"}


class RecordingPolicy:
    """Answers the allocation in ``plan`` and records every cluster it was asked about."""

    name = "recording"

    def __init__(self) -> None:
        self.plan: dict[str, dict[str, int]] = {}
        self.clusters: list[Cluster] = []

    def decide(self, jobs, cluster, *args, **kwargs):
        self.clusters.append(cluster)
        ids = {v.id for v in jobs}
        return {j: dict(a) for j, a in self.plan.items() if j in ids and a}, None


class TypedRig:
    """Store + fake backend (typed unless ``types`` is empty) + fake clock + controller."""

    def __init__(self, tmp_path: Path, nodes=None, types=None) -> None:
        self.clock = FakeClock()
        self.backend = FakeBackend(dict(TYPED if nodes is None else nodes), TYPES if types is None else types)
        self.store = JobStore(tmp_path / "jobs.db")
        self.policy = RecordingPolicy()
        sched = Scheduler(self.store, policy_name="fifo")
        sched.policy = self.policy   # type: ignore[assignment]
        config = ControllerConfig(state_dir=tmp_path, interval_s=3600.0, launch_timeout_s=20.0, max_retries=2)
        self.controller = Controller(self.store, self.backend, sched, config, clock=self.clock,
                                     monotonic=self.clock)

    def submit(self, job_id: str, plan: dict[str, int], **spec) -> None:
        self.store.submit({"entrypoint": "train.py", "init_batch_size": 8, **spec}, job_id=job_id,
                          now=self.clock())
        self.policy.plan[job_id] = plan
        self.controller.request_round()

    def tick(self, n: int = 1) -> None:
        for _ in range(n):
            self.clock.advance(0.5)
            self.controller.tick()


@pytest.fixture
def rig(tmp_path):
    made: list[TypedRig] = []

    def make(**kw) -> TypedRig:
        folder = tmp_path / f"rig{len(made)}"
        folder.mkdir()
        made.append(TypedRig(folder, **kw))
        return made[-1]

    yield make
    for r in made:
        r.store.close()


# ------------------------------------------------------------------------------ types from resources


def test_node_type_comes_from_pollux_resource_then_ray_accelerator_else_untyped():
    assert gt.gpu_type_of({"GPU": 2, "pollux_gpu_type_t4": 2, "accelerator_type:T4": 1}) == "t4"
    assert gt.gpu_type_of({"GPU": 8, "accelerator_type:A100": 1.0}) == "A100"
    assert gt.gpu_type_of({"GPU": 8, "CPU": 16}) is None
    assert gt.gpu_type_of({"GPU": 8, "pollux_gpu_type_": 1, "accelerator_type:": 1}) is None   # no name
    assert gt.gpu_type_of({"pollux_gpu_type_b": 1, "pollux_gpu_type_a": 1}) == "a"   # ambiguous: first


def test_untyped_nodes_give_exactly_the_old_cluster_and_typed_ones_a_typed_cluster():
    plain = [NodeInfo("node-0", "i0", "a", 2), NodeInfo("node-1", "i1", "a", 4)]
    assert gt.cluster_of(plain) == Cluster(("node-0", "node-1"), (2, 4))
    assert gt.cluster_of(plain).types == ()
    typed = [NodeInfo("a100-0", "i0", "a", 2, gpu_type="a100"), NodeInfo("x", "i1", "a", 4)]
    c = gt.cluster_of(typed)
    assert c.types == ("a100", "gpu") and c.type_capacity() == {"a100": 2, "gpu": 4}
    assert gt.node_types(c) == {"a100-0": "a100", "x": "gpu"}
    assert gt.job_gpu_types({"a100-0": 1, "x": 0, "gone": 3}, {"a100-0": "a100", "x": "gpu"}) == ["a100"]


def test_a_replica_asks_for_its_nodes_type_resource():
    ours = NodeInfo("t4-0", "i", "a", 2, {"GPU": 2, "pollux_gpu_type_t4": 2}, gpu_type="t4")
    ray = NodeInfo("n", "i", "a", 8, {"GPU": 8, "accelerator_type:A100": 1}, gpu_type="A100")
    plain = NodeInfo("p", "i", "a", 8, {"GPU": 8})
    assert gt.type_resource(ours, 2.0) == {"pollux_gpu_type_t4": 2.0}
    assert gt.type_resource(ray, 4.0) == {"accelerator_type:A100": gt.ACCELERATOR_SHARE}
    assert gt.type_resource(plain, 1.0) == {}
    launch = ReplicaLaunch(0, "t4-0", ["x"], None, {}, "log")
    out = gt.with_type_resources([launch, replace(launch, rank=1, node="p")], {"t4-0": ours, "p": plain})
    assert out[0].resources == {"GPU": 1.0, "pollux_gpu_type_t4": 1.0}
    assert out[1].resources == {"GPU": 1.0}
    assert launch.resources == {"GPU": 1.0}   # the original launch is not changed
    # the replica learns its type (the agent reports it as gpu_type in its hints); untyped: unset
    assert out[0].env == {"POLLUX_GPU_TYPE": "t4"} and out[1].env == {} and launch.env == {}


def test_a_type_aware_policy_sees_the_jobs_model_per_type():
    """The service's view of a job for a type-aware policy: the model it reported per type (hints
    v2), and on a type it has not run on yet its current model; a type-unaware one gets none."""
    from pollux.cluster.control.scheduler import job_view
    from pollux.goodput import GradStats, ThroughputParams
    from pollux.hints import build_hints

    slow = ThroughputParams(0.1, 0.01, 0.0, 0.0, 0.0, 0.0, 1.0)
    fast = ThroughputParams(0.05, 0.002, 0.0, 0.0, 0.0, 0.0, 1.0)
    hints = build_hints(slow, GradStats(1.0, 1.0), 32, 512, (8, 64), True, 2, 10.0, 0, gpu_type="t4",
                        types={"a100": {"throughput": fast, "local_bsz_bounds": [8, 256]}})
    with JobStore(":memory:") as store:
        job = store.submit({"entrypoint": "train.py", "working_dir": "/tmp", "init_batch_size": 32,
                            "max_batch_size": 512}, name="j")
        view = job_view(store.get_job(job.id), hints, 100.0, 16, ("t4", "a100", "v100"))
        plain = job_view(store.get_job(job.id), hints, 100.0, 16)
    assert view.type_models is not None and view.type_limits is not None
    assert set(view.type_models) == {"t4", "a100", "v100"}
    assert view.type_models["a100"].throughput_params == fast
    assert view.type_models["t4"].throughput_params == slow
    assert view.type_models["v100"] is view.model                # not run there yet: its current model
    assert view.type_limits["a100"].max_local_bsz == 256 and view.type_limits["t4"].max_local_bsz == 64
    assert plain.type_models is None and plain.type_limits is None


def test_embedded_nodes_untyped_by_default_typed_from_a_cluster_string():
    assert node_specs(3, 2, None) == [("node-0", 2, None), ("node-1", 2, None), ("node-2", 2, None)]
    assert node_specs(9, 9, "t4:2x2,a100:1x4") == [("t4-0", 2, "t4"), ("t4-1", 2, "t4"),
                                                   ("a100-0", 4, "a100")]
    assert node_args("node-0", 2, None)["resources"] == {"pollux-node-node-0": 1.0}
    args = node_args("a100-0", 4, "a100")
    assert args["num_gpus"] == 4
    assert args["resources"] == {"pollux-node-a100-0": 1.0, "pollux_gpu_type_a100": 4.0}
    with pytest.raises(ValueError, match="--cluster: cluster entry 't4:2'"):
        node_specs(1, 1, "t4:2")


def test_local_nodes_option_names_itself_in_errors(capsys):
    code = main(["server", "start", "--local-nodes", "t4:2x2,t4:1x2", "--state-dir", "/nonexistent/x"])
    err = capsys.readouterr().err
    assert code == 2 and "--local-nodes" in err and "listed twice" in err
    code = main(["server", "start", "--local-nodes", "t4", "--state-dir", "/nonexistent/x"])
    err = capsys.readouterr().err
    assert code == 2 and "--local-nodes" in err and "TYPE:NODESxGPUS" in err
    code = main(["server", "start", "--local-nodes", "t4:1x1", "--ray-address", "127.0.0.1:1",
                 "--state-dir", "/nonexistent/x"])
    err = capsys.readouterr().err
    assert code != 0 and "--local-nodes" in err


# ------------------------------------------------------------------------------ controller and scheduler


def test_types_flow_from_backend_nodes_into_the_schedulers_cluster(rig):
    r = rig()
    r.submit("a", {})
    r.tick()
    seen = r.policy.clusters[-1]
    assert seen.nodes == ("a100-0", "t4-0", "t4-1")          # the backend's nodes, by name
    assert seen.types == ("a100", "t4", "t4") and seen.heterogeneous
    assert seen.type_capacity() == {"a100": 2, "t4": 4}
    # A node that joins later brings its type to the next round.
    r.backend.add_node("v100-0", 4, gpu_type="v100")
    r.controller.request_round()
    r.tick()
    assert r.policy.clusters[-1].type_capacity() == {"a100": 2, "t4": 4, "v100": 4}


def test_untyped_backend_gives_the_policy_an_untyped_cluster_and_launches_as_before(rig):
    r = rig(nodes={"node-0": 2, "node-1": 2}, types={})
    r.submit("a", {"node-0": 2, "node-1": 1})
    r.tick(3)
    assert r.policy.clusters[-1].types == ()
    (launches,) = r.backend.requested("a")
    assert [s.resources for s in launches] == [{"GPU": 1.0}] * 3   # nothing type-related asked


def test_replicas_ask_for_and_land_on_nodes_of_the_allocations_type(rig):
    r = rig()
    r.submit("fast", {"a100-0": 2})
    r.submit("slow", {"t4-0": 2, "t4-1": 2}, resources={"GPU": 2})
    r.tick(4)
    assert r.store.get_job("fast").state == "running" and r.store.get_job("slow").state == "running"
    (fast,) = r.backend.requested("fast")
    want = {"GPU": 1.0, "pollux_gpu_type_a100": 1.0}
    assert [(s.node, s.resources) for s in fast] == [("a100-0", want)] * 2
    (slow,) = r.backend.requested("slow")
    assert [(s.node, s.resources.get("pollux_gpu_type_t4")) for s in slow] == [("t4-0", 2.0), ("t4-1", 2.0)]
    for job, want in (("fast", "a100"), ("slow", "t4")):
        hosts = [r.backend.listed[rep.node] for rep in r.backend.of(job)]
        assert all(rep.placed for rep in r.backend.of(job))
        assert {h.gpu_type for h in hosts} == {want}


def test_a_replica_asking_for_another_type_is_never_placed_by_the_backend(rig):
    r = rig()
    wrong = ReplicaLaunch(0, "t4-0", ["x"], None, {}, "log",
                          resources={"GPU": 1.0, "pollux_gpu_type_a100": 1.0})
    r.backend.create_actors("j", 0, [wrong])
    assert not r.backend.of("j")[0].placed   # as Ray: the t4 node has no a100 resource


def test_a_node_whose_type_changed_since_the_round_gets_no_launch_until_the_next_round(rig):
    r = rig()
    r.submit("a", {"a100-0": 2})
    r.tick()   # the round allocates a100-0 (typed a100 in the round's cluster)
    assert r.store.get_job("a").allocation == {"a100-0": 2}
    # The node came back with other GPUs under the same name before the launch.
    r.controller.nodes = [replace(n, gpu_type="t4") if n.name == "a100-0" else n for n in r.controller.nodes]
    alive = {n.name: n for n in r.controller.nodes}
    assert gt.type_mismatch({"a100-0": 2}, alive, r.controller.cluster) \
        == "node a100-0 has GPU type t4, but the allocation was made for type a100"
    rounds = r.controller.rounds
    r.tick()
    assert r.backend.requested("a") == []          # nothing launched on the wrong type ...
    assert r.controller.rounds == rounds + 1       # ... a round at once instead (interval: 1 h)
    assert r.controller.cluster.types == ("a100", "t4", "t4")   # the backend's listing again
    r.tick(4)
    assert len(r.backend.requested("a")) == 1 and r.store.get_job("a").state == "running"


# ------------------------------------------------------------------------------ API and CLI

TOKEN = "types-test-token"
CLUSTER = {"nodes": [{"name": "a100-0", "gpus": 2, "address": "10.0.0.1", "gpu_type": "a100"},
                     {"name": "t4-0", "gpus": 4, "address": "10.0.0.2", "gpu_type": "t4"},
                     {"name": "t4-1", "gpus": 4, "address": "10.0.0.3", "gpu_type": "t4"}],
           "total_gpus": 10, "policy": "fifo", "interval_s": 30.0, "rounds": 3, "ray_address": "x:1",
           "running_jobs": 1}


@pytest.fixture
def service(tmp_path):
    from pollux.cluster.api.app import create_app

    store = JobStore(tmp_path / "jobs.db")
    types = {n["name"]: n["gpu_type"] for n in CLUSTER["nodes"]}
    app = create_app(store, TOKEN, log_dir=tmp_path, cluster_info=lambda: CLUSTER, node_types=lambda: types)
    with serve_on_loopback(app) as url:
        state = tmp_path / "state"
        write_state(state, url, TOKEN)
        try:
            yield store, state
        finally:
            store.close()


def _cli(capsys, *argv: str) -> str:
    capsys.readouterr()
    code = main(list(argv))
    out = capsys.readouterr()
    assert code == 0, out.err
    return out.out


def test_api_ls_describe_and_nodes_show_gpu_types(service, capsys):
    store, state = service
    sd = ("--state-dir", str(state))
    store.submit({"entrypoint": "train.py", "init_batch_size": 8}, job_id="fast")
    store.submit({"entrypoint": "train.py", "init_batch_size": 8}, job_id="slow")
    store.submit({"entrypoint": "train.py", "init_batch_size": 8}, job_id="wait")
    store.transition("fast", "starting", allocation={"a100-0": 2})
    store.transition("slow", "starting", allocation={"t4-0": 4, "t4-1": 1})
    store.record_replica("fast", 0, 0, "a100-0", 123, "log")

    jobs = {j["id"]: j for j in json.loads(_cli(capsys, "ls", "--json", *sd))}
    assert [jobs[j]["gpu_types"] for j in ("fast", "slow", "wait")] == [["a100"], ["t4"], []]

    lines = _cli(capsys, "ls", *sd).splitlines()
    assert lines[0].split() == ["ID", "NAME", "STATE", "GPUS", "TYPE", "ALLOCATION", "RESTARTS", "AGE",
                                "RUNTIME"]
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert rows["fast"][3:6] == ["2", "a100", "a100-0:2"]
    assert rows["slow"][3:6] == ["5", "t4", "t4-0:4,t4-1:1"]
    assert rows["wait"][3:6] == ["0", "-", "-"]

    detail = json.loads(_cli(capsys, "describe", "--json", "fast", *sd))
    assert detail["gpu_types"] == ["a100"] and detail["node_types"] == {"a100-0": "a100"}
    text = _cli(capsys, "describe", "fast", *sd)
    assert "  gpu type      a100" in text
    history = text.split("allocation history\n", 1)[1].splitlines()
    assert history[0].split() == ["TIME", "GPUS", "ALLOCATION", "TYPE"] and history[1].split()[-1] == "a100"
    replicas = text.split("replicas\n", 1)[1].splitlines()
    assert replicas[0].split() == ["RESTART", "RANK", "NODE", "TYPE", "PID", "STARTED", "EXIT"]
    assert replicas[1].split()[:5] == ["0", "0", "a100-0", "a100", "123"]

    nodes = _cli(capsys, "nodes", *sd).splitlines()
    assert nodes[0].split() == ["NODE", "TYPE", "GPUS", "ADDRESS"]
    assert [line.split()[:3] for line in nodes[1:4]] == [["a100-0", "a100", "2"], ["t4-0", "t4", "4"],
                                                         ["t4-1", "t4", "4"]]
    assert nodes[4] == "GPUs by type: a100 2, t4 8"
    assert json.loads(_cli(capsys, "nodes", "--json", *sd))[0]["gpu_type"] == "a100"
    capsys.readouterr()
    main(["server", "status", *sd])   # (exit 1 here: no Ray behind this test's service)
    assert "a100-0:2 (a100), t4-0:4 (t4), t4-1:4 (t4)" in capsys.readouterr().out


def test_untyped_describe_and_nodes_show_no_types():
    job = {"id": "a", "name": "a", "state": "running", "spec": {"entrypoint": "x", "init_batch_size": 8},
           "submit_time": 0.0, "start_time": None, "end_time": None, "restarts": 0, "failures": 0,
           "attained_service": 0.0, "allocation": {"node-0": 1}, "gpu_types": [], "node_types": {},
           "allocation_history": [{"time": 0.0, "allocation": {"node-0": 1}}],
           "replicas": [{"restart": 0, "rank": 0, "node": "node-0", "pid": 1, "start_time": 0.0,
                         "exit_code": None}]}
    text = describe_text(job)
    assert "gpu type" not in text and "TYPE" not in text
    assert nodes_text({"nodes": [{"name": "node-0", "gpus": 2, "address": "h"}]}).splitlines() == [
        "NODE    TYPE  GPUS  ADDRESS", "node-0  -        2  h", "GPUs by type: untyped 2"]


# ------------------------------------------------------------------------------ end to end on Ray

#: Run by the replicas: print the rank, then wait (the test stops the service, which stops them).
REPLICA = "import os, time\nprint('rank', os.environ.get('POLLUX_RANK'), flush=True)\ntime.sleep(30)\n"

#: Run in a separate process (a Ray driver of its own): each live replica actor of the namespace,
#: with the GPU-type resources of the Ray node hosting it.
WHERE = """
import json, sys
import ray
from ray._private import ray_constants
ray_constants.ENABLE_RAY_CLUSTER = False
ray.init(address=sys.argv[1], namespace="pollux", logging_level="ERROR", log_to_driver=False,
         include_dashboard=False)
nodes = {n["NodeID"]: n["Resources"] for n in ray.nodes() if n["Alive"]}
out = {}
for a in ray._private.state.actors().values():
    if a.get("Name") and a.get("State") == "ALIVE":
        res = nodes.get(a["Address"]["NodeID"], {})
        out[a["Name"]] = sorted(k for k in res if k.startswith(("pollux_gpu_type_", "pollux-node-")))
print(json.dumps(out))
ray.shutdown()
"""


def test_e2e_replicas_run_on_ray_nodes_of_their_allocations_type(tmp_path):
    pytest.importorskip("ray")
    import httpx

    from pollux.cluster import server
    from pollux.cluster.backends import processes, rayhost
    from pollux.cluster.state.folder import ray_auth_env
    from pollux.raylink import LOOPBACK_ENV

    state = tmp_path / "state"
    work = tmp_path / "work"
    work.mkdir()
    (work / "replica.py").write_text(REPLICA)
    started = time.monotonic()
    info = server.start(state, local_nodes="t4:1x2,a100:1x2", policy="fifo", interval_s=1.0, timeout_s=150,
                        stop_grace_s=5.0)
    try:
        client = httpx.Client(base_url=info.url, timeout=30,
                              headers={"Authorization": f"Bearer {info.token}"})
        nodes = client.get("/v1/cluster").json()["nodes"]
        assert {n["name"]: n["gpu_type"] for n in nodes} == {"t4-0": "t4", "a100-0": "a100"}
        spec = {"entrypoint": str(work / "replica.py"), "working_dir": str(work), "init_batch_size": 8,
                "min_replicas": 2, "max_replicas": 2, "preemptible": False}
        ids = [client.post("/v1/jobs", json={"name": n, "spec": spec}).json()["id"] for n in ("one", "two")]
        deadline = time.monotonic() + 90
        jobs: dict = {}
        while time.monotonic() < deadline:
            jobs = {j["id"]: j for j in client.get("/v1/jobs").json()}
            if all(jobs[i]["state"] == "running" for i in ids):
                break
            time.sleep(0.3)
        assert all(jobs[i]["state"] == "running" for i in ids), jobs
        env = {**os.environ, **LOOPBACK_ENV, **ray_auth_env(state)}
        where = subprocess.run([sys.executable, "-c", WHERE, info.ray_address], env=env, capture_output=True,
                               text=True, timeout=90)
        assert where.returncode == 0, where.stderr[-2000:]
        hosts = json.loads(where.stdout.strip().splitlines()[-1])
        types = {}
        for jid in ids:
            (gpu_type,) = jobs[jid]["gpu_types"]       # fifo packs each job on one node: one type
            node = next(iter(jobs[jid]["allocation"]))
            types[jid] = gpu_type
            mine = {name: res for name, res in hosts.items() if name.startswith(f"{jid}/")}
            assert len(mine) == 2, hosts
            for res in mine.values():   # the Ray node hosting each replica is the allocated one, of its type
                assert res == sorted([f"pollux-node-{node}", f"pollux_gpu_type_{gpu_type}"]), (jid, res)
        assert sorted(types.values()) == ["a100", "t4"]   # one job per type
        code = main(["ls", "--state-dir", str(state)])
        assert code == 0
        print(f"e2e: running on both types {time.monotonic() - started:.1f} s after start")
    finally:
        report = server.stop(state, timeout_s=60)
    assert not rayhost.cluster_processes(state), "processes of the embedded cluster left running"
    assert not processes.pid_alive(info.service_pid) and not processes.pid_alive(info.rayhost_pid)
    assert report["was_running"]

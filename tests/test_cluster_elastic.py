"""Elastic jobs in the service (issue 14, item 6): the hand-off that lets a Litz job resize in place.

The store stays the one source of truth: each allocation has a version (its row in the allocation
history); the job's master reads it (``GET /v1/jobs/{id}/allocation``), moves its workers and
acknowledges the version (``PUT``). The controller keeps the run (no stop, no restart counted) and
takes the new placement as the run's own only once the current version is acknowledged; a job that
does not acknowledge within ``resize_timeout_s`` is stopped and relaunched the ordinary way. These
tests run the production store, API and controller against the in-memory fake backend.
"""

from __future__ import annotations

import signal

import httpx
import pytest

from api_helpers import serve_on_loopback
from elastic_rig import ADMIN, NODES, Rig
from pollux import contract as ct
from pollux.cluster.api.app import create_app
from pollux.cluster.control.controller import Controller
from pollux.cluster.state.spec import JobSpec, SpecError
from pollux.cluster.state.store import JobStore


@pytest.fixture
def rig(tmp_path):
    r = Rig(tmp_path)
    yield r
    r.store.close()


def test_kind_is_part_of_the_spec_and_named_in_errors():
    assert JobSpec.from_dict({"entrypoint": "x.py", "init_batch_size": 1}).kind == "restart"
    spec = JobSpec.from_dict({"entrypoint": "x.py", "init_batch_size": 1, "kind": "elastic"})
    assert spec.kind == "elastic" and JobSpec.from_dict(spec.to_dict()) == spec
    with pytest.raises(SpecError, match=r"^kind: expected one of restart, elastic, got 'litz'"):
        JobSpec.from_dict({"entrypoint": "x.py", "init_batch_size": 1, "kind": "litz"})


def test_store_versions_acknowledgements_and_overtaken_versions(tmp_path):
    with JobStore(tmp_path / "jobs.db") as store:
        job = store.submit({"entrypoint": "x.py", "init_batch_size": 1, "kind": "elastic"})
        assert store.allocation_version(job.id) == (0, {}, 0)
        store.set_allocation(job.id, {"node-0": 2}, now=10.0)
        v1, alloc, applied = store.allocation_version(job.id)
        assert alloc == {"node-0": 2} and applied == 0 and v1 > 0
        store.set_allocation(job.id, {"node-0": 2, "node-1": 2}, now=20.0)
        v2 = store.allocation_version(job.id)[0]
        assert v2 > v1
        assert not store.ack_allocation(job.id, v1, now=21.0)        # overtaken: not recorded
        assert store.allocation_version(job.id)[2] == 0
        assert store.ack_allocation(job.id, v2, now=22.5)
        assert store.allocation_version(job.id) == (v2, {"node-0": 2, "node-1": 2}, v2)
        other = store.submit({"entrypoint": "x.py", "init_batch_size": 1})
        with pytest.raises(ValueError, match="not an allocation of job"):
            store.ack_allocation(other.id, v2)                       # another job's version
        rows = store.resizes(job.id)
        assert [(r.version, r.time, r.applied) for r in rows] == [(v1, 10.0, None), (v2, 20.0, 22.5)]


def test_an_elastic_job_runs_one_master_that_holds_no_gpu_and_knows_where_ray_is(rig):
    rig.submit("litz", {"node-0": 2, "node-1": 1})
    rig.tick(4)
    assert rig.store.get_job("litz").state == "running"
    (launches,) = rig.backend.requested("litz")
    (master,) = launches
    assert master.node == "node-0" and master.resources == {"GPU": 0.0}
    assert master.env[ct.ENV_RAY_ADDRESS] == "127.0.0.1:6379"
    assert master.env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0" and master.env[ct.ENV_NUM_REPLICAS] == "1"
    # The service still accounts the whole allocation to the run (its workers hold those GPUs).
    assert rig.controller.groups["litz"].usage == {"node-0": {"GPU": 2.0}, "node-1": {"GPU": 1.0}}


def test_a_new_allocation_is_applied_in_place_once_acknowledged_without_a_restart(rig):
    rig.submit("litz", {"node-0": 2})
    rig.tick(4)
    group = rig.controller.groups["litz"]
    rig.allocate("litz", {"node-0": 2, "node-1": 2, "node-2": 2})
    rig.tick(3)
    job = rig.store.get_job("litz")
    assert job.state == "running" and job.restarts == 0 and not rig.backend.signals   # nobody stopped
    assert group.placement == {"node-0": 2} and group.resize_target == job.allocation
    rig.ack("litz")
    rig.tick()
    assert rig.controller.groups["litz"] is group
    assert group.placement == {"node-0": 2, "node-1": 2, "node-2": 2}
    assert group.usage == {n: {"GPU": 2.0} for n in NODES}
    # Shrinking works the same way; a job that never resizes never restarts.
    rig.allocate("litz", {"node-2": 2})
    rig.tick(2)
    rig.ack("litz")
    rig.tick()
    assert group.placement == {"node-2": 2} and rig.store.get_job("litz").restarts == 0
    assert len(rig.backend.requested("litz")) == 1 and not rig.backend.signals
    applied = [r for r in rig.store.resizes("litz") if r.applied is not None]
    assert len(applied) == 2


def test_a_job_that_ignores_a_resize_is_stopped_and_relaunched_after_the_limit(rig):
    rig.submit("litz", {"node-0": 2})
    rig.tick(4)
    rig.allocate("litz", {"node-1": 2})
    rig.tick(2)
    assert not rig.backend.signals
    rig.tick(25)                                       # 12.5 s > resize_timeout_s = 10 s
    assert ("litz/0/0", int(signal.SIGTERM)) in rig.backend.signals
    rig.tick(6)
    job = rig.store.get_job("litz")
    assert job.restarts == 1 and job.state == "running"
    assert [s.node for s in rig.backend.requested("litz")[-1]] == ["node-1"]   # relaunched where allocated


def test_preempting_an_elastic_job_to_no_gpus_stops_it_the_ordinary_way(rig):
    rig.submit("litz", {"node-0": 2})
    rig.tick(4)
    rig.allocate("litz", {})
    rig.tick(2)
    assert ("litz/0/0", int(signal.SIGTERM)) in rig.backend.signals
    rig.tick(4)
    assert rig.store.get_job("litz").state == "pending"


def test_restart_jobs_still_restart_to_resize(rig):
    rig.submit("plain", {"node-0": 1}, kind="restart")
    rig.tick(4)
    rig.allocate("plain", {"node-0": 2})
    rig.tick(6)
    assert rig.store.get_job("plain").restarts == 1


def test_after_a_service_restart_the_adopted_run_holds_what_it_acknowledged(tmp_path):
    rig = Rig(tmp_path)
    rig.submit("litz", {"node-0": 2})
    rig.tick(4)
    rig.allocate("litz", {"node-0": 2, "node-1": 2})
    rig.tick(2)
    rig.ack("litz")
    rig.tick()
    # A second service life over the same store and (live) backend adopts the master.
    again = Controller(rig.store, rig.backend, rig.controller.scheduler, rig.controller.config,
                       clock=rig.clock, monotonic=rig.clock)
    again.recover()
    assert again.groups["litz"].placement == {"node-0": 2, "node-1": 2}
    rig.store.close()


def test_api_allocation_routes_for_the_jobs_own_token(tmp_path):
    with JobStore(tmp_path / "jobs.db") as store:
        job = store.submit({"entrypoint": "x.py", "init_batch_size": 1, "kind": "elastic"})
        other = store.submit({"entrypoint": "x.py", "init_batch_size": 1})
        store.set_allocation(job.id, {"node-0": 2}, now=10.0)
        app = create_app(store, ADMIN)
        with serve_on_loopback(app) as url:
            own = {"Authorization": f"Bearer {job.token}"}
            r = httpx.get(f"{url}/v1/jobs/{job.id}/allocation", headers=own)
            assert r.status_code == 200, r.text
            body = r.json()
            assert body["allocation"] == {"node-0": 2} and body["applied"] == 0 and body["state"] == "pending"
            r = httpx.put(f"{url}/v1/jobs/{job.id}/allocation", headers=own,
                          json={"version": body["version"]})
            assert r.status_code == 200 and r.json()["applied"] == body["version"], r.text
            bad = httpx.put(f"{url}/v1/jobs/{job.id}/allocation", headers=own, json={"version": 999})
            assert bad.status_code == 422 and bad.json()["field"] == "version", bad.text
            odd = httpx.put(f"{url}/v1/jobs/{job.id}/allocation", headers=own, json={"v": 1})
            assert odd.status_code == 422 and odd.json()["field"] == "body"
            theirs = httpx.get(f"{url}/v1/jobs/{other.id}/allocation", headers=own)
            assert theirs.status_code == 403
            assert httpx.get(f"{url}/v1/jobs/{job.id}/allocation").status_code == 401
            detail = httpx.get(f"{url}/v1/jobs/{job.id}", headers={"Authorization": f"Bearer {ADMIN}"}).json()
            assert detail["allocation_history"][-1]["applied"] is not None


def test_the_litz_masters_link_reads_acknowledges_and_reports_valid_hints(tmp_path):
    """`pollux.litz.service.ServiceLink` against the real API: the hints the master builds pass the
    service's hints validation, and an unknown version is refused with an error naming the call."""
    from pollux.litz.service import ServiceError, ServiceLink, litz_hints

    with JobStore(tmp_path / "jobs.db") as store:
        job = store.submit({"entrypoint": "x.py", "init_batch_size": 1, "kind": "elastic"})
        store.set_allocation(job.id, {"node-0": 2, "node-1": 1}, now=10.0)
        with serve_on_loopback(create_app(store, ADMIN)) as url:
            link = ServiceLink(url, job.id, job.token)
            now = link.get()
            assert now.slots() == ["node-0", "node-0", "node-1"] and now.applied == 0
            assert link.ack(now.version).applied == now.version
            link.put_hints(litz_hints(num_executors=16, task_s=0.05, workers=3))
            stored = store.get_hints(job.id)
            assert stored["init_batch_size"] == 16 and stored["max_replicas_seen"] == 3
            with pytest.raises(ServiceError, match=r"PUT /v1/jobs/.*/allocation: HTTP 422"):
                link.ack(now.version + 1000)
            other = store.submit({"entrypoint": "y.py", "init_batch_size": 1})
            with pytest.raises(ServiceError, match="HTTP 403"):       # its token is for its own job
                ServiceLink(url, other.id, job.token).get()

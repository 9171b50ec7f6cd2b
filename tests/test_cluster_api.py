"""The scheduler's REST API (SPEC §9): a real app over a real SQLite store, no mocks."""

from __future__ import annotations

import json
import threading

import httpx
import pytest
import uvicorn
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from api_helpers import bearer, sample_hints, wait_started
from pollux.cluster.api.app import create_app
from pollux.cluster.state.store import JobStore

ADMIN = "admin-secret-token"
#: The entrypoint (relative to ``working_dir``) must exist now: the API checks it at submission.
SPEC = {"entrypoint": "train.py", "init_batch_size": 128, "max_batch_size": 4096, "max_replicas": 4}


def auth(token: str) -> dict[str, str]:
    return bearer(token)


def make_hints() -> dict:
    return sample_hints()


@pytest.fixture
def store(tmp_path):
    with JobStore(tmp_path / "jobs.db") as s:
        yield s


@pytest.fixture(autouse=True)
def workdir(tmp_path):
    """A real working folder with the entrypoint SPEC names; SPEC points at it for this test."""
    folder = tmp_path / "work"
    folder.mkdir()
    (folder / "train.py").write_text("print('training')\n")
    SPEC["working_dir"] = str(folder)
    yield folder
    SPEC.pop("working_dir", None)


@pytest.fixture
def client(store, tmp_path):
    with TestClient(create_app(store, ADMIN, log_dir=tmp_path / "logs")) as c:
        yield c


def submit(client, name="a", spec=SPEC):
    r = client.post("/v1/jobs", json={"name": name, "spec": spec}, headers=auth(ADMIN))
    assert r.status_code == 201, r.text
    return r.json()


def test_health_needs_no_auth(client):
    r = client.get("/v1/health")
    assert r.status_code == 200 and r.json() == {"status": "ok"}


@pytest.mark.parametrize("headers", [{}, auth("wrong"), {"Authorization": "Basic abc"}])
def test_user_endpoints_reject_missing_or_wrong_token(client, headers):
    job = submit(client)
    for method, url in [("GET", "/v1/jobs"), ("POST", "/v1/jobs"), ("GET", f"/v1/jobs/{job['id']}"),
                        ("POST", f"/v1/jobs/{job['id']}/cancel"), ("GET", f"/v1/jobs/{job['id']}/logs"),
                        ("PUT", f"/v1/jobs/{job['id']}/hints")]:
        r = client.request(method, url, headers=headers, json={})
        assert r.status_code == 401, (method, url, r.text)
        assert "detail" in r.json()


def test_job_token_is_not_an_admin_token(client):
    job = submit(client)
    assert client.get("/v1/jobs", headers=auth(job["token"])).status_code == 401


def test_submit_list_describe_cancel(client):
    a = submit(client, "a")
    b = submit(client, "b")
    assert a["state"] == "pending" and a["name"] == "a" and a["token"]
    assert a["spec"]["init_batch_size"] == 128

    r = client.get("/v1/jobs", headers=auth(ADMIN))
    assert r.status_code == 200
    jobs = r.json()
    assert [j["id"] for j in jobs] == [a["id"], b["id"]]
    assert all("token" not in j for j in jobs)

    r = client.get(f"/v1/jobs/{a['id']}", headers=auth(ADMIN))
    assert r.status_code == 200
    d = r.json()
    assert d["id"] == a["id"] and d["state"] == "pending" and "token" not in d
    assert d["allocation"] == {} and d["allocation_history"] == [] and d["replicas"] == []
    assert d["hints"] is None
    assert d["transitions"][0]["to_state"] == "pending"

    r = client.post(f"/v1/jobs/{a['id']}/cancel", headers=auth(ADMIN))
    assert r.status_code == 200 and r.json()["state"] == "cancelled"
    r = client.post(f"/v1/jobs/{a['id']}/cancel", headers=auth(ADMIN))
    assert r.status_code == 409 and "detail" in r.json()

    r = client.get("/v1/jobs", params={"state": "cancelled"}, headers=auth(ADMIN))
    assert [j["id"] for j in r.json()] == [a["id"]]
    r = client.get("/v1/jobs", params=[("state", "cancelled"), ("state", "pending")], headers=auth(ADMIN))
    assert {j["id"] for j in r.json()} == {a["id"], b["id"]}
    r = client.get("/v1/jobs", params={"state": "bogus"}, headers=auth(ADMIN))
    assert r.status_code == 422 and r.json()["field"] == "state"

    for url in ["/v1/jobs/job-nope", "/v1/jobs/job-nope/logs"]:
        assert client.get(url, headers=auth(ADMIN)).status_code == 404
    assert client.post("/v1/jobs/job-nope/cancel", headers=auth(ADMIN)).status_code == 404


def test_describe_shows_allocation_and_history(client, store):
    job = submit(client)
    store.transition(job["id"], "starting")
    store.set_allocation(job["id"], {"node-0": 2, "node-1": 1})
    d = client.get(f"/v1/jobs/{job['id']}", headers=auth(ADMIN)).json()
    assert d["state"] == "starting" and d["allocation"] == {"node-0": 2, "node-1": 1}
    assert d["allocation_history"][-1]["allocation"] == {"node-0": 2, "node-1": 1}
    assert [t["to_state"] for t in d["transitions"]] == ["pending", "starting"]


@pytest.mark.parametrize("spec, field", [
    ({"entrypoint": "train.py"}, "spec.init_batch_size"),
    ({**SPEC, "max_replicas": -1}, "spec.max_replicas"),
    ({**SPEC, "bogus": 1}, "spec.bogus"),
    ({**SPEC, "resources": {"GPU": -1}}, "spec.resources.GPU"),
    ("not an object", "spec"),
])
def test_malformed_spec_is_422_naming_the_field(client, spec, field):
    r = client.post("/v1/jobs", json={"spec": spec}, headers=auth(ADMIN))
    assert r.status_code == 422, r.text
    assert r.json()["field"] == field and r.json()["detail"]


def test_malformed_submit_bodies(client):
    r = client.post("/v1/jobs", content=b"{not json", headers=auth(ADMIN))
    assert r.status_code == 422 and r.json()["field"] == "body"
    r = client.post("/v1/jobs", json={"name": "x"}, headers=auth(ADMIN))
    assert r.status_code == 422 and r.json()["field"] == "spec"
    r = client.post("/v1/jobs", content=b'{"spec": {"entrypoint": "t.py", "init_batch_size": NaN}}',
                    headers=auth(ADMIN))
    assert r.status_code == 422 and r.json()["field"] == "spec.init_batch_size"
    assert client.get("/v1/jobs", headers=auth(ADMIN)).json() == []


def test_hints_with_job_token_then_visible_in_describe(client):
    job = submit(client)
    hints = make_hints()
    r = client.put(f"/v1/jobs/{job['id']}/hints", json=hints, headers=auth(job["token"]))
    assert r.status_code == 200, r.text
    d = client.get(f"/v1/jobs/{job['id']}", headers=auth(ADMIN)).json()
    assert d["hints"] == hints
    # The admin token is accepted as well.
    r = client.put(f"/v1/jobs/{job['id']}/hints", json=hints, headers=auth(ADMIN))
    assert r.status_code == 200
    assert scrape(client.get("/metrics", headers=auth(ADMIN)).text)[("pollux_hints_received_total", ())] == 2


def test_hints_with_another_jobs_token_is_403(client):
    a, b = submit(client, "a"), submit(client, "b")
    r = client.put(f"/v1/jobs/{a['id']}/hints", json=make_hints(), headers=auth(b["token"]))
    assert r.status_code == 403 and "detail" in r.json()
    assert client.get(f"/v1/jobs/{a['id']}", headers=auth(ADMIN)).json()["hints"] is None


def test_nonfinite_and_invalid_hints_are_422_naming_the_field(client):
    job = submit(client)
    text = json.dumps(make_hints()).replace('"gamma": 2.23', '"gamma": NaN')
    assert "NaN" in text
    r = client.put(f"/v1/jobs/{job['id']}/hints", content=text.encode(), headers=auth(job["token"]))
    assert r.status_code == 422, r.text
    assert r.json()["field"] == "throughput.gamma"

    text = json.dumps(make_hints()).replace('"sqr": 8.95', '"sqr": Infinity')
    r = client.put(f"/v1/jobs/{job['id']}/hints", content=text.encode(), headers=auth(job["token"]))
    assert r.status_code == 422 and r.json()["field"] == "grad.sqr"

    bad = make_hints()
    del bad["init_batch_size"]
    r = client.put(f"/v1/jobs/{job['id']}/hints", json=bad, headers=auth(job["token"]))
    assert r.status_code == 422 and r.json()["field"] == "init_batch_size"
    assert client.get(f"/v1/jobs/{job['id']}", headers=auth(ADMIN)).json()["hints"] is None
    r = client.put("/v1/jobs/job-nope/hints", json=make_hints(), headers=auth(ADMIN))
    assert r.status_code == 404


def test_logs_concatenates_existing_replica_files(client, store, tmp_path):
    job = submit(client)
    url = f"/v1/jobs/{job['id']}/logs"
    r = client.get(url, headers=auth(ADMIN))
    assert r.status_code == 200 and r.text == "" and r.headers["content-type"].startswith("text/plain")

    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    (log_dir / "r0k0.log").write_text("hello from rank 0\n")
    absolute = tmp_path / "r0k1.log"
    absolute.write_text("hello from rank 1")
    (log_dir / "r1k0.log").write_text("after restart\n")
    store.record_replica(job["id"], 0, 0, "node-0", 111, "r0k0.log")  # relative to log_dir
    store.record_replica(job["id"], 0, 1, "node-1", 112, absolute)
    store.record_replica(job["id"], 0, 2, "node-1", 113, tmp_path / "missing.log")
    store.record_replica(job["id"], 1, 0, "node-0", 114, log_dir / "r1k0.log")

    text = client.get(url, headers=auth(ADMIN)).text
    assert text == ("==> restart 0 rank 0 (node node-0) <==\nhello from rank 0\n"
                    "==> restart 0 rank 1 (node node-1) <==\nhello from rank 1\n"
                    "==> restart 1 rank 0 (node node-0) <==\nafter restart\n")
    text = client.get(url, params={"restart": 0, "rank": 1}, headers=auth(ADMIN)).text
    assert text == "==> restart 0 rank 1 (node node-1) <==\nhello from rank 1\n"
    assert client.get(url, params={"restart": 1}, headers=auth(ADMIN)).text.endswith("after restart\n")


def test_metrics_gauges(client, store):
    a, b = submit(client, "a"), submit(client, "b")
    store.transition(a["id"], "starting")
    store.set_allocation(a["id"], {"node-0": 2, "node-1": 1})
    client.post(f"/v1/jobs/{b['id']}/cancel", headers=auth(ADMIN))
    assert client.get("/metrics").status_code == 401          # per-job series: a token is needed
    r = client.get("/metrics", headers=auth(ADMIN))
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    lines = r.text.splitlines()
    assert "# TYPE pollux_jobs gauge" in lines
    assert "# TYPE pollux_allocated_gpus gauge" in lines
    assert "# TYPE pollux_hints_received_total counter" in lines
    samples = scrape(r.text)
    assert samples[("pollux_jobs", (("state", "starting"),))] == 1
    assert samples[("pollux_jobs", (("state", "cancelled"),))] == 1
    assert samples[("pollux_jobs", (("state", "running"),))] == 0
    assert samples[("pollux_allocated_gpus", ())] == 3
    assert samples[("pollux_hints_received_total", ())] == 0
    assert samples[("pollux_queue_length", ())] == 0
    assert samples[("pollux_round_duration_seconds_count", ())] == 0
    # Per job, while it runs and for a while after it ended; no ``_created`` series anywhere.
    labels = (("gpu_type", ""), ("job", a["id"]), ("kind", "restart"), ("user", "admin"))
    assert samples[("pollux_job_gpus", labels)] == 3 and samples[("pollux_job_restarts", labels)] == 0
    assert {name for name, _ in samples if name.startswith("pollux_job_")} == {
        "pollux_job_gpus", "pollux_job_restarts", "pollux_job_failures"}   # no hints yet: no outlook
    assert not any(name.endswith("_created") for name, _ in samples)


def scrape(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The samples of a Prometheus text exposition, by name and sorted labels."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_openapi_lists_the_paths(client):
    paths = client.get("/openapi.json").json()["paths"]
    for p in ["/v1/health", "/v1/jobs", "/v1/jobs/{job_id}", "/v1/jobs/{job_id}/cancel",
              "/v1/jobs/{job_id}/logs", "/v1/jobs/{job_id}/hints", "/metrics"]:
        assert p in paths
    assert "put" in paths["/v1/jobs/{job_id}/hints"] and "post" in paths["/v1/jobs"]


def test_real_uvicorn_server_on_loopback(store):
    app = create_app(store, ADMIN)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning",
                                           lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_started(server, thread)
        host, port = server.servers[0].sockets[0].getsockname()[:2]
        assert host == "127.0.0.1" and port > 0
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=5) as http:
            r = http.post("/v1/jobs", json={"name": "live", "spec": SPEC}, headers=auth(ADMIN))
            assert r.status_code == 201
            r = http.get("/v1/jobs", headers=auth(ADMIN))
            assert r.status_code == 200 and [j["name"] for j in r.json()] == ["live"]
            assert http.get("/v1/jobs").status_code == 401
    finally:
        server.should_exit = True
        thread.join(timeout=10)
    assert not thread.is_alive()


def test_unknown_query_parameters_are_422_naming_them(client):
    """A misspelt filter is an error, not a silently unfiltered list."""
    r = client.get("/v1/jobs", params={"states": "running"}, headers=auth(ADMIN))
    assert r.status_code == 422 and r.json()["field"] == "states"
    assert client.get("/metrics", params={"x": "1"}).json()["field"] == "x"


def test_check_files_off_accepts_paths_the_service_cannot_see(store):
    """Where the replicas' file system is not the service's, ``check_files=False`` skips that check
    (format and ranges are still checked)."""
    with TestClient(create_app(store, ADMIN, check_files=False)) as c:
        spec = {"entrypoint": "/elsewhere/train.py", "init_batch_size": 8}
        assert c.post("/v1/jobs", json={"spec": spec}, headers=auth(ADMIN)).status_code == 201
        r = c.post("/v1/jobs", json={"spec": {**spec, "init_batch_size": 0}}, headers=auth(ADMIN))
        assert r.status_code == 422 and r.json()["field"] == "spec.init_batch_size"


def test_describe_names_where_the_job_s_tensorboard_files_go(store, tmp_path):
    """With the service's state folder, a job's detail names its TensorBoard folder (the one the
    launcher gives its replicas as POLLUX_TENSORBOARD_DIR); without one, null."""
    from pollux.cluster.backends.launcher import TENSORBOARD_FOLDER

    job = store.submit(SPEC)
    with TestClient(create_app(store, ADMIN, state_dir=tmp_path, check_files=False)) as client:
        detail = client.get(f"/v1/jobs/{job.id}", headers=auth(ADMIN)).json()
    assert detail["tensorboard_dir"] == str(tmp_path / TENSORBOARD_FOLDER / job.id)
    with TestClient(create_app(store, ADMIN, check_files=False)) as client:
        assert client.get(f"/v1/jobs/{job.id}", headers=auth(ADMIN)).json()["tensorboard_dir"] is None


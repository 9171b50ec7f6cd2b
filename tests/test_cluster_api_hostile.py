"""The API under hostile and clumsy input (issue 10): each case the issue reproduced, and its fix.

Real app, real SQLite store, real files; the size and depth cases also go through a real uvicorn on
loopback, where a bad request once reset the connection for the requests after it. Every refusal must
be a 413/422 naming the field, never a 500, and must leave nothing stored.
"""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import pytest
import uvicorn
from fastapi.testclient import TestClient

from api_helpers import bearer, sample_hints
from pollux.cluster.api.app import create_app
from pollux.cluster.api.limits import MAX_BODY_BYTES, MAX_JSON_DEPTH
from pollux.cluster.state.store import JobStore

ADMIN = "hostile-admin-token"
#: Two nodes of 2 GPU slots, 8 CPUs and 32 GB each, as the backend reports them.
NODES = [{"GPU": 2.0, "CPU": 8.0, "memory": 3.2e10}, {"GPU": 2.0, "CPU": 8.0, "memory": 3.2e10}]


def auth(token: str = ADMIN) -> dict[str, str]:
    return bearer(token)


def make_hints() -> dict:
    return sample_hints()


@pytest.fixture
def work(tmp_path):
    folder = tmp_path / "work"
    folder.mkdir()
    (folder / "train.py").write_text("print('training')\n")
    return folder


@pytest.fixture
def spec(work):
    return {"entrypoint": "train.py", "working_dir": str(work), "init_batch_size": 128,
            "max_batch_size": 4096, "max_replicas": 4}


@pytest.fixture
def store(tmp_path):
    with JobStore(tmp_path / "jobs.db") as s:
        yield s


@pytest.fixture
def client(store, tmp_path):
    app = create_app(store, ADMIN, log_dir=tmp_path / "logs", node_resources=lambda: NODES)
    with TestClient(app) as c:
        yield c


def refused(response, status: int, field: str) -> None:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["field"] == field, body
    assert body["detail"].startswith(field), body


def nothing_stored(client) -> None:
    r = client.get("/v1/jobs", headers=auth())
    assert r.status_code == 200 and r.json() == []


# -- item 2: lone surrogates

def test_lone_surrogate_in_the_entrypoint_is_422_and_nothing_is_stored(client, spec):
    text = json.dumps({"name": "x", "spec": {**spec, "entrypoint": "/tmp/@.py"}}).replace("@", "\\ud800")
    r = client.post("/v1/jobs", content=text.encode(), headers=auth())
    refused(r, 422, "spec.entrypoint")
    nothing_stored(client)


@pytest.mark.parametrize("where, field", [("name", "name"), ("args", "spec.args.1"),
                                          ("resource", "spec.resources.\\udc80x")])
def test_lone_surrogate_anywhere_names_its_field(client, spec, where, field):
    body = {"name": "ok", "spec": {**spec, "args": ["--a", "ok"]}}
    if where == "name":
        body["name"] = "job-@"
    elif where == "args":
        body["spec"]["args"][1] = "@"
    else:
        body["spec"]["resources"] = {"@x": 1}
    text = json.dumps(body).replace("@", "\\udc80")
    r = client.post("/v1/jobs", content=text.encode(), headers=auth())
    refused(r, 422, field)
    nothing_stored(client)


def test_lone_surrogate_in_hints_is_422(client, spec):
    job = client.post("/v1/jobs", json={"spec": spec}, headers=auth()).json()
    text = json.dumps({**make_hints(), "@": 1}).replace("@", "\\ud800")
    r = client.put(f"/v1/jobs/{job['id']}/hints", content=text.encode(), headers=auth(job["token"]))
    assert r.status_code == 422 and "surrogate" in r.json()["detail"], r.text
    assert client.get(f"/v1/jobs/{job['id']}", headers=auth()).json()["hints"] is None


def test_one_bad_stored_job_never_breaks_listing_describe_or_cancel(client, store, spec):
    """A row an older service stored (a lone surrogate and 1e20 replicas in its spec) still lists,
    describes and cancels, and so do the jobs beside it."""
    good = client.post("/v1/jobs", json={"name": "good", "spec": spec}, headers=auth()).json()
    bad = client.post("/v1/jobs", json={"name": "bad", "spec": spec}, headers=auth()).json()
    old = '{"entrypoint": "/tmp/\\ud800.py", "init_batch_size": 8, "min_replicas": 1e20}'
    with store._tx() as conn:  # what the old service wrote
        conn.execute("UPDATE jobs SET spec = ? WHERE id = ?", (old, bad["id"]))
    r = client.get("/v1/jobs", headers=auth())
    assert r.status_code == 200, r.text
    assert [j["id"] for j in r.json()] == [good["id"], bad["id"]]
    r = client.get(f"/v1/jobs/{bad['id']}", headers=auth())
    assert r.status_code == 200, r.text
    assert r.json()["spec_error"]
    assert client.post(f"/v1/jobs/{bad['id']}/cancel", headers=auth()).status_code in (200, 409)
    assert client.post(f"/v1/jobs/{good['id']}/cancel", headers=auth()).status_code == 200


# -- items 3 and 4: every spec field checked against what the cluster and the file system allow

def test_min_replicas_1e20_is_422(client, spec):
    refused(client.post("/v1/jobs", json={"spec": {**spec, "min_replicas": 1e20}}, headers=auth()),
            422, "spec.min_replicas")
    nothing_stored(client)


@pytest.mark.parametrize("change, field", [
    ({"entrypoint": "train\x00.py"}, "spec.entrypoint"),
    ({"entrypoint": "."}, "spec.entrypoint"),                 # a directory
    ({"entrypoint": "tool.sh"}, "spec.entrypoint"),           # not executable
    ({"entrypoint": "missing.py"}, "spec.entrypoint"),
    ({"working_dir": "/nonexistent/pollux-work"}, "spec.working_dir"),
    ({"resources": {"GPU": 0}}, "spec.resources.GPU"),
    ({"resources": {"GPU": 1, "CPU": 1e9}}, "spec.resources.CPU"),   # no node has 1e9 CPUs
    ({"resources": {"GPU": 3}}, "spec.resources.GPU"),              # nodes have 2 slots
    ({"min_replicas": 5, "max_replicas": 8}, "spec.min_replicas"),  # 4 slots in all
    ({"args": ["x" * 70_000]}, "spec.args.0"),
])
def test_a_job_that_can_never_start_is_refused_at_submission(client, spec, work, change, field):
    (work / "tool.sh").write_text("#!/bin/sh\necho hi\n")
    (work / "tool.sh").chmod(0o644)
    refused(client.post("/v1/jobs", json={"name": "x", "spec": {**spec, **change}}, headers=auth()),
            422, field)
    nothing_stored(client)


def test_a_job_that_can_start_is_accepted(client, spec, work):
    (work / "tool.sh").write_text("#!/bin/sh\necho hi\n")
    (work / "tool.sh").chmod(0o755)
    for change in ({}, {"entrypoint": "./tool.sh"}, {"resources": {"GPU": 2, "CPU": 4}},
                   {"min_replicas": 4, "max_replicas": 4}):
        r = client.post("/v1/jobs", json={"spec": {**spec, **change}}, headers=auth())
        assert r.status_code == 201, (change, r.text)


@pytest.mark.parametrize("name", ["evil\nname", "\x1b[31mred\x1b[0m", "tab\there", "bidi\u202eevil"])
def test_control_characters_in_a_name_are_422(client, spec, name):
    refused(client.post("/v1/jobs", json={"name": name, "spec": spec}, headers=auth()), 422, "name")
    nothing_stored(client)


# -- item 9: limits on size, depth and numbers

def test_a_body_over_the_limit_is_413_naming_body(client, spec):
    r = client.post("/v1/jobs", json={"name": "n" * (2 * MAX_BODY_BYTES), "spec": spec}, headers=auth())
    refused(r, 413, "body")
    nothing_stored(client)


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 970, 200_000])
def test_deep_json_is_422_naming_body(client, spec, depth):
    deep = "[" * depth + "]" * depth
    text = json.dumps({"name": "x", "spec": spec})[:-1] + f', "extra": {deep}}}'
    refused(client.post("/v1/jobs", content=text.encode(), headers=auth()), 422, "body")
    nothing_stored(client)


def test_brackets_inside_strings_do_not_count_as_depth(client, spec):
    r = client.post("/v1/jobs", json={"name": "[" * 100 + '"{', "spec": {**spec, "args": ["{" * 500]}},
                    headers=auth())
    assert r.status_code == 201, r.text


@pytest.mark.parametrize("query, field", [
    ("restart=99999999999999999999", "restart"), ("rank=99999999999999999999", "rank"),
    ("restart=-1", "restart"), ("rank=-5", "rank"), ("restart=abc", "restart"),
    ("restarts=1", "restarts"),
])
def test_out_of_range_query_numbers_are_422_naming_the_parameter(client, spec, query, field):
    job = client.post("/v1/jobs", json={"spec": spec}, headers=auth()).json()
    refused(client.get(f"/v1/jobs/{job['id']}/logs?{query}", headers=auth()), 422, field)


def test_nonfinite_and_oversized_hint_numbers_are_422(client, spec):
    job = client.post("/v1/jobs", json={"spec": spec}, headers=auth()).json()
    url = f"/v1/jobs/{job['id']}/hints"
    text = json.dumps(make_hints()).replace('"epoch": 3', '"epoch": 1e999')
    refused(client.put(url, content=text.encode(), headers=auth(job["token"])), 422, "epoch")
    text = json.dumps(make_hints()).replace('"epoch": 3', f'"epoch": {"9" * 5000}')
    refused(client.put(url, content=text.encode(), headers=auth(job["token"])), 422, "body")


def test_metrics_counts_without_loading_jobs(client, store, spec):
    """/metrics answers from counts: it never reads the jobs themselves (50 MB of them made it slow)."""
    client.post("/v1/jobs", json={"spec": spec}, headers=auth())
    calls = []
    real = store.list_jobs
    store.list_jobs = lambda *a, **k: calls.append(a) or real(*a, **k)  # observe, do not replace
    try:
        r = client.get("/metrics", headers=auth())
    finally:
        store.list_jobs = real
    assert r.status_code == 200 and 'pollux_jobs{state="pending"} 1' in r.text
    assert calls == []


# -- item 1: a job's token authorises its own hints and nothing else

def test_a_job_token_authorises_only_its_own_hints(client, store, spec):
    a = client.post("/v1/jobs", json={"spec": spec}, headers=auth()).json()
    b = client.post("/v1/jobs", json={"spec": spec}, headers=auth()).json()
    for method, url in [("GET", "/v1/jobs"), ("POST", "/v1/jobs"), ("GET", f"/v1/jobs/{a['id']}"),
                        ("POST", f"/v1/jobs/{a['id']}/cancel"), ("GET", f"/v1/jobs/{a['id']}/logs"),
                        ("GET", "/v1/cluster")]:
        r = client.request(method, url, headers=auth(a["token"]), json={"spec": spec})
        assert r.status_code == 401, (method, url, r.text)
    hints = make_hints()
    assert client.put(f"/v1/jobs/{a['id']}/hints", json=hints, headers=auth(a["token"])).status_code == 200
    assert client.put(f"/v1/jobs/{a['id']}/hints", json=hints, headers=auth(b["token"])).status_code == 403
    # A new launch gets a new token; the previous one no longer authorises anything.
    fresh = store.issue_token(a["id"])
    assert client.put(f"/v1/jobs/{a['id']}/hints", json=hints, headers=auth(a["token"])).status_code == 401
    assert client.put(f"/v1/jobs/{a['id']}/hints", json=hints, headers=auth(fresh)).status_code == 200
    assert client.get("/v1/jobs", headers=auth(fresh)).status_code == 401


# -- over a real server: limits before reading, and a connection that survives a bad request

@pytest.fixture
def server(store):
    app = create_app(store, ADMIN, check_files=False)
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not srv.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    yield srv.servers[0].sockets[0].getsockname()[:2]
    srv.should_exit = True
    thread.join(timeout=10)


def test_deep_json_does_not_break_the_connection(server):
    host, port = server
    spec = {"entrypoint": "t.py", "init_batch_size": 8}
    with httpx.Client(base_url=f"http://{host}:{port}", timeout=10) as http:
        deep = "[" * 970 + "]" * 970
        r = http.post("/v1/jobs", content=f'{{"spec": {deep}}}'.encode(), headers=auth())
        refused(r, 422, "body")
        r = http.post("/v1/jobs", json={"spec": spec}, headers=auth())  # same connection
        assert r.status_code == 201, r.text
        assert [j["spec"]["entrypoint"] for j in http.get("/v1/jobs", headers=auth()).json()] == ["t.py"]


def test_chunked_body_over_the_limit_is_413_while_streaming(server):
    host, port = server

    def chunks():
        yield b'{"name": "'
        for _ in range(2 * MAX_BODY_BYTES // 65536):
            yield b"n" * 65536
        yield b'", "spec": {"entrypoint": "t.py", "init_batch_size": 8}}'

    with httpx.Client(base_url=f"http://{host}:{port}", timeout=10) as http:
        r = http.post("/v1/jobs", content=chunks(), headers=auth())  # no Content-Length
        refused(r, 413, "body")
        assert http.get("/v1/jobs", headers=auth()).json() == []


def test_declared_length_over_the_limit_is_413_before_the_body_is_sent(server):
    """A Content-Length of 1 GB is refused from the headers alone: the client never sends a byte of
    the body and still gets its answer."""
    host, port = server
    with socket.create_connection((host, port), timeout=10) as sock:
        sock.sendall(f"POST /v1/jobs HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {ADMIN}\r\n"
                     f"Content-Type: application/json\r\nContent-Length: {10**9}\r\n\r\n".encode())
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
            data = sock.recv(65536)
            if not data:
                break
            answer += data
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413"), head
    assert json.loads(body)["field"] == "body"


# -- answers that cannot fail, whatever a callback or an old row holds

def test_an_unencodable_value_in_an_answer_is_replaced_not_a_500(store):
    """Text that is not valid Unicode or a NaN reaching an answer (here from the cluster callback)
    is sent as U+FFFD and null; the answer is still 200 and valid JSON."""
    info = {"nodes": [{"name": "node-\udc80", "gpus": 2}], "interval_s": float("nan"), "policy": "pollux"}
    with TestClient(create_app(store, ADMIN, cluster_info=lambda: info)) as c:
        r = c.get("/v1/cluster", headers=auth())
    assert r.status_code == 200, r.text
    assert r.json() == {"nodes": [{"name": "node-\ufffd", "gpus": 2}], "interval_s": None, "policy": "pollux"}


def test_unavailable_node_resources_do_not_block_submission(store, spec):
    """While the backend cannot say what its nodes hold, a spec is checked without them (the
    controller's launch-failure budget still bounds a job that cannot start)."""
    def broken():
        raise ConnectionError("Ray is restarting")

    with TestClient(create_app(store, ADMIN, node_resources=broken)) as c:
        r = c.post("/v1/jobs", json={"spec": {**spec, "resources": {"GPU": 3}}}, headers=auth())
    assert r.status_code == 201, r.text

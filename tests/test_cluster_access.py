"""Who may call what, route by route: every route of the API with every kind of credential, against
the table in docs/cluster.md (read from the file, so the docs and the service cannot drift apart).

A real server on loopback over a real store with two users: user A owns the job each job route names,
user B owns another. The job's own token and another job's token, a wrong token, no token and the
admin's complete the credentials. A request that changes something (a cancel, a new user, a revoke)
gets a fresh job or user for each credential, so that every cell is answered from the same start.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from api_helpers import sample_hints, serve_on_loopback
from pollux.cluster.api.app import create_app
from pollux.cluster.state.store import JobRecord, JobStore

ADMIN = "access-admin-token"
DOCS = Path(__file__).resolve().parents[1] / "docs" / "cluster.md"
CREDENTIALS = ("no token", "wrong token", "the job's token", "another job's token", "user A (owner)",
               "user B", "admin")


def access_table() -> dict[tuple[str, str], dict[str, int]]:
    """``{(method, path): {credential: status}}`` from the table between the access-table markers."""
    text = DOCS.read_text()
    block = text.split("<!-- access-table -->", 1)[1].split("<!-- /access-table -->", 1)[0]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in block.strip().splitlines()]
    header, body = rows[0], rows[2:]
    assert header[2:] == list(CREDENTIALS), header
    table = {}
    for row in body:
        method, path = re.fullmatch(r"`(\w+) (\S+)`", row[0]).groups()
        table[method, path] = {c: int(v) for c, v in zip(CREDENTIALS, row[2:], strict=True)}
    return table


@dataclass
class World:
    store: JobStore
    url: str
    work: Path
    tokens: dict[str, str]
    names: itertools.count

    def spec(self) -> dict:
        return {"entrypoint": "train.py", "working_dir": str(self.work), "init_batch_size": 64}

    def job_of_a(self) -> JobRecord:
        """A new running job of user A with one replica log and an allocation (version 1)."""
        job = self.store.submit(self.spec(), owner="alice")
        self.store.transition(job.id, "starting")
        self.store.set_allocation(job.id, {"node-0": 1})
        self.store.transition(job.id, "running")
        log = self.work / f"{job.id}.log"
        log.write_text("step 1\n")
        self.store.record_replica(job.id, 0, 0, "node-0", None, log)
        return job


@pytest.fixture
def world(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text("print('training')\n")
    with JobStore(tmp_path / "jobs.db") as store:
        tokens = {"admin": ADMIN, "user A (owner)": store.add_user("alice").token,
                  "user B": store.add_user("bob").token}
        other = store.submit({"entrypoint": "train.py", "working_dir": str(work), "init_batch_size": 64},
                             owner="bob")
        tokens["another job's token"] = other.token
        app = create_app(store, ADMIN, log_dir=work, cluster_info=lambda: {"nodes": []})
        with serve_on_loopback(app) as url:
            yield World(store, url, work, tokens, itertools.count())


def _call(world: World, method: str, path: str, credential: str) -> int:
    """Send the route's valid request with ``credential``; its status code."""
    job = world.job_of_a()
    tokens = {**world.tokens, "the job's token": job.token, "wrong token": "not-a-token"}
    body = None
    if path == "/v1/jobs" and method == "POST":
        body = {"spec": world.spec()}
    elif path.endswith("/hints"):
        body = sample_hints()
    elif path.endswith("/allocation") and method == "PUT":
        body = {"version": world.store.allocation_version(job.id)[0]}
    elif path == "/v1/users":
        body = {"name": f"user{next(world.names)}"} if method == "POST" else None
    name = f"victim{next(world.names)}"
    if "{name}" in path:
        world.store.add_user(name)
    url = world.url + path.replace("{id}", job.id).replace("{name}", name)
    headers = {} if credential == "no token" else {"Authorization": f"Bearer {tokens[credential]}"}
    return httpx.request(method, url, json=body, headers=headers, timeout=10).status_code


def test_the_table_names_every_route_of_the_api(world):
    served = httpx.get(world.url + "/openapi.json").json()["paths"]
    routes = {(m.upper(), p.replace("{job_id}", "{id}")) for p, ops in served.items() for m in ops}
    assert routes == set(access_table())


@pytest.mark.parametrize("route", sorted(access_table()), ids=lambda r: f"{r[0]} {r[1]}")
def test_each_credential_gets_the_answer_the_docs_give(world, route):
    method, path = route
    got = {c: _call(world, method, path, c) for c in CREDENTIALS}
    assert got == access_table()[route]


def test_a_user_lists_only_its_own_jobs_and_submits_jobs_of_its_own(world):
    mine = world.job_of_a()
    theirs = world.store.list_jobs(owner="bob")
    alice = {"Authorization": f"Bearer {world.tokens['user A (owner)']}"}
    listed = httpx.get(world.url + "/v1/jobs", headers=alice).json()
    assert mine.id in {j["id"] for j in listed} and {j["owner"] for j in listed} == {"alice"}
    assert not {j.id for j in theirs} & {j["id"] for j in listed}
    new = httpx.post(world.url + "/v1/jobs", json={"spec": world.spec()}, headers=alice).json()
    assert new["owner"] == "alice" and world.store.get_job(new["id"]).owner == "alice"
    admin = httpx.get(world.url + "/v1/jobs", headers={"Authorization": f"Bearer {ADMIN}"}).json()
    assert {j["owner"] for j in admin} == {"alice", "bob"}


def test_a_revoked_user_is_refused_and_its_jobs_stay(world):
    job = world.job_of_a()
    world.store.revoke_user("alice")
    alice = {"Authorization": f"Bearer {world.tokens['user A (owner)']}"}
    assert httpx.get(world.url + "/v1/jobs", headers=alice).status_code == 401
    assert world.store.get_job(job.id).state == "running"
    admin = {"Authorization": f"Bearer {ADMIN}"}
    assert httpx.post(world.url + "/v1/users/alice/revoke", headers=admin).status_code == 409
    again = httpx.post(world.url + "/v1/users", json={"name": "alice"}, headers=admin).json()
    assert httpx.get(world.url + f"/v1/jobs/{job.id}",
                     headers={"Authorization": f"Bearer {again['token']}"}).status_code == 200

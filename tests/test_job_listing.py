"""The job listing (``GET /v1/jobs``) made from remembered JSON (:mod:`pollux.cluster.api.listing`):
byte for byte the answer the plain way gives (every job through ``job_dict``, the list through one
``json.dumps``), for jobs in every state, with every filter, after every kind of change, for rows
edited by hand; its memory; the API's answer; and the benchmark's ``--quick`` run."""

from __future__ import annotations

import json
import math
import sqlite3
import threading
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from api_helpers import bearer
from bench_scripts import BENCHMARKS, run_quick_json
from pollux.cluster.api.answers import job_dict, sanitise
from pollux.cluster.api.app import create_app
from pollux.cluster.api.listing import JobListing
from pollux.cluster.state.lifecycle import JOB_STATES
from pollux.cluster.state.store import JobStore

ADMIN = "admin-secret-token"
SPEC = {"entrypoint": "train.py", "init_batch_size": 128, "max_batch_size": 4096, "max_replicas": 8,
        "args": ["--lr", "0.1"], "env": {"MODE": "fast"}}
#: A typed cluster's nodes; ``x9`` is untyped (left out of ``gpu_types``).
TYPES = {"n0": "a100", "n1": "a100", "n2": "t4", "n3": "t4"}


def plain_listing(store: JobStore, states: list[str] | None = None, owner: str | None = None,
                  types: dict[str, str] | None = None) -> bytes:
    """The answer as the API made it before the listing was remembered: records, dicts, one dump
    (strict JSON, else lone surrogates replaced and non-finite numbers null)."""
    content = [job_dict(j, types=types) for j in store.list_jobs(states, owner=owner)]
    try:
        text = json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except (UnicodeEncodeError, ValueError, TypeError):
        text = json.dumps(sanitise(content), ensure_ascii=False, allow_nan=False, separators=(",", ":"),
                          default=str)
    return text.encode("utf-8")


def populate(store: JobStore) -> dict[str, str]:
    """Jobs in every state, of three owners, with allocations on typed and untyped nodes; returns
    ``{label: job id}``."""
    ids: dict[str, str] = {}

    def job(label: str, owner: str | None = None, name: str | None = None, spec: dict | None = None) -> str:
        ids[label] = store.submit(spec or SPEC, name=name, owner=owner, now=1000.0 + len(ids)).id
        return ids[label]

    job("pending")
    job("pending_unicode", owner="alice", name="ünïcødé-作业")
    store.transition(job("starting", spec={**SPEC, "resources": {"GPU": 2}}), "starting", now=1100.0,
                     allocation={"n0": 2})
    running = job("running", owner="alice")
    store.transition(running, "starting", now=1100.0, allocation={"n1": 1, "n2": 2, "x9": 1})
    store.transition(running, "running", now=1130.0)
    store.transition(running, None, now=1200.0, failure=True, restart=True)
    store.add_service(running, 1234.5)
    rescaling = job("rescaling", owner="bob")
    store.transition(rescaling, "starting", now=1100.0, allocation={"n3": 4})
    store.transition(rescaling, "running", now=1130.0)
    store.transition(rescaling, "rescaling", now=1300.0, allocation={"n3": 2, "n0": 2})
    for label, ending, reason, owner in (("succeeded", "succeeded", None, "bob"),
                                         ("failed", "failed", "exit code 1", None),
                                         ("cancelled", "cancelled", None, "alice")):
        done = job(label, owner=owner)
        store.transition(done, "starting", now=1100.0, allocation={"n2": 1})
        store.transition(done, "running", now=1130.0)
        store.add_service(done, 99.0)
        store.transition(done, ending, reason, now=1400.0)
    return ids


@pytest.fixture
def store(tmp_path: Path):
    with JobStore(tmp_path / "jobs.db") as s:
        populate(s)
        yield s


def edit(store: JobStore, sql: str, *params: object) -> None:
    """A change by hand, through a second connection (as an operator's ``sqlite3`` would)."""
    with sqlite3.connect(store.path) as conn:
        conn.execute(sql, params)


FILTERS = [None, [], ["running", "rescaling"], ["failed", "cancelled", "succeeded"],
           *([s] for s in JOB_STATES)]


@pytest.mark.parametrize("types", [{}, TYPES], ids=["untyped", "typed"])
def test_every_filter_and_owner_gives_the_plain_answer(store, types):
    listing = JobListing(store)
    for _ in range(2):                    # the first pass fills the memory, the second reads it
        for owner in (None, "alice", "bob", "nobody"):
            for states in FILTERS:
                got = listing.render(states, owner=owner, types=types)
                assert got == plain_listing(store, states, owner, types), (owner, states)
    everything = json.loads(listing.render(None, types=types))
    assert {j["state"] for j in everything} == set(JOB_STATES)
    assert any(j["gpu_types"] for j in everything) is bool(types)


def test_each_change_is_listed_at_once(store):
    listing = JobListing(store)
    ids = {j.name: j.id for j in store.list_jobs()}
    pending = store.list_jobs(["pending"])[0].id
    running = next(j.id for j in store.list_jobs(["running"]))
    changes = [
        lambda: store.transition(pending, "starting", now=2000.0, allocation={"n2": 1}),
        lambda: store.transition(pending, "running", now=2010.0),
        lambda: store.add_service(running, 30.0),
        lambda: store.add_restart(running),
        lambda: store.add_failure(running),
        lambda: store.transition(running, "rescaling", now=2020.0, allocation={"n0": 1, "n3": 1}),
        lambda: store.apply_round("pollux", None, {running: {"n1": 3}}, now=2030.0),
        lambda: store.transition(running, "running", now=2040.0),
        lambda: store.transition(pending, "failed", "out of memory", now=2050.0),
        lambda: store.submit(SPEC, name="late", owner="bob", now=2060.0),
        lambda: store.transition(running, "cancelled", now=2070.0),
        lambda: edit(store, "UPDATE jobs SET owner = 'carol' WHERE id = ?", ids["ünïcødé-作业"]),
        lambda: edit(store, "UPDATE jobs SET name = 'renamed' WHERE id = ?", ids["ünïcødé-作业"]),
        lambda: edit(store, "UPDATE jobs SET spec = ? WHERE id = ?", json.dumps({**SPEC, "max_replicas": 2}),
                     ids["ünïcødé-作业"]),
    ]
    before = listing.render(None, types=TYPES)
    for n, change in enumerate(changes):
        change()
        running_only = listing.render(["running"], types=TYPES)      # shares the memory
        assert running_only == plain_listing(store, ["running"], None, TYPES), n
        after = listing.render(None, types=TYPES)
        assert after == plain_listing(store, None, None, TYPES), n
        assert after != before, f"change {n} not listed"
        before = after


def test_a_changed_type_map_is_listed_at_once(store):
    listing = JobListing(store)
    first = listing.render(None, types=TYPES)
    changed = {**TYPES, "n0": "h100", "x9": "t4"}       # the running, starting and rescaling jobs' nodes
    running = listing.render(["running"], types=changed)
    assert running == plain_listing(store, ["running"], types=changed)
    second = listing.render(None, types=changed)         # nothing made with the old map is left
    assert second == plain_listing(store, types=changed) and second != first
    assert listing.render(None, types={}) == plain_listing(store, types={})


def test_a_job_whose_stored_spec_no_longer_validates_is_failed_as_before(store, tmp_path):
    bad = {"pending": "not json", "running": json.dumps({**SPEC, "init_batch_size": -1}),
           "succeeded": json.dumps({"entrypoint": 3})}
    for state, text in bad.items():
        edit(store, "UPDATE jobs SET spec = ? WHERE id = (SELECT id FROM jobs WHERE state = ? LIMIT 1)",
             text, state)
    twin = tmp_path / "twin.db"
    with sqlite3.connect(store.path) as source, sqlite3.connect(twin) as copy:
        source.backup(copy)
    with JobStore(twin) as old:
        old_jobs = {j.id: j for j in old.list_jobs(["pending", "running"])}   # the plain way fails them
    listing = JobListing(store)
    pending_now = json.loads(listing.render(["pending", "running"], types=TYPES))
    assert {j["id"] for j in pending_now} == set(old_jobs)
    new_jobs = {j.id: j for j in store.list_jobs()}
    failed = [j for j in new_jobs.values() if j.spec_error is not None and j.state == "failed"
              and (j.failure_reason or "").startswith("invalid spec:")]
    assert len(failed) == 2
    kept = [j for j in new_jobs.values() if j.spec_error is not None and j.state == "succeeded"]
    assert len(kept) == 1                  # a terminal job is shown with its error, not failed
    assert listing.render(None, types=TYPES) == plain_listing(store, types=TYPES)


def test_rows_edited_by_hand_render_as_before(store):
    listing = JobListing(store)
    listing.render(None, types=TYPES)
    ids = [j.id for j in store.list_jobs()]
    edit(store, "UPDATE jobs SET name = CAST(x'ff61' AS TEXT) WHERE id = ?", ids[0])    # not UTF-8
    edit(store, "UPDATE jobs SET name = x'6869' WHERE id = ?", ids[1])                  # a BLOB
    edit(store, "UPDATE jobs SET attained_service = 1e999 WHERE id = ?", ids[2])         # infinite
    edit(store, "UPDATE jobs SET allocation = 'garbage' WHERE id = ?", ids[3])
    got = listing.render(None, types=TYPES)
    assert got == plain_listing(store, types=TYPES)
    jobs = json.loads(got)
    assert jobs[0]["name"] == "\ufffda" and jobs[2]["attained_service"] is None
    assert jobs[3]["allocation"] == {} and math.isfinite(jobs[4]["attained_service"])


def test_memory_holds_only_the_jobs_listed(store):
    listing = JobListing(store)
    listing.render(["running"], types=TYPES)
    assert len(listing) == len(store.list_jobs(["running"]))
    listing.render(None, types=TYPES)
    ids = {j.id for j in store.list_jobs()}
    assert {e.row[0] for e in listing.remembered()} == ids
    gone = sorted(ids)[0]
    edit(store, "DELETE FROM jobs WHERE id = ?", gone)
    listing.render(["pending"], types=TYPES)
    listing.render(None, types=TYPES)
    assert {e.row[0] for e in listing.remembered()} == ids - {gone}


def test_listings_while_jobs_change_are_whole(store):
    listing = JobListing(store)
    ids = {j.id for j in store.list_jobs()}
    running = store.list_jobs(["running"])[0].id
    answers: list[bytes] = []

    def lister() -> None:
        for _ in range(15):
            answers.append(listing.render(None, types=TYPES))

    threads = [threading.Thread(target=lister) for _ in range(3)]
    for t in threads:
        t.start()
    for _ in range(30):
        store.add_service(running, 1.0)
    for t in threads:
        t.join()
    assert len(answers) == 45
    assert all({j["id"] for j in json.loads(a)} == ids for a in answers)
    assert listing.render(None, types=TYPES) == plain_listing(store, types=TYPES)


def test_the_api_answers_the_plain_bytes(store):
    alice = store.add_user("alice").token
    app = create_app(store, ADMIN, node_types=lambda: dict(TYPES), check_files=False)
    with TestClient(app) as client:
        for _ in range(2):
            r = client.get("/v1/jobs", headers=bearer(ADMIN))
            assert r.status_code == 200 and r.headers["content-type"] == "application/json"
            assert r.content == plain_listing(store, types=TYPES)
            r = client.get("/v1/jobs?state=running&state=pending", headers=bearer(ADMIN))
            assert r.content == plain_listing(store, ["running", "pending"], types=TYPES)
            r = client.get("/v1/jobs", headers=bearer(alice))
            assert r.content == plain_listing(store, owner="alice", types=TYPES)
            assert {j["owner"] for j in r.json()} == {"alice"}
        assert client.get("/v1/jobs?state=bogus", headers=bearer(ADMIN)).status_code == 422


def test_benchmark_quick_run():
    rep, _ = run_quick_json(BENCHMARKS / "job_listing.py", timeout_s=120)
    assert rep["benchmark"] == "job_listing" and rep["quick"] is True
    assert rep["identical"] is True and rep["jobs"] == 300
    assert rep["remembered"]["jobs"] == rep["jobs"]
    for kind in ("old", "new_cold", "new_warm", "new_after_round", "running_new_warm", "user_new_warm"):
        assert rep["listing"][kind]["cpu_ms_p50"] > 0, kind
    assert set(rep["speedup_cpu_p50"]) == {"new_cold", "new_warm", "new_after_round", "running_only",
                                          "user_own"}
    assert isinstance(rep["target"]["pass"], bool)

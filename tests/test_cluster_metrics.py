"""Per-job series in ``/metrics``: what the latest round expects of each job, labelled by job, user,
kind and GPU type; a user's scrape holds only its own jobs; ended jobs' series go after a while; the
round-duration and API-latency histograms. A real server on loopback over a real store."""

from __future__ import annotations

import time

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from api_helpers import sample_hints, serve_on_loopback
from pollux.cluster.api.app import create_app
from pollux.cluster.api.metrics import RETAIN_S
from pollux.cluster.control.scheduler import schedule_once
from pollux.cluster.state.store import JobStore
from pollux.policy.base import Cluster
from pollux.policy.registry import make_policy

ADMIN = "metrics-admin-token"
SPEC = {"entrypoint": "/bin/true", "init_batch_size": 64, "max_batch_size": 1024}


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def job_values(text: str, name: str) -> dict[str, float]:
    """``{job: value}`` of one per-job series."""
    return {dict(labels)["job"]: v for (n, labels), v in samples(text).items() if n == name}


@pytest.fixture
def served(tmp_path):
    with JobStore(tmp_path / "jobs.db") as store:
        types = {"node-0": "a100", "node-1": "a100", "node-2": "t4", "node-3": "t4"}
        with serve_on_loopback(create_app(store, ADMIN, check_files=False, node_types=lambda: types)) as url:
            yield store, url


def scrape(url: str, token: str) -> str:
    r = httpx.get(url + "/metrics", headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 200, r.text
    return r.text


def test_each_job_s_outlook_is_a_series_and_a_user_sees_only_its_own(served):
    store, url = served
    alice, bob = store.add_user("alice"), store.add_user("bob")
    mine = store.submit(SPEC, owner="alice", now=1.0)
    theirs = store.submit({**SPEC, "kind": "elastic"}, owner="bob", now=2.0)
    admins = store.submit(SPEC, now=3.0)
    for job in (mine, theirs):
        store.put_hints(job.id, sample_hints(64))
    res = schedule_once(store, Cluster.uniform(4, 2), make_policy("pollux"), 10.0, np.random.default_rng(0))
    store.apply_round(res.policy, res.policy_state, res.changed, now=10.0, outlook=res.outlook.values(),
                      duration_s=0.02, jobs=res.num_jobs)
    text = scrape(url, ADMIN)
    goodput = job_values(text, "pollux_job_goodput")
    expected = {j: o.goodput for j, o in res.outlook.items() if o.goodput is not None}
    assert goodput == pytest.approx(expected) and set(goodput) <= {mine.id, theirs.id}
    assert set(job_values(text, "pollux_job_gpus")) == {mine.id, theirs.id, admins.id}
    for name in ("batch_size", "local_bsz", "accumulation_steps", "efficiency", "speedup", "pgns"):
        assert set(job_values(text, f"pollux_job_{name}")) == set(expected), name
    labels = {dict(k)["job"]: dict(k) for (n, k), _ in samples(text).items() if n == "pollux_job_gpus"}
    assert labels[theirs.id]["user"] == "bob" and labels[theirs.id]["kind"] == "elastic"
    assert labels[admins.id]["user"] == "admin" and labels[mine.id]["kind"] == "restart"
    for job_id, row in res.allocation.items():
        want = ",".join(sorted({{"node-0": "a100", "node-1": "a100"}.get(n, "t4") for n in row}))
        assert labels[job_id]["gpu_type"] == want
    assert samples(text)[("pollux_round_duration_seconds_count", ())] == 1
    assert samples(text)[("pollux_round_duration_seconds_bucket", (("le", "0.025"),))] == 1
    assert samples(text)[("pollux_round_duration_seconds_bucket", (("le", "0.01"),))] == 0
    # A user's scrape: only its own jobs' series (the cluster-wide counts stay).
    assert set(job_values(scrape(url, alice.token), "pollux_job_gpus")) == {mine.id}
    assert set(job_values(scrape(url, bob.token), "pollux_job_gpus")) == {theirs.id}
    latency = samples(scrape(url, ADMIN))
    route = (("method", "GET"), ("route", "/metrics"))
    assert latency[("pollux_api_request_duration_seconds_count", route)] >= 3


def test_ended_jobs_series_go_after_the_retention(served):
    store, url = served
    now = time.time()
    recent = store.submit(SPEC, now=now - 50)
    store.transition(recent.id, "cancelled", now=now - 10)
    old = store.submit(SPEC, now=now - 5000)
    store.transition(old.id, "cancelled", now=now - RETAIN_S - 60)
    running = store.submit(SPEC, now=now - 5000)
    assert set(job_values(scrape(url, ADMIN), "pollux_job_gpus")) == {recent.id, running.id}


def test_the_grafana_dashboard_queries_only_series_the_service_exposes(served):
    """Every ``pollux_*`` name in the dashboard's queries is in a real scrape (histogram parts too)."""
    import json
    import re
    from pathlib import Path

    store, url = served
    job = store.submit(SPEC, now=1.0)
    store.put_hints(job.id, sample_hints(64))
    res = schedule_once(store, Cluster.uniform(2, 2), make_policy("pollux"), 5.0, np.random.default_rng(0))
    store.apply_round(res.policy, res.policy_state, res.changed, now=5.0, outlook=res.outlook.values(),
                      duration_s=0.01, jobs=res.num_jobs)
    scrape(url, ADMIN)     # a first request, so that the API-latency histogram has a child to show
    exposed = {name for name, _ in samples(scrape(url, ADMIN))}
    dashboard = json.loads((Path(__file__).resolve().parents[1] / "docs" / "grafana" /
                            "pollux-dashboard.json").read_text())
    queries = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    queries += [v["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    used = {name for q in queries for name in re.findall(r"pollux_[a-z_]+", q)}
    assert len(used) >= 15 and used <= exposed, sorted(used - exposed)


def test_label_values_are_escaped_in_the_text_format(tmp_path):
    """The per-job lines are written here, not by prometheus_client: a GPU type with a quote, a
    backslash and a newline still parses back to itself."""
    odd = 'a"b\\c\nd'
    with JobStore(tmp_path / "jobs.db") as store:
        job = store.submit(SPEC)
        store.transition(job.id, "starting")
        store.set_allocation(job.id, {"node-0": 1})
        app = create_app(store, ADMIN, check_files=False, node_types=lambda: {"node-0": odd})
        with serve_on_loopback(app) as url:
            text = scrape(url, ADMIN)
    (labels,) = [dict(k) for (n, k), _ in samples(text).items() if n == "pollux_job_gpus"]
    assert labels == {"job": job.id, "user": "admin", "kind": "restart", "gpu_type": odd}

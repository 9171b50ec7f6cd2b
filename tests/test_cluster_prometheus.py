"""A real Prometheus server (Debian's ``prometheus`` package) scrapes the service: a PromQL query
returns a per-job goodput series for every running job of the demo workload.

The service is the production store, API (HTTP on loopback), scheduler (the Pollux policy) and
controller, over the in-memory fake backend instead of Ray, so that the five demo jobs run (as far
as the service can tell) within a second; each reports hints, and the next round writes what it
expects of each job. Prometheus scrapes ``/metrics`` with the admin token every second, as its
documentation's configuration (docs/metrics.md) says. Both servers are stopped by the test.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.parse
from pathlib import Path

import httpx
import pytest

from api_helpers import sample_hints, serve_on_loopback
from fake_backend import FakeBackend, FakeClock
from pollux.cluster.api.app import create_app
from pollux.cluster.control.controller import Controller, ControllerConfig
from pollux.cluster.control.scheduler import Scheduler
from pollux.cluster.demo import DEFAULT_JOBS, DemoJob, demo_spec
from pollux.cluster.state.store import JobStore
from system_tools import debian_program

ADMIN = "prometheus-test-admin-token"
REPO = Path(__file__).resolve().parents[1]
#: The demo's cluster: 4 nodes x 2 GPU slots.
NODES = {f"node-{i}": 2 for i in range(4)}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _query(prom: str, promql: str) -> list[dict]:
    r = httpx.get(f"{prom}/api/v1/query", params={"query": promql}, timeout=5)
    r.raise_for_status()
    return r.json()["data"]["result"]


@pytest.fixture
def prometheus_binary() -> str:
    return debian_program("prometheus", "prometheus")


def test_prometheus_reads_a_goodput_series_for_every_running_demo_job(tmp_path, prometheus_binary):
    clock = FakeClock()
    with JobStore(tmp_path / "jobs.db") as store:
        controller = Controller(store, FakeBackend(dict(NODES)), Scheduler(store, policy_name="pollux"),
                                ControllerConfig(state_dir=tmp_path, interval_s=3600.0), clock=clock,
                                monotonic=clock)
        script = REPO / "examples" / "digits" / "train.py"
        for job in DEFAULT_JOBS:
            store.submit(demo_spec(DemoJob(*job), script), name=job[0], now=clock())

        def rounds(n: int) -> None:
            for _ in range(n):
                controller.request_round()
                clock.advance(0.5)
                controller.tick()

        rounds(4)
        running = [j.id for j in store.list_jobs(["running"])]
        assert running, "the fake cluster ran none of the demo jobs"
        for job_id in running:
            store.put_hints(job_id, sample_hints(store.get_job(job_id).spec.init_batch_size))
        rounds(2)
        running = [j.id for j in store.list_jobs(["running"])]
        expected = {o.job_id for o in store.outlooks(running).values() if o.goodput is not None}
        assert expected == set(running), "every running job has a goodput outlook"

        with serve_on_loopback(create_app(store, ADMIN, check_files=False)) as url:
            token_file = tmp_path / "scrape-token"
            token_file.write_text(ADMIN)
            target = urllib.parse.urlsplit(url).netloc
            # honor_labels: the series' own ``job`` label (the Pollux job) wins over the scrape's.
            scrape = {"job_name": "pollux", "metrics_path": "/metrics", "honor_labels": True,
                      "authorization": {"type": "Bearer", "credentials_file": str(token_file)},
                      "static_configs": [{"targets": [target]}]}
            config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                      "scrape_configs": [scrape]}
            (tmp_path / "prometheus.yml").write_text(json.dumps(config))   # JSON is YAML
            port = _free_port()
            prom = f"http://127.0.0.1:{port}"
            log = open(tmp_path / "prometheus.log", "wb")
            proc = subprocess.Popen([prometheus_binary, f"--config.file={tmp_path / 'prometheus.yml'}",
                                     f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                     f"--web.listen-address=127.0.0.1:{port}"],
                                    stdout=log, stderr=subprocess.STDOUT)
            try:
                deadline = time.monotonic() + 60
                found: dict[str, float] = {}
                while time.monotonic() < deadline:
                    assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()[-2000:]
                    try:
                        result = _query(prom, 'pollux_job_goodput{job=~"job-.*"}')
                    except httpx.HTTPError:
                        result = []
                    found = {r["metric"]["job"]: float(r["value"][1]) for r in result}
                    if set(found) >= expected:
                        break
                    time.sleep(0.5)
                assert set(found) == expected, f"Prometheus saw {sorted(found)}; running {sorted(expected)}"
                outlook = store.outlooks(running)
                assert found == pytest.approx({j: outlook[j].goodput for j in expected})
                # The labels travel: each series names its user and kind.
                labels = {r["metric"]["job"]: r["metric"] for r in _query(prom, "pollux_job_goodput")}
                assert {m["user"] for m in labels.values()} == {"admin"}
                assert {m["kind"] for m in labels.values()} == {"restart"}
                assert _query(prom, "pollux_round_duration_seconds_count")[0]["value"][1] != "0"
            finally:
                proc.terminate()
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=20)
                log.close()

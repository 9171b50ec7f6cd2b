"""The web view without a browser: who sees which pages and jobs, the login cookie, paging and
filters, escaping, and the hints history (the store's table, its down-sampling, the API route the
charts are checked against)."""

from __future__ import annotations

import itertools
import re
import sqlite3

import pytest
from fastapi.testclient import TestClient

from api_helpers import bearer, sample_hints
from pollux.cluster.api.app import create_app
from pollux.cluster.state.hints_table import MAX_HISTORY_POINTS
from pollux.cluster.state.store import JobStore
from pollux.cluster.web.charts import line_chart
from pollux.cluster.web.session import COOKIE, local_target
from pollux.hints import hints_to_model

ADMIN = "web-admin-token"
HOSTILE = "<script>alert('x')</script>"
SPEC = {"entrypoint": "train.py", "init_batch_size": 128, "max_batch_size": 4096}
CLUSTER = {"nodes": [{"name": "node-0", "gpus": 4, "address": "10.0.0.1", "gpu_type": "a100"},
                     {"name": "node-1", "gpus": 4, "address": "10.0.0.2"}], "policy": "pollux"}


def running(store: JobStore, owner: str | None, allocation: dict[str, int], *, name: str | None = None,
            hints: int = 0, t0: float = 1000.0) -> str:
    """A running job of ``owner`` holding ``allocation``, with ``hints`` bodies one second apart."""
    job = store.submit(SPEC, owner=owner, name=name, now=t0)
    store.transition(job.id, "starting", now=t0 + 1)
    store.set_allocation(job.id, allocation, now=t0 + 1)
    store.transition(job.id, "running", now=t0 + 2)
    for k in range(hints):
        store.put_hints(job.id, sample_hints(), now=t0 + 10 + k)
    return job.id


@pytest.fixture
def world(tmp_path):
    with JobStore(tmp_path / "jobs.db") as store:
        alice = store.add_user("alice").token
        bob = store.add_user("bob").token
        ids = {"alice": running(store, "alice", {"node-0": 2}, name=HOSTILE, hints=5),
               "bob": running(store, "bob", {"node-1": 3}, hints=2),
               "admin": running(store, None, {"node-0": 1})}
        logs = tmp_path / "r0.log"
        logs.write_text("".join(f"line {k} <b>\n" for k in range(300)))
        store.record_replica(ids["alice"], 0, 0, "node-0", None, logs)
        app = create_app(store, ADMIN, cluster_info=lambda: CLUSTER, node_types=lambda: {"node-0": "a100"})
        with TestClient(app) as client:
            yield {"store": store, "client": client, "ids": ids,
                   "tokens": {"alice": alice, "bob": bob, "admin": ADMIN}}


def listed(html: str) -> set[str]:
    return set(re.findall(r'<tr data-job="([^"]+)"', html))


def test_every_page_redirects_to_the_login_without_a_token(world):
    client = world["client"]
    job = world["ids"]["alice"]
    for path in ("/", f"/jobs/{job}", "/cluster", "/rounds", "/?state=running"):
        answer = client.get(path, follow_redirects=False)
        assert answer.status_code == 303, path
        assert answer.headers["location"].startswith("/login?next=")
        wrong = client.get(path, headers=bearer("not-a-token"), follow_redirects=False)
        assert wrong.status_code == 303, path
    assert client.get("/login").status_code == 200


def test_a_job_token_is_not_a_web_credential(world):
    store = world["store"]
    job = store.submit(SPEC, owner="alice")
    answer = world["client"].get(f"/jobs/{job.id}", headers=bearer(job.token), follow_redirects=False)
    assert answer.status_code == 303
    login = world["client"].post("/login", data={"token": job.token}, follow_redirects=False)
    assert login.status_code == 401 and COOKIE not in login.headers.get("set-cookie", "")


def test_a_user_sees_only_its_own_jobs_and_the_admin_sees_all(world):
    client, ids, tokens = world["client"], world["ids"], world["tokens"]
    assert listed(client.get("/", headers=bearer(tokens["alice"])).text) == {ids["alice"]}
    assert listed(client.get("/", headers=bearer(tokens["bob"])).text) == {ids["bob"]}
    assert listed(client.get("/", headers=bearer(ADMIN)).text) == set(ids.values())
    assert client.get(f"/jobs/{ids['bob']}", headers=bearer(tokens["alice"])).status_code == 404
    assert client.get(f"/jobs/{ids['admin']}", headers=bearer(tokens["alice"])).status_code == 404
    assert client.get(f"/jobs/{ids['alice']}", headers=bearer(tokens["alice"])).status_code == 200
    assert client.get(f"/jobs/{ids['bob']}", headers=bearer(ADMIN)).status_code == 200
    assert client.get("/jobs/no-such-job", headers=bearer(ADMIN)).status_code == 404
    assert client.get("/jobs/..%2F..", headers=bearer(ADMIN)).status_code == 404
    # A user cannot ask for another user's jobs.
    assert client.get("/?user=bob", headers=bearer(tokens["alice"])).status_code == 404


def test_the_login_sets_a_strict_http_only_cookie_and_logout_clears_it(world):
    client = world["client"]
    answer = client.post("/login", data={"token": world["tokens"]["alice"], "next": "/cluster"},
                         follow_redirects=False)
    assert answer.status_code == 303 and answer.headers["location"] == "/cluster"
    cookie = answer.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie and "path=/" in cookie
    assert listed(client.get("/").text) == {world["ids"]["alice"]}
    out = client.post("/logout", follow_redirects=False)
    assert out.status_code == 303
    client.cookies.clear()
    assert client.get("/", follow_redirects=False).status_code == 303
    bad = client.post("/login", data={"token": "wrong"}, follow_redirects=False)
    assert bad.status_code == 401 and "Unknown token" in bad.text
    big = client.post("/login", content=b"token=" + b"x" * 20000,
                      headers={"content-type": "application/x-www-form-urlencoded"})
    assert big.status_code == 413


def test_the_login_goes_back_only_to_pages_of_this_site():
    assert local_target("/jobs/x?y=1") == "/jobs/x?y=1"
    for target in ("https://evil.example/", "//evil.example/", "/\\evil.example", "javascript:x", "",
                   None, "/a\r\nSet-Cookie: x"):
        assert local_target(target) == "/"


def test_hostile_names_and_log_lines_are_escaped(world):
    client = world["client"]
    job = world["ids"]["alice"]
    for path in ("/", f"/jobs/{job}"):
        html = client.get(path, headers=bearer(ADMIN)).text
        assert HOSTILE not in html and "&lt;script&gt;" in html
    page = client.get(f"/jobs/{job}", headers=bearer(ADMIN))
    assert "line 299 &lt;b&gt;" in page.text and "line 199 &lt;b&gt;" not in page.text   # the last 100
    assert "script-src" not in page.headers["content-security-policy"]
    assert "default-src 'none'" in page.headers["content-security-policy"]


def test_the_jobs_table_is_paged_and_filtered(world):
    store, client = world["store"], world["client"]
    for k in range(120):
        store.submit(SPEC, owner="alice", now=2000.0 + k)
    first = client.get("/", headers=bearer(ADMIN)).text
    assert len(listed(first)) == 50 and "page 1 of 3" in first and "123 in all" in first
    third = client.get("/?page=3", headers=bearer(ADMIN)).text
    assert len(listed(third)) == 23
    pending = client.get("/?state=pending", headers=bearer(ADMIN)).text
    assert "120 in all" in pending and world["ids"]["alice"] not in pending
    mine = client.get("/?state=running&user=bob", headers=bearer(ADMIN)).text
    assert listed(mine) == {world["ids"]["bob"]}
    admins = client.get("/?user=admin", headers=bearer(ADMIN)).text
    assert listed(admins) == {world["ids"]["admin"]}
    both = client.get("/?state=running&state=pending&page=2", headers=bearer(ADMIN)).text
    assert "123 in all" in both and 'href="/?state=running&amp;state=pending&amp;page=3"' in both
    for bad in ("/?state=bogus", "/?page=0", "/?page=x", "/?sort=name"):
        answer = client.get(bad, headers=bearer(ADMIN))
        assert answer.status_code == 422 and 'id="error"' in answer.text, bad


def test_the_jobs_page_is_paged_with_a_thousand_jobs(world):
    """A page holds 50 jobs however many the store keeps (its time is the benchmark's business:
    benchmarks/views_load.py); the pages together hold every job once."""
    store, client = world["store"], world["client"]
    for k in range(1000):
        store.submit(SPEC, owner="alice" if k % 2 else None, now=3000.0 + k)
    total = len(store.list_jobs())
    first = client.get("/", headers=bearer(ADMIN)).text
    assert f"{total} in all" in first and f"page 1 of {-(-total // 50)}" in first
    seen: list[str] = []
    for page in range(1, -(-total // 50) + 1):
        html = client.get("/", params={"page": page}, headers=bearer(ADMIN)).text
        rows = re.findall(r'<tr data-job="([^"]+)"', html)
        assert len(rows) == (50 if page * 50 <= total else total % 50)
        seen += rows
    assert sorted(seen) == sorted(j.id for j in store.list_jobs())


def test_the_cluster_and_rounds_pages(world):
    store, client, ids = world["store"], world["client"], world["ids"]
    store.apply_round("pollux", None, {}, duration_s=0.0123, jobs=3, objective=0.876543)
    store.apply_round("fifo", None, {}, duration_s=0.002, jobs=3)
    admin = client.get("/cluster", headers=bearer(ADMIN)).text
    assert "a100" in admin and "6 of 8 GPUs in use" in admin
    assert f'data-job="{ids["bob"]}"' in admin and f'data-job="{ids["alice"]}"' in admin
    alice = client.get("/cluster", headers=bearer(world["tokens"]["alice"])).text
    assert f'data-job="{ids["alice"]}"' in alice and ids["bob"] not in alice and "another user" in alice
    rounds = client.get("/rounds", headers=bearer(ADMIN)).text
    assert "12.3 ms" in rounds and "pollux" in rounds
    objectives = re.findall(r"<tr><td class=\"n\">\d+</td>.*?<td class=\"n\">([^<]*)</td></tr>", rounds)
    assert objectives == ["–", "0.8765"]   # newest first; fifo keeps no objective


def test_job_page_charts_hold_the_api_s_points(world):
    client, job = world["client"], world["ids"]["alice"]
    api = client.get(f"/v1/jobs/{job}/hints/history", headers=bearer(world["tokens"]["alice"]))
    assert api.status_code == 200
    points = api.json()
    assert len(points) == 5 and points[0]["gpus"] == 2 and points[0]["goodput"] > 0
    html = client.get(f"/jobs/{job}", headers=bearer(ADMIN)).text
    for series in ("goodput", "efficiency", "pgns", "batch_size", "step_time"):
        block = html.split(f'<svg data-series="{series}"', 1)[1].split("</svg>", 1)[0]
        drawn = [(float(t), float(v)) for t, v in re.findall(r'data-t="([^"]+)" data-v="([^"]+)"', block)]
        assert drawn == [(p["time"], p[series]) for p in points], series
    gpus = html.split('<svg data-series="gpus"', 1)[1].split("</svg>", 1)[0]
    assert re.findall(r'data-v="([^"]+)"', gpus) == ["2.0"]
    # Without the agent's measurements (no "current" in its hints) there is nothing measured to draw.
    assert all(p["measured_step_time"] is None and p["measured_goodput"] is None for p in points)
    assert 'data-series="measured_' not in html


def drawn_series(html: str, series: str) -> list[tuple[float, float]]:
    """The (time, value) points of one chart of a page, as drawn."""
    block = html.split(f'<svg data-series="{series}"', 1)[1].split("</svg>", 1)[0]
    return [(float(t), float(v)) for t, v in re.findall(r'data-t="([^"]+)" data-v="([^"]+)"', block)]


def test_measured_step_time_and_goodput_charts_hold_the_api_s_points(world):
    """Hints version 3 carries what the job runs and its measured step time: the page charts it right
    after each prediction, with the API's points, and the goodput is the model's efficiency at the
    measured batch times that batch over the measured step time."""
    store, client = world["store"], world["client"]
    job = running(store, "alice", {"node-0": 2}, t0=2000.0)
    runs = [(1, 64, 0, None), (2, 64, 0, (0.41, 12)), (2, 64, 1, (0.83, 30)), (2, 128, 1, (1.7, 5))]
    bodies = []
    for k, (replicas, local_bsz, accum_steps, timed) in enumerate(runs):
        current = {"replicas": replicas, "local_bsz": local_bsz, "accum_steps": accum_steps,
                   "batch_size": replicas * local_bsz * (accum_steps + 1)}
        if timed is not None:
            current.update(step_time=timed[0], steps=timed[1])
        bodies.append(store.put_hints(job, {**sample_hints(), "current": current}, now=2010.0 + k))
    api = client.get(f"/v1/jobs/{job}/hints/history", headers=bearer(world["tokens"]["alice"]))
    assert api.status_code == 200
    points = api.json()
    assert [p["measured_step_time"] for p in points] == [None, 0.41, 0.83, 1.7]
    assert [p["measured_batch_size"] for p in points] == [64.0, 128.0, 256.0, 512.0]
    model = hints_to_model(bodies[0])[0]
    for p in points[1:]:
        batch = p["measured_batch_size"]
        expected = batch * float(model.efficiency(batch)) / p["measured_step_time"]
        assert p["measured_goodput"] == pytest.approx(expected, rel=1e-12)
    assert points[0]["measured_goodput"] is None
    # A larger batch loses statistical efficiency: the measured goodput is not examples per second.
    assert points[3]["measured_goodput"] < 512.0 / 1.7

    html = client.get(f"/jobs/{job}", headers=bearer(ADMIN)).text
    order = re.findall(r'<svg data-series="([^"]+)"', html)
    assert order == ["gpus", "batch_size", "efficiency", "pgns", "step_time", "measured_step_time",
                     "goodput", "measured_goodput"]
    for series in ("measured_step_time", "measured_goodput", "step_time", "goodput"):
        assert drawn_series(html, series) == [(p["time"], p[series]) for p in points
                                              if p[series] is not None], series


def test_hints_history_route_follows_the_owner_rule_and_checks_points(world):
    client, ids, tokens = world["client"], world["ids"], world["tokens"]
    path = f"/v1/jobs/{ids['alice']}/hints/history"
    assert client.get(path).status_code == 401
    assert client.get(path, headers=bearer(tokens["bob"])).status_code == 404
    assert client.get(path, headers=bearer(ADMIN)).status_code == 200
    assert len(client.get(path + "?points=2", headers=bearer(ADMIN)).json()) == 2
    for bad in ("?points=1", f"?points={MAX_HISTORY_POINTS + 1}", "?points=x", "?limit=3"):
        answer = client.get(path + bad, headers=bearer(ADMIN))
        assert answer.status_code == 422 and "field" in answer.json(), bad
    assert client.get(f"/v1/jobs/{ids['bob']}/hints/history", headers=bearer(ADMIN)).json()[0]["gpus"] == 3


def test_history_is_down_sampled_on_the_server_and_keeps_the_newest(tmp_path):
    with JobStore(tmp_path / "jobs.db") as store:
        job = running(store, None, {"node-0": 1}, hints=0)
        body = sample_hints()
        for k in range(400):
            store.put_hints(job, body, now=5000.0 + k)
        full = store.hints_history(job, MAX_HISTORY_POINTS)
        assert [e.time for e in full] == [5000.0 + k for k in range(400)]
        for wanted in (2, 3, 50, 200, 399):
            got = store.hints_history(job, wanted)
            assert 2 <= len(got) <= wanted
            assert got[0].time == 5000.0 and got[-1].time == 5399.0
            gaps = {b.seq - a.seq for a, b in itertools.pairwise(got[:-1])}
            assert len(gaps) <= 1   # a fixed stride, the newest added
        with pytest.raises(ValueError, match="points"):
            store.hints_history(job, 1)
        assert store.get_hints(job) == full[-1].hints


def test_history_is_written_with_the_latest_hints_and_survives_an_upgrade(tmp_path):
    """A version-6 database (before the history) upgrades with each job's latest hints as the first
    entry of its history."""
    path = tmp_path / "jobs.db"
    with JobStore(path) as store:
        job = running(store, None, {"node-0": 1}, hints=3)
    conn = sqlite3.connect(path)
    conn.execute("DROP TABLE hints_history")
    conn.execute("ALTER TABLE rounds DROP COLUMN objective")   # and what version 8 added
    conn.execute("UPDATE schema_version SET version = 6")
    conn.commit()
    conn.close()
    with JobStore(path) as store:
        history = store.hints_history(job)
        assert [e.time for e in history] == [1012.0]
        store.put_hints(job, sample_hints(), now=1100.0)
        assert [e.time for e in store.hints_history(job)] == [1012.0, 1100.0]


def test_a_chart_of_nothing_and_of_one_point():
    assert line_chart("x", "X", "", []).empty
    one = line_chart("x", "X", "", [(1.0, 3.5), (2.0, None)])
    assert [(p.t_text, p.v_text) for p in one.points] == [("1.0", "3.5")]

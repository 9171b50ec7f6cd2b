"""The web view in a real browser: Debian's headless Chromium, driven by Playwright, against the
service's application served on loopback over a store with two users' jobs running with hints
histories. With user A's token the jobs page shows A's jobs and none of B's, and A's job page draws
exactly the points the API gives for its hints history; with the admin's token every job shows.
Screenshots go to pytest's folder (and, with ``POLLUX_SAVE_SCREENSHOT=1``, to ``docs/img/``).

The browser is the system's (``/usr/bin/chromium``): where it is missing and this runs as root with
apt, the test installs Debian's ``chromium`` package; elsewhere it skips and says why. Playwright
never downloads a browser here (its driver ships with the pip package).
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import httpx
import pytest

from api_helpers import bearer, sample_hints, serve_on_loopback
from pollux.cluster.api.app import create_app
from pollux.cluster.control.outlook import OutlookCache
from pollux.cluster.control.scheduler import job_view
from pollux.cluster.state.store import JobStore
from system_tools import debian_program

ADMIN = "browser-admin-token"
DOCS_IMG = Path(__file__).resolve().parents[1] / "docs" / "img"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SERIES = ("batch_size", "efficiency", "pgns", "step_time", "goodput")


def chromium() -> Path:
    """Debian's Chromium, installed if missing and this can (root, apt); skips with the reason
    otherwise (``system_tools``)."""
    return Path(debian_program("chromium", "chromium"))


def _job(store: JobStore, owner: str | None, name: str, allocations: list[tuple[float, dict[str, int]]],
         hints_at: list[float]) -> str:
    """A running job whose allocation changes at the given times, with hints bodies at ``hints_at``
    (the batch limit differs per body, so the points differ)."""
    job = store.submit({"entrypoint": "train.py", "init_batch_size": 128, "max_batch_size": 4096},
                       owner=owner, name=name, now=allocations[0][0] - 30)
    store.transition(job.id, "starting", now=allocations[0][0])
    for when, allocation in allocations:
        store.set_allocation(job.id, allocation, now=when)
    store.transition(job.id, "running", now=allocations[0][0] + 5)
    for k, when in enumerate(hints_at):
        store.put_hints(job.id, sample_hints(init_batch_size=96 + 16 * k), now=when)
    return job.id


@pytest.fixture
def world(tmp_path):
    now = time.time()
    with JobStore(tmp_path / "jobs.db") as store:
        tokens = {"alice": store.add_user("alice").token, "bob": store.add_user("bob").token}
        start = now - 900
        ids = {
            "alice": [
                _job(store, "alice", "resnet-imagenet", [(start, {"node-0": 1}), (start + 300, {"node-0": 2}),
                                                          (start + 600, {"node-0": 2, "node-1": 2})],
                     [start + 60 * k + 20 for k in range(14)]),
                _job(store, "alice", "bert-finetune", [(start + 100, {"node-1": 1})],
                     [start + 120 + 90 * k for k in range(6)]),
            ],
            "bob": [_job(store, "bob", "gpt-small", [(start + 50, {"node-2": 3})],
                         [start + 80 + 60 * k for k in range(8)])],
        }
        ids["admin"] = [store.submit({"entrypoint": "train.py", "init_batch_size": 64}, name="queued").id]
        every = [i for group in ids.values() for i in group]
        views = [job_view(store.get_job(i), store.get_hints(i), now) for i in every]
        outlooks = OutlookCache().round(views, store.current_allocations(), now, {})
        store.apply_round("pollux", None, {}, now=now, outlook=outlooks.values(), duration_s=0.02,
                          jobs=len(views))
        cluster = {"nodes": [{"name": f"node-{k}", "gpus": 4, "address": "127.0.0.1", "gpu_type": "a100"}
                             for k in range(3)], "policy": "pollux"}
        app = create_app(store, ADMIN, cluster_info=lambda: cluster,
                         node_types=lambda: {f"node-{k}": "a100" for k in range(3)})
        with serve_on_loopback(app) as url:
            yield {"url": url, "ids": ids, "tokens": {**tokens, "admin": ADMIN}}


def test_the_web_view_in_a_real_browser(world, tmp_path):
    executable = chromium()
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (the dev extra)")
    url, ids, tokens = world["url"], world["ids"], world["tokens"]
    with sync_api.sync_playwright() as driver:
        context = driver.chromium.launch_persistent_context(
            str(tmp_path / "profile"), executable_path=str(executable), headless=True, args=ARGS,
            viewport={"width": 1500, "height": 1000})
        try:
            page = context.new_page()

            def log_in(token: str) -> None:
                page.goto(url + "/logout")
                page.goto(url + "/")
                assert page.url.startswith(url + "/login")
                page.fill("input[name=token]", token)
                page.click("button[type=submit]")
                page.wait_for_url(url + "/")

            def listed() -> set[str]:
                return set(page.eval_on_selector_all("tr[data-job]", "rows => rows.map(r => r.dataset.job)"))

            log_in(tokens["alice"])
            assert listed() == set(ids["alice"])
            page.screenshot(path=str(tmp_path / "web-jobs.png"), full_page=True)

            job = ids["alice"][0]
            page.goto(f"{url}/jobs/{job}")
            expected = httpx.get(f"{url}/v1/jobs/{job}/hints/history", headers=bearer(tokens["alice"]),
                                 timeout=10).json()
            assert len(expected) == 14
            for series in SERIES:
                drawn = page.eval_on_selector_all(
                    f"svg[data-series={series}] circle",
                    "cs => cs.map(c => [Number(c.dataset.t), Number(c.dataset.v)])")
                assert drawn == [[p["time"], p[series]] for p in expected if p[series] is not None], series
                assert len(drawn) == len(expected), series
            gpus = page.eval_on_selector_all("svg[data-series=gpus] circle",
                                             "cs => cs.map(c => Number(c.dataset.v))")
            assert gpus == [1, 2, 4]
            assert {p["gpus"] for p in expected} == {1, 2, 4}
            page.screenshot(path=str(tmp_path / "web-job.png"), full_page=True)
            other = page.goto(f"{url}/jobs/{ids['bob'][0]}")
            assert other is not None and other.status == 404

            log_in(tokens["admin"])
            assert listed() == {i for group in ids.values() for i in group}
            page.screenshot(path=str(tmp_path / "web-jobs-admin.png"), full_page=True)
        finally:
            context.close()
    if os.environ.get("POLLUX_SAVE_SCREENSHOT") == "1":
        DOCS_IMG.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(tmp_path / "web-jobs-admin.png", DOCS_IMG / "web-jobs.png")
        shutil.copyfile(tmp_path / "web-job.png", DOCS_IMG / "web-job.png")

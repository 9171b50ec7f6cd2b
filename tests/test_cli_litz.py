"""`pollux litz run`, and the worked example of docs/litz.md (the code is read from the doc itself,
so the doc cannot rot): locally, and on Ray through the runtime and through the command.

One module-scoped Ray cluster for the Ray tests, stopped at the end and checked by PID. The command's
own start and stop of Ray are checked through stand-ins for `ray.init`/`ray.shutdown` (a second
cluster would double the file's time); inside a cluster the caller started, it must leave it running.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from pollux.cli.entry import main

DOC = Path(__file__).resolve().parents[1] / "docs" / "litz.md"
TINY_MLR = ["--set", "n=600", "--set", "d=8", "--iterations", "20", "--set", "report_every=5",
            "--executors", "4"]


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(["litz", "run", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def doc_example_source() -> str:
    m = re.search(r"<!-- litz-example: kmeans\.py[^>]*-->\s*```python\n(.*?)```", DOC.read_text(), re.S)
    assert m, "docs/litz.md: the worked example (<!-- litz-example: kmeans.py --> block) is missing"
    return m.group(1)


@pytest.fixture(scope="module")
def kmeans(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The doc's kmeans.py, written to a file and imported from there."""
    path = tmp_path_factory.mktemp("litz-doc") / "kmeans.py"
    path.write_text(doc_example_source())
    spec = importlib.util.spec_from_file_location("litz_doc_kmeans", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


def ray_children_gone(before: set[int], timeout_s: float = 20.0) -> list[int]:
    """This process's children that were not there ``before`` (earlier tests may leave long-lived
    helpers of their own, e.g. multiprocessing's resource tracker), once they had time to exit."""
    from pollux.cluster.backends.processes import descendants

    def new() -> list[int]:
        return [p for p in descendants(os.getpid()) if p not in before]

    deadline = time.monotonic() + timeout_s
    while new() and time.monotonic() < deadline:
        time.sleep(0.2)
    return new()


# ------------------------------------------------------------------------------ no Ray

def test_mlr_local_json_summary_and_progress(capsys):
    from pollux.litz.apps import numpy_sgd_reference

    rc, out, err = run_cli(capsys, "mlr", "--local", *TINY_MLR, "--json")
    assert rc == 0, err
    data = json.loads(out)
    for key in ("app", "runtime", "config", "wall_s", "objective", "iterations", "workers", "shards",
                "executors", "resizes", "checkpoints", "cache", "tasks_completed", "tasks_per_s",
                "metrics", "final"):
        assert key in data, key
    assert data["app"] == "mlr" and data["runtime"] == "local"
    assert data["iterations"] == 20 and data["tasks_completed"] == 80 and data["workers"] == 1
    assert data["config"] == {"n": 600, "d": 8, "report_every": 5, "iterations": 20}
    assert set(data["cache"]) == {"hits", "misses", "hit_rate"}
    # the summary's trajectory is plain numpy synchronous SGD on the same batches (s = 0)
    ref = numpy_sgd_reference(num_executors=4, n=600, d=8, iterations=20, report_every=5)
    got = [(m["iteration"], m["objective"]) for m in data["metrics"]]
    assert [i for i, _ in got] == [i for i, _ in ref] == [5, 10, 15, 20]
    for (_, a), (_, b) in zip(got, ref, strict=True):
        assert math.isclose(a, b, rel_tol=1e-9)
    lines = [ln for ln in err.splitlines() if ln.startswith("[")]
    assert len(lines) == 4
    assert all("objective" in ln and "workers 1" in ln and "tasks/s" in ln for ln in lines)


def test_mlr_local_text_summary(capsys):
    rc, out, err = run_cli(capsys, "mlr", "--local", *TINY_MLR, "--quiet")
    assert rc == 0 and err == ""
    assert out.startswith("mlr (local): objective ") and "after 20 iteration(s)" in out


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["mlr", "--set", "learning_rate=0.1"], "--set learning_rate: unknown config key of mlr"),
        (["mlr", "--set", "lr=fast"], "--set lr=fast: expected float"),
        (["mlr", "--set", "lr=-1"], "'lr' must be > 0"),
        (["mlr", "--set", "double_buffer=maybe"], "--set double_buffer=maybe: expected bool"),
        (["mlr", "--set", "lr"], "--set lr: expected KEY=VALUE"),
        (["lda", "--staleness", "1"], "--staleness: the lda application has no 'staleness' setting"),
        (["lda", "--executors", "8", "--set", "num_blocks=4"], "'num_blocks' (4) must be >="),
        (["mlr", "--iterations", "5", "--epochs", "1"], "--iterations and --epochs"),
        (["lda", "--epochs", "2.5"], "--epochs: lda's 'epochs' is a whole number, got 2.5"),
        (["mlr", "--local", "--resize-at", "1:4"], "--local runs in one process"),
        (["mlr", "--resize-at", "soon"], "expected SECONDS:WORKERS"),
        (["mlr", "--checkpoint-every", "2"], "--checkpoint-every needs --checkpoint-dir"),
        (["nope"], "expected mlr, lda, FILE.py:FACTORY"),
        (["missing_file.py:app"], "missing_file.py: no such file"),
        (["kmeans", "--set", "clusters=4"], "--set clusters: unknown config key of kmeans"),
        (["kmeans", "--set", "k=many"], "--set k=many: expected int"),
        (["kmeans", "--memory-budget", "lots"], "expected a size like 500M or 2G, got 'lots'"),
        (["kmeans", "--memory-budget", "0"], "expected a size of at least one byte"),
        (["kmeans", "--local", "--memory-budget", "1M"], "--local keeps every executor in memory"),
    ],
)
def test_bad_input_is_one_line_naming_the_key(capsys, argv, needle):
    rc, out, err = run_cli(capsys, *argv)
    assert rc == 2 and out == ""
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("pollux litz run: error: ") and needle in last, err


def test_key_tables_cover_every_key_the_apps_read():
    """The command's typed key tables must not drift from what the applications read."""
    import pollux.datasets as data_mod
    import pollux.litz.apps.lda as lda_mod
    import pollux.litz.apps.mlr as mlr_mod
    from pollux.cli.litz_apps import LDA_KEYS, MLR_KEYS

    def read(module: Any) -> set[str]:
        text = Path(module.__file__).read_text()
        return set(re.findall(r"config(?:\.get\(|\[)\"(\w+)\"", text))

    assert {"lr", "staleness"} <= read(mlr_mod) and "num_topics" in read(lda_mod)  # the regex works
    assert read(mlr_mod) | read(data_mod) <= set(MLR_KEYS)
    assert read(lda_mod) <= set(LDA_KEYS)


def test_doc_example_converges_locally(kmeans):
    from pollux.litz.local import run_local

    app = kmeans.kmeans_app(k=4, staleness=1)
    summary = run_local(app, num_executors=4)
    true_centres, points = kmeans.blobs(app.config)
    best = kmeans.inertia(points, true_centres)
    objectives = [m["objective"] for m in summary.metrics]
    assert summary.final["iterations"] == 30 and len(objectives) == 6
    assert objectives[-1] < objectives[0]
    assert summary.final["objective"] <= 1.02 * best  # within 2 % of the generating centres


def test_doc_example_through_the_cli_locally(capsys, kmeans):
    rc, out, err = run_cli(capsys, f"{kmeans.__file__}:kmeans_app", "--local", "--set", "k=4",
                           "--iterations", "20", "--staleness", "0", "--json")
    assert rc == 0, err
    data = json.loads(out)
    assert data["app"] == "kmeans"
    assert data["config"] == {"k": 4, "dim": 2, "n": 2000, "batch": 50, "iterations": 20, "staleness": 0,
                              "seed": 0}  # the factory's defaults with the overrides
    assert data["iterations"] == 20 and data["objective"] < 2.2
    rc, out, err = run_cli(capsys, f"{kmeans.__file__}:kmeans_app", "--local", "--set", "clusters=3")
    assert rc == 2 and "--set clusters: unknown config key of kmeans_app" in err


# ------------------------------------------------------------------------------ Ray

@pytest.fixture(scope="module")
def ray_cluster() -> Any:
    """One local Ray cluster for the Ray tests; stopped at the end, and no process of it left."""
    ray = pytest.importorskip("ray")
    from pollux import raylink
    from pollux.cluster.backends.processes import descendants

    before = set(descendants(os.getpid()))
    raylink.start_local(2)
    yield ray
    ray.shutdown()
    assert ray_children_gone(before) == [], "Ray processes left behind"


def test_cli_on_ray_starts_resizes_stops_and_matches_local(capsys, monkeypatch, ray_cluster):
    """The command's own Ray start and stop, seen through stand-ins for `ray.init`/`ray.shutdown`
    (so the module's one cluster serves the run), then the run itself for real."""
    import pollux.cli.litz_commands as lc

    ray, calls = ray_cluster, []
    monkeypatch.setattr(lc, "_ray_running", lambda _ray: False)
    monkeypatch.setattr(ray, "init", lambda **kw: calls.append(("init", kw)))
    monkeypatch.setattr(ray, "shutdown", lambda: calls.append(("shutdown", {})))
    monkeypatch.setattr(lc, "_wait_for_children", lambda: calls.append(("wait", {})))
    monkeypatch.delenv("RAY_USAGE_STATS_ENABLED", raising=False)
    rc, out, err = run_cli(capsys, "mlr", *TINY_MLR, "--workers", "2", "--resize-at", "0:3", "--task-floor",
                           "0.01", "--json")
    assert rc == 0, err
    assert [c for c, _ in calls] == ["init", "shutdown", "wait"]
    init = calls[0][1]
    assert init["address"] == "local" and init["num_cpus"] == os.cpu_count()
    assert init["include_dashboard"] is False and init["_node_ip_address"] == "127.0.0.1"
    assert os.environ["RAY_USAGE_STATS_ENABLED"] == "0"
    assert os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0"
    data = json.loads(out)
    assert data["runtime"] == "ray" and data["tasks_completed"] == 80
    assert data["workers"] == 3 and data["shards"] == 2
    assert [(r["from"], r["to"]) for r in data["resizes"]] == [(2, 3)]
    assert data["cache"]["hits"] > 0 and 0 < data["cache"]["hit_rate"] < 1
    assert "resize workers 2 -> 3" in err and "iteration 20" in err
    # s = 0: the same logical computation as the sequential reference, whatever the resize
    rc, out_local, err = run_cli(capsys, "mlr", "--local", *TINY_MLR, "--json")
    local = json.loads(out_local)
    for a, b in zip(data["metrics"], local["metrics"], strict=True):
        assert a["iteration"] == b["iteration"] and math.isclose(a["objective"], b["objective"], rel_tol=1e-6)


def test_doc_example_on_ray_runtime_and_cli(capsys, kmeans, ray_cluster):
    from pollux.litz.records import RuntimeConfig
    from pollux.litz.runtime import LitzRuntime

    ray = ray_cluster
    ray.cloudpickle.register_pickle_by_value(kmeans)
    try:
        app = kmeans.kmeans_app(k=4, iterations=20, staleness=1)
        rt = LitzRuntime(app, RuntimeConfig(num_executors=4, num_workers=2, num_shards=2))
        rt.resize(num_workers=3)  # applied once the run starts
        summary = rt.run()
    finally:  # process-wide: later tests must not inherit it
        ray.cloudpickle.unregister_pickle_by_value(kmeans)
    true_centres, points = kmeans.blobs(app.config)
    assert summary.final["iterations"] == 20
    assert summary.final["objective"] <= 1.05 * kmeans.inertia(points, true_centres)
    assert summary.num_workers == 3 and summary.cache_hits > 0

    rc, out, err = run_cli(capsys, f"{kmeans.__file__}:kmeans_app", "--set", "iterations=20", "--json")
    assert rc == 0, err
    data: dict[str, Any] = json.loads(out)
    assert data["runtime"] == "ray" and data["iterations"] == 20
    assert data["objective"] <= 1.05 * kmeans.inertia(points, true_centres)
    assert ray.is_initialized(), "the command must leave a Ray it did not start running"


def test_kmeans_under_a_memory_budget_evicts_and_gives_the_in_memory_centres(capsys, ray_cluster):
    """``--memory-budget`` of about half the executors' bytes (4 of ~0.2 MB each on one worker):
    executors are evicted and read back, and the centres are those of the run without a budget."""
    tiny = ["kmeans", "--set", "points_per_executor=1500", "--set", "dim=16", "--set", "k=8",
            "--iterations", "6", "--executors", "4", "--workers", "1", "--json", "--quiet"]
    rc, out, err = run_cli(capsys, *tiny)
    assert rc == 0, err
    plain = json.loads(out)
    rc, out, err = run_cli(capsys, *tiny, "--memory-budget", "0.2M")
    assert rc == 0, err
    budget = json.loads(out)
    ooc = budget["out_of_core"]
    assert ooc["budget_bytes"] == int(0.2 * (1 << 20)) and ooc["evictions"] > 0 and ooc["reloads"] > 0
    assert ooc["peak_bytes"] <= ooc["budget_bytes"] and ooc["bytes_read"] > 0
    assert plain["out_of_core"]["evictions"] == 0
    assert budget["final"]["centres"] == plain["final"]["centres"]

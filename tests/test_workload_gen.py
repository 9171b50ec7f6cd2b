"""Workload generation from a Philly-format trace, the built-in default profiles and demo workload."""

from __future__ import annotations

import csv
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from pollux.cli import main
from pollux.policy.base import Cluster
from pollux.sim import defaults
from pollux.sim.engine import SimConfig, simulate
from pollux.sim.profiles import default_metadata, load_profiles
from pollux.sim.workload import WorkloadJob, read_workload
from pollux.sim.workload_gen import (
    MAX_JCT,
    REPLICA_CHOICES,
    SCALING_RANGE,
    application_for,
    best_batch,
    filter_trace,
    fixed_batch_jct,
    generate_workload,
    read_trace,
    scaling_table,
    tuned_configs,
)

HEADER = "timestamp,duration,num_gpus,gpu_time,cluster\n"
APPS = ("bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3")


@pytest.fixture(scope="module")
def profiles():
    return load_profiles(defaults.profiles_dir())


@pytest.fixture(scope="module")
def configs(profiles):
    return {app: tuned_configs(p, single_replica=app == "ncf") for app, p in profiles.items()}


def write_trace(tmp_path: Path, body: str, name: str = "philly.csv") -> Path:
    path = tmp_path / name
    path.write_text(HEADER + body)
    return path


def row(day: int, hhmmss: str, duration: float, gpus: int = 1) -> str:
    return f"2017-10-{day:02d} {hhmmss},{duration},{gpus},{duration * gpus},c1\n"


def mixed_trace(tmp_path: Path, n: int = 40) -> Path:
    """``n`` eligible jobs on two days, distinct offsets, GPU times across all four buckets."""
    hours = (0.5, 3.0, 30.0, 300.0)
    lines = []
    for k in range(n):
        offset = 60 * k + 7                                  # seconds after 02:00
        hh, rem = divmod(2 * 3600 + offset, 3600)
        stamp = f"{hh:02d}:{rem // 60:02d}:{rem % 60:02d}"
        lines.append(row(9 + k % 2, stamp, hours[k % 4] * 3600 / 2, gpus=2))
    return write_trace(tmp_path, "".join(lines))


# --------------------------------------------------------------------------------------------------
# Trace reading and filters


def test_filters_duration_gpu_time_and_window(tmp_path):
    body = "".join([
        row(9, "03:00:00", 59),                      # too short
        row(9, "03:00:01", 60),                      # kept: exactly 60 s
        row(9, "03:00:02", 1000 * 3600 / 4 - 1, 4),  # kept: just under 1000 GPU-hours
        row(9, "03:00:03", 1000 * 3600 / 4, 4),      # exactly 1000 GPU-hours: dropped
        row(9, "01:59:59", 600),                     # before the window
        row(9, "02:00:00", 600),                     # kept: window start
        row(10, "09:59:59", 600),                    # kept: window end, another day
        row(11, "10:00:00", 600),                    # window end is exclusive
        row(12, "23:30:00", 600),                    # evening
    ])
    jobs = read_trace(write_trace(tmp_path, body))
    assert len(jobs) == 9
    assert jobs[2].gpu_time == pytest.approx(jobs[2].duration * 4)
    kept = filter_trace(jobs)
    assert [j.line for j in kept] == [3, 4, 7, 8]
    assert [j.time_of_day - 7200 for j in kept] == [3601, 3602, 0, 28799]


def test_submission_times_are_offsets_from_0200(tmp_path):
    body = "".join([row(9, "02:00:05", 600), row(10, "02:00:03", 600), row(11, "09:00:00", 600),
                    row(12, "11:00:00", 600)])
    profiles = load_profiles(defaults.profiles_dir(), apps=["cifar10", "ncf"])
    out = generate_workload(write_trace(tmp_path, body), profiles, num_jobs=3, seed=0)
    assert [j.submit_time for j in out] == [3.0, 5.0, 7 * 3600.0]
    assert [j.name for j in out] == [f"{j.application}-{k}" for k, j in enumerate(out)]


def test_bucket_mapping():
    rng = np.random.default_rng(0)
    seen = {h: Counter(application_for(h, rng) for _ in range(400)) for h in
            (0.0, 0.999, 1.0, 9.99, 10.0, 99.9, 100.0, 999.0)}
    for h in (0.0, 0.999):
        assert set(seen[h]) == {"cifar10", "ncf"} and 150 < seen[h]["ncf"] < 250
    for h in (1.0, 9.99):
        assert set(seen[h]) == {"deepspeech2", "bert"} and 150 < seen[h]["bert"] < 250
    assert set(seen[10.0]) == set(seen[99.9]) == {"yolov3"}
    assert set(seen[100.0]) == set(seen[999.0]) == {"imagenet"}


def test_generated_jobs_follow_buckets_and_configs(tmp_path, profiles, configs):
    path = mixed_trace(tmp_path)
    trace = {j.time_of_day - 7200: j for j in filter_trace(read_trace(path))}
    out = generate_workload(path, profiles, num_jobs=30, seed=3)
    assert len(out) == 30 and len({j.name for j in out}) == 30
    assert [j.submit_time for j in out] == sorted(j.submit_time for j in out)
    allowed = {0: {"cifar10", "ncf"}, 1: {"deepspeech2", "bert"}, 2: {"yolov3"}, 3: {"imagenet"}}
    for k, job in enumerate(out):
        src = trace[int(job.submit_time)]
        bucket = int(math.log10(src.gpu_hours)) + 1 if src.gpu_hours >= 1 else 0
        assert job.application in allowed[bucket]
        assert job.name == f"{job.application}-{k}"
        assert (job.num_replicas, job.batch_size) in {(c.replicas, c.batch_size)
                                                     for c in configs[job.application]}


def test_same_seed_same_workload(tmp_path, profiles):
    path = mixed_trace(tmp_path)
    a = generate_workload(path, profiles, num_jobs=20, seed=7)
    b = generate_workload(path, profiles, num_jobs=20, seed=7)
    c = generate_workload(path, profiles, num_jobs=20, seed=8)
    assert a == b
    assert a != c


def test_too_few_jobs_and_missing_profile(tmp_path, profiles):
    path = mixed_trace(tmp_path, n=8)
    with pytest.raises(ValueError, match="only 8 job"):
        generate_workload(path, profiles, num_jobs=9)
    with pytest.raises(ValueError, match="no profile"):
        generate_workload(path, {"cifar10": profiles["cifar10"]}, num_jobs=8)


@pytest.mark.parametrize(("body", "needle"), [
    ("2017-10-09 03:00,60,1,60,c\n", ":2: field 'timestamp'"),
    ("2017-13-09 03:00:00,60,1,60,c\n", ":2: field 'timestamp'"),
    ("2017-10-09 03:00:00,sixty,1,60,c\n", ":2: field 'duration'"),
    ("2017-10-09 03:00:00,60,1,60,c\n2017-10-09 03:00:00,60,1,-5,c\n", ":3: field 'gpu_time'"),
    ("2017-10-09 03:00:00,60,1.5,90,c\n", ":2: field 'num_gpus'"),
    ("2017-10-09 03:00:00,60,0,0,c\n", ":2: field 'num_gpus'"),
    ("2017-10-09 03:00:00,inf,1,60,c\n", ":2: field 'duration'"),
    ("2017-10-09 03:00:00,60,1\n", ":2: expected 5 fields"),
])
def test_malformed_trace_errors(tmp_path, body, needle):
    path = write_trace(tmp_path, body)
    with pytest.raises(ValueError) as exc:
        read_trace(path)
    assert str(path) in str(exc.value) and needle in str(exc.value)


def test_trace_header_and_empty_errors(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("timestamp,duration,gpus\n2017-10-09 03:00:00,60,1\n")
    with pytest.raises(ValueError, match=r"bad\.csv:1: missing column\(s\) num_gpus, gpu_time"):
        read_trace(bad)
    empty = tmp_path / "empty.csv"
    empty.write_text(HEADER)
    with pytest.raises(ValueError, match="no jobs"):
        read_trace(empty)
    with pytest.raises(FileNotFoundError, match="no such trace file"):
        read_trace(tmp_path / "missing.csv")


# --------------------------------------------------------------------------------------------------
# TunedJobs configurations


def test_tuned_configs_meet_the_criteria(profiles, configs):
    lo, hi = SCALING_RANGE
    for app, cfgs in configs.items():
        p = profiles[app]
        assert cfgs, app
        if app == "ncf":
            assert [(c.replicas, c.batch_size) for c in cfgs] == [(1, 32768)]
            continue
        base = min(fixed_batch_jct(p, 1, int(b)) for b in p.batch_sizes)
        for c in cfgs:
            assert c.replicas in REPLICA_CHOICES and c.batch_size in p.batch_sizes
            jcts = {int(b): fixed_batch_jct(p, c.replicas, int(b)) for b in p.batch_sizes}
            assert c.jct == pytest.approx(min(jcts.values())) == pytest.approx(jcts[c.batch_size])
            assert c.scaling == pytest.approx(base / (c.replicas * c.jct))
            assert lo <= c.scaling <= hi and c.jct < MAX_JCT, (app, c)
        # Every replica count left out fails a criterion.
        chosen = {c.replicas for c in cfgs}
        for t in scaling_table(p):
            if t.replicas not in chosen:
                assert not (lo <= t.scaling <= hi and t.jct < MAX_JCT), (app, t)


def test_tuned_config_fallback(profiles):
    p = profiles["yolov3"]
    # No pair reaches 90-95 % scaling: the pairs closest to the range (within 12 h) are used.
    cfgs = tuned_configs(p, scaling_range=(0.9, 0.95))
    table = [t for t in scaling_table(p) if t.jct < MAX_JCT]
    gap = min(max(0.9 - t.scaling, t.scaling - 0.95, 0) for t in table)
    assert cfgs and all(max(0.9 - c.scaling, c.scaling - 0.95, 0) == pytest.approx(gap) for c in cfgs)
    # Nothing finishes within a minute: the fastest pair.
    (fast,) = tuned_configs(p, max_jct=60.0)
    assert fast.jct == min(t.jct for t in scaling_table(p))


def test_fixed_batch_jct_matches_the_simulator(profiles):
    """A job run alone at its TunedJobs configuration finishes when fixed_batch_jct says (plus the
    30 s start-up delay), in the simulator."""

    class Packed:
        name = "fifo"

        def decide(self, jobs, cluster, state, now, rng):
            out = {}
            for j in jobs:
                r, k = j.fixed[0], 0
                out[j.id] = {}
                while r > 0:
                    out[j.id][cluster.nodes[k]] = min(4, r)
                    r -= 4
                    k += 1
            return out, {}

    assert Cluster.uniform(16, 4).total_gpus == 64
    for app, replicas, batch in (("cifar10", 8, 2048), ("bert", 12, 384)):
        p = profiles[app]
        res = simulate([WorkloadJob("j", 0.0, app, replicas, batch)], {app: p}, Packed(), SimConfig())
        expected = fixed_batch_jct(p, replicas, batch) + 30.0
        assert res.jobs[0].jct == pytest.approx(expected, rel=1e-6, abs=1e-3)
    assert best_batch(profiles["cifar10"], 1)[0] in profiles["cifar10"].batch_sizes


# --------------------------------------------------------------------------------------------------
# The built-in defaults


def test_default_profiles_load_and_match_metadata(profiles):
    meta = default_metadata()
    assert sorted(profiles) == list(APPS)
    for app, p in profiles.items():
        m = meta[app]
        assert p.meta == m
        assert len(p.epoch_ends) == m.epochs == p.progress.shape[1]
        assert p.batch_sizes[0] == m.init_batch_size and p.batch_sizes[-1] == m.max_batch_size
        with (defaults.profiles_dir() / app / "placements.csv").open() as fh:
            lbs = [float(r["local_bsz"]) for r in csv.DictReader(fh)]
        assert min(lbs) == m.min_local_bsz
        assert max(lbs) == (16 if app == "yolov3" else m.max_local_bsz)   # yolov3: metadata override
        assert len(p.measured_placements) == 108
        step, sync = p.step_time("4", m.min_local_bsz)
        assert 0 <= sync < step
    root = defaults.profiles_dir()
    size = sum(f.stat().st_size for f in root.rglob("*") if f.is_file())
    assert size < 300 * 1024
    assert "Apache" in (root / "README.md").read_text()


def test_default_workload(profiles):
    jobs = read_workload(defaults.workload_file(), applications=profiles)
    apps = Counter(j.application for j in jobs)
    assert 24 <= len(jobs) <= 32
    assert "imagenet" not in apps and apps["yolov3"] <= 2 and len(apps) >= 4
    assert max(j.submit_time for j in jobs) <= 2 * 3600


# --------------------------------------------------------------------------------------------------
# The command line


def test_cli_workload_generate(tmp_path, capsys):
    trace = mixed_trace(tmp_path, n=12)
    out = tmp_path / "sub" / "w.csv"
    args = ["workload", "generate", "--trace", str(trace), "--jobs", "10", "--seed", "2",
            "--profiles", str(defaults.profiles_dir()), "--out", str(out)]
    assert main(args) == 0
    assert "wrote 10 jobs" in capsys.readouterr().err
    jobs = read_workload(out, applications=APPS)
    assert len(jobs) == 10
    first = out.read_bytes()
    assert main([*args[:-1], str(tmp_path / "again.csv")]) == 0
    assert (tmp_path / "again.csv").read_bytes() == first

    bad = write_trace(tmp_path, "2017-10-09 03:00:00,60,1,x,c\n", name="bad.csv")
    assert main(["workload", "generate", "--trace", str(bad), "--out", str(tmp_path / "o.csv")]) == 1
    err = capsys.readouterr().err
    assert "bad.csv:2: field 'gpu_time'" in err
    assert not (tmp_path / "o.csv").exists()
    assert main(["workload", "generate", "--trace", str(trace), "--jobs", "13",
                 "--out", str(tmp_path / "o.csv")]) == 1
    assert "only 12 job(s)" in capsys.readouterr().err

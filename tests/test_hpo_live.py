"""A live study (issue 37's acceptance): ``pollux hpo run`` on the embedded cluster, 8 trials of the
digits example, 2 at a time, with a driver killed mid-study and started again.

The service runs the Pollux policy on one virtual node of 3 GPU slots, with trials of at most 2
replicas. Each trial trains for a few epochs and reports its test accuracy after each
(``pollux.hpo.report``); the median pruner may stop a trial from its first report once 2 trials have
completed. The space is the example's without ``--width`` (1, the script's default), to keep the
trials short on a shared machine.

*The re-allocation.* The policy moves a job only when the gain outweighs the restart: a job's
speedup on a new allocation is discounted by ``(T − R·δ)/(T + δ)`` (age T, δ = 30 s), so a job
younger than about 45 s is not worth moving, and a digits trial on an idle machine is over sooner.
As on a shared cluster, the study therefore starts while other jobs hold every GPU (three
non-preemptible ``sleep`` jobs of :data:`BUSY_S` seconds): the first two trials wait, then start
with their age behind them, one GPU each, the third slot free; once their hints arrive the policy
gives the free slot to one of them (its job checkpoints and restarts on 2 replicas). This depends on
the clock, not on how fast the machine trains. A pruned trial's GPUs go to the others the same way.

1. The driver runs as ``python -m pollux.cli hpo run ...`` in a subprocess; once a trial has finished
   and another has just started (its job submitted, nothing reported yet), it gets SIGKILL, as if
   its machine died.
2. The same command is run again: it adopts the running trials (their jobs kept running meanwhile),
   tells those that ended what became of them, and asks only the rest.

Checked: the study has exactly 8 trials, each COMPLETE, PRUNED or FAIL with a recorded reason, with
its parameters and (unless failed) its intermediate values, a COMPLETE one's value being its last
report; each trial ran as exactly one job (one per trial number, none submitted twice), a pruned
trial's job was cancelled, every job has ended; at least one trial's job was re-allocated (moved to
``rescaling``, or given a second non-empty allocation); the second driver adopted at least one
trial. The timeline is printed (``pytest -s``).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

#: Long (half a minute or more): `pytest -m "not slow"` leaves it out.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
DIGITS = ROOT / "examples" / "digits" / "train.py"
SPACE = """\
args: true
lr: {type: float, low: 1.0e-3, high: 0.3, log: true}
momentum: {type: float, low: 0.5, high: 0.99}
weight_decay: {type: float, low: 1.0e-6, high: 1.0e-2, log: true}
"""
TRIALS = 8
CONCURRENT = 2
#: Epochs of a trial: enough for its hints to arrive (every 2 s, ``--refit-interval 2``) and a round
#: to move it before it ends, on an idle machine (about 1.5 s an epoch there).
EPOCHS = 5
#: How long the jobs holding the cluster when the study starts run (see the module docstring).
BUSY_S = 50
STUDY = "live"
#: How long the whole study may take on a loaded 2-core machine before the test gives up.
STUDY_TIMEOUT_S = 900.0
RAY_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}


def driver(state: Path, workdir: Path, log: Path) -> subprocess.Popen[bytes]:
    """``pollux hpo run`` of the study, its output in ``log``."""
    command = [sys.executable, "-m", "pollux.cli", "hpo", "run", "--state-dir", str(state),
               "--space", str(workdir / "space.yaml"), "--trials", str(TRIALS),
               "--concurrent", str(CONCURRENT),
               "--direction", "max", "--pruner", "median", "--pruner-startup-trials", "2",
               "--pruner-warmup-steps", "0", "--study", STUDY, "--storage", str(workdir / "hpo.db"),
               "--batch-size", "16", "--max-batch-size", "128", "--local-bsz-bounds", "8", "64",
               "--max-replicas", "2", "--working-dir", str(workdir), str(DIGITS), "--epochs", str(EPOCHS),
               "--refit-interval", "2"]
    env = {**os.environ, **RAY_ENV}
    with log.open("ab") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=workdir, env=env)


def trials(workdir: Path) -> list[Any]:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.load_study(study_name=STUDY, storage=f"sqlite:///{workdir / 'hpo.db'}").get_trials()


def wait_for(ok: Any, timeout: float, what: str, logs: list[Path]) -> None:
    deadline = time.monotonic() + timeout
    while not ok():
        if time.monotonic() > deadline:
            tails = "\n".join(p.read_text(errors="replace")[-3000:] for p in logs if p.exists())
            raise AssertionError(f"timed out waiting for {what}\n{tails}")
        time.sleep(0.5)


def test_a_live_study_survives_its_driver_and_runs_every_trial_once(tmp_path, monkeypatch):
    pytest.importorskip("ray")
    pytest.importorskip("optuna")
    from optuna.trial import TrialState

    from pollux.cluster import server
    from pollux.cluster.backends import processes, rayhost
    from pollux.cluster.client import PolluxClient
    from pollux.hpo import attrs

    assert shutil.which("sleep"), "the busy jobs run sleep"
    for name, value in RAY_ENV.items():
        monkeypatch.setenv(name, value)
    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / "space.yaml").write_text(SPACE)
    state = tmp_path / "state"
    first_log, second_log = workdir / "driver-1.log", workdir / "driver-2.log"
    t0 = time.monotonic()
    timeline: list[str] = []

    def mark(what: str) -> None:
        timeline.append(f"{time.monotonic() - t0:6.1f}s  {what}")

    info = server.start(state, local_nodes=1, gpus_per_node=3, policy="pollux", interval_s=3.0,
                        stop_grace_s=20.0, timeout_s=180)
    mark("service up (1 node x 3 GPU slots, pollux policy)")
    first: subprocess.Popen[bytes] | None = None
    second: subprocess.Popen[bytes] | None = None
    try:
        with PolluxClient(info.url, info.token) as client:
            busy = {"entrypoint": shutil.which("sleep"), "args": [str(BUSY_S)], "working_dir": str(workdir),
                    "init_batch_size": 1, "max_replicas": 1, "preemptible": False}
            ids = [client.submit(busy, name=f"busy-{i}")["id"] for i in range(3)]
            wait_for(lambda: all(client.job(i)["state"] == "running" for i in ids), 120,
                     "the busy jobs running", [])
        mark(f"3 busy jobs hold the 3 GPUs for {BUSY_S} s")
        first = driver(state, workdir, first_log)

        def one_done_one_running() -> bool:
            if not (workdir / "hpo.db").exists():
                return False
            try:
                now = trials(workdir)
            except Exception:                    # the study is not made yet
                return False
            done = [t for t in now if t.state.is_finished()]
            # A trial submitted since (its job known, nothing reported yet) runs for many seconds
            # more: the second driver must adopt it. (One further along may end before the kill.)
            fresh = [t for t in now if t.state == TrialState.RUNNING and attrs.JOB in t.user_attrs
                     and not t.intermediate_values]
            return bool(done) and bool(fresh)

        wait_for(one_done_one_running, STUDY_TIMEOUT_S, "a finished and a fresh running trial", [first_log])
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
        before = {t.number: t.state.name for t in trials(workdir)}
        mark(f"driver 1 killed (SIGKILL); trials then: {before}")
        assert "RUNNING" in before.values() and "COMPLETE" in before.values(), before

        second = driver(state, workdir, second_log)
        status = second.wait(timeout=STUDY_TIMEOUT_S)
        mark(f"driver 2 exited with {status}")
        output = second_log.read_text(errors="replace")
        assert status == 0, output[-4000:]
        assert "adopted" in output, output[-4000:]

        with PolluxClient(info.url, info.token) as client:
            jobs = [j for j in client.jobs() if j["name"].startswith(f"{STUDY}-t")]
            details = {j["id"]: client.job(j["id"]) for j in jobs}
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
        report = server.stop(state, timeout_s=60)
        mark("service stopped")
    assert not rayhost.cluster_processes(state), "processes of the embedded cluster left running"
    assert not processes.pid_alive(info.service_pid)
    assert report["was_running"]

    study = trials(workdir)
    assert [t.number for t in study] == list(range(TRIALS))
    by_name = {j["name"]: j for j in jobs}
    assert len(by_name) == len(jobs) == TRIALS, sorted(j["name"] for j in jobs)   # one job per trial
    states = {}
    for t in study:
        assert t.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL), t
        assert set(t.params) == {"lr", "momentum", "weight_decay"}, t.params
        job = by_name[f"{STUDY}-t{t.number}"]
        assert t.user_attrs[attrs.JOB] == job["id"]
        assert job["state"] in ("succeeded", "failed", "cancelled"), job
        spec_args = details[job["id"]]["spec"]["args"]
        assert spec_args[spec_args.index("--lr") + 1] == repr(t.params["lr"])
        if t.state == TrialState.FAIL:
            assert t.user_attrs[attrs.FAILURE], t.user_attrs
        else:
            assert t.intermediate_values, t
        if t.state == TrialState.COMPLETE:
            assert t.value == t.user_attrs[attrs.LAST_VALUE] == t.intermediate_values[t.last_step]
            assert job["state"] == "succeeded"
            assert t.last_step == EPOCHS - 1
        if t.state == TrialState.PRUNED:
            assert job["state"] == "cancelled"
        states[t.number] = t.state.name
    moved = [d["name"] for d in details.values()
             if any(tr["to_state"] == "rescaling" for tr in d["transitions"])
             or len([a for a in d["allocation_history"] if a["allocation"]]) >= 2]
    assert moved, "no trial's job was re-allocated"
    mark(f"checked: trials {states}; re-allocated: {sorted(moved)}")
    print("\nhpo live timeline:\n" + "\n".join(timeline))

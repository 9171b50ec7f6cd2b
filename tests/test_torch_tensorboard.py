"""The agent's scalars in TensorBoard event files (issue 35), read back with TensorBoard's own reader.

* The digits example on 2 gloo replicas with ``--tensorboard-dir``: one event file (rank 0's), every
  per-step scalar with one point per optimiser step, every per-decision scalar with the count the run
  logged and the batch sizes it ran.
* Naming a folder without TensorBoard installed is an ``ImportError`` saying what to install, before
  the process group exists; bad folders are errors naming the field.
* A script's own ``SummaryWriter`` keeps its events beside the agent's.
* Under the service: the launcher gives every replica ``POLLUX_TENSORBOARD_DIR`` beside the job's
  checkpoint folder and creates it with the same owner and modes; the job detail names it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pwd
import re
import socket
import stat
import subprocess
import sys
import tempfile
from itertools import groupby
from pathlib import Path
from typing import Any

import pytest
import torch

import pollux.torch as ptorch
from pollux.contract import ENV_CHECKPOINT_DIR, ENV_TENSORBOARD_DIR
from pollux.torch.context import get_context
from pollux.torch.env import AgentEnv
from pollux.torch.tensorboard import (
    DECISION_SCALARS,
    NAMESPACE,
    STEP_SCALARS,
    ScalarLog,
    StepScalars,
    with_tensorboard_dir,
)

needs_tensorboard = pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None,
                                       reason="needs the tensorboard package (make install)")
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (chown to another user)")

ROOT = Path(__file__).resolve().parents[1]
TRAIN = ROOT / "examples" / "digits" / "train.py"
TIMEOUT = 240
LOGGED = re.compile(r"TensorBoard: (\d+) step points and (\d+) decision points in (\S+)")


def read_scalars(folder: Path) -> dict[str, list[Any]]:
    """Every scalar of the event files in ``folder``, every point kept, by TensorBoard's own reader."""
    from tensorboard.backend.event_processing import event_accumulator

    acc = event_accumulator.EventAccumulator(str(folder), size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    return {tag: acc.Scalars(tag) for tag in acc.Tags()["scalars"]}


def tags(names: tuple[str, ...]) -> set[str]:
    return {f"{NAMESPACE}/{name}" for name in names}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@needs_tensorboard
def test_digits_on_two_replicas_writes_every_scalar_once_per_step_or_decision(tmp_path: Path) -> None:
    board = tmp_path / "board"
    torchrun = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                "GROUP_RANK")
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLLUX_") and k not in torchrun}
    env["OMP_NUM_THREADS"] = "1"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
           f"--master_port={free_port()}", str(TRAIN), "--epochs", "2", "--refit-interval", "0.3",
           "--tensorboard-dir", str(board)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    (line,) = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    out = json.loads(line)
    assert out["replicas"] == 2 and out["epochs"] == 2
    logged = LOGGED.findall(proc.stderr)
    assert len(logged) == 1, proc.stderr[-4000:]            # rank 0 alone writes, and says so once
    step_points, decision_points = int(logged[0][0]), int(logged[0][1])
    assert Path(logged[0][2]) == board
    assert len(list(board.glob("events.out.tfevents.*"))) == 1

    scalars = read_scalars(board)
    assert set(scalars) == tags(STEP_SCALARS) | tags(DECISION_SCALARS)
    steps = out["steps"]
    assert step_points == steps
    for name in STEP_SCALARS:                   # one point per optimiser step, at steps 1 … N
        assert [e.step for e in scalars[f"{NAMESPACE}/{name}"]] == list(range(1, steps + 1)), name
    assert {e.value for e in scalars["pollux/replicas"]} == {2.0}
    assert scalars["pollux/progress"][-1].value == pytest.approx(out["progress"], rel=1e-6)
    assert all(e.value > 0 for e in scalars["pollux/step_time_measured"])
    assert all(e.value > 0 for e in scalars["pollux/lr_factor"])
    assert all(e.value >= 1.0 - 1e-6 for e in scalars["pollux/gain"])

    batch = scalars["pollux/batch_size"]
    local = scalars["pollux/local_bsz"]
    accum = scalars["pollux/accumulation_steps"]
    assert len(batch) == len(local) == len(accum) == decision_points >= out["epochs"]
    assert batch[0].step == 0 and batch[-1].step <= steps
    assert [e.step for e in batch] == sorted(e.step for e in batch)
    assert [e.step for e in local] == [e.step for e in accum] == [e.step for e in batch]
    for b, m, s in zip(batch, local, accum, strict=True):
        assert b.value == 2 * m.value * (s.value + 1)
    ran = [int(size) for size, _ in groupby(e.value for e in batch)]
    assert ran in (out["batch_sizes"], [*out["batch_sizes"], out["final_batch_size"]]), (ran, out)
    predicted = scalars["pollux/step_time_predicted"]      # at the decisions made with a throughput model
    assert 1 <= len(predicted) < decision_points and all(e.value > 0 for e in predicted)
    assert {e.step for e in predicted} <= {e.step for e in batch}


def test_without_tensorboard_a_folder_is_an_import_error_before_the_group_exists(agent, tmp_path: Path):
    import torch.distributed as dist

    agent.setitem(sys.modules, "tensorboard", None)         # as if it were not installed
    with pytest.raises(ImportError, match=r"pip install 'pollux\[tensorboard\]'"):
        ptorch.init_process_group("gloo", tensorboard_dir=tmp_path / "board")
    agent.setenv(ENV_TENSORBOARD_DIR, str(tmp_path / "board"))
    with pytest.raises(ImportError, match=ENV_TENSORBOARD_DIR):
        ptorch.init_process_group("gloo")
    assert not dist.is_initialized() and not (tmp_path / "board").exists()
    agent.delenv(ENV_TENSORBOARD_DIR)
    ptorch.init_process_group("gloo")                       # no folder: TensorBoard is not needed
    assert not get_context().scalar_log.enabled


@needs_tensorboard
def test_folders_are_checked_and_the_argument_wins_over_the_variable(tmp_path: Path) -> None:
    env = AgentEnv(tensorboard_dir=str(tmp_path / "from-env"))
    assert with_tensorboard_dir(env, tmp_path / "mine").tensorboard_dir == str(tmp_path / "mine")
    assert with_tensorboard_dir(env, None).tensorboard_dir == str(tmp_path / "from-env")
    with pytest.raises(TypeError, match="tensorboard_dir: expected a folder path"):
        with_tensorboard_dir(env, 3)                        # type: ignore[arg-type]
    with pytest.raises(ValueError, match="tensorboard_dir: expected a folder path"):
        with_tensorboard_dir(env, " ")
    (tmp_path / "a-file").write_text("")
    with pytest.raises(ValueError, match=f"{ENV_TENSORBOARD_DIR}: .*a-file exists and is not a folder"):
        with_tensorboard_dir(AgentEnv(tensorboard_dir=str(tmp_path / "a-file")), None)
    quiet = ScalarLog(tmp_path / "other-rank", writer=False)   # the other ranks write nothing
    quiet.write_step(StepScalars(1, 1.0, 1.0, 2.0, 1.0, 0.01, 2))
    quiet.close()
    assert not quiet.enabled and quiet.step_points == 0 and not (tmp_path / "other-rank").exists()


@needs_tensorboard
def test_a_scripts_own_summary_writer_keeps_its_events_beside_the_agents(agent, tmp_path: Path) -> None:
    from torch.utils.tensorboard import SummaryWriter

    mine = SummaryWriter(str(tmp_path / "mine"))               # the script's own, made first
    torch.manual_seed(0)
    x, y = torch.randn(64, 4), torch.randn(64, 1)
    net = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    ptorch.init_process_group("gloo", tensorboard_dir=tmp_path / "agent")
    model = ptorch.AdaptiveDataParallel(net, opt)
    loader = ptorch.AdaptiveDataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8, shuffle=True)
    for _ in ptorch.remaining_epochs_until(2):
        for xb, yb in loader:
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            loss.backward()
            opt.step()
            mine.add_scalar("train/loss", loss.item(), model.steps)
    mine.close()
    log = get_context().scalar_log
    log.close()
    assert model.steps == 16 and log.step_points == 16               # 2 epochs of 8 steps

    theirs = read_scalars(tmp_path / "mine")
    assert set(theirs) == {"train/loss"} and [e.step for e in theirs["train/loss"]] == list(range(1, 17))
    ours = read_scalars(tmp_path / "agent")
    every = tags(STEP_SCALARS) | tags(DECISION_SCALARS)
    assert every - {"pollux/step_time_predicted"} <= set(ours) <= every
    assert [e.step for e in ours["pollux/progress"]] == list(range(1, 17))
    decided = [e.step for e in ours["pollux/batch_size"]]
    assert len(decided) == log.decision_points
    assert [s for s in decided if s in (0, 8)] == [0, 8]            # each epoch's start, and the refits
    assert {e.value for e in ours["pollux/batch_size"]} == {8.0}


# ------------------------------------------------------------------------------------------ the service


def test_the_launcher_sets_the_folder_beside_the_checkpoints(tmp_path: Path) -> None:
    from pollux.cluster.api.answers import tensorboard_dir
    from pollux.cluster.backends import launcher
    from pollux.cluster.state.spec import JobSpec

    spec = JobSpec.from_dict({"entrypoint": "train.py", "init_batch_size": 8})
    ckpt = tmp_path / "checkpoints" / "job-1"
    launches = launcher.build_launches(spec, {"a": 2, "b": 1}, command=["x"], log_root=tmp_path,
                                       base_env={ENV_CHECKPOINT_DIR: str(ckpt)})
    expected = str(tmp_path / "tensorboard" / "job-1")
    assert [s.env[ENV_TENSORBOARD_DIR] for s in launches] == [expected] * 3
    assert tensorboard_dir(tmp_path, "job-1") == expected and tensorboard_dir(None, "job-1") is None
    named = {ENV_CHECKPOINT_DIR: str(ckpt), ENV_TENSORBOARD_DIR: "/elsewhere"}
    given = launcher.build_launches(spec, {"a": 1}, command=["x"], log_root=tmp_path, base_env=named)
    assert given[0].env[ENV_TENSORBOARD_DIR] == "/elsewhere"
    bare = launcher.build_launches(spec, {"a": 1}, command=["x"], log_root=tmp_path, base_env={})
    assert ENV_TENSORBOARD_DIR not in bare[0].env
    launcher.prepare_checkpoint_dir(ckpt, None)
    assert ckpt.is_dir() and Path(expected).is_dir()
    assert stat.S_IMODE((tmp_path / "tensorboard").stat().st_mode) == 0o700


def test_a_launched_job_gets_its_folder_and_the_detail_names_it(tmp_path: Path) -> None:
    from fake_backend import FakeBackend, FakeClock
    from pollux.cluster.api.answers import tensorboard_dir
    from pollux.cluster.control.controller import Controller, ControllerConfig
    from pollux.cluster.control.scheduler import Scheduler
    from pollux.cluster.state.store import JobStore

    class Plan:
        name = "scripted"

        def decide(self, jobs, *args, **kwargs):
            return {v.id: {"node-0": 2} for v in jobs}, None

    clock = FakeClock()
    backend = FakeBackend({"node-0": 2})
    store = JobStore(tmp_path / "jobs.db")
    try:
        scheduler = Scheduler(store, policy_name="fifo")
        scheduler.policy = Plan()   # type: ignore[assignment]
        config = ControllerConfig(state_dir=tmp_path, interval_s=3600.0)
        controller = Controller(store, backend, scheduler, config, clock=clock, monotonic=clock)
        store.submit({"entrypoint": "train.py", "init_batch_size": 8}, job_id="tb", now=clock())
        controller.request_round()
        for _ in range(20):
            clock.advance(0.5)
            controller.tick()
            if backend.requested("tb"):
                break
        (launches,) = backend.requested("tb")
        folder = tensorboard_dir(tmp_path, "tb")
        assert [s.env[ENV_TENSORBOARD_DIR] for s in launches] == [folder, folder]
        assert folder is not None and Path(folder).is_dir()
        assert Path(launches[0].env[ENV_CHECKPOINT_DIR]).parent.parent == Path(folder).parent.parent
    finally:
        store.close()


@needs_root
def test_run_as_hands_the_folder_to_the_user_in_a_passable_parent() -> None:
    from pollux.cluster.backends import launcher

    nobody = pwd.getpwnam("nobody")
    base = Path(tempfile.mkdtemp(prefix="pollux-tb-"))
    try:
        base.chmod(0o755)
        state = base / "state"
        state.mkdir()
        launcher.prepare_run_as(state, "nobody")
        assert stat.S_IMODE((state / "tensorboard").stat().st_mode) == 0o711
        ckpt = state / "checkpoints" / "job-1"
        old = state / "tensorboard" / "job-1"
        old.mkdir()
        (old / "events.out.tfevents.1").write_text("from a run as root")
        launcher.prepare_checkpoint_dir(ckpt, "nobody")
        assert old.stat().st_uid == nobody.pw_uid and stat.S_IMODE(old.stat().st_mode) == 0o700
        assert (old / "events.out.tfevents.1").stat().st_uid == nobody.pw_uid
        assert stat.S_IMODE((state / "tensorboard").stat().st_mode) == 0o711
    finally:
        import shutil
        shutil.rmtree(base, ignore_errors=True)

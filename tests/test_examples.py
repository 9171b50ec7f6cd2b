"""The digits example (examples/digits/train.py) and the agent-overhead benchmark, run as a user runs them.

Each test starts the script in a subprocess (alone, or under torchrun with two gloo replicas on
127.0.0.1) with an environment stripped of POLLUX_* and torchrun variables, and checks the JSON
line rank 0 prints at the end, and the batch-size decisions the library logs on stderr.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("sklearn")

#: Long (half a minute or more): `pytest -m "not slow"` leaves it out.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
TRAIN = ROOT / "examples" / "digits" / "train.py"
BENCH = ROOT / "benchmarks" / "agent_overhead.py"
BIN = Path(sys.executable).parent
TIMEOUT = 300
RESULT_KEYS = {"test_accuracy", "batch_sizes", "epochs", "progress", "replicas"}
N_TRAIN, M0 = 1347, 16
TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                 "GROUP_RANK")
CHANGE = re.compile(r"pollux\.torch INFO batch size (\d+) -> (\d+) .*predicted goodput ([+-][0-9.]+)%")


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLLUX_") and k not in TORCHRUN_VARS}
    env.update(OMP_NUM_THREADS="1", **extra)
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def torchrun(nproc: int) -> list[str]:
    torchrun_bin = BIN / "torchrun"
    head = [str(torchrun_bin)] if torchrun_bin.exists() else [sys.executable, "-m", "torch.distributed.run"]
    return [*head, f"--nproc_per_node={nproc}", "--master_addr=127.0.0.1", f"--master_port={free_port()}"]


def run(cmd: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, cwd=ROOT, env=env or clean_env(), capture_output=True, text=True,
                          timeout=TIMEOUT)
    assert proc.returncode == 0, f"{cmd} exited with {proc.returncode}:\n{proc.stderr[-4000:]}"
    return proc


def result_line(stdout: str) -> dict:
    lines = [ln for ln in stdout.splitlines() if ln.startswith("{")]
    assert len(lines) == 1, f"expected one JSON line (rank 0 only), got:\n{stdout}"
    out = json.loads(lines[0])
    assert RESULT_KEYS <= set(out), out
    return out


def check_batch_sizes(out: dict, max_batch: int = 512) -> None:
    sizes = out["batch_sizes"]
    assert sizes and sizes[0] == M0, sizes
    assert all(M0 <= b <= max_batch for b in sizes), sizes
    assert all(a != b for a, b in itertools.pairwise(sizes)), sizes   # distinct neighbours


def check_progress(out: dict, epochs: int) -> None:
    """An epoch is N/M0 steps of progress, whatever the batch size was.

    An epoch ends at the first step whose progress reaches ``(epoch + 1)·N/M0``, so the total can
    overshoot by the progress of the last step, which is at most its batch over M0 (gain ≤ scale).
    """
    target = epochs * N_TRAIN / M0
    largest = max(out["batch_sizes"])
    assert target * 0.999 <= out["progress"] <= target + largest / M0 + 1e-6, \
        (out["progress"], target, largest)


def check_train_metrics(out: dict) -> None:
    """The last epoch's training loss and accuracy, and the examples of all epochs, over all replicas.

    The example sums them with ``pollux.torch.Accumulator``. A step's progress is at most its examples
    over M0 (gain(S) ≤ S), so the examples trained on are at least M0·progress, less the fewer than K
    leftovers each pass skips; rank 0's share alone would be about 1/K of that, and an epoch whose
    first part was lost at a restart would fall short by that part.
    """
    assert 0 < out["train_loss"] < 1.0 and 0.5 < out["train_accuracy"] <= 1.0, out
    examples, replicas = out["train_examples"], out["replicas"]
    skipped = (replicas - 1) * (examples // N_TRAIN + 2)
    assert examples >= M0 * out["progress"] - skipped - 1e-6, (examples, out["progress"])
    # The counted examples are the sampler's drawn positions, less the skipped leftovers: none twice.
    assert 0 <= out["stream_position"] - examples <= skipped, (examples, out["stream_position"])


def test_digits_default_run_alone_reaches_95_percent():
    """The full default run (30 epochs, adaptive batch) alone: ≥ 95 % test accuracy."""
    start = time.monotonic()
    proc = run([sys.executable, str(TRAIN)])
    out = result_line(proc.stdout)
    assert out["replicas"] == 1 and out["epochs"] == 30
    assert out["test_accuracy"] >= 0.95, out
    check_batch_sizes(out)
    check_progress(out, 30)
    check_train_metrics(out)
    assert out["train_accuracy"] >= 0.95, out
    assert time.monotonic() - start < 120


def test_digits_torchrun_grows_the_batch_with_logged_gains():
    """Two replicas: the batch grows, and every change is logged with a predicted gain ≥ 5 %."""
    proc = run([*torchrun(2), str(TRAIN), "--epochs", "12", "--refit-interval", "0.5"])
    out = result_line(proc.stdout)
    assert out["replicas"] == 2 and out["epochs"] == 12
    assert out["test_accuracy"] >= 0.9, out
    check_batch_sizes(out)
    sizes = out["batch_sizes"]
    assert len(sizes) >= 2, f"the batch size never changed:\n{proc.stderr[-3000:]}"
    changes = [(int(a), int(b), float(g)) for a, b, g in CHANGE.findall(proc.stderr)]
    assert [(a, b) for a, b, _ in changes] == list(itertools.pairwise(sizes)), proc.stderr[-3000:]
    assert all(g >= 5.0 for _, _, g in changes), changes
    check_progress(out, 12)
    check_train_metrics(out)      # summed over both replicas, not rank 0's half


def test_digits_sigterm_checkpoints_and_resumes_on_two_replicas(tmp_path):
    """Alone with POLLUX_CHECKPOINT_DIR: SIGTERM → exit 143; the job then finishes under torchrun."""
    env = clean_env(POLLUX_CHECKPOINT_DIR=str(tmp_path / "ckpt"))
    cmd = [sys.executable, str(TRAIN), "--epochs", "8", "--refit-interval", "0.5"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        seen = []
        for line in proc.stderr:           # wait until a few epochs are done
            seen.append(line)
            if "digits INFO epoch 2:" in line:
                proc.send_signal(signal.SIGTERM)
                break
        rest_out, rest_err = proc.communicate(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 143, "".join(seen) + rest_err
    assert "{" not in rest_out          # preempted: no final result
    assert list((tmp_path / "ckpt").iterdir())

    resumed = run([*torchrun(2), str(TRAIN), "--epochs", "8", "--refit-interval", "0.5"], env=env)
    assert "digits INFO resumed at epoch" in resumed.stderr
    out = result_line(resumed.stdout)
    assert out["replicas"] == 2 and out["epochs"] == 8 and out["runs"] == 2
    assert out["test_accuracy"] >= 0.9, out
    check_batch_sizes(out)
    check_progress(out, 8)
    check_train_metrics(out)      # the epoch interrupted by SIGTERM kept its first part

    again = run([sys.executable, str(TRAIN), "--epochs", "8"], env=env)     # finished: just reports
    out2 = result_line(again.stdout)
    assert out2["runs"] == 3 and out2["progress"] == pytest.approx(out["progress"])
    assert out2["test_accuracy"] == pytest.approx(out["test_accuracy"])
    assert out2["train_loss"] == out["train_loss"] and out2["train_examples"] == out["train_examples"]


def test_agent_overhead_benchmark_smoke():
    proc = run([sys.executable, str(BENCH), "--blocks", "1", "--steps", "3", "--warmup", "1", "--json"])
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    for key in ("overhead", "step_time_ddp_s", "step_time_adp_s", "block_medians_ddp_s",
                "block_medians_adp_s", "machine", "replicas", "device"):
        assert key in out, key
    assert out["replicas"] == 2 and out["device"] == "cpu"
    assert len(out["block_medians_ddp_s"]) == len(out["block_medians_adp_s"]) == 1
    assert out["step_time_ddp_s"] > 0 and out["step_time_adp_s"] > 0
    assert out["overhead"] == pytest.approx(out["step_time_adp_s"] / out["step_time_ddp_s"] - 1)
    assert out["adp_optimizer_steps"] == 1 + 3       # warm-up and timed steps, statistics every step
    assert out["max_param_diff"] < 1e-4               # both copies did the same training


def test_digits_width_widens_the_convolutions_and_rejects_zero():
    """``--width W`` multiplies the convolution channels (1: the default network, unchanged); a width
    below 1 is refused by name before any training."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("digits_example_width", TRAIN)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    default, wide = example.DigitsCNN(), example.DigitsCNN(4)
    assert (default.conv1.out_channels, default.conv2.out_channels) == (16, 32)
    assert (wide.conv1.out_channels, wide.conv2.out_channels) == (64, 128)
    assert sum(p.numel() for p in default.parameters()) < 40_000
    with pytest.raises(ValueError, match="width"):
        example.DigitsCNN(0)
    proc = subprocess.run([sys.executable, str(TRAIN), "--width", "0"], capture_output=True, text=True,
                          env=clean_env(), timeout=TIMEOUT)
    assert proc.returncode != 0 and "--width: must be >= 1" in proc.stderr

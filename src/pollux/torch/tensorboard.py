"""The agent's scalars as TensorBoard event files, so a run can be watched in TensorBoard (issue 35).

When a folder is given — ``init_process_group(tensorboard_dir=...)`` or ``POLLUX_TENSORBOARD_DIR``,
which the service sets for every replica — rank 0 writes what the agent measures and decides under
the ``pollux/`` namespace:

* per optimiser step (one point each, at the step's number ``model.steps``): ``pollux/progress``,
  ``pollux/gain``, ``pollux/pgns``, ``pollux/lr_factor``, ``pollux/step_time_measured`` and
  ``pollux/replicas``;
* per batch-size decision (one point each time the loader fixes its configuration: at the start of
  every epoch, at every periodic refit and after an out-of-memory error, at the number of updates
  made so far): ``pollux/batch_size``, ``pollux/local_bsz``, ``pollux/accumulation_steps`` and, once
  a throughput model exists, ``pollux/step_time_predicted``.

The writer is torch's ``torch.utils.tensorboard.writer.FileWriter`` — the event file writer under
``SummaryWriter`` — opened at the first point (so a run that never steps leaves no file), flushed
every :data:`FLUSH_SECS` seconds and when the process ends. Each step's (or decision's) scalars go
into one event: TensorBoard reads them as separate scalars all the same, and the writer's thread,
which checksums every event in Python, spends about 170 µs of CPU per step instead of about 720 µs
with one ``add_scalar`` per value (measured on the 2-core development VM). It has a folder of its own
and no state shared with other writers: a script's own ``SummaryWriter`` on another folder keeps
working beside it. TensorBoard is an optional dependency; naming a folder
without it installed is an ``ImportError`` saying what to install, raised before training starts
rather than at the first point.
"""

from __future__ import annotations

import atexit
import dataclasses
import importlib
import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pollux.contract import ENV_TENSORBOARD_DIR
from pollux.torch.api import BatchConfig
from pollux.torch.decisions import predicted_step_time

if TYPE_CHECKING:
    from pollux.torch.context import AgentContext
    from pollux.torch.env import AgentEnv

logger = logging.getLogger("pollux.torch")

__all__ = ["DECISION_SCALARS", "FLUSH_SECS", "NAMESPACE", "STEP_SCALARS", "DecisionScalars", "ScalarLog",
           "StepScalars", "log_decision", "log_step", "require_tensorboard", "with_tensorboard_dir"]

#: Every tag the agent writes starts with this and a slash, apart from the tags a script writes.
NAMESPACE = "pollux"
#: The scalars written once per optimiser step, and once per batch-size decision (tags without the
#: namespace).
STEP_SCALARS: tuple[str, ...] = ("progress", "gain", "pgns", "lr_factor", "step_time_measured", "replicas")
DECISION_SCALARS: tuple[str, ...] = ("batch_size", "local_bsz", "accumulation_steps", "step_time_predicted")
#: Seconds between flushes of the event file while the job runs: a live TensorBoard lags this much.
FLUSH_SECS = 10.0
#: Events the writer's thread may have queued before a new point waits for it.
MAX_QUEUE = 100
#: What to install when TensorBoard is missing.
INSTALL_HINT = "pip install 'pollux[tensorboard]'"


@dataclass(frozen=True, slots=True)
class StepScalars:
    """What one optimiser step leaves in TensorBoard; ``step`` is the number of updates it completes.

    ``step_time_measured`` is the loader's timing of the step (its micro-steps, from the moment the
    script holds a batch to the moment it asks for the next), the quantity the throughput model fits.
    """

    step: int
    progress: float
    gain: float
    pgns: float
    lr_factor: float
    step_time_measured: float
    replicas: int

    def values(self) -> dict[str, float]:
        return {name: float(getattr(self, name)) for name in STEP_SCALARS}


@dataclass(frozen=True, slots=True)
class DecisionScalars:
    """The batch configuration a decision left in force, at ``step`` updates made so far.

    ``step_time_predicted`` is the throughput model's step time for that configuration (None before
    the first fit: the point is then left out of that one scalar).
    """

    step: int
    batch_size: int
    local_bsz: int
    accumulation_steps: int
    step_time_predicted: float | None

    def values(self) -> dict[str, float]:
        out = {name: getattr(self, name) for name in DECISION_SCALARS}
        return {name: float(value) for name, value in out.items() if value is not None}


def require_tensorboard() -> None:
    """Raise ``ImportError`` saying what to install unless TensorBoard can be imported."""
    try:
        importlib.import_module("tensorboard")
        importlib.import_module("torch.utils.tensorboard")
    except ImportError as exc:
        raise ImportError(f"TensorBoard scalars (tensorboard_dir or {ENV_TENSORBOARD_DIR}) need the "
                          f"tensorboard package, which is not installed: {INSTALL_HINT}") from exc


def with_tensorboard_dir(env: AgentEnv, tensorboard_dir: str | os.PathLike[str] | None) -> AgentEnv:
    """``env`` with the script's ``tensorboard_dir``, which wins over ``POLLUX_TENSORBOARD_DIR``.

    Checks now, before the process group exists, that TensorBoard is installed when either names a
    folder, and that the folder is not a file: a job fails at its start, not at its first step.
    """
    if tensorboard_dir is not None:
        path = os.fspath(tensorboard_dir) if isinstance(tensorboard_dir, str | os.PathLike) else None
        if not isinstance(path, str):
            raise TypeError(f"tensorboard_dir: expected a folder path, got {tensorboard_dir!r}")
        if not path.strip():
            raise ValueError("tensorboard_dir: expected a folder path, got an empty string")
        env = dataclasses.replace(env, tensorboard_dir=path)
    if env.tensorboard_dir is not None:
        require_tensorboard()
        if os.path.exists(env.tensorboard_dir) and not os.path.isdir(env.tensorboard_dir):
            source = "tensorboard_dir" if tensorboard_dir is not None else ENV_TENSORBOARD_DIR
            raise ValueError(f"{source}: {env.tensorboard_dir} exists and is not a folder")
    return env


class ScalarLog:
    """Rank 0's TensorBoard writer of the agent's scalars (see the module docstring).

    ``writer`` is False on the other ranks: they keep the same calls and write nothing. Counts of the
    points written (``step_points``, ``decision_points``) are logged when the writer closes.
    """

    def __init__(self, log_dir: str | os.PathLike[str] | None, *, writer: bool = True,
                 flush_secs: float = FLUSH_SECS) -> None:
        self.log_dir = None if log_dir is None else os.fspath(log_dir)
        if self.log_dir is not None:
            require_tensorboard()
        self.enabled = self.log_dir is not None and writer
        self.flush_secs = float(flush_secs)
        self.step_points = 0
        self.decision_points = 0
        self._writer: Any = None
        self._exit_hook = False

    def write_step(self, record: StepScalars) -> None:
        """One point per per-step scalar, at ``record.step``."""
        if self.enabled:
            self._write(record.values(), record.step)
            self.step_points += 1

    def write_decision(self, record: DecisionScalars) -> None:
        """One point per per-decision scalar, at ``record.step``."""
        if self.enabled:
            self._write(record.values(), record.step)
            self.decision_points += 1

    def _write(self, values: dict[str, float], step: int) -> None:
        from tensorboard.compat.proto.summary_pb2 import Summary

        summary = Summary(value=[Summary.Value(tag=f"{NAMESPACE}/{name}", simple_value=value)
                                 for name, value in values.items()])
        self._open().add_summary(summary, int(step))

    def _open(self) -> Any:
        if self._writer is None:
            from torch.utils.tensorboard.writer import FileWriter

            self._writer = FileWriter(self.log_dir, max_queue=MAX_QUEUE, flush_secs=self.flush_secs)
            if not self._exit_hook:       # a context that is never shut down still flushes at exit
                atexit.register(self.close)
                self._exit_hook = True
        return self._writer

    def flush(self) -> None:
        """Write what is queued to the event file now."""
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        """Flush and close the event file (a later point opens a new one); idempotent."""
        writer, self._writer = self._writer, None
        if writer is None:
            return
        writer.close()
        logger.info("TensorBoard: %d step points and %d decision points in %s", self.step_points,
                    self.decision_points, self.log_dir)


def log_step(ctx: AgentContext, seconds: float) -> None:
    """The per-step scalars after an optimiser step the loader timed at ``seconds`` (rank 0)."""
    adp = ctx.adp
    if not ctx.scalar_log.enabled or adp is None:
        return
    ctx.scalar_log.write_step(StepScalars(step=adp.steps, progress=adp.progress, gain=adp.gain,
                                          pgns=adp.pgns, lr_factor=adp.lr_factor,
                                          step_time_measured=float(seconds), replicas=ctx.replicas))


def log_decision(ctx: AgentContext, config: BatchConfig) -> None:
    """The per-decision scalars of the configuration the loader now runs (rank 0)."""
    if not ctx.scalar_log.enabled:
        return
    params = ctx.fit_params
    predicted = None if params is None else predicted_step_time(params, ctx.nodes, config,
                                                                ctx.profiler.max_local_bsz())
    steps = ctx.adp.steps if ctx.adp is not None else 0
    ctx.scalar_log.write_decision(DecisionScalars(step=steps, batch_size=config.batch_size,
                                                  local_bsz=config.local_bsz,
                                                  accumulation_steps=config.accum_steps,
                                                  step_time_predicted=predicted))

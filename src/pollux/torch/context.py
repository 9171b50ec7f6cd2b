"""The agent's per-process context: what the model wrapper, the loader and the epoch loop share.

One :class:`AgentContext` exists per training process (created by :func:`init_process_group`, or on
first use). It holds the parsed environment, the checkpoint registry, the profiler and periodic
fitter, the hint reporter, the epoch counter, the SIGTERM flag and the *current step*: the loader
announces each optimiser step (its batch configuration and micro-steps) here, and the
:class:`~pollux.torch.parallel.AdaptiveDataParallel` wrapper reads it to know whether a backward pass
is an accumulation step or the synchronised one, how to average, and what scale the step runs at.
The context holds the wrapper and the loaders as the small protocols of :mod:`pollux.torch.api`
(``ModelWrapper``, ``BatchLoader``) and calls only their public methods.

Replicas agree on every decision that changes control flow (checkpoint-and-exit on SIGTERM, a refit,
an out-of-memory skip) through flags carried in one small all-reduce per step that the gradient hook
launches; the decisions themselves (batch configuration) are made by rank 0 and broadcast.
"""

from __future__ import annotations

import atexit
import datetime
import gc
import json
import logging
import os
import signal
import sys
import threading
from typing import Any

import torch
import torch.distributed as dist

from pollux.contract import PREEMPTED_EXIT_CODE
from pollux.goodput import ThroughputParams
from pollux.torch.api import BatchLoader, ModelWrapper, StepInfo, SyncOutcome
from pollux.torch.checkpoint import CheckpointStore, StateRegistry
from pollux.torch.env import AgentEnv, read_env
from pollux.torch.oom import is_oom
from pollux.torch.profiling import PeriodicFitter, StepProfiler
from pollux.torch.reporting import HintReporter
from pollux.torch.shares import BalanceReport
from pollux.torch.tensorboard import ScalarLog, with_tensorboard_dir

logger = logging.getLogger("pollux.torch")

#: Exit status after a checkpoint requested by SIGTERM: "preempted, resume me" (SPEC §8).
PREEMPT_EXIT_CODE = PREEMPTED_EXIT_CODE   # the agent–service contract (pollux.contract)
#: Seconds between refits of the throughput model (and hint reports), SPEC §3.
REFIT_INTERVAL_S = 30.0
#: Fault injection for tests: forward passes with a local batch above this raise a synthetic OOM.
ENV_FAULT_OOM_ABOVE = "POLLUX_FAULT_OOM_ABOVE"
#: Overrides the refit interval (seconds), for tests and experiments.
ENV_REFIT_INTERVAL = "POLLUX_REFIT_INTERVAL_S"
#: File in the checkpoint directory noting the local batch bound after a fatal out-of-memory error.
OOM_NOTE = "pollux-oom.json"
#: Fault injection for tests: ``MOMENT:N[,MOMENT:N...]`` sends this process SIGTERM at the N-th (1-based)
#: time it passes the named moment (see :data:`FAULT_MOMENTS`); ``POLLUX_FAULT_SIGTERM_RANK`` picks the
#: rank (default 0).
ENV_FAULT_SIGTERM = "POLLUX_FAULT_SIGTERM"
ENV_FAULT_SIGTERM_RANK = "POLLUX_FAULT_SIGTERM_RANK"
#: The moments at which a SIGTERM can be injected: inside a step (before a micro-step's forward
#: pass), during a checkpoint save, right after a batch-size change, during the step that ends an
#: epoch, and during a refit (between the fit and the decision).
FAULT_MOMENTS = ("step", "save", "change", "epoch_end", "refit")


class EpochState:
    """The epoch counter (checkpointed). ``driver_active`` while ``remaining_epochs_until`` runs."""

    def __init__(self) -> None:
        self.epoch = 0
        self.driver_active = False

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": int(self.epoch)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch = int(state["epoch"])


class _ProfileState:
    """Checkpointed profile: step-time records, the last fit, the most replicas seen — per GPU type.

    Step times measured on one GPU type say nothing exact about another, so a job restarted on
    another type (heterogeneous clusters, issue 13) starts a fresh profile there, as a new job
    would, and keeps the old type's records and fit aside (``ctx.other_types``): they come back if
    the job returns to that type, and the hints report the fit of every type (``types``). Without
    types (``POLLUX_GPU_TYPE`` unset) there is one profile, as before.
    """

    def __init__(self, ctx: AgentContext) -> None:
        self.ctx = ctx

    def state_dict(self) -> dict[str, Any]:
        fit = self.ctx.fit_params
        out: dict[str, Any] = {"profiler": self.ctx.profiler.state_dict(),
                               "fit": None if fit is None else fit.to_dict()}
        if self.ctx.env.gpu_type is not None or self.ctx.other_types:
            out["gpu_type"] = self.ctx.env.gpu_type
            out["other_types"] = dict(self.ctx.other_types)
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        others: dict[str, Any] = dict(state.get("other_types") or {})
        saved, current = state.get("gpu_type"), self.ctx.env.gpu_type
        mine: dict[str, Any] | None = {"profiler": state["profiler"], "fit": state.get("fit")}
        if saved != current:
            if saved is not None:
                others[saved] = mine           # the type it ran on: kept aside
            mine = others.pop(current, None) if current is not None else None
        self.ctx.other_types = others
        if mine is None:                       # a type it has not run on: a fresh profile
            return
        self.ctx.profiler.load_state_dict(mine["profiler"])
        fit = mine.get("fit")
        self.ctx.fit_params = None if fit is None else ThroughputParams.from_dict(fit)


class AgentContext:
    """Shared state of the agent in this process (see the module docstring)."""

    def __init__(self, env: AgentEnv, *, owns_process_group: bool = False) -> None:
        self.env = env
        self.owns_process_group = owns_process_group
        store = CheckpointStore(env.checkpoint_dir) if env.checkpoint_dir is not None else None
        self.registry = StateRegistry(store, clean=env.rank == 0)
        self.profiler = StepProfiler()
        interval = os.environ.get(ENV_REFIT_INTERVAL, "").strip()
        self.fitter = PeriodicFitter(float(interval) if interval else REFIT_INTERVAL_S)
        self.fit_params: ThroughputParams | None = None
        #: Profiles of the other GPU types the job has run on: {type: {"profiler": state, "fit": params}}.
        self.other_types: dict[str, dict[str, Any]] = {}
        self.reporter = HintReporter(env.scheduler_url, env.job_id, env.job_token)
        self.scalar_log = ScalarLog(env.tensorboard_dir, writer=self.rank == 0)   # TensorBoard, rank 0
        self.epoch_state = EpochState()
        self.registry.register("pollux_epoch", self.epoch_state)
        self.registry.register("pollux_profile", _ProfileState(self))
        #: The model wrapper (set by ``AdaptiveDataParallel``), the loaders in creation order and the
        #: one being iterated: used through their public protocols only (:mod:`pollux.torch.api`).
        self.adp: ModelWrapper | None = None
        self.loaders: list[BatchLoader] = []
        self.active_loader: BatchLoader | None = None
        self.step: StepInfo | None = None
        #: The latest LB-BSP state of the loader being iterated (None: balancing off), which the
        #: wrapper's ``to_scalars()`` shows.
        self.balance_report: BalanceReport | None = None
        self._next_sid = 0
        self.sigterm_requested = False
        self._prev_sigterm_handler: Any = None
        self._handler_installed = False
        self.oom_in_step = False
        above = os.environ.get(ENV_FAULT_OOM_ABOVE, "").strip()
        self.fault_oom_above: int | None = int(above) if above else None
        self._prev_excepthook: Any = None
        #: Called on every replica (in the same order) before each checkpoint save; they may run
        #: collectives, e.g. to fold per-replica metrics into rank 0's state (see ``Accumulator``).
        self.before_save: list[Any] = []
        self._faults = _parse_faults(os.environ.get(ENV_FAULT_SIGTERM, ""))
        self._fault_rank = int(os.environ.get(ENV_FAULT_SIGTERM_RANK, "0") or 0)
        self._fault_counts: dict[str, int] = {}
        if env.checkpointing:
            self._install_sigterm_handler()
            self._install_excepthook()

    # ---------------------------------------------------------------- identity

    def refit_throughput(self) -> None:
        """Refit the throughput model from the profiled steps (rank 0, at each refit); a failed fit
        keeps the previous model. The context owns the model: it is checkpointed with the profile."""
        fit = self.profiler.fit(previous=self.fit_params)
        self.fitter.mark()
        if fit is not None and fit.ok:
            self.fit_params = fit.params
        elif fit is not None:
            logger.warning("throughput fit failed, keeping the previous model: %s", fit.message)

    def type_hints(self, bounds: tuple[int, int]) -> dict[str, dict[str, Any]] | None:
        """The hints' ``types``: the fit of every other GPU type the job has run on (with these
        local batch bounds); None on an untyped cluster or before any other type."""
        if self.env.gpu_type is None:
            return None
        out = {t: {"throughput": entry["fit"], "local_bsz_bounds": list(bounds)}
               for t, entry in sorted(self.other_types.items()) if entry.get("fit") is not None}
        return out or None

    @property
    def rank(self) -> int:
        return dist.get_rank() if dist.is_initialized() else self.env.rank

    @property
    def replicas(self) -> int:
        return dist.get_world_size() if dist.is_initialized() else self.env.num_replicas

    @property
    def nodes(self) -> int:
        return max(min(self.env.num_nodes, self.replicas), 1)

    def collective_device(self) -> torch.device:
        if dist.is_initialized() and dist.get_backend() == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    # ---------------------------------------------------------------- signals

    def _install_sigterm_handler(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            logger.warning("not in the main thread: SIGTERM will not trigger a checkpoint")
            return

        def handler(signum: int, frame: Any) -> None:
            self.sigterm_requested = True

        self._prev_sigterm_handler = signal.signal(signal.SIGTERM, handler)
        self._handler_installed = True

    def _install_excepthook(self) -> None:
        """An out-of-memory error the agent could not absorb (in the backward pass, say) ends the
        process; before it does, the lowered local batch bound is noted in the checkpoint directory
        so that the restarted job does not run out of memory at the same local batch again."""
        previous = sys.excepthook

        def hook(exc_type: Any, exc: BaseException, tb: Any) -> None:
            try:
                if is_oom(exc):
                    self.note_oom_for_restart()
            except Exception:  # pragma: no cover - never hide the original error
                pass
            previous(exc_type, exc, tb)

        self._prev_excepthook = previous
        sys.excepthook = hook

    def note_oom_for_restart(self) -> int | None:
        """Record ``floor(m × 0.75)`` for the current local batch m in ``pollux-oom.json``."""
        loader, info = self.active_loader, self.step
        if (not self.env.checkpointing or loader is None or info is None or not info.managed
                or loader.user_max_local_bsz is not None):
            return None
        bound = int(info.local_bsz * 0.75)
        if bound < 1:
            return None
        path = os.path.join(str(self.env.checkpoint_dir), OOM_NOTE)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"max_local_bsz": bound, "local_bsz": info.local_bsz, "rank": self.rank}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        logger.error("out of memory at local batch size %d: the restarted job will use at most %d",
                     info.local_bsz, bound)
        return bound

    def oom_note(self) -> int | None:
        """The local batch bound noted by a previous run that died of an out-of-memory error."""
        if not self.env.checkpointing:
            return None
        try:
            with open(os.path.join(str(self.env.checkpoint_dir), OOM_NOTE), encoding="utf-8") as f:
                return int(json.load(f)["max_local_bsz"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def close(self) -> None:
        """Undo what the context installed (signal handler, excepthook); flush the reporter briefly."""
        if self._prev_excepthook is not None:
            sys.excepthook = self._prev_excepthook
            self._prev_excepthook = None
        if self._handler_installed:
            try:
                signal.signal(signal.SIGTERM, self._prev_sigterm_handler or signal.SIG_DFL)
            except (ValueError, TypeError):  # pragma: no cover - not the main thread
                pass
            self._handler_installed = False
        self.reporter.close(flush=True, timeout=2.0)
        self.scalar_log.close()

    def fault_point(self, moment: str) -> None:
        """Fault injection (tests): send this process SIGTERM at the configured passage of ``moment``."""
        if not self._faults or moment not in self._faults:
            return
        count = self._fault_counts.get(moment, 0) + 1
        self._fault_counts[moment] = count
        if count in self._faults[moment] and self.rank == self._fault_rank:
            logger.warning("fault injection: SIGTERM at %s #%d (rank %d)", moment, count, self.rank)
            os.kill(os.getpid(), signal.SIGTERM)

    # ---------------------------------------------------------------- steps

    def new_sid(self) -> int:
        sid = self._next_sid
        self._next_sid += 1
        return sid

    def begin_step(self, info: StepInfo) -> None:
        """Announce a step (loader or implicit); the model wrapper prepares its measurement."""
        self.step = info
        self.oom_in_step = False
        if self.adp is not None:
            self.adp.begin_step(info)

    def outgoing_flags(self) -> list[float]:
        """Flags this replica contributes to the step's all-reduce: [sigterm, refit due, oom]."""
        refit = 0.0
        # The first refit waits until both step times and gradient statistics exist.
        if (self.rank == 0 and self.active_loader is not None and len(self.profiler) > 0
                and (self.adp is None or self.adp.stats_ready) and self.fitter.due()):
            refit = 1.0
        return [1.0 if self.sigterm_requested else 0.0, refit, 1.0 if self.oom_in_step else 0.0]

    def finish_step(self) -> SyncOutcome:
        """Close the current step: agree on the flags; skip the update if any replica ran out of memory."""
        info = self.step
        if info is None or self.adp is None:
            return SyncOutcome()
        outcome = self.adp.finish_sync(info)
        if outcome.oom and not info.skipped:
            info.skipped = True
            self.adp.discard_gradients()
        info.finished = True
        return outcome

    # ---------------------------------------------------------------- collectives

    def agree(self, flag: bool) -> bool:
        """True on every replica if ``flag`` is True on any (one tiny all-reduce)."""
        if not dist.is_initialized() or dist.get_world_size() == 1:
            return bool(flag)
        t = torch.tensor([1.0 if flag else 0.0], dtype=torch.float64, device=self.collective_device())
        dist.all_reduce(t)
        return bool(t.item() > 0)

    def broadcast_ints(self, values: list[int]) -> list[int]:
        """Rank 0's ``values`` on every replica."""
        if not dist.is_initialized() or dist.get_world_size() == 1:
            return [int(v) for v in values]
        t = torch.tensor([int(v) for v in values], dtype=torch.int64, device=self.collective_device())
        dist.broadcast(t, src=0)
        return [int(v) for v in t.tolist()]

    # ---------------------------------------------------------------- checkpoints

    def save_checkpoint(self, reason: str) -> None:
        """Rank 0 saves every registered state (no-op without a checkpoint directory).

        Called on every replica: the ``before_save`` hooks run everywhere first.
        """
        if not self.registry.enabled:
            return
        for hook in self.before_save:
            hook()
        if self.rank != 0:
            return
        self.fault_point("save")
        self.registry.save({"reason": reason, "epoch": self.epoch_state.epoch,
                            "replicas": self.replicas, "restarts": self.env.restarts})

    def preempt(self) -> None:
        """SIGTERM agreed by the replicas: rank 0 checkpoints, all wait, then exit with 143."""
        logger.warning("preemption requested (SIGTERM): saving a checkpoint and exiting with %d",
                       PREEMPT_EXIT_CODE)
        self.save_checkpoint("preempt")
        if dist.is_initialized():
            dist.barrier()
        for handler in logging.getLogger().handlers + logger.handlers:
            try:
                handler.flush()
            except Exception:  # pragma: no cover
                pass
        self.shutdown()
        sys.exit(PREEMPT_EXIT_CODE)

    def shutdown(self) -> None:
        """Close the context and tear the process group down now, while the interpreter is alive.

        A gloo process group that is only destroyed during interpreter finalisation (when the last
        reference, held by DDP, goes away) can abort the process; so the group is destroyed and the
        model wrapper drops its references to it. The wrapper is unusable afterwards.
        """
        self.close()
        if dist.is_initialized():
            dist.destroy_process_group()
        if self.adp is not None:
            self.adp.release_process_group()
        gc.collect()

    def end_epoch(self) -> None:
        """After an epoch: checkpoint (rank 0), then honour a SIGTERM any replica received."""
        preempt = self.agree(self.sigterm_requested) if self.registry.enabled else False
        self.save_checkpoint("epoch")
        if preempt:
            self.preempt()


def _parse_faults(text: str) -> dict[str, set[int]]:
    """``"save:2,step:7"`` → ``{"save": {2}, "step": {7}}``; a bad entry is an error naming it."""
    out: dict[str, set[int]] = {}
    for item in (t.strip() for t in text.split(",")):
        if not item:
            continue
        moment, _, count = item.partition(":")
        if moment not in FAULT_MOMENTS or not count.strip().isdigit() or int(count) < 1:
            raise ValueError(f"{ENV_FAULT_SIGTERM}: bad entry {item!r}; expected MOMENT:N with MOMENT one "
                             f"of {', '.join(FAULT_MOMENTS)} and N >= 1")
        out.setdefault(moment, set()).add(int(count))
    return out


_CONTEXT: AgentContext | None = None
_ATEXIT_REGISTERED = False


def get_context() -> AgentContext:
    """The process's context, initialising the process group from the environment if needed."""
    if _CONTEXT is None:
        init_process_group()
    assert _CONTEXT is not None
    return _CONTEXT


def init_process_group(backend: str | None = None, *, timeout: datetime.timedelta | None = None,
                       tensorboard_dir: str | os.PathLike[str] | None = None) -> AgentEnv:
    """Join the job's process group as the environment describes it (SPEC §8).

    ``backend`` is ``"gloo"`` or ``"nccl"`` (default: nccl when CUDA is available, else gloo). With
    several replicas the rendezvous is ``tcp://MASTER_ADDR:MASTER_PORT`` (POLLUX_* first). A single
    process gets a world of one over an in-memory store (no port). An already initialised default
    process group is used as it is. Returns the parsed environment; calling it again is a no-op.
    ``tensorboard_dir`` (else ``POLLUX_TENSORBOARD_DIR``): rank 0 writes the agent's scalars there.
    """
    global _CONTEXT, _ATEXIT_REGISTERED
    if _CONTEXT is not None:
        return _CONTEXT.env
    env = with_tensorboard_dir(read_env(), tensorboard_dir)
    owns = False
    if not dist.is_initialized():
        if backend is None:
            backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl" and torch.cuda.is_available():
            torch.cuda.set_device(env.local_rank % max(torch.cuda.device_count(), 1))
        kwargs: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
        if env.distributed:
            dist.init_process_group(backend, init_method=env.init_method, rank=env.rank,
                                    world_size=env.num_replicas, **kwargs)
        else:
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, **kwargs)
        owns = True
    elif dist.get_world_size() != env.num_replicas and env.source != "single":
        logger.warning("the existing process group has %d processes, the environment says %d",
                       dist.get_world_size(), env.num_replicas)
    _CONTEXT = AgentContext(env, owns_process_group=owns)
    if owns and not _ATEXIT_REGISTERED:
        atexit.register(_destroy_at_exit)
        _ATEXIT_REGISTERED = True
    logger.info("pollux agent: rank %d of %d on %d node(s) (%s), checkpoints %s", _CONTEXT.rank,
                _CONTEXT.replicas, _CONTEXT.nodes, env.source, env.checkpoint_dir or "off")
    return env


#: How long the replicas wait for each other at a normal exit before tearing the group down anyway.
EXIT_BARRIER_TIMEOUT_S = 30.0


def _destroy_at_exit() -> None:
    """Tear the process group down before the interpreter does (gloo may abort otherwise).

    At a normal exit the replicas first meet at a barrier, so that no replica destroys its end of the
    group (rank 0 also hosts the rendezvous store) while a peer is still using it: a replica that
    finished its work early and tore down first could make a slower peer abort in teardown ("terminate
    called without an active exception"). After an uncaught exception (``sys.last_value`` is set
    before ``atexit`` runs) the peers may be blocked elsewhere, so there is no barrier then.
    """
    ctx = _CONTEXT
    if ctx is None or not ctx.owns_process_group:
        return
    if getattr(sys, "last_value", None) is None and dist.is_initialized() and dist.get_world_size() > 1:
        try:
            timeout = datetime.timedelta(seconds=EXIT_BARRIER_TIMEOUT_S)
            if dist.get_backend() == "gloo":
                dist.monitored_barrier(timeout=timeout)
            else:
                dist.barrier()
        except Exception as exc:  # a peer is gone: tear down regardless
            logger.warning("exit barrier failed (%s); tearing the process group down anyway", exc)
    ctx.shutdown()


def reset_context() -> None:
    """Forget the context (tests): restore the SIGTERM handler, destroy a group it created."""
    global _CONTEXT
    ctx, _CONTEXT = _CONTEXT, None
    if ctx is None:
        return
    if ctx.owns_process_group:
        ctx.shutdown()
    else:
        ctx.close()

"""Replay of a hyper-parameter optimisation study in the simulator (issue 37, part 2; thesis §3.5.5).

An Optuna study (TPE, seeded) asks for trials; each trial is one job of the simulator running an
application's measured profile (CIFAR-10 in the benchmark) for the profile's epochs, and what it
reaches is given by the synthetic surface of :mod:`pollux.sim.hpo_space`. ``concurrent`` trials run
at once: the first ones are asked at t = 0 and every time a trial ends (completed or pruned) the next
one is asked and submitted at that moment, until ``trials`` have been asked. The study sees results
through ask-and-tell, in the order the trials end, as a real asynchronous HPO driver would.

Two arms, on the same cluster and the same study protocol:

* ``pollux``: the Pollux policy; every trial is an adaptive job that starts on one GPU (the
  exploration cap, as on the live service) and then gets what the policy gives it, choosing its
  batch size for its allocation.
* ``static``: the FIFO policy over rigid jobs; every trial asks for ``static_gpus`` GPUs (4) and
  runs a fixed global batch of ``static_gpus × local batch``. The default local batch is the
  application's initial batch (CIFAR-10: 128, the batch its recipe is tuned at) on every GPU — the
  thesis's "fixed per-GPU batch size". FIFO places a 4-GPU job on one node when one has room.

Pruning (``pruner="median"``): Optuna's ``MedianPruner`` on the trials' validation accuracy,
reported at every epoch boundary the job's progress has passed by the end of each scheduling round.
A pruned trial's job is stopped at the end of that round (the simulator's hook), so its GPUs are
free for the next round — the earliest the policy could give them out in any case, also for a job
that completes mid-round. The pruned trial's end is therefore at most one interval (60 s) after the
epoch that condemned it, in both arms alike.

The study's engine hook is :class:`StudyReplay` (a :class:`pollux.sim.engine.RoundHook`); the study
itself lives in memory. Same configuration and seed, same result.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import optuna
from optuna.trial import Trial, TrialState

from pollux.policy.registry import make_policy
from pollux.sim.engine import RoundActions, SimConfig, SimJob, simulate
from pollux.sim.hpo_space import Surface, TrialCurve, distributions
from pollux.sim.profiles import AppProfile
from pollux.sim.workload import WorkloadJob

__all__ = ["ARMS", "PRUNERS", "HpoConfig", "HpoResult", "StudyReplay", "TrialRecord", "result_dict",
           "run_study"]

Arm = Literal["pollux", "static"]
#: The arms and the scheduling policy each runs.
ARMS: dict[str, str] = {"pollux": "pollux", "static": "fifo"}
#: The pruners a study may use.
PRUNERS = ("none", "median")
COMPLETE = "complete"
PRUNED = "pruned"


@dataclass(frozen=True)
class HpoConfig:
    """One study on one arm. ``warmup_epochs`` (median pruner): epochs a trial runs before it may be
    pruned; None is a tenth of the epochs (the first epochs are too noisy to judge). ``startup_trials``:
    completed trials the median pruner waits for before pruning at all (Optuna's default, 5)."""

    arm: Arm
    application: str = "cifar10"
    trials: int = 100
    concurrent: int = 4
    gpus: int = 16
    gpus_per_node: int = 4
    seed: int = 0
    pruner: str = "none"
    static_gpus: int = 4
    static_local_batch: int | None = None
    warmup_epochs: int | None = None
    startup_trials: int = 5
    interval: float = 60.0

    def __post_init__(self) -> None:
        if self.arm not in ARMS:
            raise ValueError(f"arm: expected one of {', '.join(ARMS)}, got {self.arm!r}")
        if self.pruner not in PRUNERS:
            raise ValueError(f"pruner: expected one of {', '.join(PRUNERS)}, got {self.pruner!r}")
        for name in ("trials", "concurrent", "gpus", "gpus_per_node", "static_gpus"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: must be an integer >= 1, got {value!r}")
        if self.gpus % self.gpus_per_node:
            raise ValueError(f"gpus: {self.gpus} is not a whole number of nodes of {self.gpus_per_node}")
        if self.static_gpus > self.gpus:
            raise ValueError(f"static_gpus: {self.static_gpus} is more than the cluster's {self.gpus}")
        if self.static_local_batch is not None and self.static_local_batch < 1:
            raise ValueError(f"static_local_batch: must be >= 1, got {self.static_local_batch}")
        if self.warmup_epochs is not None and self.warmup_epochs < 0:
            raise ValueError(f"warmup_epochs: must be >= 0, got {self.warmup_epochs}")
        if self.startup_trials < 0:
            raise ValueError(f"startup_trials: must be >= 0, got {self.startup_trials}")

    @property
    def nodes(self) -> int:
        return self.gpus // self.gpus_per_node


@dataclass
class TrialRecord:
    """One trial: what it tried, what it reached, and when and on what it ran.

    ``value`` is the final accuracy of a completed trial, the last reported one of a pruned trial.
    ``start`` is the first round it held GPUs (None if it never did); ``gpus`` is ``[time, GPUs]`` at
    its first round with GPUs and wherever the count changed.
    """

    number: int
    name: str
    params: dict[str, float]
    surface_value: float
    submit: float
    value: float | None = None
    state: str = "running"
    start: float | None = None
    end: float | None = None
    epochs_run: int = 0
    gpus: list[list[float]] = field(default_factory=list)
    restarts: int = 0
    gpu_hours: float = 0.0

    @property
    def jct(self) -> float | None:
        return None if self.end is None else self.end - self.submit


@dataclass
class HpoResult:
    """One study on one arm: its trials and the study-level figures (seconds, accuracy fractions)."""

    config: HpoConfig
    trials: list[TrialRecord]
    makespan: float
    mean_jct: float
    mean_jct_complete: float | None
    best_value: float | None
    best_params: dict[str, float] | None
    top5_mean: float | None
    gpu_hours: float
    rounds: int
    wall_s: float
    timeline: dict[str, list[float]]

    @property
    def pruned(self) -> int:
        return sum(1 for t in self.trials if t.state == PRUNED)


class StudyReplay:
    """The study as the engine's round hook: asks trials, reports epochs, prunes, tells results.

    Order within a round (deterministic): every job's new epochs are reported in name order (and a
    running trial the pruner condemns is marked); then the trials that ended in the round — completed
    at their completion time, pruned at the round's end — are told in order of end, each followed at
    once by the ask of its successor, submitted at that end.
    """

    def __init__(self, config: HpoConfig, profile: AppProfile, surface: Surface | None = None) -> None:
        self.config = config
        self.profile = profile
        self.epochs = int(profile.meta.epochs)
        self.surface = surface or Surface()
        self.study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(
            seed=config.seed), pruner=self._pruner())
        self.dists = distributions()
        self.records: dict[str, TrialRecord] = {}
        self.curves: dict[str, TrialCurve] = {}
        self.live: dict[str, Trial] = {}
        self.reported: dict[str, int] = {}
        self.asked = 0
        m0 = int(profile.meta.init_batch_size)
        local = config.static_local_batch if config.static_local_batch is not None else m0
        lo, hi = int(profile.meta.min_local_bsz), int(profile.meta.max_local_bsz)
        if not lo <= local <= hi:
            raise ValueError(f"static_local_batch: {local} outside the {profile.name} profile's local "
                             f"batch range [{lo}, {hi}]")
        self.static_batch = config.static_gpus * local

    def _pruner(self) -> optuna.pruners.BasePruner:
        if self.config.pruner == "none":
            return optuna.pruners.NopPruner()
        epochs = int(self.profile.meta.epochs)
        warmup = self.config.warmup_epochs if self.config.warmup_epochs is not None else epochs // 10
        return optuna.pruners.MedianPruner(n_startup_trials=self.config.startup_trials,
                                           n_warmup_steps=warmup)

    # ---- asking -----------------------------------------------------------------------------

    def ask(self, submit: float) -> WorkloadJob | None:
        """The next trial as a job submitted at ``submit``; None once ``trials`` have been asked."""
        if self.asked >= self.config.trials:
            return None
        trial = self.study.ask(self.dists)
        self.asked += 1
        name = f"trial-{trial.number:03d}"
        params = {k: float(v) for k, v in trial.params.items()}
        rng = np.random.default_rng([self.config.seed, trial.number])
        curve = self.surface.curve(params, self.epochs, rng)
        self.live[name] = trial
        self.curves[name] = curve
        self.reported[name] = 0
        self.records[name] = TrialRecord(number=trial.number, name=name, params=params,
                                         surface_value=curve.surface_value, submit=submit)
        app = self.config.application
        if self.config.arm == "static":
            return WorkloadJob(name, submit, app, self.config.static_gpus, self.static_batch)
        return WorkloadJob(name, submit, app, 1, int(self.profile.meta.init_batch_size))

    def initial_jobs(self) -> list[WorkloadJob]:
        """The first ``concurrent`` trials, submitted at t = 0."""
        jobs = []
        for _ in range(min(self.config.concurrent, self.config.trials)):
            job = self.ask(0.0)
            assert job is not None
            jobs.append(job)
        return jobs

    # ---- the hook ---------------------------------------------------------------------------

    def after_round(self, start: float, end: float, jobs: Sequence[SimJob]) -> RoundActions:
        stop: list[str] = []
        ended: list[tuple[float, str, str]] = []
        for job in sorted(jobs, key=lambda j: j.name):
            record = self.records[job.name]
            self._follow(record, job, start)
            finished = job.completion is not None
            condemned = self._report(job.name, min(job.epoch, self.epochs), check=not finished)
            if finished:
                assert job.completion is not None
                ended.append((job.completion, job.name, COMPLETE))
            elif condemned:
                stop.append(job.name)
                ended.append((end, job.name, PRUNED))
        submit: list[WorkloadJob] = []
        for when, name, state in sorted(ended):
            self._tell(name, state, when)
            nxt = self.ask(when)
            if nxt is not None:
                submit.append(nxt)
        return RoundActions(stop=tuple(stop), submit=tuple(submit))

    def _follow(self, record: TrialRecord, job: SimJob, start: float) -> None:
        """Note when the trial first held GPUs and every change of its GPU count."""
        gpus = job.replicas
        if gpus > 0 and record.start is None:
            record.start = start
        if record.start is not None and (not record.gpus or record.gpus[-1][1] != gpus):
            record.gpus.append([start, gpus])
        record.restarts = job.restarts

    def _report(self, name: str, epoch: int, check: bool) -> bool:
        """Report the epochs up to ``epoch`` not yet reported; whether the pruner condemns the trial
        (asked after each new epoch when ``check``)."""
        trial = self.live[name]
        values = self.curves[name].values
        for e in range(self.reported[name] + 1, epoch + 1):
            trial.report(float(values[e - 1]), e)
            self.reported[name] = e
            if check and trial.should_prune():
                return True
        return False

    def _tell(self, name: str, state: str, when: float) -> None:
        trial = self.live.pop(name)
        record = self.records[name]
        record.state = state
        record.end = when
        record.epochs_run = self.reported[name]
        if state == COMPLETE:
            record.value = self.curves[name].final
            self.study.tell(trial, record.value)
        else:
            done = self.reported[name]
            record.value = float(self.curves[name].values[done - 1]) if done else None
            self.study.tell(trial, state=TrialState.PRUNED)


def run_study(config: HpoConfig, profiles: Mapping[str, AppProfile],
              progress: Callable[[str], None] | None = None, surface: Surface | None = None) -> HpoResult:
    """Run one study on one arm to its last trial (deterministic for a configuration)."""
    started = time.perf_counter()
    if config.application not in profiles:
        raise ValueError(f"application: no profile for {config.application!r} "
                         f"(profiles: {', '.join(sorted(profiles))})")
    replay = StudyReplay(config, profiles[config.application], surface)
    sim = SimConfig(interval=config.interval, num_nodes=config.nodes, gpus_per_node=config.gpus_per_node,
                    seed=config.seed)
    label = f"hpo-{config.arm}-{config.pruner}-s{config.seed}"
    result = simulate(replay.initial_jobs(), dict(profiles), make_policy(ARMS[config.arm]), sim,
                      label, progress=progress, hook=replay)
    by_name = {j.name: j for j in result.jobs}
    trials = sorted(replay.records.values(), key=lambda t: t.number)
    for t in trials:
        job = by_name[t.name]
        t.gpu_hours = job.gpu_hours
        t.restarts = job.restarts
    return _summarise(config, trials, result.rounds, time.perf_counter() - started,
                      {k: list(result.timeline[k]) for k in ("time", "allocated_gpus", "running_jobs")})


def _summarise(config: HpoConfig, trials: list[TrialRecord], rounds: int, wall: float,
               timeline: dict[str, list[float]]) -> HpoResult:
    ends = [t.end for t in trials if t.end is not None]
    if len(ends) != len(trials):
        raise RuntimeError(f"hpo {config.arm}: {len(trials) - len(ends)} trial(s) never ended")
    jcts = [t.jct for t in trials if t.jct is not None]
    complete = [t for t in trials if t.state == COMPLETE and t.value is not None]
    values = sorted((t.value for t in complete if t.value is not None), reverse=True)
    best = max(complete, key=lambda t: (t.value, -t.number)) if complete else None
    complete_jcts = [t.jct for t in complete if t.jct is not None]
    return HpoResult(
        config=config, trials=trials, makespan=max(ends), mean_jct=float(np.mean(jcts)),
        mean_jct_complete=float(np.mean(complete_jcts)) if complete_jcts else None,
        best_value=best.value if best is not None else None,
        best_params=dict(best.params) if best is not None else None,
        top5_mean=float(np.mean(values[:5])) if values else None,
        gpu_hours=float(sum(t.gpu_hours for t in trials)), rounds=rounds, wall_s=wall, timeline=timeline,
    )


def result_dict(result: HpoResult, with_trials: bool = True) -> dict[str, Any]:
    """A JSON-able summary of one study (hours for times; the trials' records when ``with_trials``)."""
    out: dict[str, Any] = {
        "arm": result.config.arm, "policy": ARMS[result.config.arm], "pruner": result.config.pruner,
        "seed": result.config.seed, "makespan_h": result.makespan / 3600.0,
        "mean_jct_min": result.mean_jct / 60.0,
        "mean_jct_complete_min": (None if result.mean_jct_complete is None
                                  else result.mean_jct_complete / 60.0),
        "best_value": result.best_value, "top5_mean": result.top5_mean, "best_params": result.best_params,
        "trials": len(result.trials), "pruned": result.pruned, "gpu_hours": result.gpu_hours,
        "rounds": result.rounds, "wall_s": round(result.wall_s, 1),
    }
    if with_trials:
        out["trial_records"] = [_trial_dict(t) for t in result.trials]
    return out


def _trial_dict(t: TrialRecord) -> dict[str, Any]:
    return {"number": t.number, "params": t.params, "value": t.value, "state": t.state,
            "surface_value": t.surface_value, "submit_h": t.submit / 3600.0,
            "start_h": None if t.start is None else t.start / 3600.0,
            "end_h": None if t.end is None else t.end / 3600.0, "epochs_run": t.epochs_run,
            "restarts": t.restarts, "gpu_hours": t.gpu_hours,
            "gpus": [[round(when / 3600.0, 4), int(g)] for when, g in t.gpus]}

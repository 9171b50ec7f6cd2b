"""The driver: an Optuna study whose trials are Pollux jobs, kept at most K at a time.

:class:`StudyRunner` asks, submits, watches and tells, through Optuna's ask-and-tell interface and
the service's HTTP API (a :class:`JobService`, :class:`pollux.cluster.client.PolluxClient` in
production). About once a second (``poll_s``) it

1. reads the jobs (one ``GET /v1/jobs``) and the running trials (one read of the storage);
2. for a trial whose job has ended, tells the study its outcome (:mod:`pollux.hpo.outcome`);
3. for a trial with new intermediate values, asks the pruner (``optuna.trial.Trial(study,
   trial_id).should_prune()``); a pruned trial's job is cancelled at once — the service runs a round
   on a cancellation, so its GPUs go to the other trials without waiting for the next interval — and
   the trial is told PRUNED;
4. asks new trials while fewer than K run and the study has fewer than N trials, and submits each as
   the job ``<study>-t<number>``.

**N is the size of the study**, not of this run: every trial asked counts (COMPLETE, PRUNED, FAIL,
RUNNING) but those the driver gave up itself (below), so the same command run again after a stop
runs only the rest.

**Resuming** (:meth:`StudyRunner.run` starts with it). The job of each trial is in the trial's user
attribute ``pollux_job``, written right after the submission; a restarted driver, before it asks
anything, goes through the study's RUNNING trials: one whose job still runs is *adopted* (watched,
not submitted again); one whose job ended meanwhile is told its outcome; one without ``pollux_job``
(the driver died between the ask and writing it) is looked up by its job's name and its
``HPO_TRIAL_ID``, and submitted now if it never was. A finished trial is never run again. So a driver
killed with SIGKILL loses nothing: its jobs keep running and the next driver takes them over.

**Stopping** (:meth:`StudyRunner.request_stop`, which ``pollux hpo run`` calls on Ctrl-C). The
driver cancels the running trials' jobs and tells each trial FAIL with the reason ``interrupted``,
marks it ``pollux_requeued`` and queues its parameters again (``study.enqueue_trial``): the next run
of the command asks those first, and the interrupted trials do not count towards N. A submission the
service refuses is handled the same way and stops the driver with the service's answer (every trial
would be refused alike). A service that cannot be reached is retried for ``unreachable_s``; then the
driver stops and leaves its trials RUNNING, for the next driver to adopt.
"""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import optuna
from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial, TrialState

from pollux.cluster.client import ClientError
from pollux.hpo import attrs
from pollux.hpo.outcome import Outcome, job_outcome, missing_job
from pollux.hpo.progress import Observer, QuietObserver, RunningView, StudySnapshot
from pollux.hpo.space import SearchSpace
from pollux.hpo.study import StudyError, trial_id
from pollux.hpo.summary import best_trial, format_params, state_counts
from pollux.hpo.trial_env import ENV_STORAGE, ENV_TRIAL_ID, trial_env
from pollux.hpo.trial_job import JobTemplate, job_name

__all__ = ["INTERRUPTED", "JobService", "RunResult", "RunnerConfig", "StudyRunner"]

#: The failure reason of the trials a stop (Ctrl-C) gave up.
INTERRUPTED = "interrupted"
#: The user attribute of a queued-again trial that names the trial it repeats.
RETRY_OF = "pollux_retry_of"


class JobService(Protocol):
    """The part of :class:`pollux.cluster.client.PolluxClient` the driver uses."""

    def submit(self, spec: dict[str, Any], name: str | None = None) -> dict[str, Any]: ...

    def job(self, job_id: str) -> dict[str, Any]: ...

    def jobs(self, states: list[str] | None = None) -> list[dict[str, Any]]: ...

    def cancel(self, job_id: str) -> dict[str, Any]: ...


@dataclass(frozen=True)
class RunnerConfig:
    """``trials`` in the study (N), ``concurrent`` at most at once (K), the tick, and how long an
    unreachable service is waited for."""

    trials: int
    concurrent: int
    poll_s: float = 1.0
    unreachable_s: float = 120.0

    def __post_init__(self) -> None:
        if self.trials < 1 or self.concurrent < 1:
            raise ValueError(f"trials and concurrent must be >= 1, got {self.trials} and {self.concurrent}")


@dataclass
class RunningTrial:
    """A trial this driver watches: its job, the job's latest record, the values seen so far."""

    number: int
    trial_id: int
    job_id: str
    params: dict[str, Any]
    job: dict[str, Any] = field(default_factory=dict)
    seen: dict[int, float] = field(default_factory=dict)


@dataclass(frozen=True)
class RunResult:
    """How a run of the driver ended: the study complete, or stopped (``interrupted``)."""

    interrupted: bool
    adopted: int
    submitted: int


class StudyRunner:
    """Runs ``study`` on the service (see the module docstring).

    ``storage`` is the study's storage (the driver writes its trials' user attributes there and finds
    trial ids through its public API); ``template`` the job every trial shares; ``observer`` hears the
    news. ``clock`` (monotonic seconds) and ``wait`` (a stop-aware sleep) are for tests.
    """

    def __init__(self, study: optuna.Study, storage: BaseStorage, client: JobService, space: SearchSpace,
                 template: JobTemplate, config: RunnerConfig, *, storage_url: str,
                 observer: Observer | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.study = study
        self.storage = storage
        self.client = client
        self.space = space
        self.template = template
        self.config = config
        self.storage_url = storage_url
        self.observer = observer or QuietObserver()
        self._clock = clock
        self._stop = threading.Event()
        self._running: dict[int, RunningTrial] = {}
        self._unreachable_since: float | None = None
        self._adopted = 0
        self._submitted = 0
        self._maximize = study.direction == optuna.study.StudyDirection.MAXIMIZE

    # -- the loop

    def request_stop(self) -> None:
        """Stop at the next tick: cancel the running trials and queue them again (thread-safe)."""
        self._stop.set()

    def run(self) -> RunResult:
        """Resume, then run until the study has N finished trials or a stop is requested."""
        self._resume()
        self._fill()
        self._publish()
        while self._running or self._counted() < self.config.trials:
            if self._stop.wait(self.config.poll_s):
                break
            self._poll()
            if self._stop.is_set():
                break
            self._fill()
            self._publish()
        interrupted = self._stop.is_set() and bool(self._running or self._counted() < self.config.trials)
        if interrupted:
            self._interrupt()
        self._publish()
        return RunResult(interrupted=interrupted, adopted=self._adopted, submitted=self._submitted)

    def _trials(self, *states: TrialState) -> dict[int, FrozenTrial]:
        """The study's trials (in ``states``, if given) by number."""
        trials = self.study.get_trials(deepcopy=False, states=states or None)
        return {t.number: t for t in trials}

    def _counted(self) -> int:
        return state_counts(self.study.get_trials(deepcopy=False)).counted

    def _fill(self) -> None:
        """Ask and submit trials while fewer than K run and the study is short of N."""
        while len(self._running) < self.config.concurrent and self._counted() < self.config.trials:
            trial = self.study.ask(self.space.distributions())
            self._submit(trial.number, trial_id(self.storage, self.study, trial.number), dict(trial.params))

    def _submit(self, number: int, tid: int, params: dict[str, Any]) -> None:
        name = job_name(self.study.study_name, number)
        self.storage.set_trial_user_attr(tid, attrs.JOB_NAME, name)
        env = trial_env(params, storage_url=self.storage_url, trial_id=tid, number=number,
                        study=self.study.study_name)
        spec = self.template.for_trial(self.space, params, env)
        try:
            job = self.client.submit(spec, name=name)
        except ClientError as exc:
            self._requeue(number, tid, params, f"submission failed: {exc}")
            raise StudyError(f"the service did not take trial {number}'s job: {exc}") from exc
        self.storage.set_trial_user_attr(tid, attrs.JOB, job["id"])
        self._running[number] = RunningTrial(number, tid, job["id"], params, job=job)
        self._submitted += 1
        self.observer.event(f"trial {number} started: {job['id']} {format_params(params)}")

    # -- watching

    def _jobs(self) -> dict[str, dict[str, Any]] | None:
        """Every job by id, or None while the service cannot be reached (for up to ``unreachable_s``)."""
        try:
            jobs = self.client.jobs()
        except ClientError as exc:
            if exc.status != 0:
                raise
            now = self._clock()
            if self._unreachable_since is None:
                self._unreachable_since = now
                self.observer.event(f"the service cannot be reached ({exc}); trying again")
            elif now - self._unreachable_since > self.config.unreachable_s:
                raise StudyError(f"the service has not answered for {self.config.unreachable_s:g} s "
                                 f"({exc}); the study is left as it is: run the command again to "
                                 "resume it") from exc
            return None
        if self._unreachable_since is not None:
            self._unreachable_since = None
            self.observer.event("the service answers again")
        return {job["id"]: job for job in jobs}

    def _job(self, job_id: str, jobs: Mapping[str, dict[str, Any]]) -> dict[str, Any] | None:
        """The job from the listing, else asked for alone (None if the service does not know it)."""
        if job_id in jobs:
            return jobs[job_id]
        try:
            return self.client.job(job_id)
        except ClientError as exc:
            if exc.status == 404:
                return None
            raise

    def _poll(self) -> None:
        jobs = self._jobs()
        if jobs is None:
            return
        trials = self._trials(TrialState.RUNNING)
        for number, running in sorted(self._running.items()):
            frozen = trials.get(number)
            if frozen is None:                  # finished by someone else (another driver)
                del self._running[number]
                continue
            job = self._job(running.job_id, jobs)
            if job is None:
                self._finish(running, missing_job(running.job_id))
                continue
            running.job = job
            outcome = job_outcome(job, frozen)
            if outcome is not None:
                self._finish(running, outcome)
            elif frozen.intermediate_values != running.seen:
                running.seen = dict(frozen.intermediate_values)
                if optuna.trial.Trial(self.study, running.trial_id).should_prune():
                    self._prune(running, frozen)

    def _prune(self, running: RunningTrial, frozen: FrozenTrial) -> None:
        """Cancel the job, then tell PRUNED; a job that ended meanwhile is told its own outcome."""
        try:
            self.client.cancel(running.job_id)
        except ClientError as exc:
            if exc.status not in (404, 409):
                raise
            job = self._job(running.job_id, {})
            outcome = missing_job(running.job_id) if job is None else job_outcome(job, frozen)
            if outcome is not None:
                self._finish(running, outcome)
                return
        step = frozen.last_step
        self.storage.set_trial_user_attr(running.trial_id, attrs.PRUNED_AT, step)
        self.study.tell(running.number, state=TrialState.PRUNED, skip_if_finished=True)
        del self._running[running.number]
        value = frozen.intermediate_values.get(step) if step is not None else None
        self.observer.event(f"trial {running.number} pruned at step {step} (value {_num(value)}); "
                            f"{running.job_id} cancelled")

    def _finish(self, running: RunningTrial, outcome: Outcome) -> None:
        """Tell the study a trial's outcome and stop watching it."""
        if outcome.failure is not None:
            self.storage.set_trial_user_attr(running.trial_id, attrs.FAILURE, outcome.failure)
        value = outcome.value if outcome.state == TrialState.COMPLETE else None
        self.study.tell(running.number, value, state=outcome.state, skip_if_finished=True)
        self._running.pop(running.number, None)
        if outcome.state == TrialState.COMPLETE:
            best = best_trial(self.study.get_trials(deepcopy=False), self._maximize)
            best_text = f"; best {_num(best.value)} (trial {best.number})" if best is not None else ""
            self.observer.event(f"trial {running.number} complete: {_num(value)}{best_text}")
        else:
            self.observer.event(f"trial {running.number} failed: {outcome.failure}")

    # -- resuming and stopping

    def _resume(self) -> None:
        """Take over the RUNNING trials a former driver left (see the module docstring)."""
        left = self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        if not left:
            return
        jobs = self._jobs() or {}
        for frozen in left:
            tid = trial_id(self.storage, self.study, frozen.number)
            job_id = frozen.user_attrs.get(attrs.JOB)
            job = self._job(str(job_id), jobs) if job_id is not None else self._find_job(frozen, tid, jobs)
            if job_id is None and job is None:
                self.observer.event(f"trial {frozen.number} was asked but never submitted: submitting it now")
                self._submit(frozen.number, tid, dict(frozen.params))
                continue
            if job is None:
                running = RunningTrial(frozen.number, tid, str(job_id), dict(frozen.params))
                self._finish(running, missing_job(str(job_id)))
                continue
            if job_id is None:
                self.storage.set_trial_user_attr(tid, attrs.JOB, job["id"])
            running = RunningTrial(frozen.number, tid, job["id"], dict(frozen.params), job=job)
            outcome = job_outcome(job, frozen)
            if outcome is not None:
                self._finish(running, outcome)
                continue
            self._running[frozen.number] = running     # seen nothing yet: the pruner judges it next tick
            self._adopted += 1
            self.observer.event(f"trial {frozen.number} adopted: {job['id']} is {job['state']}")

    def _find_job(self, frozen: FrozenTrial, tid: int,
                  jobs: Mapping[str, dict[str, Any]]) -> dict[str, Any] | None:
        """The job submitted for a trial whose ``pollux_job`` was never written: same name, and the
        trial's own id and storage in its environment (another study may reuse the name)."""
        name = frozen.user_attrs.get(attrs.JOB_NAME) or job_name(self.study.study_name, frozen.number)
        found = None
        for job in jobs.values():
            env = (job.get("spec") or {}).get("env") or {}
            if (job.get("name") == name and env.get(ENV_TRIAL_ID) == str(tid)
                    and env.get(ENV_STORAGE) == self.storage_url):
                found = job
        return found

    def _interrupt(self) -> None:
        """Cancel the running trials' jobs; tell each FAIL ``interrupted`` and queue it again."""
        jobs = self._jobs() or {}
        trials = self._trials()
        for number, running in sorted(self._running.items()):
            frozen = trials.get(number)
            job = jobs.get(running.job_id)
            outcome = job_outcome(job, frozen) if job is not None and frozen is not None else None
            if outcome is not None:
                self._finish(running, outcome)
                continue
            try:
                self.client.cancel(running.job_id)
            except ClientError as exc:
                if exc.status not in (0, 404, 409):
                    raise
            self._requeue(number, running.trial_id, running.params, INTERRUPTED)
            self.observer.event(f"trial {number} interrupted: {running.job_id} cancelled; its parameters "
                                "are queued again")
        self._running.clear()

    def _requeue(self, number: int, tid: int, params: dict[str, Any], reason: str) -> None:
        """Tell a trial FAIL for the driver's own ``reason`` and queue its parameters again."""
        self.storage.set_trial_user_attr(tid, attrs.FAILURE, reason)
        self.storage.set_trial_user_attr(tid, attrs.REQUEUED, True)
        self.study.tell(number, state=TrialState.FAIL, skip_if_finished=True)
        self.study.enqueue_trial(params, user_attrs={RETRY_OF: number})
        self._running.pop(number, None)

    # -- the display

    def _publish(self) -> None:
        trials = self._trials()
        now = datetime.datetime.now()       # Optuna stamps a trial's start in local time, naive
        views = []
        for number, running in sorted(self._running.items()):
            frozen = trials.get(number)
            last_value = attrs_value(frozen, attrs.LAST_VALUE)
            last_step = attrs_value(frozen, attrs.LAST_STEP)
            start = frozen.datetime_start if frozen is not None else None
            job = running.job
            views.append(RunningView(
                number=number, job_id=running.job_id, job_state=str(job.get("state", "?")),
                gpus=sum((job.get("allocation") or {}).values()), restarts=int(job.get("restarts") or 0),
                params=running.params, last_step=int(last_step) if last_step is not None else None,
                last_value=float(last_value) if last_value is not None else None,
                seconds=(now - start).total_seconds() if start is not None else 0.0))
        best = best_trial(trials.values(), self._maximize)
        self.observer.update(StudySnapshot(
            study=self.study.study_name, target=self.config.trials, counts=state_counts(trials.values()),
            running=tuple(views), best_number=best.number if best is not None else None,
            best_value=best.value if best is not None else None, maximize=self._maximize))


def attrs_value(trial: FrozenTrial | None, key: str) -> Any:
    """A user attribute of ``trial`` (None without a trial or the attribute)."""
    return None if trial is None else trial.user_attrs.get(key)


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"

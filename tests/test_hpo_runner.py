"""The HPO driver (``pollux.hpo.runner``) and ``pollux hpo run|show`` against a fake service: trials
complete, are pruned (their jobs cancelled) or fail with the job's reason; at most K run; a driver
killed anywhere is resumed without running a trial twice; a stop cancels and requeues. The trials'
reports go through the real ``pollux.hpo.report`` path into a real SQLite study."""

from __future__ import annotations

import io
import json
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState

from pollux.cli import main
from pollux.cluster.client import ClientError
from pollux.hpo import attrs
from pollux.hpo.display import StudyDisplay, status_text
from pollux.hpo.progress import RunningView, StudySnapshot
from pollux.hpo.runner import INTERRUPTED, RETRY_OF, RunnerConfig, StudyRunner
from pollux.hpo.space import parse_space
from pollux.hpo.storage import open_storage, storage_url
from pollux.hpo.study import StudyError, StudyOptions, open_study
from pollux.hpo.summary import StateCounts
from pollux.hpo.trial_job import JobTemplate
from pollux.hpo.trial_report import Reporter

ROOT = Path(__file__).resolve().parents[1]
SPACE = {"args": True, "lr": {"type": "float", "low": 1e-3, "high": 0.3, "log": True},
         "width": {"type": "int", "low": 1, "high": 4}}
TEMPLATE = {"entrypoint": "/abs/train.py", "working_dir": "/abs", "args": ["--epochs", "3"],
            "init_batch_size": 16, "env": {"EXTRA": "1"}}
TERMINAL = ("succeeded", "failed", "cancelled")


class Killed(BaseException):
    """The driver dies here, as under SIGKILL: nothing after it runs."""


def die_at(when: int) -> Callable[[int], None]:
    """A hook that kills the driver at its ``when``-th call (a tick, a submission)."""

    def hook(count: int) -> None:
        if count == when:
            raise Killed

    return hook


@dataclass
class Plan:
    """What a trial's job does: one report per tick, then it ends."""

    values: tuple[float, ...] = (0.5, 0.8, 0.9)
    end: str = "succeeded"
    reason: str | None = None
    report: bool = True


class FakeService:
    """The ``PolluxClient`` methods the driver uses, over jobs that follow a :class:`Plan` per trial
    number; each job advances one step per ``jobs()`` call (the driver's tick) and reports through
    the real reporter, as the trial's rank 0 would."""

    def __init__(self, plans: dict[int, Plan] | None = None) -> None:
        self.plans = plans or {}
        self.storage: Any = None              # the study's storage, where the fake trials report
        self.jobs_by_id: dict[str, dict[str, Any]] = {}
        self.steps: dict[str, int] = {}
        self.reporters: dict[str, Reporter] = {}
        self.submissions: list[tuple[str, dict[str, Any]]] = []
        self.cancelled: list[str] = []
        self.max_active = 0
        self.ticks = 0
        self.on_tick: Callable[[int], None] | None = None
        self.on_submit: Callable[[int], None] | None = None
        self.down: set[int] = set()
        self.refuse: ClientError | None = None

    def __enter__(self) -> FakeService:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def health(self) -> dict[str, Any]:
        return {"status": "ok"}

    def submit(self, spec: dict[str, Any], name: str | None = None) -> dict[str, Any]:
        if self.refuse is not None:
            raise self.refuse
        job_id = f"job-{len(self.jobs_by_id)}"
        job = {"id": job_id, "name": name, "state": "pending", "spec": spec, "allocation": {}, "restarts": 0,
               "failure_reason": None}
        self.jobs_by_id[job_id] = job
        self.steps[job_id] = 0
        if self.storage is None:              # run through the CLI: open the study's storage once
            self.storage = open_storage(spec["env"]["HPO_STORAGE"])
        self.reporters[job_id] = Reporter({**spec["env"], "POLLUX_RANK": "0"}, storage=self.storage)
        self.submissions.append((str(name), spec))
        if self.on_submit is not None:
            self.on_submit(len(self.submissions))
        return dict(job)

    def _advance(self) -> None:
        for job_id, job in self.jobs_by_id.items():
            if job["state"] in TERMINAL:
                continue
            env = job["spec"]["env"]
            plan = self.plans.get(int(env["HPO_TRIAL_NUMBER"]), Plan())
            step = self.steps[job_id]
            if job["state"] == "pending":
                job.update(state="running", allocation={"node-0": 1})
            elif step < len(plan.values):
                if plan.report:
                    self.reporters[job_id].report(plan.values[step], step)
                self.steps[job_id] = step + 1
            else:
                job.update(state=plan.end, failure_reason=plan.reason, allocation={})
        active = sum(j["state"] not in TERMINAL for j in self.jobs_by_id.values())
        self.max_active = max(self.max_active, active)

    def jobs(self, states: list[str] | None = None) -> list[dict[str, Any]]:
        self.ticks += 1
        if self.on_tick is not None:
            self.on_tick(self.ticks)
        if self.ticks in self.down:
            raise ClientError(0, "cannot reach the Pollux service at http://127.0.0.1:1")
        self._advance()
        return [dict(j) for j in self.jobs_by_id.values()]

    def job(self, job_id: str) -> dict[str, Any]:
        if job_id not in self.jobs_by_id:
            raise ClientError(404, f"unknown job {job_id!r}")
        return dict(self.jobs_by_id[job_id])

    def cancel(self, job_id: str) -> dict[str, Any]:
        job = self.jobs_by_id[job_id]
        if job["state"] in TERMINAL:
            raise ClientError(409, f"job {job_id!r} is already {job['state']}")
        job.update(state="cancelled", allocation={})
        self.cancelled.append(job_id)
        return dict(job)

    def jobs_of(self, number: int) -> list[dict[str, Any]]:
        return [j for j in self.jobs_by_id.values() if j["spec"]["env"]["HPO_TRIAL_NUMBER"] == str(number)]


@dataclass(frozen=True)
class Store:
    """A study's storage and the URL the trials are told (a label for the in-memory one)."""

    storage: Any
    url: str


@pytest.fixture
def sqlite_store(tmp_path):
    """The production storage: SQLite, through Optuna's cache (slow on a loaded machine: ~0.1 s a write)."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    url = storage_url(tmp_path / "hpo.db")
    return Store(open_storage(url), url)


@pytest.fixture
def store():
    """Optuna's in-memory storage, for the driver's logic (the fake trials report into the same object)."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return Store(optuna.storages.InMemoryStorage(), "memory://study")


def make_runner(store: Store, service: FakeService, trials: int = 6, concurrent: int = 2, startup: int = 2,
                **config: Any) -> StudyRunner:
    service.storage = store.storage
    options = StudyOptions(name="s", storage_url=store.url, direction="maximize", startup_trials=startup)
    study = open_study(options, store.storage)
    return StudyRunner(study, store.storage, service, parse_space(SPACE, "space.yaml"), JobTemplate(TEMPLATE),
                       RunnerConfig(trials=trials, concurrent=concurrent, poll_s=0.0, **config),
                       storage_url=store.url, clock=lambda: float(service.ticks))


def trials_of(store: Store) -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name="s", storage=store.storage).get_trials()


def test_a_study_completes_prunes_and_fails_trials_with_at_most_k_jobs(sqlite_store):
    url = sqlite_store.url
    service = FakeService({2: Plan(values=(0.1, 0.1, 0.1)),
                           3: Plan(end="failed", reason="replica 0 on node-0 exited with code 1"),
                           4: Plan(report=False)})
    runner = make_runner(sqlite_store, service)
    result = runner.run()
    assert not result.interrupted and result.submitted == 6 and result.adopted == 0
    trials = trials_of(sqlite_store)
    assert [t.state for t in trials] == [TrialState.COMPLETE, TrialState.COMPLETE, TrialState.PRUNED,
                                         TrialState.FAIL, TrialState.FAIL, TrialState.COMPLETE]
    assert service.max_active == 2
    assert [t.value for t in trials if t.state == TrialState.COMPLETE] == [0.9, 0.9, 0.9]
    pruned = trials[2]
    assert pruned.intermediate_values == {0: 0.1} and pruned.user_attrs[attrs.PRUNED_AT] == 0
    assert service.cancelled == [pruned.user_attrs[attrs.JOB]]
    assert trials[3].user_attrs[attrs.FAILURE] == "replica 0 on node-0 exited with code 1"
    assert "succeeded but reported no value" in trials[4].user_attrs[attrs.FAILURE]
    for t in trials:
        assert t.params and t.user_attrs[attrs.JOB_NAME] == f"s-t{t.number}"
        assert len(service.jobs_of(t.number)) == 1
    name, spec = service.submissions[0]
    params = trials[0].params
    assert name == "s-t0"
    assert spec["args"] == ["--epochs", "3", "--lr", repr(params["lr"]), "--width", str(params["width"])]
    assert spec["env"]["EXTRA"] == "1" and json.loads(spec["env"]["HPO_PARAMS"]) == params
    assert spec["env"]["HPO_STORAGE"] == url and spec["env"]["HPO_STUDY"] == "s"
    assert TEMPLATE["args"] == ["--epochs", "3"]              # the template is not changed


def test_a_second_run_of_a_finished_study_does_nothing(store):
    service = FakeService()
    make_runner(store, service, trials=2).run()
    again = make_runner(store, service, trials=2).run()
    assert again.submitted == 0 and len(service.submissions) == 2
    more = make_runner(store, service, trials=3).run()          # N is the study's size: one more
    assert more.submitted == 1 and [t.number for t in trials_of(store)] == [0, 1, 2]


def test_a_resumed_study_does_not_repeat_the_first_run_s_suggestions(store):
    service = FakeService()
    make_runner(store, service, trials=3).run()
    make_runner(store, service, trials=6).run()
    params = [tuple(sorted(t.params.items())) for t in trials_of(store)]
    assert len(params) == 6 and len(set(params)) == 6


def test_a_killed_driver_is_resumed_without_running_a_trial_twice(store):
    service = FakeService({1: Plan(values=(0.5, 0.6, 0.7, 0.8, 0.9, 0.9))})
    service.on_tick = die_at(6)
    with pytest.raises(Killed):
        make_runner(store, service, trials=4).run()
    left = trials_of(store)
    assert TrialState.COMPLETE in [t.state for t in left] and TrialState.RUNNING in [t.state for t in left]
    service.on_tick = None
    result = make_runner(store, service, trials=4).run()
    assert result.adopted >= 1
    trials = trials_of(store)
    assert len(trials) == 4 and all(t.state == TrialState.COMPLETE for t in trials)
    assert all(len(service.jobs_of(t.number)) == 1 for t in trials)


def test_a_job_that_ended_while_no_driver_ran_is_told_its_outcome(store):
    service = FakeService({0: Plan(end="failed", reason="node lost")})
    service.on_tick = die_at(2)
    with pytest.raises(Killed):
        make_runner(store, service, trials=2).run()
    service.on_tick = None
    for _ in range(6):                       # the jobs run on without a driver
        service.jobs()
    assert all(j["state"] in TERMINAL for j in service.jobs_by_id.values())
    result = make_runner(store, service, trials=2).run()
    assert result.adopted == 0 and result.submitted == 0
    trials = trials_of(store)
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.COMPLETE]
    assert trials[0].user_attrs[attrs.FAILURE] == "node lost"


def test_a_trial_asked_but_never_submitted_is_submitted_on_resume(store):
    service = FakeService()
    original = service.submit

    def submit_or_die(spec: dict[str, Any], name: str | None = None) -> dict[str, Any]:
        if len(service.submissions) == 1:
            raise Killed                     # dies after the ask, before the job exists
        return original(spec, name)

    service.submit = submit_or_die            # type: ignore[method-assign]
    with pytest.raises(Killed):
        make_runner(store, service, trials=3).run()
    asked = trials_of(store)[1]
    assert asked.state == TrialState.RUNNING and attrs.JOB not in asked.user_attrs
    service.submit = original                 # type: ignore[method-assign]
    make_runner(store, service, trials=3).run()
    trials = trials_of(store)
    assert len(trials) == 3 and all(t.state == TrialState.COMPLETE for t in trials)
    assert json.loads(service.jobs_of(1)[0]["spec"]["env"]["HPO_PARAMS"]) == asked.params
    assert all(len(service.jobs_of(t.number)) == 1 for t in trials)


def test_a_job_submitted_just_before_the_driver_died_is_found_by_name_and_adopted(store):
    service = FakeService()
    service.on_submit = die_at(2)
    with pytest.raises(Killed):                # the job exists; its id never reached the study
        make_runner(store, service, trials=3).run()
    assert attrs.JOB not in trials_of(store)[1].user_attrs
    service.on_submit = None
    result = make_runner(store, service, trials=3).run()
    assert result.adopted == 2
    trials = trials_of(store)
    assert len(trials) == 3 and all(t.state == TrialState.COMPLETE for t in trials)
    assert all(len(service.jobs_of(t.number)) == 1 for t in trials)
    assert trials[1].user_attrs[attrs.JOB] == service.jobs_of(1)[0]["id"]


def test_a_stop_cancels_the_running_trials_and_queues_them_again(store):
    service = FakeService()
    runner = make_runner(store, service, trials=4)
    service.on_tick = lambda tick: runner.request_stop() if tick == 2 else None
    result = runner.run()
    assert result.interrupted
    trials = trials_of(store)
    stopped = [t for t in trials if t.state == TrialState.FAIL]
    assert len(stopped) == 2 and sorted(service.cancelled) == sorted(t.user_attrs[attrs.JOB] for t in stopped)
    assert all(t.user_attrs[attrs.FAILURE] == INTERRUPTED and t.user_attrs[attrs.REQUEUED] for t in stopped)
    waiting = [t for t in trials if t.state == TrialState.WAITING]
    assert [t.user_attrs[RETRY_OF] for t in waiting] == [t.number for t in stopped]
    service.on_tick = None
    again = make_runner(store, service, trials=4).run()
    assert again.submitted == 4                 # the requeued trials do not count towards N
    trials = trials_of(store)
    done = [t for t in trials if t.state == TrialState.COMPLETE]
    assert len(done) == 4 and [t.params for t in done[:2]] == [t.params for t in stopped]


def test_a_refused_submission_stops_the_driver_and_requeues_the_trial(store):
    service = FakeService()
    service.refuse = ClientError(422, "must be >= 1, got 0", "spec.init_batch_size")
    with pytest.raises(StudyError, match=r"did not take trial 0's job: 422 spec\.init_batch_size"):
        make_runner(store, service, trials=2).run()
    (failed, waiting) = trials_of(store)
    assert failed.state == TrialState.FAIL and failed.user_attrs[attrs.REQUEUED]
    assert failed.user_attrs[attrs.FAILURE].startswith("submission failed: 422")
    assert waiting.state == TrialState.WAITING and waiting.user_attrs[RETRY_OF] == failed.number


def test_an_unreachable_service_is_waited_for_then_the_driver_stops(store):
    service = FakeService()
    service.down = {3, 4}
    make_runner(store, service, trials=2).run()      # a short outage: the study completes
    assert all(t.state == TrialState.COMPLETE for t in trials_of(store))
    service = FakeService()
    service.down = set(range(3, 1000))
    with pytest.raises(StudyError, match="has not answered for 5 s"):
        make_runner(store, service, trials=4, unreachable_s=5.0).run()
    assert any(t.state == TrialState.RUNNING for t in trials_of(store))    # left for the next driver


def test_jobs_cancelled_or_lost_outside_the_study_fail_with_a_reason(store):
    service = FakeService()

    def meddle(tick: int) -> None:
        if tick == 2:
            service.cancel("job-0")
            del service.jobs_by_id["job-1"]

    service.on_tick = meddle
    make_runner(store, service, trials=2).run()
    trials = trials_of(store)
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.FAIL]
    assert trials[0].user_attrs[attrs.FAILURE] == "job job-0 was cancelled outside the study"
    assert trials[1].user_attrs[attrs.FAILURE] == "job job-1 not found on the service"


def test_a_study_of_the_other_direction_is_refused(store):
    open_study(StudyOptions(name="s", storage_url=store.url, direction="max"), store.storage)
    with pytest.raises(StudyError, match="exists and is maximized; --direction min does not match it"):
        open_study(StudyOptions(name="s", storage_url=store.url, direction="min"), store.storage)


def test_the_display_shows_a_live_view_on_a_terminal_and_lines_elsewhere():
    snapshot = StudySnapshot(study="s", target=8, counts=StateCounts(complete=2, pruned=1, running=2),
                             running=(RunningView(3, "job-3", "running", 2, 1, {"lr": 0.01}, 1, 0.9, 65.0),),
                             best_number=1, best_value=0.97, maximize=True)
    assert status_text(snapshot) == ("study s: 3/8 finished (2 complete, 1 pruned, 0 failed), 2 running; "
                                     "best 0.97 (trial 1)")
    plain = io.StringIO()
    with StudyDisplay(plain, terminal=False, escape=lambda s: s.replace("\x1b", "\\x1b"),
                      clock=lambda: 0.0) as display:
        display.event("trial 3 failed: \x1b[31mred")
        display.update(snapshot)
    assert plain.getvalue().splitlines() == ["[    0.0s] trial 3 failed: \\x1b[31mred", status_text(snapshot)]
    term = io.StringIO()
    with StudyDisplay(term, terminal=True, escape=str) as display:
        display.update(snapshot)
        text = io.StringIO()
        from rich.console import Console

        Console(file=text, width=200, color_system=None).print(display.renderable(snapshot))
    assert "job-3" in text.getvalue() and "1m05s" in text.getvalue() and "lr=0.01" in text.getvalue()


def test_cli_run_then_show(tmp_path, monkeypatch, capsys):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    service = FakeService({1: Plan(end="failed", reason="replica 0 exited with code 1")})
    monkeypatch.setattr("pollux.cli.hpo_commands.client_of", lambda args: service)
    space = tmp_path / "space.yaml"
    space.write_text("args: true\nlr: {type: float, low: 1.0e-3, high: 0.3, log: true}\n")
    db = tmp_path / "hpo.db"
    script = ROOT / "examples" / "digits" / "train.py"
    status = main(["hpo", "run", "--space", str(space), "--trials", "3", "--concurrent", "2",
                   "--direction", "max", "--storage", str(db), "--batch-size", "16", "--poll", "0.01",
                   str(script), "--epochs", "2"])
    out, err = capsys.readouterr()
    assert status == 0, err
    assert "trial 0 started: job-0 lr=" in err and "trial 1 failed: replica 0 exited with code 1" in err
    lines = out.splitlines()
    assert lines[0].startswith(f"study train (maximize) in sqlite:///{db}: 2 complete, 0 pruned, 1 failed")
    assert lines[2].split()[:2] == ["TRIAL", "STATE"] and lines[-1] == "trial 1: replica 0 exited with code 1"
    assert service.submissions[0][1]["args"][:2] == ["--epochs", "2"]
    assert main(["hpo", "show", "train", "--storage", str(db), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["counts"]["complete"] == 2 and shown["best"]["value"] == 0.9
    assert [t["state"] for t in shown["trials"]] == ["COMPLETE", "COMPLETE", "FAIL"]
    assert shown["trials"][2]["failure"] == "replica 0 exited with code 1"
    assert shown["trials"][0]["intermediate"] == {"0": 0.5, "1": 0.8, "2": 0.9}


def test_cli_errors_name_the_file_or_option(tmp_path, capsys):
    space = tmp_path / "space.yaml"
    space.write_text("lr: {type: float, low: 1, high: 0}\n")
    script = ROOT / "examples" / "digits" / "train.py"
    run = ["hpo", "run", "--space", str(space), "--batch-size", "16"]
    assert main([*run, "--trials", "2", str(script)]) == 1
    assert f"pollux: error: {space}: parameter 'lr': " in capsys.readouterr().err
    assert main(["hpo", "show", "nope", "--storage", str(tmp_path / "none.db")]) == 1
    assert f"--storage: no study database at {tmp_path / 'none.db'}" in capsys.readouterr().err
    url = storage_url(tmp_path / "hpo.db")
    open_study(StudyOptions(name="other", storage_url=url), open_storage(url))
    assert main(["hpo", "show", "nope", "--storage", str(tmp_path / "hpo.db")]) == 1
    assert "no study 'nope' in this storage (studies there: other)" in capsys.readouterr().err
    assert main([*run, "--trials", "0", str(script)]) == 2


def test_cli_ctrl_c_cancels_requeues_and_exits_130(tmp_path, monkeypatch, capsys):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    service = FakeService()
    service.on_tick = lambda tick: os.kill(os.getpid(), signal.SIGINT) if tick == 2 else None
    monkeypatch.setattr("pollux.cli.hpo_commands.client_of", lambda args: service)
    space = tmp_path / "space.yaml"
    space.write_text("lr: {type: float, low: 1.0e-3, high: 0.3, log: true, flag: --lr}\n")
    db = tmp_path / "hpo.db"
    script = ROOT / "examples" / "digits" / "train.py"
    before = signal.getsignal(signal.SIGINT)
    status = main(["hpo", "run", "--space", str(space), "--trials", "4", "--concurrent", "2", "--study", "s",
                   "--storage", str(db), "--batch-size", "16", "--poll", "0.01", str(script)])
    out, err = capsys.readouterr()
    assert status == 130, err
    assert signal.getsignal(signal.SIGINT) is before            # the handler is put back
    assert "stopping: cancelling the running trials" in err and "run the same command to resume" in err
    assert sorted(service.cancelled) == ["job-0", "job-1"]
    assert out.count("fail (requeued)") == 2
    states = [t.state for t in optuna.load_study(study_name="s", storage=f"sqlite:///{db}").get_trials()]
    assert states == [TrialState.FAIL, TrialState.FAIL, TrialState.WAITING, TrialState.WAITING]

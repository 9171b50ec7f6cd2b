"""The HPO replay (issue 37, part 2): the space and its surface, the engine's round hook, and studies.

The hook is checked on a toy profile where every time is known by hand (a stopped job's GPUs go to the
job queued behind it at the next round; a hook that does nothing, or submits what a workload would
have held, changes nothing). Studies run on the cifar10 profile shortened to a few epochs.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

optuna = pytest.importorskip("optuna")

from pollux.policy.registry import make_policy  # noqa: E402
from pollux.sim.engine import RoundActions, SimConfig, SimJob, simulate  # noqa: E402
from pollux.sim.hpo import HpoConfig, StudyReplay, run_study  # noqa: E402
from pollux.sim.hpo_space import FLOOR, PEAK, RUN_NOISE, SPACE, Surface, distributions  # noqa: E402
from pollux.sim.profiles import default_metadata, load_profile, load_profiles  # noqa: E402
from pollux.sim.workload import WorkloadJob  # noqa: E402

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "pollux-osdi21"
needs_data = pytest.mark.skipif(not (SHARED / "traces").is_dir(), reason=f"shared data not found at {SHARED}")
INTERVAL = 60.0


@pytest.fixture(autouse=True, scope="module")
def quiet_optuna():
    level = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    yield
    optuna.logging.set_verbosity(level)


def toy_profile(root: Path):
    """Constant 1 s steps, no gradient noise (gain = S): progress 1 per second at batch M0 = 8; the two
    epochs end at progress 60 and 120."""
    d = root / "toy"
    d.mkdir(parents=True)
    (d / "placements.csv").write_text(
        "placement,local_bsz,step_time,sync_time\n1,4,1.0,0.0\n1,16,1.0,0.0\n2,4,1.2,0.2\n2,16,1.2,0.2\n")
    (d / "scalability.csv").write_text(
        "num_nodes,num_replicas,local_bsz,step_time,sync_time\n6,6,8,3.0,2.0\n")
    (d / "validation-8.csv").write_text(
        "progress,iteration,metric,grad_sqr,grad_var\n60,60,0.5,0.0,1.0\n120,120,0.9,0.0,1.0\n")
    return {"toy": load_profile(d)}


@pytest.fixture(scope="module")
def cifar_short():
    """The cifar10 profile with its trials cut to 6 epochs (about a minute each on 4 GPUs)."""
    meta = {**default_metadata(), "cifar10": replace(default_metadata()["cifar10"], epochs=6)}
    return load_profiles(SHARED / "traces", ["cifar10"], metadata=meta)


# ---- the space and the surface ---------------------------------------------------------------


def test_the_surface_peaks_inside_the_space_and_falls_away_along_every_parameter():
    surface = Surface()
    best = surface.optimum_params()
    surface.check(best)
    assert surface.final_accuracy(best) == pytest.approx(PEAK)
    for d in SPACE:
        # walk from the optimum to each end of the parameter's range: the accuracy only falls
        for end in (d.low, d.high):
            xs = np.linspace(best[d.name], end, 12)
            acc = [surface.final_accuracy({**best, d.name: float(x)}) for x in xs]
            assert all(b <= a + 1e-12 for a, b in itertools.pairwise(acc)), d.name
    rng = np.random.default_rng(0)
    for _ in range(200):
        p = {d.name: float(rng.uniform(d.low, d.high)) for d in SPACE}
        assert FLOOR <= surface.final_accuracy(p) < PEAK


def test_the_learning_rate_acts_through_the_effective_rate():
    surface = Surface()
    base = surface.optimum_params()
    # lr 0.1 at momentum 0.9 steps like lr 0.5 at momentum 0.5: the same learning-rate coordinate
    a = surface.coordinates({**base, "lr": 0.1, "momentum": 0.9})
    b = surface.coordinates({**base, "lr": 0.5, "momentum": 0.5})
    assert a["lr"] == pytest.approx(b["lr"]) == pytest.approx(0.0)
    assert surface.pace({**base, "lr": 0.5}) > surface.pace(base) > surface.pace({**base, "lr": 0.01})


def test_the_space_matches_optunas_distributions_and_bad_params_are_named():
    dists = distributions()
    assert list(dists) == ["lr", "lr_final_ratio", "momentum", "weight_decay", "width"]
    for d in SPACE:
        dist = dists[d.name]
        assert (dist.low, dist.high, dist.log) == (d.low, d.high, d.log)
    assert isinstance(dists["width"], optuna.distributions.IntDistribution) and dists["width"].step == 16
    surface = Surface()
    good = surface.optimum_params()
    with pytest.raises(ValueError, match="missing 'momentum'"):
        surface.final_accuracy({k: v for k, v in good.items() if k != "momentum"})
    with pytest.raises(ValueError, match="weight_decay"):
        surface.final_accuracy({**good, "weight_decay": 1.0})
    with pytest.raises(ValueError, match="lr"):
        surface.final_accuracy({**good, "lr": math.nan})


def test_a_learning_curve_rises_to_its_final_value_and_is_repeatable():
    surface = Surface()
    p = {**surface.optimum_params(), "width": 32}
    one = surface.curve(p, 100, np.random.default_rng([3, 7]))
    two = surface.curve(p, 100, np.random.default_rng([3, 7]))
    other = surface.curve(p, 100, np.random.default_rng([3, 8]))
    assert np.array_equal(one.values, two.values) and one.final == two.final
    assert not np.array_equal(one.values, other.values)
    assert one.values[-1] == one.final
    assert abs(one.final - surface.final_accuracy(p)) < 5 * RUN_NOISE
    assert one.surface_value == pytest.approx(surface.final_accuracy(p))
    assert one.values[:10].mean() < one.values[45:55].mean() < one.values[90:].mean()
    # a larger learning rate climbs faster early on (relative to where it ends), same noise draws
    fast = surface.curve({**p, "lr": 0.5}, 100, np.random.default_rng([3, 7]))
    slow = surface.curve({**p, "lr": 0.01}, 100, np.random.default_rng([3, 7]))
    rel = [(c.values[9] - FLOOR) / (c.final - FLOOR) for c in (fast, slow)]
    assert rel[0] > rel[1] + 0.2
    # the final value does not depend on how many epochs the curve has
    assert surface.curve(p, 7, np.random.default_rng([3, 7])).final == one.final
    with pytest.raises(ValueError, match="epochs"):
        surface.curve(p, 0, np.random.default_rng(0))


# ---- the engine's round hook -----------------------------------------------------------------


class Recorder:
    """A hook that changes nothing and remembers what it saw."""

    def __init__(self) -> None:
        self.rounds: list[tuple[float, float, tuple[str, ...]]] = []

    def after_round(self, start: float, end: float, jobs: Sequence[SimJob]) -> RoundActions:
        self.rounds.append((start, end, tuple(j.name for j in jobs)))
        return RoundActions()


class Scripted:
    """Stops and submits what it is told at given round starts."""

    def __init__(self, stop: dict[float, tuple[str, ...]] | None = None,
                 submit: dict[float, tuple[WorkloadJob, ...]] | None = None) -> None:
        self.stop = stop or {}
        self.submit = submit or {}

    def after_round(self, start: float, end: float, jobs: Sequence[SimJob]) -> RoundActions:
        return RoundActions(stop=self.stop.get(start, ()), submit=self.submit.get(start, ()))


def _same_results(a, b) -> None:
    assert [(j.name, j.submit, j.completion, j.restarts, j.gpu_hours, j.epochs, j.batch_sizes, j.stopped)
            for j in a.jobs] == [(j.name, j.submit, j.completion, j.restarts, j.gpu_hours, j.epochs,
                                  j.batch_sizes, j.stopped) for j in b.jobs]
    assert a.timeline == b.timeline and a.rounds == b.rounds


@pytest.mark.parametrize("policy", ["fifo", "pollux"])
def test_a_hook_that_does_nothing_changes_nothing(tmp_path, policy):
    prof = toy_profile(tmp_path)
    jobs = [WorkloadJob("a", 0.0, "toy", 1, 8), WorkloadJob("b", 10.0, "toy", 2, 16),
            WorkloadJob("c", 400.0, "toy", 1, 8)]
    config = SimConfig(num_nodes=1, gpus_per_node=2)
    plain = simulate(jobs, prof, make_policy(policy), config)
    rec = Recorder()
    hooked = simulate(jobs, prof, make_policy(policy), config, hook=rec)
    _same_results(plain, hooked)
    assert not any(j.stopped for j in hooked.jobs)
    # called once per round with jobs, with that round's active jobs (c only from its submission on)
    assert [r[0] for r in rec.rounds] == plain.timeline["time"]
    assert all(end == start + INTERVAL for start, end, _ in rec.rounds)
    assert all(("c" in names) == (start >= 400.0) for start, _, names in rec.rounds)


def test_jobs_a_hook_submits_run_as_if_the_workload_held_them(tmp_path):
    prof = toy_profile(tmp_path)
    late = WorkloadJob("late", 150.0, "toy", 1, 8)
    first = [WorkloadJob("a", 0.0, "toy", 1, 8)]
    config = SimConfig(num_nodes=1, gpus_per_node=1)
    up_front = simulate([*first, late], prof, make_policy("fifo"), config)
    # decided in the round at 120 (the one whose interval holds t = 150), submitted at 150
    hooked = simulate(first, prof, make_policy("fifo"), config, hook=Scripted(submit={120.0: (late,)}))
    _same_results(up_front, hooked)
    # a: 30 s start-up + 120 s of work → done at 150; late waits for the round at 180 → 180 + 150
    assert {j.name: j.completion for j in hooked.jobs} == {"a": pytest.approx(150.0),
                                                          "late": pytest.approx(330.0)}


def test_a_stopped_job_ends_at_the_round_and_its_gpus_go_to_the_next_job_at_once(tmp_path):
    prof = toy_profile(tmp_path)
    jobs = [WorkloadJob("a", 0.0, "toy", 1, 8), WorkloadJob("b", 0.0, "toy", 1, 8)]
    config = SimConfig(num_nodes=1, gpus_per_node=1)
    res = simulate(jobs, prof, make_policy("fifo"), config, hook=Scripted(stop={60.0: ("a",)}))
    got = {j.name: j for j in res.jobs}
    a, b = got["a"], got["b"]
    # a held the only GPU for the rounds at 0 and 60 and stops at 120, after 1 of its 2 epochs
    assert a.stopped and a.completion == pytest.approx(120.0) and a.epochs == 1
    assert a.gpu_hours == pytest.approx(120.0 / 3600)
    # b starts in the round at 120: 30 s start-up + 120 s → 270; without the stop it would wait to 180
    assert not b.stopped and b.completion == pytest.approx(270.0)
    assert res.timeline["allocated_gpus"] == [1, 1, 1, 1, 1]
    plain = {j.name: j.completion for j in simulate(jobs, prof, make_policy("fifo"), config).jobs}
    assert plain == {"a": pytest.approx(150.0), "b": pytest.approx(330.0)}


def test_a_hook_s_mistakes_are_named(tmp_path):
    prof = toy_profile(tmp_path)
    jobs = [WorkloadJob("a", 0.0, "toy", 1, 8)]
    config = SimConfig(num_nodes=1, gpus_per_node=1)
    cases = [
        (Scripted(stop={0.0: ("nobody",)}), "cannot stop job 'nobody'"),
        (Scripted(submit={0.0: (WorkloadJob("a", 10.0, "toy", 1, 8),)}), "'a' is already taken"),
        (Scripted(submit={60.0: (WorkloadJob("x", 10.0, "toy", 1, 8),)}), "before the round"),
        (Scripted(submit={0.0: (WorkloadJob("x", 10.0, "nope", 1, 8),)}), "no profile for application"),
    ]
    for hook, message in cases:
        with pytest.raises(ValueError, match=message):
            simulate(jobs, prof, make_policy("fifo"), config, hook=hook)


# ---- studies ---------------------------------------------------------------------------------


def _trials(result) -> list[tuple]:
    return [(t.number, t.params, t.value, t.state, t.submit, t.start, t.end, t.gpus) for t in result.trials]


@needs_data
def test_same_seed_same_study_and_another_seed_another(cifar_short):
    config = HpoConfig("pollux", trials=6, concurrent=3, gpus=8, seed=4)
    one, two = run_study(config, cifar_short), run_study(config, cifar_short)
    assert _trials(one) == _trials(two)
    assert (one.makespan, one.mean_jct, one.best_value) == (two.makespan, two.mean_jct, two.best_value)
    other = run_study(replace(config, seed=5), cifar_short)
    assert [t.params for t in other.trials] != [t.params for t in one.trials]


@needs_data
def test_trials_arrive_as_others_end_with_at_most_k_at_once(cifar_short):
    k, n = 3, 10
    res = run_study(HpoConfig("static", trials=n, concurrent=k, gpus=8, seed=1), cifar_short)
    trials = res.trials
    assert [t.number for t in trials] == list(range(n))
    assert [t.submit for t in trials[:k]] == [0.0] * k
    ends = sorted(t.end for t in trials if t.end is not None)
    # every later trial is asked when an earlier one ends, in the order they end
    assert sorted(t.submit for t in trials[k:]) == ends[:n - k]
    events = sorted([(t.submit, 1) for t in trials] + [(t.end, -1) for t in trials if t.end is not None])
    alive = np.cumsum([d for _, d in events])
    assert alive.max() <= k and alive[-1] == 0
    # FIFO with 8 GPUs and 4 per trial: at most two run, the third waits for the next free gang
    assert max(g for t in trials for _, g in t.gpus) == 4
    assert all(t.state == "complete" and t.epochs_run == 6 for t in trials)
    surface = Surface()
    for t in trials:
        surface.check(t.params)
        assert t.surface_value == pytest.approx(surface.final_accuracy(t.params))
    best = max(trials, key=lambda t: t.value)
    assert res.best_value == best.value and res.best_params == best.params
    assert res.top5_mean == pytest.approx(np.mean(sorted(t.value for t in trials)[-5:]))
    assert res.mean_jct == pytest.approx(np.mean([t.end - t.submit for t in trials]))
    assert res.makespan == max(ends)


@needs_data
def test_pruning_stops_a_trial_and_the_queued_one_gets_its_gpus(cifar_short):
    # one 4-GPU trial runs at a time on 4 GPUs; the other queues behind it
    config = HpoConfig("static", trials=14, concurrent=2, gpus=4, seed=0, pruner="median",
                       warmup_epochs=2, startup_trials=2)
    res = run_study(config, cifar_short)
    pruned = [t for t in res.trials if t.state == "pruned"]
    assert pruned, "the median pruner pruned nothing"
    handed_over = 0
    for t in pruned:
        assert t.end is not None and t.start is not None
        assert 2 <= t.epochs_run < 6                          # not before the warm-up, before the end
        assert t.end % INTERVAL == 0                          # stopped at a round's end
        assert t.gpu_hours == pytest.approx(4 * (t.end - t.start) / 3600)
        waiting = [u for u in res.trials if u.submit < t.end and u.start is not None and u.start >= t.end]
        if waiting:                                            # the next in line starts at that round
            assert min(u.start for u in waiting) == t.end
            handed_over += 1
    assert handed_over >= 1
    assert res.pruned == len(pruned)
    assert all(t.epochs_run == 6 for t in res.trials if t.state == "complete")
    no_pruning = run_study(replace(config, pruner="none"), cifar_short)
    assert no_pruning.pruned == 0 and no_pruning.makespan > res.makespan


@needs_data
def test_the_arms_run_the_jobs_they_claim(cifar_short):
    static = StudyReplay(HpoConfig("static", trials=2), cifar_short["cifar10"])
    job = static.initial_jobs()[0]
    assert (job.num_replicas, job.batch_size) == (4, 4 * 128)
    pollux = StudyReplay(HpoConfig("pollux", trials=2), cifar_short["cifar10"])
    assert all((j.num_replicas, j.batch_size) == (1, 128) for j in pollux.initial_jobs())
    res = run_study(HpoConfig("pollux", trials=3, concurrent=3, gpus=8, seed=0), cifar_short)
    assert all(t.gpus[0][1] == 1 for t in res.trials)         # every Pollux trial starts on one GPU
    with pytest.raises(ValueError, match="static_local_batch"):
        StudyReplay(HpoConfig("static", static_local_batch=4096), cifar_short["cifar10"])


@pytest.mark.parametrize(("options", "named"), [
    ({"arm": "elastic"}, "arm"), ({"pruner": "hyperband"}, "pruner"), ({"trials": 0}, "trials"),
    ({"concurrent": 0}, "concurrent"), ({"gpus": 6}, "gpus"), ({"static_gpus": 32}, "static_gpus"),
    ({"warmup_epochs": -1}, "warmup_epochs"),
])
def test_bad_configurations_are_named(options, named):
    with pytest.raises(ValueError, match=named):
        HpoConfig(**{"arm": "static", **options})

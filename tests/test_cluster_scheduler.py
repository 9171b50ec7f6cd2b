"""The scheduling round of the live service (SPEC §9) over a real SQLite job store."""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest

from fake_backend import FakeBackend
from pollux.cluster.control.controller import Controller, ControllerConfig
from pollux.cluster.control.scheduler import RoundResult, Scheduler, job_view, schedule_once
from pollux.cluster.state.lifecycle import TRANSITIONS
from pollux.cluster.state.store import JobStore
from pollux.goodput.records import GradStats, ThroughputParams
from pollux.hints import build_hints
from pollux.policy.base import Cluster, check_allocation
from pollux.policy.registry import make_policy

PARAMS = ThroughputParams(0.0177, 0.000697, 0.0342, 0.00165, 0.128, 0.0026, 2.23)
GRAD = GradStats(sqr=8.95, var=5.07)
CLUSTER = Cluster.uniform(4, 2)


def spec(**kw):
    out = {"entrypoint": "train.py", "init_batch_size": 128, "max_batch_size": 4096}
    out.update(kw)
    return out


def hints(seen=4):
    return build_hints(PARAMS, GRAD, init_batch_size=128, max_batch_size=4096, local_bsz_bounds=(32, 1024),
                       accumulation=True, max_replicas_seen=seen, progress=100.0, epoch=1)


@pytest.fixture
def store(tmp_path):
    s = JobStore(tmp_path / "jobs.db")
    yield s
    s.close()


def submit(store, n, t0=0.0, **kw):
    return [store.submit(spec(**kw), job_id=f"j{i:03d}", now=t0 + i) for i in range(n)]


def total(alloc):
    return sum(sum(r.values()) for r in alloc.values())


def controller(store, sched, tmp_path):
    """The production path that applies a round: the controller, over a fake backend shaped like
    CLUSTER (rounds only; nothing is launched)."""
    backend = FakeBackend(dict(zip(CLUSTER.nodes, CLUSTER.gpus, strict=True)))
    return Controller(store, backend, sched, ControllerConfig(state_dir=tmp_path))


def test_job_view_without_hints_has_no_model_and_rigid_fixed(store):
    job = store.submit(spec(min_replicas=2), job_id="a", now=10.0)
    view = job_view(job, None, now=70.0, total_gpus=8)
    assert view.model is None and view.limits is None and view.max_replicas_seen == 0
    assert view.age_s == 60.0 and view.max_replicas == 8 and view.min_replicas == 2
    assert view.fixed == (2, 128)
    assert job_view(job, None, now=70.0).max_replicas == 64
    with_hints = job_view(job, hints(), now=70.0, total_gpus=8)
    assert with_hints.model is not None and with_hints.limits.max_batch_size == 4096
    assert with_hints.max_replicas_seen == 4
    capped = store.submit(spec(max_replicas=3), job_id="b", now=11.0)
    assert job_view(capped, None, now=20.0).max_replicas == 3


def test_jobs_without_hints_get_gpus_under_pollux_within_capacity(store):
    submit(store, 3)
    sched = Scheduler(store)
    assert sched.policy_name == "pollux" and sched.interval_s == 60.0
    res = sched.decide(100.0, CLUSTER)
    assert isinstance(res, RoundResult) and res.num_jobs == 3
    check_allocation(res.allocation, CLUSTER)
    assert set(res.allocation) == {"j000", "j001", "j002"}
    assert set(res.changed) == set(res.allocation)
    # nothing is written by the round itself: the controller writes its result in one call
    assert store.current_allocations() == {}
    assert store.load_policy_state("pollux") is None and res.policy_state is not None


def test_job_with_fitted_hints_is_handled(store):
    submit(store, 2)
    store.put_hints("j000", hints(seen=4), now=5.0)
    res = Scheduler(store).decide(100.0, CLUSTER)
    check_allocation(res.allocation, CLUSTER)
    assert sum(res.allocation.get("j000", {}).values()) >= 1
    assert total(res.allocation) <= CLUSTER.total_gpus


def test_second_round_reports_only_real_changes_and_state_persists(store, tmp_path):
    submit(store, 4)
    sched = Scheduler(store)
    controller(store, sched, tmp_path).run_round(100.0)
    first = sched.last_result
    assert first is not None
    assert store.current_allocations() == first.allocation
    state1 = store.load_policy_state("pollux")
    assert state1 is not None
    second = sched.decide(160.0, CLUSTER)
    assert second.previous == first.allocation
    for jid, row in second.changed.items():
        assert row != first.allocation.get(jid, {})
        assert row == second.allocation.get(jid, {})
    for jid in set(second.allocation) | set(first.allocation):
        if jid not in second.changed:
            assert second.allocation.get(jid, {}) == first.allocation.get(jid, {})
    assert store.load_policy_state("pollux") is not None


@pytest.mark.parametrize("name", ["tiresias", "fifo"])
def test_rigid_policies_are_selectable(store, name):
    submit(store, 3, min_replicas=2)
    sched = Scheduler(store, policy_name=name)
    res = sched.decide(100.0, CLUSTER)
    assert res.policy == name
    check_allocation(res.allocation, CLUSTER)
    assert res.allocation and all(sum(r.values()) == 2 for r in res.allocation.values())
    assert res.policy_state is not None and store.load_policy_state(name) is None


def test_unknown_policy_and_bad_interval_are_rejected(store):
    with pytest.raises(ValueError, match="policy"):
        Scheduler(store, policy_name="nope")
    with pytest.raises(ValueError, match="interval_s"):
        Scheduler(store, interval_s=0)


def test_controller_round_records_allocations_and_legal_transitions(store, tmp_path):
    """The round's changes reach the store only through the controller: pending → starting with
    the allocation in one write; a job losing its GPUs keeps its state until its run has stopped."""
    submit(store, 2)
    sched = Scheduler(store, policy_name="fifo")
    ctl = controller(store, sched, tmp_path)
    ctl.run_round(100.0)
    res = sched.last_result
    assert res is not None and res.allocation
    for jid in res.allocation:
        job = store.get_job(jid)
        assert job.state == "starting" and job.allocation == res.allocation[jid]
        assert job.restarts == 0
        assert store.allocation_history(jid)[-1].allocation == res.allocation[jid]
        assert [t.to_state for t in store.transitions(jid)] == ["pending", "starting"]
    assert [(r.time, r.objective) for r in store.rounds()] == [(100.0, None)]   # FIFO keeps none
    store.transition("j000", "cancelled", now=110.0)
    ctl.run_round(120.0)
    assert store.get_job("j000").allocation == {} and "j000" not in sched.last_result.allocation
    for jid in ("j000", "j001"):
        for tr in store.transitions(jid)[1:]:
            assert tr.to_state in TRANSITIONS[tr.from_state]


def test_terminal_jobs_are_ignored(store):
    submit(store, 4)
    store.transition("j000", "cancelled", now=5.0)
    store.transition("j001", "starting", now=5.0)
    store.transition("j001", "running", now=6.0)
    store.transition("j001", "succeeded", now=7.0)
    res = Scheduler(store).decide(100.0, CLUSTER)
    assert res.num_jobs == 2
    assert set(res.allocation) <= {"j002", "j003"} and set(res.changed) <= {"j002", "j003"}


def test_same_seed_same_store_same_allocation(tmp_path):
    results = []
    for k in range(2):
        with JobStore(tmp_path / f"s{k}.db") as s:
            submit(s, 12)
            s.put_hints("j003", hints(), now=20.0)
            sched = Scheduler(s, seed=7)
            controller(s, sched, tmp_path / f"c{k}").run_round(100.0)
            r1 = sched.last_result
            assert r1 is not None
            results.append((r1.allocation, sched.decide(160.0, CLUSTER).allocation))
    assert results[0] == results[1]


class _RecordingPolicy:
    """A policy that records what it is asked and answers a fixed allocation and a counter state."""

    name = "recording"

    def __init__(self):
        self.calls = []

    def decide(self, jobs, cluster, state, now, rng):
        allocation = {j.id: dict(j.allocation) for j in jobs if j.allocation}   # it arrives in the views
        self.calls.append(([j.id for j in jobs], allocation, state, now, rng))
        return {"j000": {"node-2": 2, "node-3": 0}, "j001": {}}, {"round": len(self.calls)}


def test_schedule_once_with_explicit_policy(store):
    """The round runs the policy it is given (not the default), with the stored jobs, allocation and
    state, the given time and generator; keeps its state under its name; times itself; and writes
    no allocation."""
    submit(store, 2)
    policy, rng = _RecordingPolicy(), np.random.default_rng(0)
    start = time.perf_counter()
    res = schedule_once(store, CLUSTER, policy, 50.0, rng)
    wall = time.perf_counter() - start
    assert policy.calls == [(["j000", "j001"], {}, None, 50.0, rng)]
    assert res.policy == "recording" and res.now == 50.0 and res.num_jobs == 2 and res.excluded == {}
    assert res.allocation == {"j000": {"node-2": 2}} and res.changed == res.allocation
    assert res.previous == {}
    assert 0.0 < res.duration_s <= wall
    assert res.policy_state == {"round": 1} and store.load_policy_state("recording") is None
    assert store.current_allocations() == {}
    assert [j.state for j in store.list_jobs()] == ["pending", "pending"]
    # The controller writes the round's result; the next round gets the state the policy left.
    written = store.apply_round(res.policy, res.policy_state, res.changed, now=50.0)
    assert list(written) == ["j000"] and written["j000"].state == "starting"
    assert store.load_policy_state("recording") == {"round": 1}
    assert store.load_policy_state("pollux") is None
    schedule_once(store, CLUSTER, policy, 110.0, rng)
    assert policy.calls[1][2:4] == ({"round": 1}, 110.0)


def test_a_rounds_result_is_written_in_one_transaction_or_not_at_all(store):
    """Policy state and every changed allocation go in together: one bad row writes nothing, and a
    job that ended since the round read the store is left as it is."""
    submit(store, 3)
    store.transition("j002", "cancelled", now=60.0)
    with pytest.raises(ValueError, match="allocation"):
        store.apply_round("fifo", {"round": 1}, {"j000": {"node-0": 2}, "j001": {"node-1": -1}}, now=100.0)
    assert store.current_allocations() == {} and store.load_policy_state("fifo") is None
    assert [t.to_state for t in store.transitions("j000")] == ["pending"]
    written = store.apply_round("fifo", {"round": 1}, {"j000": {"node-0": 2}, "j001": {"node-1": 1},
                                                       "j002": {"node-2": 1}}, now=100.0)
    assert sorted(written) == ["j000", "j001"]
    assert store.current_allocations() == {"j000": {"node-0": 2}, "j001": {"node-1": 1}}
    assert store.get_job("j002").state == "cancelled" and store.get_job("j002").allocation == {}
    assert store.load_policy_state("fifo") == {"round": 1}
    again = store.apply_round("fifo", {"round": 2}, {"j000": {}}, now=160.0)
    assert again["j000"].state == "starting" and again["j000"].allocation == {}


def test_round_with_100_jobs_completes(store):
    submit(store, 100)
    for i in range(0, 100, 10):
        store.put_hints(f"j{i:03d}", hints(seen=2), now=200.0)
    res = Scheduler(store).decide(300.0, CLUSTER)
    check_allocation(res.allocation, CLUSTER)
    assert res.num_jobs == 100 and 0 < total(res.allocation) <= CLUSTER.total_gpus
    print(f"100-job round on 4x2 GPUs: {res.duration_s:.3f} s")


# ---------------------------------------------------------------------------------- one job's numbers


def _write_hints_row(store, job_id, hints_obj):
    """Store hints as they are, bypassing validation (an older Pollux, or a hand edit)."""
    import json
    import sqlite3
    with sqlite3.connect(store.path) as conn:
        conn.execute("INSERT OR REPLACE INTO hints (job_id, time, hints) VALUES (?, ?, ?)",
                     (job_id, 1.0, json.dumps(hints_obj)))


def test_job_view_clamps_replica_counts_to_the_cluster(store):
    import dataclasses
    job = store.submit(spec(), job_id="huge", now=1.0)
    huge = dataclasses.replace(job, spec=dataclasses.replace(job.spec, min_replicas=10**20,
                                                             max_replicas=10**20, init_batch_size=10**20))
    view = job_view(huge, None, now=5.0, total_gpus=8)
    assert view.min_replicas == 9 and view.max_replicas == 9      # above the cluster: still never fits
    assert view.fixed[0] == 9 and view.fixed[1] <= 2**62
    assert job_view(huge, None, now=5.0).max_replicas <= 2**16
    others = [job_view(j, None, 5.0, 8) for j in submit(store, 3)]
    for name in ("pollux", "tiresias", "fifo"):
        alloc, _ = make_policy(name).decide([view, *others], CLUSTER, None, 5.0, np.random.default_rng(0))
        check_allocation(alloc, CLUSTER)
        assert "huge" not in alloc and {"j000", "j001", "j002"} <= set(alloc), (name, alloc)
    two = store.submit(spec(resources={"GPU": 2}), job_id="two", now=2.0)
    assert job_view(two, None, 5.0, 8).min_replicas == 2               # a replica needs 2 slots


def test_hints_that_make_the_policy_raise_do_not_stop_scheduling(store, caplog):
    submit(store, 3)
    bad = hints()
    bad.update(init_batch_size=10**300, max_batch_size=10**300, local_bsz_bounds=[1, 10**300])
    _write_hints_row(store, "j001", bad)
    with pytest.raises(ValueError):                  # what every round did before: no one scheduled
        make_policy("pollux").decide([job_view(j, store.get_hints(j.id), 5.0, 8) for j in store.list_jobs()],
                                     CLUSTER, None, 5.0, np.random.default_rng(0))
    sched = Scheduler(store)
    with caplog.at_level("ERROR", logger="pollux.cluster"):
        first = sched.decide(100.0, CLUSTER)
        second = sched.decide(160.0, CLUSTER)
    for res in (first, second):
        check_allocation(res.allocation, CLUSTER)
        assert {"j000", "j001", "j002"} <= set(res.allocation) and not res.excluded
    errors = [r for r in caplog.records if "j001" in r.getMessage()]
    assert len(errors) == 1 and "without its hints" in errors[0].getMessage()


def test_stored_hints_that_no_longer_validate_fall_back_to_no_model(store):
    submit(store, 2)
    bad = hints()
    bad["throughput"]["gamma"] = 1e300
    _write_hints_row(store, "j000", bad)
    res = Scheduler(store).decide(100.0, CLUSTER)
    assert set(res.allocation) == {"j000", "j001"} and not res.excluded


class _PoisonedFifo:
    """FIFO, except that any round including the job ``poison`` raises (a policy bug one job hits)."""

    name = "fifo"

    def __init__(self) -> None:
        self.inner = make_policy("fifo")

    def decide(self, jobs, cluster, state, now, rng):
        if any(j.id == "poison" for j in jobs):
            raise OverflowError("Python int too large to convert to C long")
        return self.inner.decide(jobs, cluster, state, now, rng)


def test_job_that_makes_the_policy_raise_is_left_out_of_the_round(store, caplog):
    submit(store, 3)
    store.submit(spec(), job_id="poison", now=0.5)
    store.transition("poison", "starting", now=1.0)
    store.set_allocation("poison", {CLUSTER.nodes[0]: 1}, now=1.0)
    with caplog.at_level("ERROR", logger="pollux.cluster"):
        res = schedule_once(store, CLUSTER, _PoisonedFifo(), 100.0, np.random.default_rng(0))
    assert "poison" not in res.allocation and res.changed["poison"] == {}      # left out: no GPUs
    assert "OverflowError" in res.excluded["poison"]
    assert {"j000", "j001", "j002"} <= set(res.allocation)
    assert any("left out of scheduling" in r.getMessage() for r in caplog.records)


def test_stored_row_with_huge_replica_counts_does_not_stop_the_round(store):
    import json
    import sqlite3
    submit(store, 3)
    with sqlite3.connect(store.path) as conn:
        row = json.loads(conn.execute("SELECT spec FROM jobs WHERE id = 'j000'").fetchone()[0])
        row.update(min_replicas=1e20, max_replicas=1e20)
        conn.execute("UPDATE jobs SET spec = ? WHERE id = 'j000'", (json.dumps(row),))
    store.submit(spec(min_replicas=10_000), job_id="big", now=9.0)    # valid, but more than the cluster
    for name in ("pollux", "tiresias", "fifo"):
        res = Scheduler(store, policy_name=name).decide(100.0, CLUSTER)
        check_allocation(res.allocation, CLUSTER)
        assert {"j001", "j002"} <= set(res.allocation) and "big" not in res.allocation, (name, res.allocation)


def test_a_round_reads_every_jobs_hints_with_one_query(store, monkeypatch):
    submit(store, 30)
    for i in range(0, 30, 3):
        store.put_hints(f"j{i:03d}", hints(), now=20.0)
    calls = []
    original = store.hints_of
    monkeypatch.setattr(store, "hints_of", lambda ids: calls.append(1) or original(ids))
    monkeypatch.setattr(store, "get_hints", lambda jid: pytest.fail("one query per job"))
    Scheduler(store).decide(100.0, CLUSTER)
    assert calls == [1]
    got = original(f"j{i:03d}" for i in range(30))
    assert sorted(got) == [f"j{i:03d}" for i in range(0, 30, 3)] and got["j003"]["version"] == 3
    assert original([]) == {} and original(["nope"]) == {}


def test_a_round_writes_itself_and_what_it_expects_of_each_job(store):
    """The round's outlook: on its new allocation, a job with hints gets the batch configuration,
    efficiency and goodput its model chooses there (the agent's own choice), its speedup over one GPU
    and its noise scale; a job without hints only its GPUs. The round and the outlooks are written
    with the allocations, in one call."""
    submit(store, 2)
    store.put_hints("j000", hints())
    res = schedule_once(store, CLUSTER, make_policy("pollux"), 50.0, np.random.default_rng(0))
    assert set(res.outlook) == {"j000", "j001"}
    mine = res.outlook["j000"]
    row = res.allocation["j000"]
    assert mine.gpus == sum(row.values()) > 0 and mine.nodes == len(row)
    view = job_view(store.get_job("j000"), store.get_hints("j000"), 50.0)
    plan = view.model.optimize(len(row), sum(row.values()), view.limits)
    assert mine.batch_size == pytest.approx(float(plan.batch_size))
    assert mine.accum_steps == int(plan.accum_steps)
    assert mine.goodput == pytest.approx(float(plan.goodput)) and 0 < mine.efficiency <= 1
    single = float(view.model.optimize(1, 1, view.limits).goodput)
    assert mine.speedup == pytest.approx(mine.goodput / single)
    assert mine.pgns == pytest.approx(view.model.grad_stats.pgns(view.model.init_batch_size))
    other = res.outlook["j001"]
    assert other.goodput is None and other.batch_size is None
    assert other.gpus == sum(res.allocation.get("j001", {}).values())
    store.apply_round(res.policy, res.policy_state, res.changed, now=50.0, outlook=res.outlook.values(),
                      duration_s=res.duration_s, jobs=res.num_jobs)
    (written,) = store.rounds()
    assert (written.time, written.policy, written.jobs) == (50.0, "pollux", 2)
    assert written.changed == len(res.changed)
    assert store.outlooks() == res.outlook
    assert store.outlooks(["j001"]) == {"j001": other}


def test_a_round_recomputes_the_outlook_only_of_jobs_whose_hints_or_allocation_changed(store, monkeypatch):
    from pollux.cluster.control import outlook as outlook_module

    submit(store, 3)
    for j in ("j000", "j001", "j002"):
        store.put_hints(j, hints())
    sched = Scheduler(store, policy_name="pollux")
    first = sched.decide(10.0, CLUSTER)
    store.apply_round(first.policy, first.policy_state, first.changed, now=10.0)
    computed: list[str] = []
    real = outlook_module._outlook
    monkeypatch.setattr(outlook_module, "_outlook", lambda v, r, t: computed.append(v.id) or real(v, r, t))
    second = sched.decide(20.0, CLUSTER)
    unchanged = {j for j in ("j000", "j001", "j002") if j not in second.changed}
    assert set(computed) == set(second.changed) and unchanged
    for j in unchanged:
        assert second.outlook[j] == dataclasses.replace(first.outlook[j], time=20.0)
    store.put_hints("j001", hints(seen=8))
    computed.clear()
    third = sched.decide(30.0, CLUSTER)
    assert "j001" in computed and set(computed) == set(third.changed) | {"j001"}



def test_a_round_reports_and_writes_the_objective_its_policy_reached(store, tmp_path):
    """Pollux's objective is the fitness of the allocation it chose, and the controller writes it
    with the round; FIFO keeps none."""
    from pollux.policy.base import state_objective

    submit(store, 3)
    sched = Scheduler(store, policy_name="pollux", seed=0)
    controller(store, sched, tmp_path).run_round(100.0)
    result = sched.last_result
    assert result is not None and result.policy_state is not None
    assert result.objective == result.policy_state["objective"] == state_objective(result.policy_state)
    assert result.objective is not None and result.objective > 0
    assert [(r.policy, r.objective) for r in store.rounds()] == [("pollux", result.objective)]
    assert Scheduler(store, policy_name="fifo").decide(110.0, CLUSTER).objective is None
    assert state_objective({"objective": float("nan")}) is None
    assert state_objective({"objective": True}) is None

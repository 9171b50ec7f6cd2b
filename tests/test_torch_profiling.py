"""Agent-side profiling, periodic fit and hint reporting (SPEC §3, §8); none of it needs torch."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import jsonschema
import numpy as np
import pytest

from pollux.goodput import GradStats, ThroughputParams, t_grad, t_iter
from pollux.goodput.throughput_fit import fit_objective
from pollux.hints import build_hints, load_schema
from pollux.torch.profiling import PeriodicFitter, StepProfiler
from pollux.torch.reporting import HintReporter

TRUE = ThroughputParams(alpha_grad=0.02, beta_grad=0.0007, alpha_local=0.035, beta_local=0.0016,
                        alpha_node=0.13, beta_node=0.0026, gamma=2.2)


# ------------------------------------------------------------------------------------ StepProfiler


def test_aggregation_drops_warmup_and_averages_per_key():
    prof = StepProfiler()
    assert prof.records()[0].size == 0
    assert prof.fit() is None
    assert prof.record(1, 1, 32, None, 9.0) is False            # first step after start: warm-up
    assert prof.record(1, 1, 32, None, 1.0) is True
    assert prof.record(1, 1, 32, None, 3.0) is True
    assert prof.record(1, 2, 32, 0.5, 9.0) is False             # configuration changed: warm-up
    assert prof.record(1, 2, 32, 0.4, 2.0) is True
    assert prof.record(1, 2, 32, None, 4.0) is True             # accum time missing this step
    assert prof.record(1, 2, 32, 0.6, 3.0) is True
    nodes, replicas, m, optim, accum = prof.records()
    assert nodes.tolist() == [1, 1] and replicas.tolist() == [1, 2] and m.tolist() == [32, 32]
    np.testing.assert_allclose(optim, [2.0, 3.0])
    assert math.isnan(accum[0])
    np.testing.assert_allclose(accum[1], 0.5)
    assert len(prof) == 2 and prof.num_steps == 5
    assert prof.max_replicas_seen == 2


def test_skip_next_explicit_warmup_restart_and_accum_steps_change():
    prof = StepProfiler()
    prof.record(1, 1, 16, None, 5.0)                              # warm-up
    prof.skip_next(2)
    assert not prof.record(1, 1, 16, None, 5.0)
    assert not prof.record(1, 1, 16, None, 5.0)
    assert prof.record(1, 1, 16, None, 1.0)
    assert not prof.record(1, 1, 16, None, 5.0, warmup=True)
    prof.restart()
    assert not prof.record(1, 1, 16, None, 5.0)
    assert prof.record(1, 1, 16, 0.5, 1.0, accum_steps=1) is False   # s changed: 0/None -> 1
    assert prof.record(1, 1, 16, 0.5, 1.0, accum_steps=1) is True
    assert prof.record(1, 1, 16, 0.5, 1.0, accum_steps=2) is False
    _, _, _, optim, accum = prof.records()
    np.testing.assert_allclose(optim, [1.0])
    np.testing.assert_allclose(accum, [0.5])


def test_invalid_measurements_are_ignored_and_bad_configs_raise():
    prof = StepProfiler()
    prof.record(1, 1, 8, None, 1.0)
    for bad in (0.0, -1.0, math.nan, math.inf, None):
        assert prof.record(1, 1, 8, 0.5, bad) is False
    assert prof.record(1, 1, 8, math.nan, 2.0) is True            # bad accum time: optim kept
    _, _, _, optim, accum = prof.records()
    assert optim.tolist() == [2.0] and math.isnan(accum[0])
    with pytest.raises(ValueError, match="nodes"):
        prof.record(2, 1, 8, None, 1.0)
    with pytest.raises(ValueError, match="local_bsz"):
        prof.record(1, 1, 0, None, 1.0)
    with pytest.raises(ValueError, match="replicas"):
        prof.record(1, 1.5, 8, None, 1.0)


def test_max_replicas_seen_from_records_note_and_setter():
    prof = StepProfiler()
    assert prof.max_replicas_seen == 0
    prof.record(2, 8, 32, None, 1.0)                              # counted even as warm-up
    assert prof.max_replicas_seen == 8
    prof.note_replicas(4)
    assert prof.max_replicas_seen == 8
    prof.note_replicas(12)
    assert prof.max_replicas_seen == 12
    prof.max_replicas_seen = 3
    assert prof.max_replicas_seen == 3
    with pytest.raises(ValueError):
        prof.max_replicas_seen = -1


def _synthetic_profile(rng: np.random.Generator, noise: float = 0.02) -> StepProfiler:
    """Steps timed from the true model with multiplicative noise, over the configurations a job runs."""
    configs = [(1, 1, 32, 0), (1, 1, 64, 1), (1, 1, 128, 1), (1, 2, 64, 0), (1, 4, 64, 0),
               (1, 4, 128, 1), (2, 4, 64, 0), (2, 8, 64, 0), (2, 8, 128, 0), (4, 16, 96, 1)]
    prof = StepProfiler()
    for nodes, replicas, m, s in configs:
        for _ in range(21):
            jitter = rng.lognormal(0.0, noise, size=2)
            optim = float(t_iter(TRUE, nodes, replicas, m, 0)) * jitter[0]
            accum = float(t_grad(TRUE, m)) * jitter[1] if s > 0 else None
            prof.record(nodes, replicas, m, accum, optim)
    return prof


def test_fit_recovers_known_parameters_from_synthetic_step_times():
    prof = _synthetic_profile(np.random.default_rng(0))
    fit = prof.fit()
    assert fit is not None and fit.ok, fit
    assert fit.records == 10 and fit.pinned == ()
    p = fit.params
    assert p.alpha_grad == pytest.approx(TRUE.alpha_grad, rel=0.15)
    assert p.beta_grad == pytest.approx(TRUE.beta_grad, rel=0.1)
    assert p.alpha_local == pytest.approx(TRUE.alpha_local, rel=0.15)
    assert p.alpha_node == pytest.approx(TRUE.alpha_node, rel=0.15)
    # β_local is weakly identified and the regulariser 1e-2·(β/α)² pulls it down: the fit may damp it
    # (here to ~5e-6, at an objective below the true parameters' own), never inflate it.
    assert p.beta_local <= TRUE.beta_local * 1.3
    nodes, replicas, local, optim, accum = prof.records()
    assert fit_objective(p, nodes, replicas, local, optim, accum) <= fit_objective(
        TRUE, nodes, replicas, local, optim, accum) + 1e-9
    assert p.beta_node == pytest.approx(TRUE.beta_node, rel=0.3)
    assert p.gamma == pytest.approx(TRUE.gamma, rel=0.15)
    # Predictions, in and out of sample, match the true model within a few percent.
    nodes = np.array([1, 1, 2, 4, 8])
    replicas = np.array([1, 4, 8, 16, 32])
    m = np.array([48, 100, 64, 128, 64])
    for s in (0, 2):
        np.testing.assert_allclose(t_iter(p, nodes, replicas, m, s), t_iter(TRUE, nodes, replicas, m, s),
                                   rtol=0.06)


def test_fit_on_one_gpu_pins_unexplored_parameters():
    prof = StepProfiler()
    for _ in range(5):
        prof.record(1, 1, 32, None, 0.05)
    fit = prof.fit()
    assert fit.ok and set(fit.pinned) >= {"alpha_node", "beta_node", "alpha_local", "beta_local",
                                          "alpha_grad"}
    assert prof.max_replicas_seen == 1


def test_state_dict_round_trip_through_json():
    prof = _synthetic_profile(np.random.default_rng(1))
    prof.note_replicas(32)
    state = json.loads(json.dumps(prof.state_dict(), allow_nan=False))
    restored = StepProfiler()
    restored.load_state_dict(state)
    for a, b in zip(prof.records(), restored.records(), strict=True):
        np.testing.assert_array_equal(a, b)
    assert restored.max_replicas_seen == 32
    assert restored.state_dict() == prof.state_dict()
    assert restored.fit().params == prof.fit().params              # same means, same fit
    # A restore is a restart: the next step is warm-up even in the last configuration.
    assert restored.record(4, 16, 96, 0.1, 0.2) is False
    assert restored.record(4, 16, 96, 0.1, 0.2) is True


@pytest.mark.parametrize("state", [
    None,
    {"version": 2, "records": [], "max_replicas_seen": 0},
    {"version": 1, "records": [{"nodes": 1}], "max_replicas_seen": 0},
    {"version": 1, "records": [{"nodes": 2, "replicas": 1, "local_bsz": 4, "optim_sum": 1.0,
                                "optim_count": 1, "accum_sum": 0.0, "accum_count": 0}],
     "max_replicas_seen": 0},
    {"version": 1, "records": [{"nodes": 1, "replicas": 1, "local_bsz": 4, "optim_sum": float("nan"),
                                "optim_count": 1, "accum_sum": 0.0, "accum_count": 0}],
     "max_replicas_seen": 0},
    {"version": 1, "records": [], "max_replicas_seen": -1},
])
def test_load_state_dict_rejects_malformed_state(state):
    prof = StepProfiler()
    prof.record(1, 1, 8, None, 1.0)
    prof.record(1, 1, 8, None, 1.0)
    before = prof.state_dict()
    with pytest.raises(ValueError, match="profiler state"):
        prof.load_state_dict(state)
    assert prof.state_dict() == before


def test_periodic_fitter_with_controlled_clock():
    now = [100.0]
    fitter = PeriodicFitter(interval_s=30.0, clock=lambda: now[0])
    assert fitter.due() and fitter.remaining() == 0.0            # nothing fitted yet
    fitter.mark()
    assert not fitter.due()
    now[0] = 129.9
    assert not fitter.due() and fitter.remaining() == pytest.approx(0.1)
    now[0] = 130.0
    assert fitter.due()
    fitter.mark()
    now[0] = 150.0
    assert not fitter.due()
    fitter.reset()
    assert fitter.due()
    with pytest.raises(ValueError):
        PeriodicFitter(interval_s=-1.0)
    assert PeriodicFitter().interval_s == 30.0


# ------------------------------------------------------------------------------------ HintReporter

TOKEN = "s3cret-token"
JOB = "job-42"


def _hints(epoch: int = 3) -> dict:
    return build_hints(TRUE, GradStats(sqr=2.0, var=1.5), 128, 4096, (32, 1024), True, 4, 1000.0, epoch)


@contextlib.contextmanager
def hints_server(status: int | None = None, gate: threading.Event | None = None):
    """A real service stand-in on 127.0.0.1: checks the bearer token and validates the body."""
    validator = jsonschema.Draft202012Validator(load_schema())
    received: list[dict] = []
    entered = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def do_PUT(self) -> None:
            entered.set()
            if gate is not None:
                gate.wait(10)
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.path != f"/v1/jobs/{JOB}/hints":
                return self._answer(404)
            if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                return self._answer(401)
            if self.headers.get("Content-Type") != "application/json":
                return self._answer(415)
            try:
                doc = json.loads(body)
                validator.validate(doc)
            except (ValueError, jsonschema.ValidationError):
                return self._answer(422)
            received.append(doc)
            self._answer(status or 204)

        def _answer(self, code: int) -> None:
            self.send_response(code)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.received = received
    server.entered = entered
    server.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        if gate is not None:
            gate.set()
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_report_reaches_a_real_server_with_token_and_valid_body(caplog):
    with hints_server() as server:
        reporter = HintReporter(server.url + "/", JOB, TOKEN, timeout_s=5.0)
        assert reporter.enabled and reporter.endpoint == f"{server.url}/v1/jobs/{JOB}/hints"
        with caplog.at_level(logging.WARNING, logger="pollux.torch"):
            assert reporter.report(_hints()) is True
        assert server.received == [_hints()]
        assert reporter.sent == 1 and reporter.failed == 0 and reporter.last_ok is True
        assert not caplog.records


@pytest.mark.parametrize(("token", "status", "code"), [("wrong", None, "401"), (TOKEN, 500, "500")])
def test_report_failure_statuses_return_false_and_warn(caplog, token, status, code):
    with hints_server(status=status) as server:
        reporter = HintReporter(server.url, JOB, token, timeout_s=5.0)
        with caplog.at_level(logging.WARNING, logger="pollux.torch"):
            assert reporter.report(_hints()) is False
    assert reporter.failed == 1 and reporter.last_ok is False
    assert any(r.name == "pollux.torch" and r.levelno == logging.WARNING and code in r.getMessage()
               for r in caplog.records)
    assert token not in caplog.text                                # credentials are never logged


def test_report_to_a_server_that_is_down_returns_false_and_warns(caplog):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    reporter = HintReporter(f"http://127.0.0.1:{port}", JOB, TOKEN, timeout_s=2.0)
    with caplog.at_level(logging.WARNING, logger="pollux.torch"):
        assert reporter.report(_hints()) is False
    assert any(r.name == "pollux.torch" and r.levelno == logging.WARNING for r in caplog.records)
    assert "hints PUT" in caplog.text


def test_report_to_a_server_that_never_answers_times_out(caplog):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)                         # the kernel accepts the connection; nobody answers
        reporter = HintReporter(f"http://127.0.0.1:{sock.getsockname()[1]}", JOB, TOKEN, timeout_s=0.2)
        with caplog.at_level(logging.WARNING, logger="pollux.torch"):
            assert reporter.report(_hints()) is False
    assert "hints PUT" in caplog.text


def test_invalid_hints_are_not_sent(caplog):
    with hints_server() as server:
        reporter = HintReporter(server.url, JOB, TOKEN)
        bad = _hints()
        bad["throughput"]["gamma"] = math.nan
        with caplog.at_level(logging.WARNING, logger="pollux.torch"):
            assert reporter.report(bad) is False
            assert reporter.report(None) is False          # never raises, whatever it is given
            assert reporter.report_async(bad) is False
        assert server.received == []
    assert "throughput.gamma" in caplog.text


def test_report_async_keeps_one_request_in_flight_and_sends_the_newest():
    gate = threading.Event()
    with hints_server(gate=gate) as server:
        reporter = HintReporter(server.url, JOB, TOKEN, timeout_s=5.0)
        try:
            assert reporter.report_async(_hints(epoch=1)) is True
            assert server.entered.wait(5)                   # request 1 is held by the server
            assert reporter.in_flight
            assert reporter.report_async(_hints(epoch=2)) is True   # waits behind it ...
            assert reporter.report_async(_hints(epoch=3)) is True   # ... and is replaced
            gate.set()
            assert reporter.flush(timeout=5)
            assert [h["epoch"] for h in server.received] == [1, 3]
            assert reporter.sent == 2
        finally:
            reporter.close()
        assert not reporter._thread.is_alive()
        assert reporter.report_async(_hints()) is False     # closed


def test_close_flushes_waiting_hints():
    with hints_server() as server:
        with HintReporter(server.url, JOB, TOKEN, timeout_s=5.0) as reporter:
            reporter.report_async(_hints(epoch=7))
        assert [h["epoch"] for h in server.received] == [7]
        assert not reporter._thread.is_alive()


def test_disabled_reporter(caplog):
    for url, job in ((None, JOB), ("http://127.0.0.1:1", None), ("", ""), ("  ", JOB)):
        reporter = HintReporter(url, job, TOKEN)
        assert not reporter.enabled and reporter.endpoint is None
        assert reporter.report(_hints()) is False and reporter.report_async(_hints()) is False
        reporter.close()
    with caplog.at_level(logging.WARNING, logger="pollux.torch"):
        reporter = HintReporter("file:///etc/passwd", JOB, TOKEN)
    assert not reporter.enabled and "not an http(s) URL" in caplog.text

"""The REST API of the live scheduler service (SPEC §9), built with FastAPI.

:func:`create_app` returns an application over a :class:`~pollux.cluster.store.JobStore`. Every
endpoint but ``GET /v1/health`` and ``GET /metrics`` needs ``Authorization: Bearer <token>``:

==========================================  =================================================================
``GET  /v1/health``                         ``{"status": "ok"}``; no auth
``POST /v1/jobs``                           admin; body ``{"name"?: str, "spec": {...}}`` → 201, the job with
                                            its ``token`` (returned only here, for the agent's environment)
``GET  /v1/jobs[?state=S...]``              admin; the jobs (no tokens), optionally only those in states S
``GET  /v1/jobs/{id}``                      admin; the job, allocation history, transitions, replicas, hints
``POST /v1/jobs/{id}/cancel``               admin; → cancelled (409 if already terminal)
``GET  /v1/cluster``                        admin; nodes and GPU slots, policy, interval, rounds run
``GET  /v1/jobs/{id}/logs[?restart&rank]``  admin; text/plain, the replicas' log files that exist, each after
                                            a header line ``==> restart R rank K (node N) <==``
``PUT  /v1/jobs/{id}/hints``                admin or the job's own token (another job's token → 403); the
                                            body is validated against the hints contract (SPEC §8)
``GET  /metrics``                           Prometheus text format; no auth (loopback by default, and it
                                            reveals only counts), so a scraper needs no token
==========================================  =================================================================

Errors are JSON: ``{"detail": message}``, and for a validation error (422) also ``"field"``, the dotted
path of the offending value (``"spec.init_batch_size"``, ``"throughput.gamma"``). A missing or wrong
token gives 401, an unknown job 404.

Request bodies are parsed here with :func:`json.loads` rather than by the framework, so that the error
names the field and so that non-finite numbers (``NaN``, ``Infinity``, which Python's parser accepts)
are rejected with 422 naming where they are.
"""

from __future__ import annotations

import json
import math
import secrets
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any

from fastapi import FastAPI, HTTPException, Query, Request
from fastapi.responses import JSONResponse, PlainTextResponse

from pollux.cluster.store import (
    JOB_STATES,
    TERMINAL_STATES,
    AllocationRecord,
    JobRecord,
    JobStore,
    ReplicaRecord,
    TransitionRecord,
    UnknownJobError,
)
from pollux.hints import HintsError

__all__ = ["create_app"]


class _ValidationFailure(Exception):
    """A request body or parameter failed validation; answered with 422 naming ``field``."""

    def __init__(self, field: str, detail: str) -> None:
        super().__init__(detail)
        self.field = field
        self.detail = detail


def _job_dict(job: JobRecord, *, token: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": job.id, "name": job.name, "state": job.state, "spec": job.spec.to_dict(),
        "submit_time": job.submit_time, "start_time": job.start_time, "end_time": job.end_time,
        "restarts": job.restarts, "failure_reason": job.failure_reason,
        "attained_service": job.attained_service, "allocation": dict(job.allocation),
        "failures": job.failures,
    }
    if token:
        out["token"] = job.token
    return out


def _transition_dict(t: TransitionRecord) -> dict[str, Any]:
    return {"from_state": t.from_state, "to_state": t.to_state, "time": t.time, "reason": t.reason}


def _allocation_dict(a: AllocationRecord) -> dict[str, Any]:
    return {"time": a.time, "allocation": dict(a.allocation)}


def _replica_dict(r: ReplicaRecord) -> dict[str, Any]:
    return {"restart": r.restart, "rank": r.rank, "node": r.node, "pid": r.pid, "log_path": r.log_path,
            "start_time": r.start_time, "exit_code": r.exit_code, "end_time": r.end_time}


def _nonfinite_path(obj: Any, path: str) -> str | None:
    """The dotted path of the first non-finite float in ``obj``, or None."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return path
    if isinstance(obj, Mapping):
        for key, value in obj.items():
            found = _nonfinite_path(value, f"{path}.{key}" if path else str(key))
            if found is not None:
                return found
    elif isinstance(obj, list):
        for i, value in enumerate(obj):
            found = _nonfinite_path(value, f"{path}.{i}" if path else str(i))
            if found is not None:
                return found
    return None


async def _json_body(request: Request) -> Any:
    raw = await request.body()
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise _ValidationFailure("body", f"body: invalid JSON: {exc}") from exc


def _bearer(request: Request) -> str:
    header = request.headers.get("authorization")
    if not header:
        raise HTTPException(401, "missing bearer token", headers={"WWW-Authenticate": "Bearer"})
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise HTTPException(401, "malformed Authorization header (expected 'Bearer <token>')",
                            headers={"WWW-Authenticate": "Bearer"})
    return token.strip()


def _same(a: str, b: str) -> bool:
    return secrets.compare_digest(a.encode(), b.encode())


class _Metrics:
    """In-memory counters of this service process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.hints_received = 0

    def add_hints(self) -> None:
        with self._lock:
            self.hints_received += 1


def create_app(store: JobStore, admin_token: str, *, log_dir: Path | None = None,
               on_change: Callable[[], None] | None = None,
               cluster_info: Callable[[], dict[str, Any]] | None = None) -> FastAPI:
    """The service's FastAPI application over ``store``; see the module docstring.

    ``admin_token`` authorises every user endpoint. ``log_dir``, if given, is where relative replica
    log paths are resolved (absolute ones are used as they are). ``on_change`` is called after a
    submission or a cancellation (the service schedules a round then, instead of waiting for the
    interval). ``cluster_info``, if given, answers ``GET /v1/cluster`` (admin): nodes, policy, rounds.
    """
    if not isinstance(admin_token, str) or not admin_token:
        raise ValueError("admin_token: expected a non-empty string")
    app = FastAPI(title="Pollux scheduler", version="1",
                  description="Submit, inspect and cancel jobs; receive hints from running jobs.")
    metrics = _Metrics()
    app.state.store = store
    app.state.metrics = metrics

    @app.exception_handler(_ValidationFailure)
    async def _on_validation(request: Request, exc: _ValidationFailure) -> JSONResponse:
        return JSONResponse({"detail": exc.detail, "field": exc.field}, status_code=422)

    @app.exception_handler(UnknownJobError)
    async def _on_unknown(request: Request, exc: UnknownJobError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=404)

    def require_admin(request: Request) -> None:
        if not _same(_bearer(request), admin_token):
            raise HTTPException(401, "invalid token", headers={"WWW-Authenticate": "Bearer"})

    def get_job(job_id: str) -> JobRecord:
        return store.get_job(job_id)  # UnknownJobError → 404

    @app.get("/v1/health", summary="Liveness check (no auth)")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/v1/jobs", status_code=201, summary="Submit a job (admin); returns it with its token")
    async def submit(request: Request) -> JSONResponse:
        require_admin(request)
        body = await _json_body(request)
        if not isinstance(body, Mapping):
            raise _ValidationFailure("body", "body: expected a JSON object")
        unknown = sorted(set(body) - {"name", "spec"})
        if unknown:
            raise _ValidationFailure(unknown[0], f"{unknown[0]}: unknown field")
        name = body.get("name")
        if name is not None and (not isinstance(name, str) or not name.strip()):
            raise _ValidationFailure("name", f"name: expected a non-empty string, got {name!r}")
        if "spec" not in body:
            raise _ValidationFailure("spec", "spec: required field is missing")
        spec = body["spec"]
        bad = _nonfinite_path(spec, "spec")
        if bad is not None:
            raise _ValidationFailure(bad, f"{bad}: expected a finite number")
        try:
            job = store.submit(spec, name=name)
        except ValueError as exc:
            message = str(exc)
            head = message.split(":", 1)[0].strip()
            field = "spec" if head in ("", "spec") else f"spec.{head}"
            raise _ValidationFailure(field, f"spec.{message}" if field != "spec" else message) from exc
        if on_change is not None:
            on_change()
        return JSONResponse(_job_dict(job, token=True), status_code=201)

    @app.get("/v1/jobs", summary="List jobs (admin), optionally only those in the given states")
    def list_jobs(request: Request,
                  state: Annotated[list[str] | None, Query()] = None) -> list[dict[str, Any]]:
        require_admin(request)
        if state:
            for s in state:
                if s not in JOB_STATES:
                    raise _ValidationFailure("state", f"state: unknown job state {s!r} "
                                                      f"(expected one of {', '.join(JOB_STATES)})")
        return [_job_dict(j) for j in store.list_jobs(state or None)]

    @app.get("/v1/jobs/{job_id}", summary="Describe a job (admin)")
    def describe(request: Request, job_id: str) -> dict[str, Any]:
        require_admin(request)
        job = get_job(job_id)
        out = _job_dict(job)
        out["allocation_history"] = [_allocation_dict(a) for a in store.allocation_history(job_id)]
        out["transitions"] = [_transition_dict(t) for t in store.transitions(job_id)]
        out["replicas"] = [_replica_dict(r) for r in store.replicas(job_id)]
        out["hints"] = store.get_hints(job_id)
        return out

    @app.post("/v1/jobs/{job_id}/cancel", summary="Cancel a job (admin); 409 if already terminal")
    def cancel(request: Request, job_id: str) -> dict[str, Any]:
        require_admin(request)
        job = get_job(job_id)
        if job.state in TERMINAL_STATES:
            raise HTTPException(409, f"job {job_id!r} is already {job.state}")
        try:
            job = store.transition(job_id, "cancelled", reason="cancelled by user")
        except ValueError as exc:  # it became terminal meanwhile
            raise HTTPException(409, str(exc)) from exc
        if on_change is not None:
            on_change()
        return _job_dict(job)

    @app.get("/v1/cluster", summary="The cluster as the service sees it (admin): nodes, policy, rounds")
    def cluster(request: Request) -> dict[str, Any]:
        require_admin(request)
        if cluster_info is None:
            raise HTTPException(404, "this service has no cluster backend")
        return cluster_info()

    @app.get("/v1/jobs/{job_id}/logs", response_class=PlainTextResponse,
             summary="The job's replica logs (admin), as text")
    def logs(request: Request, job_id: str, restart: int | None = None,
             rank: int | None = None) -> PlainTextResponse:
        require_admin(request)
        get_job(job_id)
        parts: list[str] = []
        for rep in store.replicas(job_id, restart):
            if (rank is not None and rep.rank != rank) or not rep.log_path:
                continue
            path = Path(rep.log_path)
            if not path.is_absolute() and log_dir is not None:
                path = Path(log_dir) / path
            try:
                text = path.read_text(errors="replace")
            except OSError:
                continue
            if text and not text.endswith("\n"):
                text += "\n"
            parts.append(f"==> restart {rep.restart} rank {rep.rank} (node {rep.node}) <==\n{text}")
        return PlainTextResponse("".join(parts))

    @app.put("/v1/jobs/{job_id}/hints",
             summary="Report a running job's hints (admin or the job's own token)")
    async def put_hints(request: Request, job_id: str) -> dict[str, Any]:
        token = _bearer(request)
        if not _same(token, admin_token):
            try:
                own = store.get_job(job_id).token
            except UnknownJobError:
                own = None
            if own is None or not _same(token, own):
                if any(_same(token, j.token) for j in store.list_jobs()):
                    raise HTTPException(403, f"this token may not post hints for job {job_id!r}")
                raise HTTPException(401, "invalid token", headers={"WWW-Authenticate": "Bearer"})
        get_job(job_id)
        body = await _json_body(request)
        try:
            data = store.put_hints(job_id, body)
        except HintsError as exc:
            raise _ValidationFailure(exc.field, str(exc)) from exc
        metrics.add_hints()
        return data

    @app.get("/metrics", response_class=PlainTextResponse,
             summary="Prometheus metrics (no auth: counts only)")
    def prometheus() -> PlainTextResponse:
        counts = {s: 0 for s in JOB_STATES}
        for job in store.list_jobs():
            counts[job.state] = counts.get(job.state, 0) + 1
        gpus = sum(sum(a.values()) for a in store.current_allocations().values())
        lines = ["# HELP pollux_jobs Number of jobs in each state.", "# TYPE pollux_jobs gauge"]
        lines += [f'pollux_jobs{{state="{s}"}} {n}' for s, n in counts.items()]
        lines += ["# HELP pollux_allocated_gpus GPUs currently allocated to jobs.",
                  "# TYPE pollux_allocated_gpus gauge", f"pollux_allocated_gpus {gpus}",
                  "# HELP pollux_hints_received_total Valid hints accepted by this service process.",
                  "# TYPE pollux_hints_received_total counter",
                  f"pollux_hints_received_total {metrics.hints_received}"]
        return PlainTextResponse("\n".join(lines) + "\n",
                                 media_type="text/plain; version=0.0.4; charset=utf-8")

    return app

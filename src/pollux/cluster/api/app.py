"""The REST API of the live scheduler service (SPEC §9), built with FastAPI.

:func:`create_app` returns an application over a :class:`~pollux.cluster.state.store.JobStore`. Every
endpoint but ``GET /v1/health`` needs ``Authorization: Bearer <token>``, and follows one rule of
:mod:`pollux.cluster.api.access` (the admin; users, each seeing only its own jobs; a job's own token
for its hints and allocation). ``docs/cluster.md`` has the table of every route's rule and status
codes, which ``tests/test_cluster_access.py`` checks cell by cell. Every route also answers 422 to a
query parameter it does not take.

==========================================  =================================================================
``GET  /v1/health``                         no auth; 200 ``{"status": "ok"}``
``POST /v1/jobs``                           admin or user (the job is theirs); → 201, the job with its
                                            ``token`` (returned only here); 401, 413, 422
``GET  /v1/jobs[?state=S...]``              admin (all) or user (its own); 200 the jobs (no tokens)
``GET  /v1/jobs/{id}``                      admin or the owner; 200 the job, allocation history,
                                            transitions, replicas, hints; 401, 404
``POST /v1/jobs/{id}/cancel``               admin or the owner; 200 → cancelled; 401, 404, 409
``GET  /v1/cluster``                        admin or user; 200 nodes and GPU slots, policy, rounds; 401, 404
``GET  /v1/jobs/{id}/logs[?restart&rank]``  admin or the owner; 200 text/plain, the replicas' log files
``PUT  /v1/jobs/{id}/hints``                admin, the owner or the job's current token; 200 the hints as
                                            stored; 401, 403 (another job's token), 404, 413, 422
``GET  /v1/jobs/{id}/allocation``           as hints; 200 ``{version, allocation, applied, state}``
``PUT  /v1/jobs/{id}/allocation``           as hints; body ``{"version": n}``: the master applied version n
``POST /v1/users``                          admin; body ``{"name": N}`` → 201 the user with its token, once
``GET  /v1/users``                          admin; 200 every user
``POST /v1/users/{name}/revoke``            admin; 200; 404, 409 (already revoked)
``GET  /metrics``                           admin (every job's series) or user (its own jobs'); Prometheus
                                            text (:mod:`pollux.cluster.api.metrics`)
``GET  /v1/jobs/{id}/hints/history``        admin or the owner; ``?points=N`` (2 … 1000, default 200): the
                                            hints history as points, down-sampled (:mod:`.web.history`)
==========================================  =================================================================

The web view (:mod:`pollux.cluster.web`: ``/``, ``/jobs/{id}``, ``/cluster``, ``/rounds``, ``/login``)
is mounted on the same application, outside the OpenAPI document, behind the same tokens.

Errors are JSON: ``{"detail": message}``, and for a validation error (422) or an over-large body (413)
also ``"field"``, the dotted path of the offending value (``"spec.init_batch_size"``,
``"throughput.gamma"``, ``"restart"``, ``"body"``); the message starts with it. A missing or wrong
token gives 401, an unknown job 404. The framework's own validation errors (a query parameter of the
wrong type or out of range) have the same shape.

Request bodies are parsed here rather than by the framework, within the limits of
:mod:`pollux.cluster.api.limits` (size, nesting depth, lone surrogates), so that each error names the
field, and non-finite numbers (``NaN``, ``Infinity``, which Python's parser accepts) are rejected with
422 naming where they are. A submitted spec is validated in full before anything is stored: its
format and ranges (:meth:`JobSpec.from_dict`), its files as the service sees them
(:meth:`JobSpec.check_files`) and whether the cluster could ever run it
(:meth:`JobSpec.check_feasible`). The OpenAPI document (``GET /openapi.json``,
:mod:`pollux.cluster.api.schema`) describes every body, answer and error.

Answers are rendered so that no stored value can make one fail: text that cannot be encoded as UTF-8
(a lone surrogate from an older database) is replaced, a non-finite number becomes ``null``; one odd
job therefore never turns a listing into a 500.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import PlainTextResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from pollux.cluster.api import schema
from pollux.cluster.api.access import (
    ADMIN_ONLY,
    JOB_ROUTE,
    MEMBER_ROUTE,
    OWNER_ROUTE,
    MemberCaller,
    OwnedJob,
    Role,
    identify,
    job_named,
)
from pollux.cluster.api.answers import (
    RenderedJSONResponse,
    SafeJSONResponse,
    allocation_dict,
    job_dict,
    replica_dict,
    tensorboard_dir,
    transition_dict,
    user_dict,
)
from pollux.cluster.api.limits import MAX_QUERY_INT, RequestError, find_nonfinite, read_json_body
from pollux.cluster.api.listing import JobListing
from pollux.cluster.api.logs import log_stream
from pollux.cluster.api.metrics import ServiceMetrics
from pollux.cluster.state.hints_table import MAX_HISTORY_POINTS
from pollux.cluster.state.lifecycle import JobState
from pollux.cluster.state.spec import JobSpec, SpecError, validate_name
from pollux.cluster.state.store import (
    JOB_STATES,
    TERMINAL_STATES,
    JobRecord,
    JobStore,
    UnknownJobError,
    UnknownUserError,
)
from pollux.cluster.state.user_table import validate_user_name
from pollux.cluster.web.history import DEFAULT_POINTS, HintsPoints
from pollux.cluster.web.routes import web_router
from pollux.cluster.web.session import Viewer
from pollux.hints import HintsError

__all__ = ["SafeJSONResponse", "create_app"]

_log = logging.getLogger(__name__)

_StateName = Literal[JOB_STATES]  # type: ignore[valid-type]
#: ``?state=`` (repeatable): the states of the jobs to list.
_StatesQuery = Annotated[list[_StateName],
                         Query(description="Only jobs in these states (repeatable).")]
#: ``?restart=`` and ``?rank=``: whole numbers in SQLite's (and any real job's) range; absent = all.
_IndexQuery = Annotated[int, Query(ge=0, le=MAX_QUERY_INT)]
#: ``?points=``: the most points of a hints history (the store down-samples a longer one).
_PointsQuery = Annotated[int, Query(alias="points", ge=2, le=MAX_HISTORY_POINTS,
                                    description="The most points (a longer history is down-sampled).")]


def _spec_field(exc: SpecError) -> str:
    """The body path of a spec error: ``name`` stays, spec fields get the ``spec.`` prefix."""
    if exc.field == "name":
        return "name"
    return "spec" if exc.field in ("", "spec") else f"spec.{exc.field}"


def _field_error(exc: SpecError) -> RequestError:
    field = _spec_field(exc)
    detail = getattr(exc, "detail", None) or str(exc).split(": ", 1)[-1]
    return RequestError(422, field, detail)


def _no_round() -> bool:
    """No scheduling round in this process to wait for."""
    return True


def create_app(store: JobStore, admin_token: str, *, log_dir: Path | None = None,
               on_change: Callable[[], None] | None = None,
               cluster_info: Callable[[], dict[str, Any]] | None = None,
               node_resources: Callable[[], list[dict[str, float]]] | None = None,
               node_types: Callable[[], Mapping[str, str]] | None = None,
               check_files: bool = True, state_dir: Path | None = None,
               wait_for_round: Callable[[], object] | None = None) -> FastAPI:
    """The service's FastAPI application over ``store``; see the module docstring.

    ``admin_token`` authorises every user endpoint. ``log_dir``, if given, is where relative replica
    log paths are resolved (absolute ones are used as they are). ``on_change`` is called after a
    submission or a cancellation (the service schedules a round then, instead of waiting for the
    interval). ``cluster_info``, if given, answers ``GET /v1/cluster`` (admin): nodes, policy, rounds.
    ``node_resources``, if given, returns each alive node's total resources; a submission the
    cluster could never run is refused with 422 (:meth:`JobSpec.check_feasible`). ``check_files``
    refuses a submission whose entrypoint or working folder the service cannot find or start
    (:meth:`JobSpec.check_files`); turn it off only where the service does not see the replicas'
    file system. ``node_types``, if given, returns ``{node: GPU type}`` of the typed nodes the
    service knows: each job then lists the ``gpu_types`` of its allocation's nodes, and a job's detail
    the type of every node it was allocated or ran on (``node_types``). ``state_dir``, the service's
    state folder, lets a job's detail name where its TensorBoard event files go (``tensorboard_dir``).
    ``wait_for_round``, if given, blocks while a scheduling round runs (the controller's
    ``round_gate.wait_quiet``, :mod:`pollux.cluster.control.round_gate`): the web view's pages and
    ``/metrics`` call it before they read the store, so that they do not render while a round runs.
    """
    if not isinstance(admin_token, str) or not admin_token:
        raise ValueError("admin_token: expected a non-empty string")
    app = FastAPI(title="Pollux scheduler", version="1", default_response_class=SafeJSONResponse,
                  description="Submit, inspect and cancel jobs; receive hints from running jobs. "
                              "Errors are {\"detail\"}, plus \"field\" on 413 and 422.")
    metrics = ServiceMetrics(store, node_types=node_types)
    points = HintsPoints(store)
    if wait_for_round is None:
        wait_for_round = _no_round
    app.state.store = store
    app.state.admin_token = admin_token
    app.state.metrics = metrics

    @app.middleware("http")
    async def _time_requests(request: Request, call_next: Callable[[Request], Any]) -> Any:
        """Observe each request's latency by method and route template (bounded label values)."""
        start = time.perf_counter()
        response = await call_next(request)
        route = getattr(request.scope.get("route"), "path", "unmatched")
        metrics.observe_request(request.method, route, time.perf_counter() - start)
        return response

    # -- errors: one JSON shape for all of them

    @app.exception_handler(RequestError)
    async def _on_request_error(request: Request, exc: RequestError) -> SafeJSONResponse:
        return SafeJSONResponse({"detail": exc.detail, "field": exc.field}, status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _on_framework_validation(request: Request, exc: RequestValidationError) -> SafeJSONResponse:
        errors = exc.errors()
        first = errors[0] if errors else {"loc": ("body",), "msg": "invalid request"}
        loc = [str(p) for p in first.get("loc", ())]
        if len(loc) >= 2 and loc[0] in ("query", "path", "header", "cookie"):
            field = loc[1]
        else:
            field = ".".join(loc) or "body"
        return SafeJSONResponse({"detail": f"{field}: {first.get('msg', 'invalid value')}", "field": field},
                                status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _on_http(request: Request, exc: StarletteHTTPException) -> SafeJSONResponse:
        return SafeJSONResponse({"detail": str(exc.detail)}, status_code=exc.status_code,
                                headers=getattr(exc, "headers", None))

    @app.exception_handler(UnknownJobError)
    async def _on_unknown(request: Request, exc: UnknownJobError) -> SafeJSONResponse:
        return SafeJSONResponse({"detail": str(exc)}, status_code=404)

    @app.exception_handler(Exception)
    async def _on_crash(request: Request, exc: Exception) -> SafeJSONResponse:
        _log.exception("%s %s failed", request.method, request.url.path)
        return SafeJSONResponse({"detail": "internal error (see the service's log)"}, status_code=500)

    def only_query(*names: str) -> Any:
        """A dependency refusing any query parameter but ``names`` (422 naming it): a misspelt
        filter (``?states=running``) is an error, not a silently unfiltered answer."""
        expected = f"expected {', '.join(names)}" if names else "this route takes none"

        async def check(request: Request) -> None:
            for key in request.query_params:
                if key not in names:
                    raise RequestError(422, key[:64], f"unknown query parameter ({expected})")

        return Depends(check)

    def types() -> dict[str, str]:
        if node_types is None:
            return {}
        try:
            return dict(node_types())
        except Exception:  # never let a listing fail for want of types
            _log.warning("node types unavailable", exc_info=True)
            return {}

    def nodes() -> list[dict[str, float]]:
        if node_resources is None:
            return []
        try:
            found = [dict(n) for n in node_resources()]
        except Exception:  # the backend is unreachable right now: accept, the controller retries
            _log.warning("node resources unavailable; submission not checked against the cluster",
                         exc_info=True)
            return []
        # A node whose resources are not known (an empty mapping) would refuse every job: when any
        # is unknown, the cluster is, and nothing is checked against it.
        return found if all(found) else []

    # -- routes

    @app.get("/v1/health", summary="Liveness check (no auth)", response_model=None,
             dependencies=[only_query()], responses=schema.responses(200, "Health", 422))
    async def health() -> SafeJSONResponse:
        return SafeJSONResponse({"status": "ok"})

    def submit_checked(body: Any, owner: str | None) -> JobRecord:
        if not isinstance(body, Mapping):
            raise RequestError(422, "body", "expected a JSON object")
        unknown = sorted(k for k in body if k not in ("name", "spec"))
        if unknown:
            raise RequestError(422, unknown[0][:64], "unknown field")
        bad = find_nonfinite(body)
        if bad is not None:
            raise RequestError(422, bad, "expected a finite number")
        name = body.get("name")
        try:
            if name is not None:
                name = validate_name(name)
            if "spec" not in body:
                raise RequestError(422, "spec", "required field is missing")
            spec = JobSpec.from_dict(body["spec"])
            if check_files:
                spec.check_files()
            spec.check_feasible(nodes())
            return store.submit(spec, name=name, owner=owner)
        except SpecError as exc:
            raise _field_error(exc) from None

    @app.post("/v1/jobs", status_code=201, dependencies=[only_query()], response_model=None,
              summary="Submit a job (admin or a user, whose job it is); returns it with its token",
              responses=schema.responses(201, "SubmittedJob", 401, 413, 422, ok_text="Submitted"),
              openapi_extra={**schema.BEARER, **schema.request_body("SubmitRequest", "The job to run.")})
    async def submit(request: Request, caller: MemberCaller) -> SafeJSONResponse:
        body = await read_json_body(request)
        job = await run_in_threadpool(submit_checked, body, caller.owner_filter)
        if on_change is not None:
            on_change()
        return SafeJSONResponse(job_dict(job, token=True, types=types()), status_code=201)

    listing = JobListing(store)   # each job's JSON, remembered by its row: pollux ls at 5,000 jobs

    @app.get("/v1/jobs", dependencies=[only_query("state")], response_model=None,
             summary="List jobs (the admin: all; a user: its own), optionally only those in the given states",
             responses=schema.responses(200, "JobList", 401, 422), openapi_extra=schema.BEARER)
    def list_jobs(caller: MemberCaller,
                  state: _StatesQuery = None) -> RenderedJSONResponse:  # type: ignore[assignment]
        body = listing.render(state or None, owner=caller.owner_filter, types=types())
        return RenderedJSONResponse(body)

    @app.get("/v1/jobs/{job_id}", dependencies=[only_query()], response_model=None,
             summary="Describe a job (the admin, or the user who owns it)",
             responses=schema.responses(200, "JobDetail", 401, 404, 422), openapi_extra=schema.BEARER)
    def describe(job_id: str, job: OwnedJob) -> SafeJSONResponse:
        known = types()
        out = job_dict(job, types=known)
        history = store.resizes(job_id)
        replicas = store.replicas(job_id)
        out["allocation_history"] = [allocation_dict(a) for a in history]
        out["transitions"] = [transition_dict(t) for t in store.transitions(job_id)]
        out["replicas"] = [replica_dict(r) for r in replicas]
        out["hints"] = store.get_hints(job_id)
        used = {*out["allocation"], *(n for a in history for n in a.allocation), *(r.node for r in replicas)}
        out["node_types"] = {n: known[n] for n in sorted(used) if n in known}
        out["tensorboard_dir"] = tensorboard_dir(state_dir, job_id)
        return SafeJSONResponse(out)

    @app.post("/v1/jobs/{job_id}/cancel", dependencies=[only_query()], response_model=None,
              summary="Cancel a job (the admin, or the user who owns it); 409 if already terminal",
              responses=schema.responses(200, "Job", 401, 404, 409, 422), openapi_extra=schema.BEARER)
    def cancel(job_id: str, job: OwnedJob) -> SafeJSONResponse:
        if job.state in TERMINAL_STATES:
            raise HTTPException(409, f"job {job_id!r} is already {job.state}")
        try:   # the lifecycle's one transition function, as for every other move
            job = store.transition(job_id, JobState.CANCELLED, reason="cancelled by user")
        except ValueError as exc:  # it became terminal meanwhile
            raise HTTPException(409, str(exc)) from exc
        if on_change is not None:
            on_change()
        return SafeJSONResponse(job_dict(job, types=types()))

    @app.get("/v1/cluster", dependencies=[MEMBER_ROUTE, only_query()], response_model=None,
             summary="The cluster as the service sees it (the admin or a user): nodes, policy, rounds",
             responses=schema.responses(200, "Cluster", 401, 404, 422), openapi_extra=schema.BEARER)
    def cluster() -> SafeJSONResponse:
        if cluster_info is None:
            raise HTTPException(404, "this service has no cluster backend")
        return SafeJSONResponse(cluster_info())

    @app.get("/v1/jobs/{job_id}/logs", dependencies=[OWNER_ROUTE, only_query("restart", "rank")],
             response_class=PlainTextResponse,
             response_model=None,
             summary="The job's replica logs (the admin, or the user who owns it), as text",
             responses=schema.responses(200, None, 401, 404, 422, text=True), openapi_extra=schema.BEARER)
    def logs(job_id: str, restart: _IndexQuery = None,  # type: ignore[assignment]
             rank: _IndexQuery = None) -> StreamingResponse:  # type: ignore[assignment]
        files: list[tuple[str, Path]] = []
        for rep in store.replicas(job_id, restart):
            if (rank is not None and rep.rank != rank) or not rep.log_path:
                continue
            path = Path(rep.log_path)
            if not path.is_absolute() and log_dir is not None:
                path = Path(log_dir) / path
            files.append((f"==> restart {rep.restart} rank {rep.rank} (node {rep.node}) <==\n", path))
        return StreamingResponse(log_stream(files), media_type="text/plain; charset=utf-8")

    def put_hints_checked(job_id: str, body: Any) -> dict[str, Any]:
        bad = find_nonfinite(body)
        if bad is not None:
            raise RequestError(422, bad, "expected a finite number")
        try:
            return store.put_hints(job_id, body)
        except HintsError as exc:
            raise RequestError(422, exc.field or "body", exc.detail) from exc

    @app.put("/v1/jobs/{job_id}/hints", response_model=None,
             dependencies=[JOB_ROUTE, only_query()],
             summary="Report a running job's hints (the admin, its owner, or the job's own token)",
             responses=schema.responses(200, "Hints", 401, 403, 404, 413, 422, ok_text="The hints as stored"),
             openapi_extra={**schema.BEARER, **schema.request_body("Hints", "The job's hints (SPEC §8).")})
    async def put_hints(request: Request, job_id: str) -> SafeJSONResponse:
        body = await read_json_body(request)
        data = await run_in_threadpool(put_hints_checked, job_id, body)
        metrics.add_hints()
        return SafeJSONResponse(data)

    @app.get("/v1/jobs/{job_id}/allocation", response_model=None,
             dependencies=[JOB_ROUTE, only_query()],
             summary="An elastic job's current allocation and the version it applied "
                     "(admin, owner or its token)",
             responses=schema.responses(200, "Allocation", 401, 403, 404, 422), openapi_extra=schema.BEARER)
    def get_allocation(job_id: str) -> SafeJSONResponse:
        job = job_named(store, job_id)
        version, allocation, applied = store.allocation_version(job_id)
        return SafeJSONResponse({"version": version, "allocation": allocation, "applied": applied,
                                 "state": job.state})

    def ack_checked(job_id: str, body: Any) -> None:
        version = body.get("version") if isinstance(body, dict) else None
        if not isinstance(body, dict) or set(body) != {"version"}:
            raise RequestError(422, "body", 'expected {"version": <int>}')
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise RequestError(422, "version", f"expected a positive integer, got {version!r}")
        try:
            store.ack_allocation(job_id, version)      # an overtaken version is not recorded as applied
        except ValueError as exc:
            raise RequestError(422, "version", str(exc).removeprefix("version: ")) from exc

    @app.put("/v1/jobs/{job_id}/allocation", response_model=None,
             dependencies=[JOB_ROUTE, only_query()],
             summary="An elastic job says it applied an allocation version in place "
                     "(admin, owner or its token)",
             responses=schema.responses(200, "Allocation", 401, 403, 404, 413, 422,
                                     ok_text="The allocation after the acknowledgement (applied < version: "
                                             "a newer round overtook the version acknowledged)"),
             openapi_extra={**schema.BEARER, **schema.request_body("AllocationAck", "The version applied.")})
    async def put_allocation(request: Request, job_id: str) -> SafeJSONResponse:
        body = await read_json_body(request)
        await run_in_threadpool(ack_checked, job_id, body)
        return await run_in_threadpool(get_allocation, job_id)

    def add_user_checked(body: Any) -> dict[str, Any]:
        if not isinstance(body, Mapping) or set(body) != {"name"}:
            raise RequestError(422, "body", 'expected {"name": <user name>}')
        try:
            user = store.add_user(validate_user_name(body["name"]))
        except SpecError as exc:
            raise RequestError(422, "name", exc.detail) from None
        except ValueError as exc:
            raise HTTPException(409, str(exc)) from None
        return user_dict(user, token=True)

    @app.post("/v1/users", status_code=201, dependencies=[ADMIN_ONLY, only_query()],
              response_model=None,
              summary="Create a user (admin); returns it with its token, once",
              responses=schema.responses(201, "NewUser", 401, 403, 409, 413, 422, ok_text="Created"),
              openapi_extra={**schema.BEARER, **schema.request_body("UserRequest", "The user to create.")})
    async def add_user(request: Request) -> SafeJSONResponse:
        body = await read_json_body(request)
        return SafeJSONResponse(await run_in_threadpool(add_user_checked, body), status_code=201)

    @app.get("/v1/users", dependencies=[ADMIN_ONLY, only_query()], response_model=None,
             summary="List the users (admin), revoked ones included",
             responses=schema.responses(200, "UserList", 401, 403, 422), openapi_extra=schema.BEARER)
    def list_users() -> SafeJSONResponse:
        return SafeJSONResponse([user_dict(u) for u in store.users()])

    @app.post("/v1/users/{name}/revoke", dependencies=[ADMIN_ONLY, only_query()], response_model=None,
              summary="Revoke a user's token (admin); its jobs stay. 409 if already revoked",
              responses=schema.responses(200, "User", 401, 403, 404, 409, 422), openapi_extra=schema.BEARER)
    def revoke_user(name: str) -> SafeJSONResponse:
        try:
            return SafeJSONResponse(user_dict(store.revoke_user(name)))
        except UnknownUserError as exc:
            raise HTTPException(404, str(exc)) from None
        except ValueError as exc:
            raise HTTPException(409, str(exc)) from None

    @app.get("/metrics", response_class=PlainTextResponse, response_model=None,
             summary="Prometheus metrics (the admin: every job's series; a user: its own jobs')",
             dependencies=[only_query()], responses=schema.responses(200, None, 401, 422, text=True),
             openapi_extra=schema.BEARER)
    def prometheus(caller: MemberCaller) -> PlainTextResponse:
        wait_for_round()
        return metrics.exposition(owner=caller.owner_filter)

    @app.get("/v1/jobs/{job_id}/hints/history", dependencies=[OWNER_ROUTE, only_query("points")],
             response_model=None,
             summary="A job's hints history as points over time, down-sampled (the admin, or the owner)",
             responses=schema.responses(200, "HintsHistory", 401, 404, 422), openapi_extra=schema.BEARER)
    def hints_history(job_id: str, points_wanted: _PointsQuery = DEFAULT_POINTS) -> SafeJSONResponse:
        return SafeJSONResponse([p.to_dict() for p in points.of(job_id, points_wanted)])

    def web_viewer(token: str) -> Viewer | None:
        """The web view's reading of a token, by the API's rules: the admin or a user; a job's token
        is no viewer."""
        caller = identify(token, admin_token, store)
        if caller is None or caller.role is Role.JOB:
            return None
        return Viewer(caller.owner_filter)

    app.include_router(web_router(store, web_viewer, points, log_dir=log_dir, cluster_info=cluster_info,
                                  node_types=types, wait_for_round=wait_for_round))
    schema.install(app)
    return app

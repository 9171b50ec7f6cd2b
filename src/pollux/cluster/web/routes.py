"""The pages of the web view, as a FastAPI router the service's application mounts
(:func:`pollux.cluster.api.app.create_app`): same process, same port, read-only.

==================  ===============================================================================
``GET  /``          the jobs table (``?state=S`` repeatable, ``?user=NAME``, ``?page=N``; 50 a page)
``GET  /jobs/{id}`` a job: charts over time, allocation history, transitions, the tail of its log
``GET  /cluster``   nodes, GPU types, GPUs in use, the allocation map
``GET  /rounds``    the newest rounds: when, how long, jobs seen, allocations changed, policy
``GET  /login``     a form taking a token; ``POST /login`` sets the cookie; ``/logout`` clears it
``GET  /web.css``   the style sheet (no other asset exists: charts are SVG drawn here)
==================  ===============================================================================

Every page takes the same tokens as the API (a bearer header, or the cookie ``POST /login`` sets);
without a valid one a page redirects to ``/login`` (303). A user sees only its own jobs (another
user's job page is 404, as in the API); the admin sees every job. Pages are HTML, errors too: a bad
filter is a 422 page that says which parameter is wrong.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.concurrency import run_in_threadpool

from pollux.cluster.state.lifecycle import ACTIVE_STATES, JOB_STATES
from pollux.cluster.state.records import JobRecord, UnknownJobError
from pollux.cluster.state.spec import is_job_id
from pollux.cluster.state.store import JobStore
from pollux.cluster.web.history import HintsPoints
from pollux.cluster.web.logtail import log_tail
from pollux.cluster.web.pages import (
    PAGE_SIZE,
    JobsFilter,
    allocation_rows,
    clock_text,
    job_charts,
    job_row,
    node_rows,
    pager,
    placement_text,
    round_rows,
)
from pollux.cluster.web.session import (
    MAX_TOKEN_CHARS,
    Viewer,
    ViewerLookup,
    forget_token,
    local_target,
    remember_token,
    request_token,
)

__all__ = ["web_router"]

_log = logging.getLogger(__name__)

TEMPLATES = Path(__file__).resolve().parent / "templates"
#: The largest login form read (a token and a path).
MAX_FORM_BYTES = 8 * 1024
#: What a page may load and do: its own style sheet and nothing else (no script at all).
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
                               "frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


class _PageError(Exception):
    """A page that cannot be shown as asked: its status and what to say."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def web_router(store: JobStore, viewer_of: ViewerLookup, points: HintsPoints, *,
               log_dir: Path | None = None,
               cluster_info: Callable[[], Mapping[str, Any]] | None = None,
               node_types: Callable[[], Mapping[str, str]] = dict,
               wait_for_round: Callable[[], object]) -> APIRouter:
    """The web view's routes over ``store`` (see the module docstring). ``viewer_of`` names the
    viewer of a token (the API's rules); ``points`` computes hints histories (shared with the API);
    ``log_dir`` resolves relative replica log paths; ``cluster_info`` and ``node_types`` are the
    application's (the nodes and their GPU types; None: no cluster backend). ``wait_for_round``
    blocks while a scheduling round runs (:mod:`pollux.cluster.control.round_gate`): a page is built
    after it, never during it."""
    env = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=select_autoescape(["html"]),
                      trim_blocks=True, lstrip_blocks=True)
    router = APIRouter(include_in_schema=False)

    def render(name: str, viewer: Viewer | None, code: int = 200, **context: Any) -> HTMLResponse:
        html = env.get_template(name).render(viewer=viewer, **context)
        return HTMLResponse(html, status_code=code, headers=HEADERS)

    def viewer(request: Request) -> Viewer | None:
        token = request_token(request)
        return None if token is None else viewer_of(token)

    def to_login(request: Request) -> RedirectResponse:
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return RedirectResponse(f"/login?next={quote(target, safe='')}", status_code=303, headers=HEADERS)

    def page(request: Request, build: Callable[[Viewer], HTMLResponse]) -> Response:
        """The page ``build`` makes for the request's viewer; the login page without one; an error
        page for a :class:`_PageError`."""
        who = viewer(request)
        if who is None:
            return to_login(request)
        wait_for_round()
        try:
            return build(who)
        except _PageError as exc:
            return render("error.html", who, exc.status, status=exc.status, message=exc.message)

    def known_types() -> dict[str, str]:
        try:
            return dict(node_types())
        except Exception:   # a page never fails for want of GPU types
            _log.warning("node types unavailable", exc_info=True)
            return {}

    def nodes() -> list[Mapping[str, Any]] | None:
        if cluster_info is None:
            return None
        try:
            return [n for n in cluster_info().get("nodes", []) if isinstance(n, Mapping)]
        except Exception:
            _log.warning("cluster information unavailable", exc_info=True)
            return None

    # -- the jobs table

    def jobs_filter(request: Request, who: Viewer) -> tuple[JobsFilter, int]:
        params = request.query_params
        unknown = sorted(set(params) - {"state", "user", "page"})
        if unknown:
            raise _PageError(422, f"unknown query parameter {unknown[0][:64]!r} (expected state, user, page)")
        states = tuple(dict.fromkeys(params.getlist("state")))
        bad = [s for s in states if s not in JOB_STATES]
        if bad:
            raise _PageError(422, f"state: unknown job state {bad[0][:64]!r} "
                                  f"(one of {', '.join(JOB_STATES)})")
        text = params.get("page", "1")
        if not text.isdigit() or not 1 <= int(text) <= 1_000_000:
            raise _PageError(422, f"page: expected a whole number from 1, got {text[:64]!r}")
        user = params.get("user") or None
        if not who.is_admin and user not in (None, who.user):
            raise _PageError(404, f"unknown user {user[:64]!r}")   # a user sees no other user
        return JobsFilter(states, user), int(text)

    def jobs_page(request: Request, who: Viewer) -> HTMLResponse:
        filters, number = jobs_filter(request, who)
        owner = who.user if not who.is_admin else (None if filters.user in (None, "admin") else filters.user)
        listing = store.jobs_page(filters.states or None, owner=owner,
                                  admins_only=who.is_admin and filters.user == "admin",
                                  offset=(number - 1) * PAGE_SIZE, limit=PAGE_SIZE, newest_first=True)
        outlooks = store.outlooks([j.id for j in listing.jobs])
        now = time.time()
        types = known_types()
        rows = [job_row(j, outlooks.get(j.id), types, now) for j in listing.jobs]
        users = ["admin", *(u.name for u in store.users())] if who.is_admin else []
        return render("jobs.html", who, rows=rows, pager=pager(number, listing.total, filters),
                      filters=filters, states=JOB_STATES, users=users)

    @router.get("/")
    def jobs(request: Request) -> Response:
        return page(request, lambda who: jobs_page(request, who))

    # -- one job

    def job_for(who: Viewer, job_id: str) -> JobRecord:
        if not is_job_id(job_id):
            raise _PageError(404, f"unknown job {job_id[:80]!r}")
        try:
            job = store.get_job(job_id)
        except UnknownJobError:
            raise _PageError(404, f"unknown job {job_id!r}") from None
        if not who.is_admin and job.owner != who.user:
            raise _PageError(404, f"unknown job {job_id!r}")   # to a user, another's job does not exist
        return job

    def job_page(job_id: str, who: Viewer) -> HTMLResponse:
        job = job_for(who, job_id)
        history = store.resizes(job_id)
        now = time.time()
        charts = job_charts(points.of(job_id), history, job.end_time or now)
        types = known_types()
        outlook = store.outlooks([job_id]).get(job_id)
        transitions = list(reversed(store.transitions(job_id)))
        return render("job.html", who, job=job, row=job_row(job, outlook, types, now), charts=charts,
                      allocations=allocation_rows(history), transitions=transitions,
                      logs=log_tail(store.replicas(job_id), log_dir), clock=clock_text)

    @router.get("/jobs/{job_id}")
    def job(request: Request, job_id: str) -> Response:
        return page(request, lambda who: job_page(job_id, who))

    # -- the cluster and the rounds

    def cluster_page(who: Viewer) -> HTMLResponse:
        found = nodes()
        allocations = store.current_allocations()
        visible = None
        if not who.is_admin:
            mine = store.jobs_page(sorted(ACTIVE_STATES), owner=who.user, limit=500)
            visible = {j.id for j in mine.jobs}
        types = known_types()
        listed = [{**n, "gpu_type": n.get("gpu_type") or types.get(str(n.get("name")))} for n in found or []]
        rows = node_rows(listed, allocations, visible)
        return render("cluster.html", who, nodes=rows, known=found is not None,
                      total=sum(r.gpus for r in rows), used=sum(r.used for r in rows),
                      placement=placement_text)

    @router.get("/cluster")
    def cluster(request: Request) -> Response:
        return page(request, cluster_page)

    def rounds_page(who: Viewer) -> HTMLResponse:
        rows = round_rows(store.rounds(100))
        policy = None
        if cluster_info is not None:
            try:
                policy = cluster_info().get("policy")
            except Exception:
                _log.warning("cluster information unavailable", exc_info=True)
        return render("rounds.html", who, rounds=rows, policy=policy)

    @router.get("/rounds")
    def rounds(request: Request) -> Response:
        return page(request, rounds_page)

    # -- logging in and out, and the style sheet

    @router.get("/login")
    def login_form(request: Request) -> HTMLResponse:
        return render("login.html", None, target=local_target(request.query_params.get("next")), error=None)

    @router.post("/login")
    async def login(request: Request) -> Response:
        declared = request.headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > MAX_FORM_BYTES):
            return render("login.html", None, 413, target="/", error="The form is too large.")
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_FORM_BYTES:
                return render("login.html", None, 413, target="/", error="The form is too large.")
        form = parse_qs(body.decode("utf-8", "replace"), max_num_fields=8)
        token = (form.get("token") or [""])[0].strip()
        target = local_target((form.get("next") or ["/"])[0])
        who = None
        if 0 < len(token) <= MAX_TOKEN_CHARS:
            who = await run_in_threadpool(viewer_of, token)
        if who is None:
            return render("login.html", None, 401, target=target,
                          error="Unknown token. Use the admin token or a user's token (a job's token "
                                "is not a login).")
        response = RedirectResponse(target, status_code=303, headers=HEADERS)
        remember_token(response, token, secure=request.url.scheme == "https")
        return response

    @router.api_route("/logout", methods=["GET", "POST"])
    def logout() -> Response:
        response = RedirectResponse("/login", status_code=303, headers=HEADERS)
        forget_token(response)
        return response

    @router.get("/web.css")
    def style() -> Response:
        return Response((TEMPLATES / "web.css").read_bytes(), media_type="text/css",
                        headers={"Cache-Control": "max-age=3600", "X-Content-Type-Options": "nosniff"})

    return router

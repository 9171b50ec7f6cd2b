"""Who may do what on the API: the callers a bearer token names, and the rule each route follows.

Three kinds of token: the admin's (the state folder's ``admin-token``), a user's (created by the
admin, :mod:`pollux.cluster.state.user_table`) and a job's (handed to its replicas at each launch).
Each route follows one :class:`Rule`; ``docs/cluster.md`` has the table of every route and
``tests/test_cluster_access.py`` tries each route with each kind of token against that table.

- A user sees and acts on only its own jobs: another user's job answers 404, as if it did not
  exist, so that job ids reveal nothing across users.
- A job's token is a credential only for its own job's hints and allocation; anywhere else it is an
  unknown token (401), and on another job's routes 403.
- A user's token on an admin-only route answers 403: the caller is known, the right is missing.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, HTTPException, Request

from pollux.cluster.api.auth import bearer_token, same_token, unauthorised
from pollux.cluster.state.records import JobRecord
from pollux.cluster.state.spec import is_job_id
from pollux.cluster.state.store import JobStore

__all__ = ["ADMIN_ONLY", "JOB_ROUTE", "MEMBER_ROUTE", "OWNER_ROUTE", "Caller", "MemberCaller", "OwnedJob",
           "Role", "Rule", "check_caller", "check_owner", "identify", "job_named"]


class Role(enum.Enum):
    ADMIN = "admin"
    USER = "user"
    JOB = "job"


class Rule(enum.Enum):
    """Who may call a route (the job, where the route names one)."""

    #: No token needed.
    PUBLIC = "public"
    #: The admin only.
    ADMIN = "admin"
    #: The admin or any user (a user's view is its own jobs).
    MEMBER = "member"
    #: The admin or the user who owns the job.
    OWNER = "owner"
    #: The admin, the owning user, or the job's own current token.
    JOB = "job"


@dataclass(frozen=True)
class Caller:
    """Who a request comes from: the admin, a user (``user``) or a job's replicas (``job_id``)."""

    role: Role
    user: str | None = None
    job_id: str | None = None

    @property
    def is_admin(self) -> bool:
        return self.role is Role.ADMIN

    @property
    def owner_filter(self) -> str | None:
        """The owner to list jobs of: the user's name for a user, None (every job) for the admin."""
        return self.user if self.role is Role.USER else None


def identify(token: str, admin_token: str, store: JobStore) -> Caller | None:
    """The caller of ``token``, or None for a token of no one (the admin's is compared first, in
    constant time; users' and jobs' are looked up by their hashes)."""
    if same_token(token, admin_token):
        return Caller(Role.ADMIN)
    user = store.user_of_token(token)
    if user is not None:
        return Caller(Role.USER, user=user)
    job_id = store.job_of_token(token)
    if job_id is not None:
        return Caller(Role.JOB, job_id=job_id)
    return None


def check_caller(rule: Rule, caller: Caller | None, job_id: str | None = None) -> None:
    """Raise 401 or 403 for a caller the route does not admit, before anything is looked up (see
    the module docstring); ``job_id`` is the job the route names, if any."""
    if rule is Rule.PUBLIC or (caller is not None and caller.is_admin):
        return
    if caller is None:
        raise unauthorised("invalid token")
    if caller.role is Role.JOB:
        if rule is Rule.JOB and job_id is not None and job_id == caller.job_id:
            return
        if rule is Rule.JOB:
            raise HTTPException(403, "this token may only be used for its own job")
        raise unauthorised("invalid token")
    if rule is Rule.ADMIN:
        raise HTTPException(403, "this route is the admin's")


def check_owner(caller: Caller | None, job: JobRecord) -> None:
    """404 for a user's request about another user's (or the admin's) job: to a user, the job does
    not exist."""
    if caller is not None and caller.role is Role.USER and job.owner != caller.user:
        raise HTTPException(404, f"unknown job {job.id!r}")


# -- the rules as FastAPI dependencies; the application keeps its store and admin token in
#    ``app.state`` (:func:`pollux.cluster.api.app.create_app`)


def job_named(store: JobStore, job_id: str) -> JobRecord:
    """The job ``job_id``; 404 for an id that cannot exist (never looked up) or an unknown one."""
    if not is_job_id(job_id):
        raise HTTPException(404, f"unknown job {job_id[:80]!r}")
    return store.get_job(job_id)  # UnknownJobError → 404


def _caller_of(request: Request, rule: Rule, job_id: str | None = None) -> Caller | None:
    """The request's caller, if ``rule`` admits it (401 or 403 otherwise)."""
    state = request.app.state
    caller = identify(bearer_token(request), state.admin_token, state.store)
    check_caller(rule, caller, job_id)
    return caller


def _job_for(request: Request, rule: Rule, job_id: str) -> JobRecord:
    caller = _caller_of(request, rule, job_id)
    job = job_named(request.app.state.store, job_id)
    check_owner(caller, job)
    return job


def _admin(request: Request) -> None:
    _caller_of(request, Rule.ADMIN)


def _member(request: Request) -> Caller:
    caller = _caller_of(request, Rule.MEMBER)
    assert caller is not None  # a rule other than PUBLIC never admits no one
    return caller


def _owned_job(request: Request, job_id: str) -> JobRecord:
    return _job_for(request, Rule.OWNER, job_id)


def _job_route(request: Request, job_id: str) -> JobRecord:
    return _job_for(request, Rule.JOB, job_id)


#: A route for the admin only.
ADMIN_ONLY = Depends(_admin)
#: A route for the admin and every user.
MEMBER_ROUTE = Depends(_member)
#: A route about one job, for the admin and the user who owns it.
OWNER_ROUTE = Depends(_owned_job)
#: A route about one job, for the admin, its owner and the job's own token.
JOB_ROUTE = Depends(_job_route)
#: The caller of a route for the admin and every user.
MemberCaller = Annotated[Caller, MEMBER_ROUTE]
#: The job a route names, for the admin and the user who owns it.
OwnedJob = Annotated[JobRecord, OWNER_ROUTE]

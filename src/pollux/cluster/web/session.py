"""Who a page is shown to: the token a request carries (an ``Authorization: Bearer`` header, or the
cookie the login page sets) and the viewer it names — the admin or a user. A job's own token names no
viewer: it is a credential for that job's hints and allocation only, never for the pages.

The web view does not decide who a token belongs to: the application hands it a
:data:`ViewerLookup` built on the API's own rules (:func:`pollux.cluster.api.access.identify`), so the
pages and the API cannot disagree about a token.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import Response

__all__ = ["COOKIE", "Viewer", "ViewerLookup", "forget_token", "local_target", "remember_token",
           "request_token"]

#: The cookie holding a logged-in browser's token (HttpOnly, SameSite=Strict).
COOKIE = "pollux_token"
#: The longest token the login form accepts (real ones are 43 characters).
MAX_TOKEN_CHARS = 512


@dataclass(frozen=True)
class Viewer:
    """Whom a page is shown to: a user (``user``, seeing only its own jobs) or the admin (None)."""

    user: str | None

    @property
    def is_admin(self) -> bool:
        return self.user is None

    @property
    def name(self) -> str:
        return "admin" if self.user is None else self.user


#: The viewer a token names, or None for a token of no one (or a job's).
ViewerLookup = Callable[[str], Viewer | None]


def request_token(request: Request) -> str | None:
    """The request's token: its bearer header when it has one (a malformed header counts as none,
    and the cookie is then not read), else the login cookie."""
    header = request.headers.get("authorization")
    if header is not None:
        scheme, _, token = header.partition(" ")
        return token.strip() if scheme.lower() == "bearer" and token.strip() else None
    cookie = request.cookies.get(COOKIE, "")
    return cookie or None


def local_target(target: str | None) -> str:
    """Where to go after logging in: ``target`` if it is a path of this site, else ``/`` (never
    another site: ``//host`` and ``/\\host`` are refused, as are control characters)."""
    if not target or not target.startswith("/") or target.startswith(("//", "/\\")):
        return "/"
    if any(ord(c) < 0x20 or c == "\x7f" for c in target) or len(target) > 2048:
        return "/"
    return target


def remember_token(response: Response, token: str, *, secure: bool) -> None:
    """Set the login cookie: not readable by scripts, never sent by another site's request, for
    every page of this service; ``secure`` when served over HTTPS."""
    response.set_cookie(COOKIE, token, httponly=True, samesite="strict", path="/", secure=secure)


def forget_token(response: Response) -> None:
    response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")

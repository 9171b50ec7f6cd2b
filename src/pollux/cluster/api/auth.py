"""Bearer tokens on the API: reading one from a request, and comparing two without leaking their
content or length through timing."""

from __future__ import annotations

import hashlib
import hmac

from fastapi import HTTPException, Request

__all__ = ["bearer_token", "same_token", "unauthorised"]


def unauthorised(message: str) -> HTTPException:
    """A 401 that tells the client which scheme to use."""
    return HTTPException(401, message, headers={"WWW-Authenticate": "Bearer"})


def bearer_token(request: Request) -> str:
    """The request's bearer token; 401 if it has none or a malformed ``Authorization`` header."""
    header = request.headers.get("authorization")
    if not header:
        raise unauthorised("missing bearer token")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise unauthorised("malformed Authorization header (expected 'Bearer <token>')")
    return token.strip()


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


def same_token(a: str, b: str) -> bool:
    """Whether two tokens are equal, in time independent of their content and of their lengths
    (their SHA-256 digests are compared, in constant time)."""
    return hmac.compare_digest(_digest(a), _digest(b))

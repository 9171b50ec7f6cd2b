"""Limits on what one request to the service's API may send (issue 10: hostile and clumsy users).

A request body is read in pieces and refused with 413 as soon as it passes :data:`MAX_BODY_BYTES`, or
before any of it is read when its ``Content-Length`` already says so; a body that arrives chunked, with
no length, is counted as it streams. Its JSON is refused with 422 when it nests deeper than
:data:`MAX_JSON_DEPTH` — measured on the raw text before it is parsed, since Python's parser recurses
and ~1,000 levels raise ``RecursionError`` — and when any string or key in it holds a lone surrogate
(``"\\ud800"`` is valid JSON but not valid Unicode: it cannot be stored or sent back as UTF-8).
Integer query parameters are bounded by :data:`MAX_QUERY_INT` (SQLite's integers are 64-bit; a
larger one overflowed there). String lengths and numeric ranges of a job's spec are the spec's own
validation (:mod:`pollux.cluster.state.spec`).

Every refusal is a :class:`RequestError` naming the field, answered as ``{"detail", "field"}``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

import numpy as np
from starlette.requests import Request

__all__ = [
    "MAX_BODY_BYTES",
    "MAX_JSON_DEPTH",
    "MAX_QUERY_INT",
    "RequestError",
    "find_nonfinite",
    "find_surrogate",
    "json_depth",
    "read_json_body",
]

#: Largest request body accepted, in bytes (a job spec or a hints body is a few hundred bytes).
MAX_BODY_BYTES = 1 << 20
#: Deepest nesting of arrays and objects accepted in a body (a spec or hints body nests 3 deep).
MAX_JSON_DEPTH = 32
#: Largest integer accepted in a query parameter (restart numbers and ranks are small).
MAX_QUERY_INT = 2**31 - 1


class RequestError(Exception):
    """A request refused before it reaches the store: ``status`` (413 or 422), ``field``, ``detail``.

    ``detail`` starts with the field's name, as every validation message of the API does.
    """

    def __init__(self, status: int, field: str, message: str) -> None:
        self.status = status
        self.field = field
        self.detail = f"{field}: {message}"
        super().__init__(self.detail)


# A JSON string, escapes included (the unrolled form, linear in the text).
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
# Every byte but the four brackets, deleted by bytes.translate.
_NOT_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")


def json_depth(raw: bytes) -> int:
    """The deepest nesting of ``[``/``{`` in JSON text, without parsing it (brackets inside strings
    do not count). Linear time in C and numpy, no recursion, whatever the text holds."""
    brackets = _STRING.sub(b"", raw).translate(None, _NOT_BRACKET)
    if not brackets:
        return 0
    codes = np.frombuffer(brackets, dtype=np.uint8)
    steps = np.where((codes == ord("[")) | (codes == ord("{")), 1, -1)
    return int(np.cumsum(steps).max())


def _has_surrogate(text: str) -> bool:
    if text.isascii():
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _walk(obj: Any, path: str):
    """Yield ``(path, value)`` of every value in a parsed JSON document and ``(path, key)`` of every
    key, iteratively (the depth was bounded before parsing, but recursion is not needed)."""
    stack: list[tuple[str, Any]] = [(path, obj)]
    while stack:
        where, value = stack.pop()
        yield where, value
        if isinstance(value, Mapping):
            items = list(value.items())
            for key, item in reversed(items):
                child = f"{where}.{key}" if where else str(key)
                stack.append((child, item))
            for key, _ in items:
                yield (f"{where}.{key}" if where else str(key)), key
        elif isinstance(value, list):
            for i in range(len(value) - 1, -1, -1):
                stack.append((f"{where}.{i}" if where else str(i), value[i]))


def find_surrogate(obj: Any, path: str = "") -> str | None:
    """The dotted path of the first string or key in ``obj`` holding a lone surrogate, or None.

    The path names where the bad text is; a key's own bad text is rendered with ``repr`` escapes so
    that the path itself can be sent back as UTF-8.
    """
    for where, value in _walk(obj, path):
        if isinstance(value, str) and _has_surrogate(value):
            return where.encode("utf-8", "backslashreplace").decode("utf-8")
    return None


def find_nonfinite(obj: Any, path: str = "") -> str | None:
    """The dotted path of the first non-finite number (``NaN``, ``Infinity``) in ``obj``, or None."""
    for where, value in _walk(obj, path):
        if isinstance(value, float) and not math.isfinite(value):
            return where
    return None


async def read_body(request: Request, limit: int = MAX_BODY_BYTES) -> bytes:
    """The request's body, refused with 413 (field ``body``) past ``limit`` bytes.

    A ``Content-Length`` over the limit is refused before anything is read; otherwise the body is
    read as it streams and refused as soon as it passes the limit, so a chunked body without a length
    (or with a false one) never sits whole in memory.
    """
    length = request.headers.get("content-length")
    if length is not None:
        try:
            declared = int(length)
        except ValueError:
            raise RequestError(422, "body", f"invalid Content-Length {length[:40]!r}") from None
        if declared > limit:
            raise RequestError(413, "body", f"request body of {declared} bytes is over the limit of "
                                            f"{limit} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise RequestError(413, "body", f"request body is over the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


async def read_json_body(request: Request) -> Any:
    """The request's body parsed as JSON, within every limit of this module.

    Refuses (each naming the field): a body over :data:`MAX_BODY_BYTES` (413, ``body``), text that is
    not JSON or not UTF-8 (422, ``body``), nesting deeper than :data:`MAX_JSON_DEPTH` (422, ``body``),
    a lone surrogate in any string or key (422, its path). Non-finite numbers are left for the caller,
    which knows the field's name relative to its own document.
    """
    raw = await read_body(request)
    depth = json_depth(raw)
    if depth > MAX_JSON_DEPTH:
        raise RequestError(422, "body", f"JSON nested {depth} levels deep; at most {MAX_JSON_DEPTH} "
                                        "are accepted")
    try:
        body = json.loads(raw)
    except RecursionError:  # unreachable after the depth check; kept as a last line of defence
        raise RequestError(422, "body", "JSON nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise RequestError(422, "body", f"invalid JSON: {exc}") from None
    bad = find_surrogate(body)
    if bad is not None:
        raise RequestError(422, bad or "body", "text holds a lone surrogate (not valid Unicode)")
    return body

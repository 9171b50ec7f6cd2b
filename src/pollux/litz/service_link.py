"""The master's calls to the Pollux service: its allocation (read, acknowledge) and its hints.

Standard library HTTP with the job's own token, so that a Litz master needs nothing of the service
but its URL (``POLLUX_SCHEDULER_URL``) and the routes spelled in :mod:`pollux.contract` and
:mod:`pollux.hints`.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from pollux import contract as ct
from pollux.hints import hints_path

__all__ = ["Allocation", "AllocationSource", "ServiceError", "ServiceLink"]


class ServiceError(RuntimeError):
    """The service could not be reached or refused the master's request (the message says which)."""


@dataclass(frozen=True)
class Allocation:
    """The service's answer: the current allocation, its version, and the newest version applied."""

    version: int
    allocation: dict[str, int]
    applied: int
    state: str

    def slots(self) -> list[str]:
        """One node name per allocated GPU, nodes in name order (worker i on slot i)."""
        return [n for n, g in sorted(self.allocation.items()) for _ in range(int(g))]


class AllocationSource(Protocol):
    """What the master asks of the service; :class:`ServiceLink` over HTTP, a fake in unit tests."""

    def get(self) -> Allocation:
        """The current allocation and its version (``ServiceError`` if it cannot be read)."""
        ...

    def ack(self, version: int) -> Allocation:
        """The job runs on allocation `version` now."""
        ...

    def put_hints(self, body: Mapping[str, Any]) -> None:
        """The job's hints, so that a goodput policy can size it."""
        ...


class ServiceLink:
    """The master's calls to the service, over HTTP with the job's own token (standard library)."""

    def __init__(self, url: str, job_id: str, token: str | None, timeout_s: float = 5.0) -> None:
        self.url = url.rstrip("/")
        quoted = urllib.parse.quote(job_id, safe="")
        self.path = ct.ALLOCATION_ENDPOINT.format(job_id=quoted)
        self.hints_path = hints_path(job_id)
        self.token = token
        self.timeout_s = timeout_s
        # Loopback needs no proxy; a proxy from the environment must not see the job's token.
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def _request(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> Any:
        """One call with the job's token; the JSON answer, or ``ServiceError`` naming the call."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with self._opener.open(req, timeout=self.timeout_s) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            raise ServiceError(f"{method} {path}: HTTP {exc.code} {exc.read()[:300]!r}") from exc
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise ServiceError(f"{method} {path}: {exc}") from exc

    def _allocation(self, method: str, body: Mapping[str, Any] | None = None) -> Allocation:
        got = self._request(method, self.path, body)
        try:
            return Allocation(int(got["version"]), {str(k): int(v) for k, v in got["allocation"].items()},
                              int(got["applied"]), str(got["state"]))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ServiceError(f"{method} {self.path}: unexpected answer {got!r:.300}") from exc

    def get(self) -> Allocation:
        return self._allocation("GET")

    def ack(self, version: int) -> Allocation:
        return self._allocation("PUT", {"version": int(version)})

    def put_hints(self, body: Mapping[str, Any]) -> None:
        """``PUT /v1/jobs/{id}/hints`` (the scheduler's model of the job); ``ServiceError`` if refused."""
        self._request("PUT", self.hints_path, body)

"""A small synchronous client of the scheduler service's REST API (:mod:`pollux.cluster.api.app`).

::

    with PolluxClient.from_state_dir(default_state_dir()) as client:
        job = client.submit({"entrypoint": "/abs/train.py", "init_batch_size": 128}, name="demo")
        print(client.job(job["id"])["state"])

Every method returns the decoded JSON body (or text, for :meth:`PolluxClient.logs`). A non-2xx answer
raises :class:`ClientError` with the HTTP status, the API's ``detail`` and, for a validation error, the
``field`` it names; a service that cannot be reached raises :class:`ClientError` with status 0.
"""

from __future__ import annotations

import urllib.parse
from pathlib import Path
from typing import Any

import httpx

__all__ = ["ClientError", "PolluxClient"]


class ClientError(Exception):
    """A request to the service failed: ``status`` is the HTTP status (0: no answer at all)."""

    def __init__(self, status: int, detail: str, field: str | None = None) -> None:
        self.status = int(status)
        self.detail = str(detail)
        self.field = field
        super().__init__(self.status, self.detail, field)

    def __str__(self) -> str:
        if self.status == 0:
            return self.detail
        detail = self.detail
        if self.field and not detail.startswith(self.field):
            detail = f"{self.field}: {detail}"
        return f"{self.status} {detail}"


def _detail_of(response: httpx.Response) -> tuple[str, str | None]:
    """The ``detail`` and ``field`` of an error answer, whatever shape its body has."""
    try:
        body = response.json()
    except ValueError:
        text = response.text.strip().replace("\n", " ")
        return (text[:300] or response.reason_phrase or "error"), None
    if not isinstance(body, dict) or "detail" not in body:
        return str(body)[:300], None
    detail, field = body["detail"], body.get("field")
    if isinstance(detail, list):  # the framework's own validation errors (bad query parameters)
        parts = []
        for item in detail:
            if isinstance(item, dict):
                loc = ".".join(str(p) for p in item.get("loc", ()) if p not in ("query", "path", "body"))
                msg = item.get("msg", "invalid value")
                parts.append(f"{loc}: {msg}" if loc else str(msg))
                field = field or loc or None
            else:
                parts.append(str(item))
        detail = "; ".join(parts)
    return str(detail), (str(field) if field is not None else None)


class PolluxClient:
    """The service at ``url``, authorised by the admin ``token``; see the module docstring."""

    def __init__(self, url: str, token: str, timeout: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self._http = httpx.Client(base_url=self.url, timeout=timeout,
                                  headers={"Authorization": f"Bearer {token}"})

    @classmethod
    def from_state_dir(cls, state_dir: Path | str, timeout: float = 30.0,
                       token: str | None = None) -> PolluxClient:
        """The client of the service running from ``state_dir``, with ``token`` (a user's) or else the
        folder's admin token; raises ``ServerError`` if none runs."""
        from pollux.cluster.server import connect

        info = connect(Path(state_dir), token)
        return cls(info.url, info.token, timeout=timeout)

    # -- plumbing

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> PolluxClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TimeoutException as exc:
            raise ClientError(0, f"the Pollux service at {self.url} did not answer in time "
                                 f"({type(exc).__name__})") from exc
        except httpx.TransportError as exc:
            raise ClientError(0, f"cannot reach the Pollux service at {self.url}: {exc}") from exc
        if not response.is_success:
            detail, field = _detail_of(response)
            raise ClientError(response.status_code, detail, field)
        return response

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self._request(method, path, **kwargs)
        try:
            return response.json()
        except ValueError as exc:
            raise ClientError(response.status_code,
                              f"the service at {self.url} answered {path} with invalid JSON") from exc

    @staticmethod
    def _job_path(job_id: str) -> str:
        return f"/v1/jobs/{urllib.parse.quote(str(job_id), safe='')}"

    # -- endpoints

    def health(self) -> dict[str, Any]:
        """``{"status": "ok"}`` if the service answers."""
        return self._json("GET", "/v1/health")

    def submit(self, spec: dict[str, Any], name: str | None = None) -> dict[str, Any]:
        """Submit a job; returns it, with its ``token``."""
        body: dict[str, Any] = {"spec": spec}
        if name is not None:
            body["name"] = name
        return self._json("POST", "/v1/jobs", json=body)

    def jobs(self, states: list[str] | None = None) -> list[dict[str, Any]]:
        """All jobs in submission order, or only those in ``states``."""
        params = [("state", s) for s in states] if states else None
        return self._json("GET", "/v1/jobs", params=params)

    def job(self, job_id: str) -> dict[str, Any]:
        """One job with its allocation history, transitions, replicas and latest hints."""
        return self._json("GET", self._job_path(job_id))

    def cancel(self, job_id: str) -> dict[str, Any]:
        """Cancel a job; returns it in its new state (409 if it had already ended)."""
        return self._json("POST", f"{self._job_path(job_id)}/cancel")

    def logs(self, job_id: str, restart: int | None = None, rank: int | None = None) -> str:
        """The replicas' logs as text, each after a header line ``==> restart R rank K (node N) <==``."""
        params = {k: v for k, v in (("restart", restart), ("rank", rank)) if v is not None}
        return self._request("GET", f"{self._job_path(job_id)}/logs", params=params).text

    def cluster(self) -> dict[str, Any]:
        """Nodes and GPU slots, policy, scheduling interval and rounds run."""
        return self._json("GET", "/v1/cluster")

    def add_user(self, name: str) -> dict[str, Any]:
        """Create a user (admin); returns it with its ``token``, which is shown only this once."""
        return self._json("POST", "/v1/users", json={"name": name})

    def users(self) -> list[dict[str, Any]]:
        """Every user (admin), revoked ones included."""
        return self._json("GET", "/v1/users")

    def revoke_user(self, name: str) -> dict[str, Any]:
        """Revoke a user's token (admin); its jobs stay."""
        return self._json("POST", f"/v1/users/{urllib.parse.quote(name, safe='')}/revoke")

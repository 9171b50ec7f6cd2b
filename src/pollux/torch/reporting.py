"""Reporting hints from the agent to the scheduler service (SPEC §8), with the standard library only.

``PUT {POLLUX_SCHEDULER_URL}/v1/jobs/{POLLUX_JOB_ID}/hints`` with ``Authorization: Bearer
{POLLUX_JOB_TOKEN}`` and the JSON body of :mod:`pollux.hints`. Reporting must never disturb training:
:meth:`HintReporter.report` never raises (a failure is a warning on the ``pollux.torch`` logger and a
False return), and :meth:`HintReporter.report_async` hands the body to one background thread, so at
most one request is in flight; hints submitted while one is in flight replace any still waiting, so
the newest hints go next and stale ones are never sent.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any

from pollux.contract import ENV_SCHEDULER_URL
from pollux.hints import hints_path, validate_hints

logger = logging.getLogger("pollux.torch")


def _is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class HintReporter:
    """Sends a job's hints to the scheduler service.

    ``enabled`` is False when ``url`` or ``job_id`` is missing (running without a scheduler) or the
    URL is not http(s); then every report is a no-op returning False. Requests to a loopback host
    bypass any proxy from the environment.
    """

    def __init__(self, url: str | None, job_id: str | None, token: str | None,
                 timeout_s: float = 5.0) -> None:
        self.url = url.strip().rstrip("/") if url and url.strip() else None
        self.job_id = str(job_id) if job_id not in (None, "") else None
        self.token = token.strip() if token and token.strip() else None
        self.timeout_s = float(timeout_s)
        self.sent = 0        # successful reports
        self.failed = 0      # failed reports
        self.last_ok: bool | None = None
        self._valid_url = False
        handlers: list[urllib.request.BaseHandler] = []
        if self.url is not None:
            parts = urllib.parse.urlsplit(self.url)
            self._valid_url = parts.scheme in ("http", "https") and bool(parts.hostname)
            if not self._valid_url:
                logger.warning("%s=%r is not an http(s) URL; hints reporting is disabled",
                               ENV_SCHEDULER_URL, self.url)
            elif _is_loopback(parts.hostname or ""):
                handlers.append(urllib.request.ProxyHandler({}))
        self._opener = urllib.request.build_opener(*handlers)
        self._cond = threading.Condition()
        self._pending: dict[str, Any] | None = None
        self._busy = False
        self._closed = False
        self._thread: threading.Thread | None = None

    @property
    def enabled(self) -> bool:
        return self._valid_url and self.job_id is not None

    @property
    def endpoint(self) -> str | None:
        """The full hints URL, or None when disabled."""
        if not self.enabled or self.job_id is None:
            return None
        return f"{self.url}{hints_path(self.job_id)}"

    # ---------------------------------------------------------------- synchronous

    def report(self, hints: Mapping[str, Any]) -> bool:
        """PUT the hints now; True on a 2xx answer. Never raises; failures log a warning."""
        body = self._prepare(hints)
        if body is None:
            return False
        return self._send(body)

    def _prepare(self, hints: Mapping[str, Any]) -> dict[str, Any] | None:
        if not self.enabled:
            logger.debug("hints reporting disabled (no scheduler URL or job id)")
            return None
        try:
            return validate_hints(hints)
        except Exception as exc:
            logger.warning("not reporting invalid hints for job %s: %s", self.job_id, exc)
            return None

    def _send(self, body: dict[str, Any]) -> bool:
        endpoint = self.endpoint
        assert endpoint is not None        # only called with hints that _prepare let through
        try:
            data = json.dumps(body, allow_nan=False).encode("utf-8")
            headers = {"Content-Type": "application/json", "Accept": "application/json",
                       "User-Agent": "pollux-agent"}
            if self.token is not None:
                headers["Authorization"] = f"Bearer {self.token}"
            request = urllib.request.Request(endpoint, data=data, headers=headers, method="PUT")
            with self._opener.open(request, timeout=self.timeout_s) as response:
                response.read(65536)
                status = response.status
            ok = 200 <= status < 300
            if not ok:
                logger.warning("hints PUT %s answered HTTP %d", endpoint, status)
        except urllib.error.HTTPError as exc:
            detail = ""
            try:
                detail = exc.read(300).decode("utf-8", errors="replace").strip()
            except Exception:
                pass
            finally:
                exc.close()
            logger.warning("hints PUT %s failed: HTTP %d %s%s", endpoint, exc.code, exc.reason,
                           f" ({detail})" if detail else "")
            ok = False
        except Exception as exc:
            reason = getattr(exc, "reason", None) or exc
            logger.warning("hints PUT %s failed: %s: %s", endpoint, type(exc).__name__, reason)
            ok = False
        with self._cond:
            self.last_ok = ok
            if ok:
                self.sent += 1
            else:
                self.failed += 1
        return ok

    # ---------------------------------------------------------------- asynchronous

    def report_async(self, hints: Mapping[str, Any]) -> bool:
        """Queue the hints for the background sender; never blocks on the network.

        Returns False (without queueing) when disabled, closed, or the hints are invalid. At most one
        request is in flight; hints queued behind it replace any older ones still waiting.
        """
        body = self._prepare(hints)
        if body is None:
            return False
        with self._cond:
            if self._closed:
                return False
            self._pending = body
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="pollux-hints-reporter",
                                                daemon=True)
                self._thread.start()
            self._cond.notify_all()
        return True

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending is not None or self._closed)
                if self._pending is None:
                    return
                body, self._pending = self._pending, None
                self._busy = True
            try:
                self._send(body)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    @property
    def in_flight(self) -> bool:
        """Whether a background request is being sent right now."""
        with self._cond:
            return self._busy

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until queued hints are sent (or failed); True if idle before ``timeout``."""
        with self._cond:
            if self._thread is None:
                return True
            return self._cond.wait_for(lambda: self._pending is None and not self._busy, timeout)

    def close(self, flush: bool = True, timeout: float | None = None) -> None:
        """Stop the background sender, first sending waiting hints if ``flush``. Idempotent.

        Waits at most ``timeout`` seconds (default: enough for two requests to time out); a request
        stuck beyond that is abandoned to its daemon thread.
        """
        with self._cond:
            self._closed = True
            if not flush:
                self._pending = None
            self._cond.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(2.0 * self.timeout_s + 1.0 if timeout is None else timeout)

    def __enter__(self) -> HintReporter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

"""How the API's answers are written: records as JSON objects, and a JSON response that can always be
sent (a lone surrogate from an older database, or a non-finite number, never turns an answer into a
500)."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fastapi.responses import JSONResponse, Response

from pollux.cluster.backends.gputypes import job_gpu_types
from pollux.cluster.backends.launcher import TENSORBOARD_FOLDER
from pollux.cluster.state.records import JobRecord, ReplicaRecord, ResizeRecord, TransitionRecord, UserRecord

__all__ = ["RenderedJSONResponse", "SafeJSONResponse", "allocation_dict", "job_dict", "render_json",
           "replica_dict", "sanitise", "tensorboard_dir", "transition_dict", "user_dict"]

_SURROGATE = re.compile("[\ud800-\udfff]")
# ``json.dumps`` with these settings, made once rather than per call (the job listing renders
# thousands of jobs one by one).
_STRICT = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))
_LENIENT = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"), default=str)


def sanitise(value: Any) -> Any:
    """``value`` with every lone surrogate replaced by U+FFFD and every non-finite float by None."""
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {sanitise(str(k)): sanitise(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [sanitise(v) for v in value]
    return value


def render_json(content: Any) -> bytes:
    """``content`` as the API sends it: strict JSON when the content allows, else the content with
    lone surrogates replaced and non-finite numbers as null (never an encoding error, a 500).

    Rendering an array item by item and joining the items with ``,`` inside ``[...]`` gives the
    bytes of rendering the array whole, even when one item needs the second pass: :func:`sanitise`
    changes nothing in an item that renders strictly and whose keys are strings, as every record's
    are (the job listing, :mod:`pollux.cluster.api.listing`, relies on it).
    """
    try:
        return _STRICT.encode(content).encode("utf-8")
    except (UnicodeEncodeError, ValueError, TypeError):
        return _LENIENT.encode(sanitise(content)).encode("utf-8")


class SafeJSONResponse(JSONResponse):
    """A JSON answer that can always be sent (:func:`render_json`)."""

    def render(self, content: Any) -> bytes:
        return render_json(content)


class RenderedJSONResponse(Response):
    """A JSON answer rendered already, by :func:`render_json`'s rules (the job listing's, joined from
    each job's remembered JSON): sent as it is, with the headers of a :class:`SafeJSONResponse`."""

    media_type = "application/json"


def job_dict(job: JobRecord, *, token: bool = False,
             types: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A job as the API answers it (``token`` only on the answer to its submission).

    The job listing renders the same fields straight from the job's row
    (:func:`pollux.cluster.api.listing.listed_job_json`): a field changed here must be changed there
    too (``tests/test_job_listing.py`` fails until both give the same bytes)."""
    out: dict[str, Any] = {
        "id": job.id, "name": job.name, "state": job.state, "spec": job.spec.to_dict(),
        "spec_error": job.spec_error,
        "submit_time": job.submit_time, "start_time": job.start_time, "end_time": job.end_time,
        "restarts": job.restarts, "failures": job.failures, "failure_reason": job.failure_reason,
        "attained_service": job.attained_service, "allocation": dict(job.allocation),
        "gpu_types": job_gpu_types(job.allocation, types or {}),
        "owner": job.owner,
    }
    if token:
        out["token"] = job.token
    return out


def transition_dict(t: TransitionRecord) -> dict[str, Any]:
    """One entry of a job's state history."""
    return {"from_state": t.from_state, "to_state": t.to_state, "time": t.time, "reason": t.reason}


def allocation_dict(a: ResizeRecord) -> dict[str, Any]:
    """One allocation of a job, with its version and when it was applied."""
    return {"time": a.time, "allocation": dict(a.allocation), "version": a.version, "applied": a.applied}


def replica_dict(r: ReplicaRecord) -> dict[str, Any]:
    """One replica process of a job's run."""
    return {"restart": r.restart, "rank": r.rank, "node": r.node, "pid": r.pid, "log_path": r.log_path,
            "start_time": r.start_time, "exit_code": r.exit_code, "end_time": r.end_time}


def user_dict(user: UserRecord, *, token: bool = False) -> dict[str, Any]:
    """A user as the API answers it (``token`` only on the answer to its creation)."""
    out: dict[str, Any] = {"name": user.name, "created": user.created, "revoked": user.revoked}
    if token:
        out["token"] = user.token
    return out


def tensorboard_dir(state_dir: Path | None, job_id: str) -> str | None:
    """The job detail's ``tensorboard_dir``: where the job's replicas write TensorBoard event files
    (``POLLUX_TENSORBOARD_DIR``, set by the launcher beside the job's checkpoint folder), whether or
    not any were written yet; None when the answer is made without the service's state folder."""
    if state_dir is None:
        return None
    return str(Path(state_dir) / TENSORBOARD_FOLDER / job_id)

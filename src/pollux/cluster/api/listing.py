"""The job listing's answer (``GET /v1/jobs``, what ``pollux ls`` asks), made cheap at thousands of
jobs: each job's JSON is remembered with exactly what it was made from, and the answer is joined
from the remembered pieces.

Made the plain way, every row read into a record, every record into a dict and the whole list into
JSON, a listing of 5,000 jobs cost ~150 ms of CPU. The API is one process, so every handler and the
scheduling round waited on it (``benchmarks/service_scale.py``: ``ls`` had the worst tail). Between
two listings few jobs change: a round changes the running jobs' attained service and allocation, and
most jobs have ended long ago.

A job's JSON depends only on its row (:data:`~pollux.cluster.state.job_table.LISTING_COLUMNS` as
stored) and, through ``gpu_types``, on the map from node to GPU type. The listing keeps, per job, the
row its JSON was made from, and makes the JSON again when the row read now differs in anything (state,
allocation, restarts, attained service, failure reason, end time, owner, spec, ...), or when the
type map differs from the one the remembered JSON was made with. Nothing is invalidated by events,
so nothing can be stale: a changed job is a different row, rendered anew in the same listing.

A job's JSON is made from its row directly (:func:`listed_job_json`), not through a record and
:func:`~pollux.cluster.api.answers.job_dict`, at half the cost: the same fields in the same order
(``tests/test_job_listing.py`` compares the bytes for jobs in every state). After a round changed a
thousand rows, most of the cost is in making their JSON again; the spec, half of each job's bytes, is
then taken from its previous JSON, the stored spec being the same text.

Equal rows render equal JSON, because SQLite gives each column's values one type: REAL columns hold
1 as 1.0 and -0.0 as 0.0, INTEGER columns 1.0 as 1, TEXT columns numbers as text; so two rows that
compare equal hold the same values of the same types.

Memory stays bounded: one entry per job id listed (the row and its JSON, ~1.5 KB); a listing of all
jobs keeps only the jobs it listed, so a job gone from the store is forgotten at the next one, and a
listing with another type map keeps only the jobs it made again with it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pollux.cluster.api.answers import render_json
from pollux.cluster.backends.gputypes import job_gpu_types
from pollux.cluster.state.database import stored_allocation, stored_spec
from pollux.cluster.state.job_table import LISTING_COLUMNS, JobTable

__all__ = ["JobListing", "ListedJob", "listed_job_json"]

_ID = LISTING_COLUMNS.index("id")
_SPEC = LISTING_COLUMNS.index("spec")
#: What joins the fields before the spec, the spec's JSON and the fields after it.
_SPEC_KEY = b',"spec":'


@dataclass(frozen=True, slots=True)
class ListedJob:
    """One job's JSON in the listing (``json``, UTF-8), the row it was made from (``row``), and where
    in ``json`` its spec's JSON lies (``spec_from`` to ``spec_to``), to be reused when only the other
    fields change."""

    row: tuple[Any, ...]
    json: bytes
    spec_from: int
    spec_to: int

    def spec_json(self) -> bytes:
        return self.json[self.spec_from:self.spec_to]


def listed_job_json(row: tuple[Any, ...], types: Mapping[str, str],
                    spec_json: bytes | None = None) -> ListedJob:
    """One job's JSON from its row (:data:`~pollux.cluster.state.job_table.LISTING_COLUMNS`): the bytes
    of :func:`~pollux.cluster.api.answers.render_json` of :func:`~pollux.cluster.api.answers.job_dict`
    of the record the store reads from that row, with ``types`` — made without the record, at half its
    cost. ``spec_json``: the JSON of the same stored spec, when known already.

    The spec is rendered on its own and the fields around it as two objects, joined: JSON's members
    can be split so, and :func:`~pollux.cluster.api.answers.render_json`'s second pass, which only
    replaces what the first cannot render, changes nothing in a part that renders at the first.
    """
    col = dict(zip(LISTING_COLUMNS, row, strict=True))
    spec, spec_error = stored_spec(col["spec"])
    if spec_json is None:
        spec_json = render_json(spec.to_dict())
    allocation = stored_allocation(col["allocation"])
    head = render_json({"id": col["id"], "name": col["name"], "state": col["state"]})
    tail = render_json({
        "spec_error": spec_error, "submit_time": col["submit_time"], "start_time": col["start_time"],
        "end_time": col["end_time"], "restarts": col["restarts"], "failures": col["failures"],
        "failure_reason": col["failure_reason"], "attained_service": col["attained_service"],
        "allocation": allocation, "gpu_types": job_gpu_types(allocation, types), "owner": col["owner"],
    })
    spec_from = len(head) - 1 + len(_SPEC_KEY)
    text = b"".join((head[:-1], _SPEC_KEY, spec_json, b",", tail[1:]))
    return ListedJob(row, text, spec_from, spec_from + len(spec_json))


class JobListing:
    """The listing of a store's jobs as the API answers it, remembered job by job (see the module
    docstring). Safe to share between the API's threads."""

    def __init__(self, store: JobTable) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._jobs: dict[str, ListedJob] = {}
        self._types: dict[str, str] = {}

    def __len__(self) -> int:
        """How many jobs' JSON is remembered."""
        return len(self._jobs)

    def remembered(self) -> list[ListedJob]:
        """What is remembered, job by job (for a look at its size)."""
        with self._lock:
            return list(self._jobs.values())

    def render(self, states: Iterable[str] | None = None, *, owner: str | None = None,
               types: Mapping[str, str] | None = None) -> bytes:
        """The JSON array of ``[job_dict(job, types=types) for job in store.list_jobs(states,
        owner=owner)]``, byte for byte as :func:`~pollux.cluster.api.answers.render_json` renders it.

        Like :meth:`~pollux.cluster.state.job_table.JobTable.list_jobs`, it fails a non-terminal job
        whose stored spec no longer validates; ValueError for an unknown state.
        """
        wanted = None if states is None else list(states)
        rows = self.store.listing_rows(wanted, owner=owner)
        known = dict(types or {})
        everything = wanted is None and owner is None
        with self._lock:
            retyped = known != self._types      # every job is made again, but its spec's JSON holds
            before = self._jobs
            after = {} if everything or retyped else before
            parts = []
            for row in rows:
                job_id = row[_ID]
                listed = before.get(job_id)
                if listed is None:
                    listed = listed_job_json(row, known)
                elif retyped or listed.row != row:
                    same_spec = listed.row[_SPEC] == row[_SPEC]
                    listed = listed_job_json(row, known, listed.spec_json() if same_spec else None)
                after[job_id] = listed
                parts.append(listed.json)
            self._jobs = after
            self._types = known
        return b"[" + b",".join(parts) + b"]"

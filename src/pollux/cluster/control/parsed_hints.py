"""A job's hints read into goodput models once, not every round (issue 38, the service at size).

A round turns every scheduled job's stored hints into the policy's inputs: its goodput model, batch
limits, the most replicas it has held and, for a type-aware policy, its model on each GPU type
(:func:`pollux.hints.hints_to_model` validates the body against the hints schema and builds them).
Agents send hints every few tens of seconds while rounds run every few seconds, so most rounds see
the same bodies as the last: with 1,200 jobs scheduled, validating and building them again was
1.5 s of a 2.3 s round (``benchmarks/service_scale.py``). :class:`HintsMemo` keeps each job's
parsed hints with the exact text they were parsed from and parses again only when that text
changed; the views a round builds are the same, only cheaper.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pollux.goodput import BatchLimits, GoodputModel
from pollux.hints import hints_to_model, hints_to_type_models

__all__ = ["HintsMemo", "ParsedHints", "hints_text", "parse_hints"]


@dataclass(frozen=True)
class ParsedHints:
    """What a policy reads of a job's hints (see :func:`parse_hints`)."""

    model: GoodputModel
    limits: BatchLimits
    max_replicas_seen: int
    #: Per GPU type of the cluster (type-aware policies only): the job's model there, and its limits.
    type_models: Mapping[str, GoodputModel] | None = None
    type_limits: Mapping[str, BatchLimits] | None = None


def parse_hints(hints: Mapping[str, Any], gpu_types: Sequence[str] | None = None) -> ParsedHints:
    """The goodput model, limits and most replicas held of a hints body, and with ``gpu_types`` the
    model and limits on each type: the type's own where the job reported it (hints v2), else the
    current ones — the best guess until the job runs there. Raises what
    :func:`pollux.hints.hints_to_model` raises for a body that does not validate."""
    model, limits, seen = hints_to_model(hints)
    if gpu_types is None:
        return ParsedHints(model, limits, int(seen))
    measured, measured_limits = hints_to_type_models(hints)
    return ParsedHints(model, limits, int(seen),
                       type_models={t: measured.get(t, model) for t in gpu_types},
                       type_limits={t: measured_limits.get(t, limits) for t in gpu_types})


def hints_text(hints: Mapping[str, Any] | None) -> str:
    """The canonical text of a hints body (sorted keys): equal exactly for equal bodies."""
    return json.dumps(hints, sort_keys=True, default=repr)


class HintsMemo:
    """Each job's parsed hints for each set of GPU types asked for, with the body's text they came from.

    One entry per (job, types): a type-aware round and the autoscaling rule's type-unaware view of the
    same jobs each keep theirs, rather than replacing each other's every round. A body that does not
    validate is not remembered: it raises every time it is parsed (the round's isolation remembers
    those jobs itself).
    """

    def __init__(self) -> None:
        self._parsed: dict[tuple[str, tuple[str, ...] | None], tuple[str, ParsedHints]] = {}
        self.hits = 0
        self.misses = 0

    def parse(self, job_id: str, text: str, hints: Mapping[str, Any],
              gpu_types: Sequence[str] | None) -> ParsedHints:
        """:func:`parse_hints` of ``hints`` (whose :func:`hints_text` is ``text``), remembered."""
        key = (job_id, None if gpu_types is None else tuple(gpu_types))
        known = self._parsed.get(key)
        if known is not None and known[0] == text:
            self.hits += 1
            return known[1]
        self.misses += 1
        parsed = parse_hints(hints, key[1])
        self._parsed[key] = (text, parsed)
        return parsed

    def keep_only(self, job_ids: Iterable[str]) -> None:
        """Forget the jobs not in ``job_ids`` (ended ones), so the memo stays the size of a round."""
        keep = set(job_ids)
        self._parsed = {k: v for k, v in self._parsed.items() if k[0] in keep}

"""A trial as a Pollux job: its name and its spec.

Every trial of a study runs the same script with the same job options (``pollux hpo run`` takes
them as ``pollux submit`` does); a trial adds its parameters, as variables in the spec's ``env``
(:mod:`pollux.hpo.trial_env`) and, where the space file asks, as flags after the script's own
arguments (:meth:`pollux.hpo.space.SearchSpace.args_of`).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pollux.hpo.space import SearchSpace

__all__ = ["JobTemplate", "job_name"]


def job_name(study: str, number: int) -> str:
    """The job of trial ``number``: ``<study>-t<number>``, so ``pollux ls`` shows which trial it is."""
    return f"{study}-t{number}"


@dataclass(frozen=True)
class JobTemplate:
    """The spec every trial's job shares (``entrypoint``, ``working_dir``, ``args``, batch sizes,
    replicas, ``env`` ...), as :meth:`pollux.cluster.client.PolluxClient.submit` takes it."""

    spec: Mapping[str, Any] = field(default_factory=dict)

    def for_trial(self, space: SearchSpace, params: Mapping[str, Any],
                  trial_env: Mapping[str, str]) -> dict[str, Any]:
        """The spec of one trial: the template, its flags appended to ``args``, its variables added
        to ``env`` (the trial's own win over the template's)."""
        spec = copy.deepcopy(dict(self.spec))
        spec["args"] = [*(spec.get("args") or []), *space.args_of(params)]
        spec["env"] = {**(spec.get("env") or {}), **trial_env}
        return spec

"""The example jobs shipped with the package (``example_jobs.json``), for the walk-through and docs.

Their parameters were fitted to measured profiles; each entry records its provenance. Regenerate
with ``benchmarks/make_example_jobs.py``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources

from pollux.goodput.model import BatchLimits, GoodputModel
from pollux.goodput.records import GradStats, ThroughputParams


@dataclass(frozen=True)
class ExampleJob:
    name: str
    description: str
    limits: BatchLimits
    throughput: ThroughputParams
    grad: dict[str, tuple[int, GradStats]]   # phase ("early"/"late") -> (epoch, statistics)
    provenance: str

    def model(self, phase: str) -> GoodputModel:
        return GoodputModel(self.throughput, self.grad[phase][1], self.limits.init_batch_size)


def load_example_jobs() -> dict[str, ExampleJob]:
    text = resources.files("pollux.goodput").joinpath("example_jobs.json").read_text()
    data = json.loads(text)["jobs"]
    jobs = {}
    for name, job in data.items():
        lo, hi = job["local_bsz_bounds"]
        limits = BatchLimits(job["init_batch_size"], job["max_batch_size"], lo, hi, True)
        grad = {phase: (int(g["epoch"]), GradStats(g["sqr"], g["var"]))
                for phase, g in job["grad"].items()}
        jobs[name] = ExampleJob(
            name=name, description=job["description"], limits=limits,
            throughput=ThroughputParams.from_dict(job["throughput"], where=f"{name}.throughput"),
            grad=grad, provenance=job["provenance"],
        )
    return jobs

"""The control packet that rides on each step's first gradient bucket (SPEC §2).

The replicas must agree every step on a few things (a SIGTERM, a refit, an out-of-memory error), and
the gradient statistics need the previous step's local norms summed over the replicas. Rather than
a collective of their own, these values are appended to the first bucket's all-reduce, so the sum
arrives with the gradients. Packet layout (summed over replicas): [sigterm, refit due, oom, marker,
progress, local norms of the previous step per group], then, while balancing, each replica's compute
time and memory-full flag in its own slot. ``marker`` counts the replicas that sent local norms (K
when they are valid); ``progress`` is each replica's training progress, checked for agreement.
When the bucket cannot carry float64 values exactly (fp16/bf16 gradients) the packet goes in a
collective of its own (:meth:`ControlPacket.launch`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from pollux.torch.api import StepInfo, SyncOutcome

__all__ = ["PACKET_FLAGS", "PROGRESS_TOLERANCE", "ControlPacket"]

#: Entries before the local norms: the three flags, the marker and the progress.
PACKET_FLAGS = 5
#: Relative disagreement of the replicas' progress that stops training (float32 packets round
#: at about 6e-8).
PROGRESS_TOLERANCE = 1e-6


class ControlPacket:
    """This replica's packet of the current step, and the reduced one once it has arrived."""

    def __init__(self, num_groups: int, rank: int, world: int) -> None:
        self.num_groups = num_groups
        self.rank = rank
        self.world = world
        #: The progress this replica sent, compared with the replicas' mean on arrival.
        self.sent_progress = 0.0
        #: This replica's compute time of the previous step, sent in the packet (None: balancing off).
        self.send_times: float | None = None
        self.send_memory_full = False
        self.received: tuple[int, torch.Tensor] | None = None        # (sid, reduced packet)
        self.pending: tuple[int, torch.Tensor, Any] | None = None    # unpacked fallback collective

    def start_step(self, info: StepInfo) -> None:
        self.send_times, self.send_memory_full = info.step_time, info.memory_full
        self.received = None
        self.pending = None

    def build(self, flags: list[float], progress: float, marker: float,
              local_norms: torch.Tensor) -> torch.Tensor:
        """The packet: ``flags``, ``marker``, ``progress``, the previous step's local norms, times."""
        self.sent_progress = progress
        head = torch.tensor([*flags, marker, self.sent_progress], dtype=torch.float64)
        parts = [head.to(local_norms.device, non_blocking=True), local_norms]
        if self.send_times is not None:
            # Balancing: each replica fills its own slot, so the sum is the gather of compute times.
            times = torch.zeros(2 * self.world, dtype=torch.float64)
            times[self.rank] = float(self.send_times)
            times[self.world + self.rank] = 1.0 if self.send_memory_full else 0.0
            parts.append(times.to(local_norms.device, non_blocking=True))
        return torch.cat(parts)

    def receive(self, sid: int, values: torch.Tensor) -> None:
        self.received = (sid, values.to(torch.float64, copy=True))

    def launch(self, sid: int, vec: torch.Tensor, process_group: Any) -> None:
        """Fallback for buckets that cannot carry float64 values exactly (fp16/bf16 gradients)."""
        work = dist.all_reduce(vec, group=process_group, async_op=True)
        self.pending = (sid, vec, work)

    def collect(self, info: StepInfo, outcome: SyncOutcome) -> list[float] | None:
        """The step's reduced packet, its flags read into ``outcome`` (None: it did not arrive)."""
        if self.pending is not None:
            sid, vec, work = self.pending
            self.pending = None
            work.wait()
            self.received = (sid, vec)
        if self.received is None or self.received[0] != info.sid:
            return None
        vals = self.received[1].tolist()
        self.received = None
        outcome.reduced = True
        outcome.sigterm = vals[0] > 0.5
        outcome.refit = vals[1] > 0.5
        outcome.oom = vals[2] > 0.5
        self._check_progress(vals[4] / max(info.replicas, 1))
        first = PACKET_FLAGS + self.num_groups
        if info.step_time is not None and len(vals) >= first + 2 * self.world:
            outcome.step_times = tuple(float(v) for v in vals[first:first + 2 * self.world])
        return vals

    def local_norms(self, vals: list[float], replicas: int) -> list[float] | None:
        """The summed local norms of the previous step, if all ``replicas`` sent valid ones."""
        if vals[3] > replicas - 0.5:
            return vals[PACKET_FLAGS:PACKET_FLAGS + self.num_groups]
        return None

    def _check_progress(self, mean: float) -> None:
        """Every replica must count the same progress, or they would end epochs at different steps
        and the next collective would pair mismatched operations (a hang or a gloo abort). When any
        replica differs, the mean differs from every replica's own value, so all of them stop here
        together, with this message, instead."""
        own = self.sent_progress
        if abs(mean - own) > PROGRESS_TOLERANCE * max(1.0, abs(own)):
            raise RuntimeError(
                f"pollux.torch: the replicas disagree on training progress (this replica {own!r}, mean "
                f"{mean!r}): their gradient statistics diverged, which is a bug in pollux.torch; "
                "stopping before a collective mismatch (the job can resume from its last checkpoint)")

"""The DDP communication hook of ``AdaptiveDataParallel``: the all-reduce that also measures (SPEC §2, §8).

Statistics come from a DDP communication hook (public API: ``register_comm_hook`` and ``GradBucket``),
one Python call per gradient bucket per step, measured by :mod:`pollux.torch.gradstats`:

* before the bucket's all-reduce, the squared norm of the local (pre-conditioned) gradient, per
  optimiser parameter group: one dot product per contiguous run of one group's parameters in the
  flat bucket buffer (no Python loop over parameters);
* after it, the squared norm of the averaged gradient, likewise;
* no extra collective: the first bucket of each step (small: DDP caps it at about 1 MiB) is sent as a
  copy with a few values appended: three control flags (SIGTERM received, refit due, out of memory)
  and the previous step's per-group local norms, so a step's estimate is completed one step later.

The hook is kept apart from the wrapper because it is what runs inside DDP's reducer, once per bucket,
with only the ``GradTracker`` as its state: the wrapper registers it and never calls it.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist


def pollux_comm_hook(tracker, bucket):  # unannotated: DDP checks the annotations of comm hooks
    """All-reduce the mean of the bucket over replicas and micro-steps, measuring squared norms.

    The local norms are taken before the all-reduce. The norms of the averaged gradient are taken in
    the completion callback when gradients are views of the buckets (the default: user code may
    modify them in place before the optimiser step), else at the end of the step in the training
    thread (``GradTracker.finish``). The first bucket of each step also carries the step's control
    flags and the previous step's local norms, appended to a reused copy of it (that bucket is
    small: DDP caps it at about 1 MiB).
    """
    info = tracker.step
    if info is not None and info.step_time is not None:
        info.compute_end = time.perf_counter()     # balancing: this replica's gradients are ready
        if info.compute_event is not None:         # CUDA: when they are ready on the device
            info.compute_event.record()
    buf = bucket.buffer()
    lay = tracker.layout(bucket)
    sid = info.sid if info is not None else -1
    mode = tracker.mode
    if mode == "bucket":
        tracker.local_norms(lay, buf)
    if tracker.divisor != 1.0:
        buf.div_(tracker.divisor)
    numel = buf.numel()
    send = buf
    if bucket.index() == 0:
        flags = tracker.ctx.outgoing_flags()
        if buf.dtype in (torch.float32, torch.float64):
            packet = tracker.packet(flags)
            size = numel + packet.numel()
            send = lay.send
            if send is None or send.numel() != size or send.dtype != buf.dtype:
                send = lay.send = torch.empty(size, dtype=buf.dtype, device=buf.device)
            send[:numel].copy_(buf)
            send[numel:].copy_(packet)
        else:
            tracker.launch_packet(sid, flags)
    fut = dist.all_reduce(send, group=tracker.process_group, async_op=True).get_future()
    in_callback = tracker.totals_in_callback and mode != "off"

    def done(f: torch.futures.Future) -> torch.Tensor:
        out = f.value()[0]
        if out.numel() > numel:
            tracker.receive(sid, out[numel:])
            out = out[:numel]
        if in_callback:
            tracker.total_norms(lay, out, sid)
        else:
            lay.result, lay.result_sid = out, sid
        return out

    return fut.then(done)

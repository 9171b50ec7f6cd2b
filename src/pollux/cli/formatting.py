"""Text of the ``pollux`` commands: tables, durations, ``describe``, ``server status``, the goodput
walk-through, log following, and the escaping of control characters.

Every human-readable line the CLI prints passes what came from the service or the store (job names,
arguments, failure reasons, node names, error details) through :func:`escape`: control characters, the
Unicode line and bidirectional-override characters and lone surrogates print as visible escapes
(``\\n``, ``\\x1b``, ``\\u202e``), so a job named ``"a\\n\\x1b[31mb"`` can neither break a table nor
recolour or rewrite the terminal. Backslashes are left as they are. ``--json`` output is JSON (every
control character escaped by the encoder). ``pollux logs`` prints a job's own output as it is when
piped, and with the same escaping (tabs and newlines kept) on a terminal; ``--raw`` prints it as it
is there too.

Tables are drawn by :mod:`pollux.cli.terminal`: rich's tables on a terminal, plain aligned columns
elsewhere. The functions building a command's text take ``terminal`` (default False, the plain form)
from the command, which knows where its output goes.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from typing import Any

from pollux.cli.terminal import render_table

__all__ = ["JOB_STATES", "TERMINAL_STATES", "LogFollower", "alloc", "describe_text", "duration", "escape",
           "escape_lines", "escape_log", "goodput_text", "num", "runtime", "status_text", "table", "when"]

#: Job states of the live service (the same as ``pollux.cluster.state.store.JOB_STATES``, kept here so that
#: building the parser imports nothing heavy; a test checks that they agree).
JOB_STATES = ("pending", "starting", "running", "rescaling", "succeeded", "failed", "cancelled")
TERMINAL_STATES = frozenset({"succeeded", "failed", "cancelled"})

#: Characters that must never reach a terminal raw: C0 and C1 controls, DEL, the Unicode line and
#: paragraph separators, bidirectional marks and overrides, and lone surrogates.
_UNSAFE = re.compile(r"[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069"
                     r"\ud800-\udfff]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _visible(match: re.Match[str]) -> str:
    c = match.group()
    if c in _NAMED:
        return _NAMED[c]
    return f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}"


def escape(value: Any) -> str:
    """``str(value)`` with every unsafe character (see ``_UNSAFE``) as a visible escape."""
    return _UNSAFE.sub(_visible, str(value))


def escape_lines(text: str) -> str:
    """:func:`escape` of each line of ``text``, keeping its line breaks (for multi-line messages)."""
    return "\n".join(escape(line) for line in str(text).split("\n"))


_LOG_UNSAFE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e"
                         r"\u2066-\u2069\ud800-\udfff]")


def escape_log(text: str) -> str:
    """A job's output for a terminal: :func:`escape` but for newlines and tabs."""
    return _LOG_UNSAFE.sub(_visible, text)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], right: Sequence[int] = (),
          terminal: bool = False) -> str:
    """A table of escaped cells (:func:`escape`); columns in ``right`` are right-aligned.

    Plain aligned columns two spaces apart, or on a ``terminal`` rich's table
    (:func:`pollux.cli.terminal.render_table`).
    """
    return render_table([escape(h) for h in headers], [[escape(c) for c in row] for row in rows], right,
                        terminal)


def _indented(text: str) -> list[str]:
    """The lines of a table nested in a command's text, two spaces in."""
    return ["  " + line for line in text.splitlines()]


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    m, s = divmod(s, 60)
    if m < 60:
        return f"{m}m{s:02d}s"
    h, m = divmod(m, 60)
    if h < 24:
        return f"{h}h{m:02d}m"
    d, h = divmod(h, 24)
    return f"{d}d{h:02d}h"


def when(t: float | None) -> str:
    if t is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def alloc(allocation: dict[str, int] | None) -> str:
    if not allocation:
        return "-"
    return ",".join(f"{node}:{gpus}" for node, gpus in sorted(allocation.items()))


def runtime(job: dict[str, Any], now: float) -> float | None:
    if job.get("start_time") is None:
        return None
    end = job.get("end_time")
    return (end if end is not None else now) - job["start_time"]


def num(x: Any) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


def describe_text(job: dict[str, Any], terminal: bool = False) -> str:
    """``pollux describe``: state and times, spec, transitions, allocations, replicas, hints. The
    ``tensorboard_dir`` field (where the job's TensorBoard events go) is shown when it is set."""
    now = time.time()
    spec = job["spec"]
    out = [f"{escape(job['id'])} ({escape(job['name'])})"]

    def kv(key: str, value: Any) -> None:
        out.append(f"  {key:<14}{escape(value)}")

    kv("state", job["state"])
    kv("submitted", f"{when(job['submit_time'])} ({duration(now - job['submit_time'])} ago)")
    kv("started", when(job["start_time"]))
    kv("ended", when(job["end_time"]))
    kv("runtime", duration(runtime(job, now)))
    kv("restarts", f"{job['restarts']} ({job.get('failures', 0)} failed run(s))")
    kv("service", f"{job['attained_service']:.1f} GPU-seconds")
    gpus = sum(job["allocation"].values())
    kv("allocation", f"{alloc(job['allocation'])} ({gpus} GPU(s))" if gpus else "-")
    if job.get("gpu_types"):
        kv("gpu type", ", ".join(job["gpu_types"]))
    if job.get("failure_reason"):
        kv("failure", job["failure_reason"])
    if job.get("tensorboard_dir") is not None:
        out.append(f"  TensorBoard: {escape(job['tensorboard_dir'])}")

    out.append("spec")
    kv("entrypoint", spec["entrypoint"])
    kv("args", " ".join(spec.get("args") or []) or "-")
    kv("working dir", spec.get("working_dir") or "-")
    max_bsz = spec.get("max_batch_size")
    kv("batch size", f"{spec['init_batch_size']}" + (f" (max {max_bsz})" if max_bsz else " (fixed)"))
    bounds = spec.get("local_bsz_bounds")
    if bounds:
        lo, hi = bounds
        kv("local batch", f"{lo if lo is not None else 1}..{hi if hi is not None else 'unbounded'}")
    max_r = spec.get("max_replicas")
    kv("replicas", f"{spec.get('min_replicas', 0)}..{max_r if max_r is not None else 'any'}")
    res = spec.get("resources") or {}
    kv("per replica", ", ".join(f"{k}={num(v)}" for k, v in res.items()) or "-")
    kv("preemptible", "yes" if spec.get("preemptible", True) else "no")
    kv("balance", spec.get("balance") or "off")

    transitions = job.get("transitions") or []
    if transitions:
        out.append("transitions")
        rows = [[when(t["time"]), t["from_state"] or "-", t["to_state"], t["reason"] or ""]
                for t in transitions]
        out += _indented(table(["TIME", "FROM", "TO", "REASON"], rows, terminal=terminal))
    types = job.get("node_types") or {}   # typed nodes only: an untyped cluster shows no TYPE column
    history = job.get("allocation_history") or []
    if history:
        out.append("allocation history")
        rows = [[when(a["time"]), sum(a["allocation"].values()), alloc(a["allocation"])] for a in history]
        headers = ["TIME", "GPUS", "ALLOCATION"]
        if types:
            headers.append("TYPE")
            for row, a in zip(rows, history, strict=True):
                row.append(",".join(sorted({types[n] for n in a["allocation"] if n in types})) or "-")
        out += _indented(table(headers, rows, right=(1,), terminal=terminal))
    replicas = job.get("replicas") or []
    if replicas:
        out.append("replicas")
        rows = [[r["restart"], r["rank"], r["node"], r["pid"] if r["pid"] is not None else "-",
                 when(r["start_time"]), r["exit_code"] if r["exit_code"] is not None else "-"]
                for r in replicas]
        headers = ["RESTART", "RANK", "NODE", "PID", "STARTED", "EXIT"]
        if types:
            headers.insert(3, "TYPE")
            for row, r in zip(rows, replicas, strict=True):
                row.insert(3, types.get(r["node"], "-"))
        right = (0, 1, 4, 6) if types else (0, 1, 3, 5)
        out += _indented(table(headers, rows, right=right, terminal=terminal))
    hints = job.get("hints")
    out.append("hints" + ("" if hints else "          (none received yet)"))
    if hints:
        grad = hints.get("grad") or {}
        init = hints.get("init_batch_size")
        if grad.get("sqr") and init:
            kv("noise scale", f"{grad['var'] * init / grad['sqr']:.1f} (gradient noise scale at M0={init})")
        kv("progress", f"epoch {hints.get('epoch')}, {num(hints.get('progress'))} examples at M0")
        lo, hi = hints.get("local_bsz_bounds") or (None, None)
        kv("batch limits", f"{init}..{hints.get('max_batch_size')}, local {lo}..{hi}, accumulation "
                           f"{'on' if hints.get('accumulation') else 'off'}")
        kv("replicas seen", hints.get("max_replicas_seen"))
        tp = hints.get("throughput") or {}
        if tp:
            kv("throughput", ", ".join(f"{k}={num(v)}" for k, v in tp.items()))
        balance = hints.get("balance")
        if isinstance(balance, dict):
            out.extend("  " + line for line in balance_lines(balance, terminal))
    return "\n".join(out)


def nodes_text(cluster: dict[str, Any], terminal: bool = False) -> str:
    """``pollux nodes``: one row per alive node (its GPU type, ``-`` if untyped), then GPUs per type."""
    nodes = cluster.get("nodes") or []
    if not nodes:
        return "no alive node with GPUs"
    rows = [[n.get("name"), n.get("gpu_type") or "-", n.get("gpus"), n.get("address") or "-"] for n in nodes]
    out = [table(["NODE", "TYPE", "GPUS", "ADDRESS"], rows, right=(2,), terminal=terminal)]
    per: dict[str, int] = {}
    for n in nodes:
        key = n.get("gpu_type") or "untyped"
        per[key] = per.get(key, 0) + int(n.get("gpus") or 0)
    out.append("GPUs by type: " + ", ".join(f"{escape(t)} {g}" for t, g in per.items()))
    return "\n".join(out)


def balance_lines(balance: dict[str, Any], terminal: bool = False) -> list[str]:
    """The LB-BSP part of a job's hints: mode, predicted step time, stragglers, and per rank its
    share and measured compute time (``describe``)."""
    shares = list(balance.get("shares") or [])
    times = list(balance.get("step_times") or [])
    stragglers = [int(r) for r in balance.get("stragglers") or []]
    predicted = balance.get("predicted_step_time")
    out = [f"{'balance':<14}{escape(str(balance.get('mode', '-')))}, "
           f"{len(shares)} rank(s), {sum(int(x) for x in shares)} examples per step, predicted step "
           + (f"{float(predicted):.3f} s" if isinstance(predicted, int | float) else "-")]
    if stragglers:
        out.append(f"{'stragglers':<14}rank(s) {', '.join(map(str, stragglers))} at the minimum share: "
                   "consider removing their nodes")
    rows = [[rank, share, f"{float(times[rank]):.3f}" if rank < len(times) else "-",
             "straggler" if rank in stragglers else ""] for rank, share in enumerate(shares)]
    out += _indented(table(["RANK", "SHARE", "STEP S", ""], rows, right=(0, 1, 2), terminal=terminal))
    return out


def status_text(st: dict[str, Any]) -> str:
    """``pollux server status``: the service's processes, Ray's health, nodes, policy and job counts."""
    ray_down = st["ray_healthy"] is False
    out: list[str] = []
    if not st["service_alive"]:
        out.append(f"no Pollux service runs from {escape(st['state_dir'])}")
        if st["rayhost_alive"]:
            health = f"; Ray is DOWN: {escape(st['ray_error'])}" if ray_down else ""
            out.append(f"  (its Ray host still runs, PID {st['rayhost_pid']}{health}; `pollux server start` "
                       "reuses it or replaces it)")
        elif ray_down and st["rayhost_pid"]:
            out.append(f"  (its Ray host, PID {st['rayhost_pid']}, is not running either)")
        return "\n".join(out)
    if not st["api_ok"]:
        health = "NOT answering"
    elif ray_down:
        health = "DEGRADED: its Ray cluster is down"
    else:
        health = "healthy"
    out.append(f"Pollux service: running, {health}")
    out.append(f"  URL           {escape(st['url'] or '-')}")
    out.append(f"  service PID   {st['service_pid']}")
    address = escape(st.get("ray_address") or "-")
    if st.get("rayhost_pid"):
        alive = "alive" if st["rayhost_alive"] else "NOT running"
        out.append(f"  Ray           {address} (host PID {st['rayhost_pid']}, {alive})")
    else:
        out.append(f"  Ray           {address}")
    if ray_down:
        out.append(f"  Ray health    DOWN: {escape(st['ray_error'])}")
    elif st["ray_healthy"]:
        out.append(f"  Ray health    ok ({st.get('ray_nodes', '?')} node(s) alive)")
    if st.get("run_as"):
        out.append(f"  replicas run  as {escape(st['run_as'])}")
    out.append(f"  state dir     {escape(st['state_dir'])}")
    if "error" in st:
        out.append(f"  error         {escape(st['error'])}")
    cluster = st.get("cluster")
    if isinstance(cluster, dict) and "nodes" in cluster:
        nodes = cluster["nodes"]
        total = cluster.get("total_gpus", sum(n.get("gpus", 0) for n in nodes))
        out.append(f"  nodes         {len(nodes)} node(s), {escape(total)} GPU slot(s): "
                   + (", ".join(f"{escape(n.get('name'))}:{escape(n.get('gpus'))}"
                                + (f" ({escape(n['gpu_type'])})" if n.get("gpu_type") else "")
                                for n in nodes) or "-"))
        every = escape(num(cluster.get("interval_s")))
        out.append(f"  policy        {escape(cluster.get('policy'))}, rounds every {every} s, "
                   f"{escape(cluster.get('rounds'))} round(s) run")
    jobs = st.get("jobs")
    if isinstance(jobs, dict):
        counts = [f"{escape(jobs[s])} {s}" for s in JOB_STATES if jobs.get(s)]
        out.append(f"  jobs          {', '.join(counts) if counts else 'none'}")
    return "\n".join(out)


#: Columns of the goodput walk-through, one row per GPU count: all numbers, so all right-aligned.
GOODPUT_HEADERS = ("GPUs", "nodes", "batch M", "local m", "accum s", "efficiency", "goodput/s", "speedup")


def goodput_text(jobs: dict[str, Any], results: dict[str, dict[str, Any]], terminal: bool = False) -> str:
    """``pollux goodput``: per example job and phase, the best batch per GPU count, and what it shows.

    ``jobs`` are the example jobs (:func:`pollux.goodput.examples.load_example_jobs`), ``results`` what
    ``pollux goodput --json`` prints for those shown: ``{name: {phase: {epoch, pgns, rows}}}``.
    """
    out: list[str] = []
    for name, phases in results.items():
        job = jobs[name]
        lim = job.limits
        out.append(f"\n== {name}: {job.description}")
        out.append(f"   M0={lim.init_batch_size:g}  max batch={lim.max_batch_size:g}  local batch "
                   f"{lim.min_local_bsz:g}..{lim.max_local_bsz:g}  accumulation on")
        out.append(f"   source: {job.provenance}")
        for phase, res in phases.items():
            out.append(f"\n   {phase} in training (epoch {res['epoch']}, gradient noise scale "
                       f"{res['pgns']:.0f}):")
            rows = [[r["gpus"], r["nodes"], r["batch_size"], r["local_bsz"], r["accum_steps"],
                     f"{r['efficiency']:.3f}", f"{r['goodput']:.1f}", f"{r['speedup']:.2f}x"]
                    for r in res["rows"]]
            text = table(GOODPUT_HEADERS, rows, right=range(len(GOODPUT_HEADERS)), terminal=terminal)
            out += ["   " + line for line in text.splitlines()]
    out.append("\nEarly in training the true gradient is large next to its noise (a small noise scale):"
               "\nbig batches waste examples, so the best batch stays small and extra GPUs barely help."
               "\nLate in training the noise scale has grown, large batches are efficient and more GPUs"
               "\npay off. Pollux re-tunes every job, and re-allocates the cluster, as this happens.")
    return "\n".join(out)


_LOG_HEADER = re.compile(r"^==> restart (\d+) rank (\d+) \(node .*\) <==$")


def log_sections(text: str) -> dict[tuple[int, int], tuple[str, str]]:
    """``{(restart, rank): (header line, log text)}`` of the logs endpoint's answer, in its order."""
    sections: dict[tuple[int, int], tuple[str, list[str]]] = {}
    key = None
    for line in text.splitlines(keepends=True):
        match = _LOG_HEADER.match(line.rstrip("\n"))
        if match:
            key = (int(match[1]), int(match[2]))
            sections[key] = (line if line.endswith("\n") else line + "\n", [])
        elif key is not None:
            sections[key][1].append(line)
    return {k: (header, "".join(lines)) for k, (header, lines) in sections.items()}


class LogFollower:
    """Prints what is new in each replica's log at every poll, like ``tail -f`` over several files.

    The service ends a log that does not end with a newline with one, so a line still being written
    cannot be told from a finished one: while following, the last line of a log is held back until a
    later line arrives or it is the same at the next poll (or the job ends). A line printed so and
    then continued has its continuation printed on a line of its own; nothing is lost or repeated.
    """

    def __init__(self, write: Callable[[str], Any]) -> None:
        self.write = write
        self.done: dict[tuple[int, int], int] = {}     # characters of the log printed
        self.last: dict[tuple[int, int], str] = {}     # the last line printed
        self.held: dict[tuple[int, int], str] = {}     # the last line seen but not printed
        self.current: tuple[int, int] | None = None

    def feed(self, text: str, final: bool) -> None:
        for key, (header, body) in log_sections(text).items():
            start = self.done.get(key, 0)
            last = self.last.get(key, "")
            if last and not body.startswith(last, start - len(last)):
                if body.startswith(last[:-1], start - len(last)):
                    start -= 1          # that line was unfinished: its newline came from the service
                else:
                    start = 0           # the file was replaced: print it again
            lines = body[start:].splitlines(keepends=True)
            if not lines:
                continue
            emit = lines
            if not final:
                if len(lines) == 1 and self.held.get(key) == lines[0]:
                    del self.held[key]
                else:
                    self.held[key] = lines[-1]
                    emit = lines[:-1]
            if not emit:
                continue
            chunk = "".join(emit)
            if self.current != key:
                self.write(header)
                self.current = key
            self.write(chunk)
            self.done[key] = start + len(chunk)
            self.last[key] = emit[-1]


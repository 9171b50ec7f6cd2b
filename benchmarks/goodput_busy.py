#!/usr/bin/env python3
"""The goodput benchmark while busy loops occupy every core (issue 11, item 8).

Usage: benchmarks/goodput_busy.py --data ../shared/data/pollux-osdi21/traces [--json] [--busy N]

Starts N busy-loop processes (default: one per core), records their PIDs, runs
``benchmarks/goodput.py`` with the remaining arguments, then stops exactly those PIDs. A training
process shares its cores with the agent's refits; the fits must stay fast then (every ``fit_ms``
≤ 20 ms with both cores busy), which is why the core's numerics run with BLAS limited to one thread.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

BUSY_LOOP = "while True:\n    pass\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--busy", type=int, default=os.cpu_count() or 1,
                        help="busy-loop processes to start (default: one per core)")
    args, rest = parser.parse_known_args(argv)
    bench = Path(__file__).resolve().parent / "goodput.py"
    pids: list[int] = []
    procs = []
    try:
        for _ in range(max(0, args.busy)):
            proc = subprocess.Popen([sys.executable, "-c", BUSY_LOOP])
            procs.append(proc)
            pids.append(proc.pid)
        print(f"busy loops: pids {pids}", file=sys.stderr)
        time.sleep(0.5)      # let the loops take their cores
        return subprocess.run([sys.executable, str(bench), *rest], check=False).returncode
    finally:
        for proc in procs:   # by PID, only the ones started here
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()


if __name__ == "__main__":
    sys.exit(main())

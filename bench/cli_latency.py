"""Wall time of the catalog commands in fresh processes (what a user waits for at the prompt).

    .venv/bin/python bench/cli_latency.py [--runs 7]

Each command runs `--runs` times as `python -m sparkctl ...`; the table reports min and median wall
time and CPU time (user + sys), and the machine's load average so a number from a busy box is read as
such. The issue's budget is 0.5 s for list/show/render/validate; results go to bench/PERF.md with the
machine they ran on.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COMMANDS = [
    ["--help"],
    ["list"],
    ["show", "glm-5.3-flash"],
    ["render", "glm-5.3-flash"],
    ["render", "glm-5.3-flash", "--format", "compose"],
    ["validate", "tiny", "glm-5.3-flash", "qwen3.8-flash-next"],
    ["schema"],
]


def time_command(args: list[str], runs: int) -> tuple[list[float], list[float]]:
    """Wall time and CPU time (user + sys of the child) per run.

    On a shared, oversubscribed machine wall time includes waiting for a core; CPU time is what the
    command itself costs, i.e. roughly its wall time on an idle core of the same machine.
    """
    walls, cpus = [], []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "sparkctl", *args], capture_output=True, cwd=REPO)
        walls.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime))
        if proc.returncode != 0:
            raise SystemExit(f"sparkctl {' '.join(args)} failed: {proc.stderr.decode()[-500:]}")
    return walls, cpus


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    load = os.getloadavg()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cpus, Python {platform.python_version()}")
    print(f"load average before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(f"{'command':<55} {'wall min':>9} {'wall med':>9} {'cpu min':>8} {'cpu med':>8}")
    for cmd in COMMANDS:
        walls, cpus = time_command(cmd, args.runs)
        print(
            f"{'sparkctl ' + ' '.join(cmd):<55} {min(walls):>9.3f} {statistics.median(walls):>9.3f} "
            f"{min(cpus):>8.3f} {statistics.median(cpus):>8.3f}"
        )
    load = os.getloadavg()
    print(f"load average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


if __name__ == "__main__":
    main()

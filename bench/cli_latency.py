"""Wall time of the catalog commands in fresh processes (what a user waits for at the prompt).

    .venv/bin/python bench/cli_latency.py [--runs 7]

Each command runs `--runs` times as `python -m sparkctl ...`; the table reports min and median wall
time, and the machine's load average so a number from a busy box is read as such. The issue's budget
is 0.5 s for list/show/render/validate; results go to bench/PERF.md with the machine they ran on.
"""

from __future__ import annotations

import argparse
import os
import platform
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


def time_command(args: list[str], runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "sparkctl", *args], capture_output=True, cwd=REPO)
        times.append(time.perf_counter() - start)
        if proc.returncode != 0:
            raise SystemExit(f"sparkctl {' '.join(args)} failed: {proc.stderr.decode()[-500:]}")
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    load = os.getloadavg()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cpus, Python {platform.python_version()}")
    print(f"load average before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(f"{'command':<55} {'min s':>7} {'median s':>9}")
    for cmd in COMMANDS:
        times = time_command(cmd, args.runs)
        print(f"{'sparkctl ' + ' '.join(cmd):<55} {min(times):>7.3f} {statistics.median(times):>9.3f}")
    load = os.getloadavg()
    print(f"load average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


if __name__ == "__main__":
    main()

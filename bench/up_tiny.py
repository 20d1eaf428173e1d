"""Time from `sparkctl up tiny` to a healthy endpoint (real vLLM on the CPU, native runtime).

Each run is a fresh `sparkctl up tiny --json` in its own process with a temp state dir, then `down`.
Run 1 starts with an empty cache (the tiny model is generated); later runs reuse it, which is what a
user sees from the second `make up` on. Reports the wall time of the `up` command, `seconds_to_healthy`
as `up` measured it, and the stage timings, plus the load average around the runs (the dev box is
shared, so load is part of the result).

    .venv/bin/python bench/up_tiny.py --runs 3 [--port 18020] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def one_run(env: dict[str, str], port: int) -> dict:
    t0 = time.monotonic()
    res = subprocess.run(
        [sys.executable, "-m", "sparkctl", "up", "tiny", "--port", str(port), "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        cwd=REPO,
    )
    wall = time.monotonic() - t0
    subprocess.run(
        [sys.executable, "-m", "sparkctl", "down", "tiny"], env=env, capture_output=True, timeout=120
    )
    if res.returncode != 0:
        raise SystemExit(f"sparkctl up tiny failed (rc {res.returncode}):\n{res.stderr}")
    out = json.loads(res.stdout)
    return {
        "wall_s": round(wall, 2),
        "seconds_to_healthy": out["seconds_to_healthy"],
        "timings_s": out["timings_s"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--port", type=int, default=18020)
    ap.add_argument("--json", dest="json_out", help="also write the results here")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="sparkctl-bench-up-") as tmp:
        env = {**os.environ, "SPARKCTL_STATE_DIR": f"{tmp}/state", "SPARKCTL_CACHE_DIR": f"{tmp}/cache"}
        load_before = os.getloadavg()
        runs = []
        for i in range(args.runs):
            r = one_run(env, args.port)
            r["model_cache"] = "cold (generated)" if i == 0 else "warm"
            runs.append(r)
            print(
                f"run {i + 1}: healthy after {r['seconds_to_healthy']:.1f}s (wall {r['wall_s']:.1f}s) {r['timings_s']}"
            )
        load_after = os.getloadavg()

    healthy = [r["seconds_to_healthy"] for r in runs]
    result = {
        "command": f"sparkctl up tiny --port {args.port} --json",
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "loadavg_before": [round(x, 2) for x in load_before],
            "loadavg_after": [round(x, 2) for x in load_after],
        },
        "runs": runs,
        "seconds_to_healthy": {
            "min": min(healthy),
            "median": statistics.median(healthy),
            "max": max(healthy),
        },
    }
    print(
        json.dumps(result["seconds_to_healthy"]),
        "load",
        result["machine"]["loadavg_before"],
        "->",
        result["machine"]["loadavg_after"],
    )
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()

"""T2, tool calling: the community's `tool-eval-bench` (PyPI) run against the same server, its score kept.

Optional (`bench --t2`): it needs the tool installed (`pip install tool-eval-bench==3.0.0`) and a
server that serves tools (a recipe with a tool-call parser). Whatever happens is recorded (score,
or why there is none) next to the speed numbers; a missing tool or a failed run never loses them.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from sparkctl.bench.client import Target

VERSION = "3.0.0"


def _scores(data: Any, path: str = "") -> dict[str, float]:
    """Every numeric field whose name says score/accuracy/pass rate, by its dotted path."""
    out: dict[str, float] = {}
    if isinstance(data, dict):
        for k, v in data.items():
            p = f"{path}.{k}" if path else str(k)
            low = str(k).lower()
            if (
                isinstance(v, int | float)
                and not isinstance(v, bool)
                and any(w in low for w in ("score", "accuracy", "pass_rate", "passed", "total"))
            ):
                out[p] = float(v)
            elif isinstance(v, dict) and len(out) < 64:
                out.update(_scores(v, p))
    return out


def run(target: Target, *, out_dir: Path, timeout_s: float = 3600.0) -> dict[str, Any]:
    """Run tool-eval-bench's short suite with thinking off; return its score block (or the reason for none)."""
    exe = shutil.which("tool-eval-bench") or str(Path(sys.executable).with_name("tool-eval-bench"))
    if not Path(exe).exists():
        return {
            "ran": False,
            "reason": f"tool-eval-bench is not installed (pip install tool-eval-bench=={VERSION})",
        }
    out_dir = out_dir.resolve()  # the tool runs with the output folder as its cwd
    out_dir.mkdir(parents=True, exist_ok=True)
    json_file = out_dir / "t2-tool-eval-bench.json"
    cmd = [exe, "--base-url", f"{target.base_url}/v1", "--model", target.model, "--no-think", "--short",
           "--temperature", "0", "--no-live", "--json-file", str(json_file), "--output-dir", str(out_dir / "t2")]  # fmt: skip
    if target.api_key:
        cmd += ["--api-key", target.api_key]
    try:
        # in the output folder: the tool keeps its run history (data/benchmarks.sqlite) under its cwd
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=out_dir)
    except subprocess.TimeoutExpired:
        return {"ran": False, "reason": f"tool-eval-bench did not finish in {timeout_s:.0f} s"}
    version = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout.strip() or None
    rec: dict[str, Any] = {"ran": True, "tool_version": version, "returncode": proc.returncode,
                           "command": " ".join(cmd[1:]), "json_file": str(json_file)}  # fmt: skip
    try:
        data = json.loads(json_file.read_text())
    except (OSError, ValueError):
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        rec["reason"] = "no JSON result: " + " | ".join(tail)[:400]
        return rec
    rec["scores"] = _scores(data)
    return rec

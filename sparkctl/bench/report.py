"""The self-contained HTML report: the record inlined as JSON, our own small SVG charting inlined.

Nothing is fetched when the page opens (no CDN, no fonts), so a report mailed or copied to an
offline Spark opens the same. The record can be downloaded back from the page, and each chart
exports as SVG, PNG or CSV.
"""

from __future__ import annotations

import html
import json
from importlib import resources
from typing import Any

from sparkctl.bench import tables


def _asset(name: str) -> str:
    return resources.files("sparkctl.bench").joinpath("assets", name).read_text()


def _json_for_script(data: Any) -> str:
    # no "<", ">" or "&" inside the <script> element (none can end it or open a comment); JSON.parse
    # reads the \u escapes back; "\u2028" breaks old JS parsers
    text = json.dumps(data, default=str)
    for ch, esc in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028")):
        text = text.replace(ch, esc)
    return text


def _table(cols: tuple[str, ...], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f'<table class="data"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _page(title: str, meta: str, tables_html: str, data: Any, download_name: str) -> str:
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{html.escape(title)}</title>
<style>{_asset("report.css")}</style>
</head><body>
<header><h1>{html.escape(title)}</h1><p class="meta">{meta}</p>
<button id="download" data-name="{html.escape(download_name)}">Download data (JSON)</button></header>
<main><div id="charts"></div>{tables_html}</main>
<script type="application/json" id="bench-data">{_json_for_script(data)}</script>
<script>{_asset("report.js")}</script>
</body></html>
"""


def verification_line(v: dict[str, Any] | None, recipe: str | None) -> str:
    """Which verification of the pack the numbers were taken under, in words (docs/verify.md)."""
    if not recipe:
        return "pack not verified (no recipe)"
    if not v:
        return f"pack never verified (sparkctl verify {recipe})"
    verdict = "passed" if v.get("ok") else "FAILED"
    layers = "+".join(v.get("layers") or [])
    return f"pack {verdict} {v.get('mode')} verify ({layers}) of {v.get('created_at')}"


def render_html(record: dict[str, Any]) -> str:
    t = record.get("target", {})
    host = record.get("host", {})
    gpus = ", ".join(g.get("name", "?") for g in host.get("gpus", [])) or "no GPU"
    status = (
        "complete"
        if record.get("complete")
        else ("interrupted, partial" if record.get("interrupted") else "partial")
    )
    if record.get("error"):
        status += f" (stopped: {record['error']})"
    server = record.get("server", {})
    meta = html.escape(
        f"{t.get('model')} at {t.get('base_url') or t.get('url')} · recipe {t.get('recipe') or '-'} "
        f"(hash {str(server.get('recipe_hash') or '-')[:12]}) · {host.get('hostname')} · {gpus} · "
        f"sparkctl {record.get('sparkctl_version')} · {record.get('created_at')} · {status} · "
        f"{verification_line(record.get('verification'), t.get('recipe'))}"
    )
    parts = ["<section><h2>Results</h2>", _table(tables.COLUMNS, tables.rows(record)), "</section>"]
    g = tables.grid_rows(record)
    if g:
        parts += [
            "<section><h2>Grid (llama-benchy fields)</h2>",
            _table(tables.GRID_COLUMNS, g),
            "</section>",
        ]
    for v in record.get("variants", []):
        parts.append(_conditions_html(v))
        t2 = v.get("t2")
        if t2:
            body = ", ".join(f"{k} {x:g}" for k, x in (t2.get("scores") or {}).items()) or t2.get(
                "reason", "-"
            )
            parts.append(
                f"<section><h2>T2 tool calling (tool-eval-bench)</h2><p>{html.escape(body)}</p></section>"
            )
    defs = "".join(
        f"<dt>{html.escape(k)}</dt><dd>{html.escape(v)}</dd>"
        for k, v in record.get("definitions", {}).items()
    )
    parts.append(f"<section><h2>Definitions</h2><dl>{defs}</dl></section>")
    name = f"sparkctl bench · {t.get('recipe') or t.get('model') or 'server'}"
    return _page(name, meta, "".join(parts), record, "bench.json")


def _conditions_html(v: dict[str, Any]) -> str:
    """The run's conditions: what a reader needs to trust (or dispute) the numbers."""
    c = v.get("conditions")
    if not c:
        return ""
    gpu = c.get("gpu") or {}
    if gpu.get("sampled"):
        g = (
            "; ".join(
                f"{x.get('name')}: SM {_rng(x.get('sm_clock_mhz'))} MHz (max {x.get('sm_clock_max_mhz')}, "
                f"cap {x.get('sm_clock_cap_mhz')}{', CAPPED' if x.get('capped') else ''}), power "
                f"{(x.get('power_w') or {}).get('median')} W median"
                for x in gpu.get("gpus", [])
            )
            + f" ({gpu.get('samples')} samples every {gpu.get('interval_s')} s)"
        )
    else:
        g = gpu.get("reason", "not sampled")
    nonphys = sum(
        (lv.get("per_stream_decode") or {}).get("nonphysical", 0)
        for lv in (v.get("workloads", {}).get("concurrency") or {}).get("levels", [])
    ) + sum(t.get("nonphysical", 0) for t in (v.get("workloads", {}).get("t1") or {}).get("tasks", []))
    verify = c.get("verify")
    rows = {
        "engine": f"{c.get('engine_version') or '?'}; packages: "
        + ", ".join(f"{k} {x}" for k, x in (c.get("packages") or {}).items()),
        "recipe hash": str(c.get("recipe_hash") or "-"),
        "verify": "none kept"
        if not verify
        else f"{verify.get('path')} ({verify.get('verdict') or verify.get('ok')})",
        "GPU during the run": g,
        "thinking": c.get("thinking", "?"),
        "sampling": ", ".join(f"{k}={x}" for k, x in (c.get("sampling") or {}).items()),
        "prompts": c.get("prompt_uniqueness", ""),
        "token counts": c.get("token_counts", ""),
        "per-stream figures": (c.get("figures") or {}).get("per_stream", ""),
        "aggregate figures": (c.get("figures") or {}).get("aggregate", ""),
        "non-physical samples left out": str(nonphys),
    }
    dl = "".join(f"<dt>{html.escape(k)}</dt><dd>{html.escape(str(x))}</dd>" for k, x in rows.items())
    return f'<section class="conditions"><h2>Conditions · {html.escape(v.get("label", ""))}</h2><dl>{dl}</dl></section>'


def _rng(s: dict[str, Any] | None) -> str:
    return "-" if not s else f"{s['min']:.0f}-{s['max']:.0f} (median {s['median']:.0f})"


def render_boot_html(rec: dict[str, Any]) -> str:
    """The boot comparison page: stage bars per variant, the table, refusals with the engine's reason."""
    from sparkctl.bench.tables import BOOT_COLUMNS, boot_rows

    host = rec.get("host", {})
    meta = html.escape(
        f"{rec.get('recipe')} · {host.get('hostname')} · {host.get('cpus')} CPUs · {rec.get('created_at')} · "
        f"fastest: {rec.get('fastest') or '-'}"
    )
    tbl = "<section><h2>Stages (seconds from `up`)</h2>" + _table(BOOT_COLUMNS, boot_rows(rec)) + "</section>"
    return _page(f"sparkctl bench boot · {rec.get('recipe')}", meta, tbl, rec, "boot.json")


def render_compare_html(result: dict[str, Any]) -> str:
    files = result["files"]
    cols = ("variant", "workload", "case", "metric", files[0], *[x for f in files[1:] for x in (f, "Δ%")])
    rows = []
    for r in result["rows"]:
        cells = [r["variant"], r["workload"], r["case"], r["metric"], f"{r['base']:.2f}"]
        for o in r["others"]:
            cells += [
                "-" if o["value"] is None else f"{o['value']:.2f}",
                "-" if o["pct"] is None else f"{o['pct']:+.1f}%",
            ]
        rows.append(cells)
    tbl = "<section><h2>Before → after</h2>" + _table(cols, rows) + "</section>"
    return _page("sparkctl bench compare", html.escape(" → ".join(files)), tbl, result, "compare.json")

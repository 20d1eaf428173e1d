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
    defs = "".join(
        f"<dt>{html.escape(k)}</dt><dd>{html.escape(v)}</dd>"
        for k, v in record.get("definitions", {}).items()
    )
    parts.append(f"<section><h2>Definitions</h2><dl>{defs}</dl></section>")
    name = f"sparkctl bench · {t.get('recipe') or t.get('model') or 'server'}"
    return _page(name, meta, "".join(parts), record, "bench.json")


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

"""`sparkctl bench` end to end against the session's real tiny vLLM (CPU), every workload scaled down.

One full run (suite, follow-up, long prompt, concurrency, the arena-v2 grid narrowed to what a
512-token model holds) feeds the schema, HTML (real headless Chromium) and compare checks; the
peer cross-check interleaves vLLM's own `bench serve` request function with ours request by
request, so both see the same server on a busy 2-core host. The sweep test starts two more
servers (a copy of the tiny recipe under another name and port) through `up`/`down`.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ctrl_c import sigint_default

from sparkctl.bench import record as records
from sparkctl.bench.compare import compare
from sparkctl.bench.grids import ARENA_V2_SCHEDULE
from sparkctl.bench.report import render_compare_html

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

SCALED = [
    "--runs", "1", "--warmup", "1", "--max-tokens", "16",
    "--concurrency", "1,2", "--requests", "2",
    "--long-tokens", "200", "--followup-tokens", "260",  # vLLM CPU caches in 128-token blocks
    "--grid", "arena-v2", "--grid-depths", "0,64", "--grid-concurrency", "1,2",
    "--grid-pp", "32", "--grid-tg", "8", "--grid-runs", "1",
    "--slo", "ttft_ms=5000", "--slo", "tpot_ms=1000",
]  # fmt: skip


@pytest.fixture(scope="module")
def full_run(tiny_server, tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "tiny"
    wl = "suite,followup,long,concurrency"
    res = tiny_server.sparkctl("bench", "tiny", "-w", wl, *SCALED, "--out", str(out), timeout=600)
    assert res.returncode == 0, res.stderr
    return out, res, json.loads((out / "bench.json").read_text())


def test_every_workload_runs_and_the_record_validates(full_run):
    out, res, rec = full_run
    records.validate(rec)
    assert rec["complete"] and not rec["interrupted"] and rec["error"] is None
    assert rec["server"]["recipe"] == "tiny" and rec["server"]["recipe_hash"]
    v = rec["variants"][0]
    assert v["model"] == "tiny" and v["max_model_len"] == 512
    assert v["server"]["engine_version"].startswith("0.32")
    wl = v["workloads"]
    # suite: eight categories, a fresh nonce at the start of every prompt, server-counted tokens
    assert sorted(wl["suite"]["per_category"]) == sorted(
        ["coding", "prose", "reasoning", "summary", "format", "json", "html", "narrative"]
    )
    samples = wl["suite"]["samples"]
    assert all(
        s["ok"] and s["completion_tokens"] == 16 and s["count_source"] == "continuous" for s in samples
    )
    assert wl["suite"]["summary"]["goodput"]["total"] == 8
    assert wl["suite"]["server_metrics"]["prompt_tokens"] >= sum(s["prompt_tokens"] for s in samples)
    assert wl["suite"]["prefill_crosscheck"]["server_tps"] > 0
    # follow-up: the second turn hit vLLM's prefix cache (its own counters say so), the first did not
    fu = wl["followup"]
    assert fu["hit_verified"] and fu["server_hit_rate"] > 0.2 and fu["server_cold_hit_rate"] == 0.0
    # long prompt sized with the server's /tokenize to within a few tokens of the target
    point = wl["long"]["points"][0]
    assert abs(point["tokenized"] - 200) <= 12 and point["samples"][0]["prompt_tokens"] == point["tokenized"]
    # concurrency: per level, aggregate over the window and a per-stream median
    levels = {lv["concurrency"]: lv for lv in wl["concurrency"]["levels"]}
    assert set(levels) == {1, 2} and all(
        len(lv["samples"]) == 2 and lv["aggregate_tps"] > 0 for lv in levels.values()
    )
    # the grid keeps arena-v2's task order, restricted to the chosen depths and levels
    tasks = [(t["depth"], t["concurrency"]) for t in wl["grid"]["tasks"]]
    assert tasks[:2] == [t for t in ARENA_V2_SCHEDULE if t in ((0, 1), (0, 2))] and tasks[2:] == [
        (64, 1),
        (64, 2),
    ]
    for t in wl["grid"]["tasks"]:
        assert t["tg_throughput"]["mean"] > 0 and len(t["e2e_ttft"]["values"]) == t["concurrency"]
        assert bool(t["context_runs"]) == (t["depth"] > 0)  # prefix caching: the context loads first
    assert "decode tok/s p50" in res.stdout and "grid (llama-benchy fields)" in res.stdout


@pytest.mark.skipif(CHROMIUM is None, reason="Debian chromium is not installed (make test installs it)")
def test_html_report_draws_its_charts_in_headless_chromium(full_run, tmp_path):
    playwright = pytest.importorskip("playwright.sync_api")
    out, _, rec = full_run
    html = (out / "report.html").read_text()
    assert "http://" not in html.replace("http://127.0.0.1", "").replace("http://www.w3.org", "")  # no CDN
    errors: list[str] = []
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1400, "height": 900}, accept_downloads=True)
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.route(
            "**/*",
            lambda r: (
                r.abort() if not r.request.url.startswith(("file:", "data:", "blob:")) else r.continue_()
            ),
        )
        page.goto((out / "report.html").as_uri())
        page.wait_for_selector("body[data-charts]")
        assert int(page.get_attribute("body", "data-charts")) == 8  # 2 suite, 1 TTFT, 2 concurrency, 3 grid
        assert page.locator("svg.bar-chart rect.bar").count() >= 16
        assert page.locator("svg.line-chart circle.point").count() >= 4
        assert page.locator("svg.heat-map rect.cell").count() == 12  # 3 maps x 4 tasks
        # hover shows the value
        page.locator("svg.heat-map rect.cell").first.hover()
        assert "depth" in page.locator("#tip").inner_text()
        # each chart exports, and the data downloads back as the same record
        with page.expect_download() as d:
            page.locator("button.export-svg").first.click()
        assert d.value.suggested_filename.endswith(".svg")
        with page.expect_download() as d:
            page.locator("button.export-png").first.click()
        png = Path(d.value.path()).read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n"
        with page.expect_download() as d:
            page.locator("#download").click()
        assert json.loads(Path(d.value.path()).read_text())["created_at"] == rec["created_at"]
        shot = Path(os.environ.get("SPARKCTL_BENCH_SCREENSHOT", tmp_path / "report.png"))
        page.screenshot(path=str(shot), full_page=True)
        # the compare page draws before -> after bars from its inlined comparison
        faster = json.loads(json.dumps(rec))
        cats = faster["variants"][0]["workloads"]["suite"]["per_category"]
        cats[next(c for c, v in cats.items() if v["decode_tps"])]["decode_tps"]["median"] *= 2
        (tmp_path / "b.json").write_text(json.dumps(faster))
        result = compare([out / "bench.json", tmp_path / "b.json"])
        (tmp_path / "cmp.html").write_text(render_compare_html(result))
        page.goto((tmp_path / "cmp.html").as_uri())
        page.wait_for_selector("body[data-charts]")
        assert int(page.get_attribute("body", "data-charts")) >= 4
        assert page.locator("svg.bar-chart rect.bar").count() >= 2 * len(result["rows"]) // 2
        browser.close()
    assert errors == []
    assert shot.stat().st_size > 20_000


def test_compare_reads_our_records_and_llama_benchy_json(full_run, tiny_server, tmp_path):
    out, _, rec = full_run
    faster = json.loads(json.dumps(rec))
    # a category whose every stream was judged not physical (a loaded 2-core box) has no decode figure: skip it
    cats = faster["variants"][0]["workloads"]["suite"]["per_category"]
    measured = [c for c, s in cats.items() if s["decode_tps"]]
    assert measured, "no category has a decode figure"
    for c in measured:
        cats[c]["decode_tps"]["median"] *= 1.25
    (tmp_path / "b.json").write_text(json.dumps(faster))
    res = tiny_server.sparkctl("bench", "compare", str(out / "bench.json"), str(tmp_path / "b.json"), "--json",
                               "--html", str(tmp_path / "cmp.html"))  # fmt: skip
    assert res.returncode == 0, res.stderr
    rows = json.loads(res.stdout)["rows"]
    row = next(r for r in rows if r["case"] == measured[0] and r["metric"] == "decode tok/s")
    assert row["others"][0]["pct"] == pytest.approx(25.0) and row["others"][0]["better"] is True
    assert '"rows"' in (tmp_path / "cmp.html").read_text()  # the comparison is inlined for the page's charts
    # llama-benchy's own JSON report shape (schemas/benchmark_report_schema.json), as sparkrun keeps it
    lb = {"version": "0.4.0", "timestamp": "2026-12-01 10:00:00Z", "latency_mode": "generation", "latency_ms": 1.0,
          "model": "tiny", "prefix_caching_enabled": True, "max_concurrency": 2, "benchmarks": [
              {"concurrency": 1, "context_size": 0, "prompt_size": 32, "response_size": 8,
               "is_context_prefill_phase": False,
               "tg_throughput": {"mean": 50.0, "std": 1.0, "values": [49.0, 51.0]},
               "pp_throughput": {"mean": 1000.0, "std": 0.0, "values": [1000.0]},
               "e2e_ttft": {"mean": 40.0, "std": 0.0, "values": [40.0]}}]}  # fmt: skip
    (tmp_path / "lb.json").write_text(json.dumps({"results": [lb]}))
    res = tiny_server.sparkctl(
        "bench", "compare", str(tmp_path / "lb.json"), str(out / "bench.json"), "--json"
    )
    assert res.returncode == 0, res.stderr
    tg = next(
        r for r in json.loads(res.stdout)["rows"] if r["metric"] == "tg t/s" and r["case"] == "pp32/tg8 c1"
    )
    ours = next(
        t
        for t in rec["variants"][0]["workloads"]["grid"]["tasks"]
        if t["depth"] == 0 and t["concurrency"] == 1
    )
    assert tg["others"][0]["value"] == pytest.approx(ours["tg_throughput"]["mean"])
    assert tg["others"][0]["pct"] == pytest.approx(100 * (ours["tg_throughput"]["mean"] - 50) / 50)
    # our grid is also written in llama-benchy's report format, and reads back as the same numbers
    lb_ours = json.loads((out / "llama-benchy.json").read_text())
    assert len([b for b in lb_ours["benchmarks"] if not b["is_context_prefill_phase"]]) == 4
    assert (
        len([b for b in lb_ours["benchmarks"] if b["is_context_prefill_phase"]]) == 2
    )  # the d64 context loads
    res = tiny_server.sparkctl(
        "bench", "compare", str(out / "llama-benchy.json"), str(out / "bench.json"), "--json"
    )
    assert res.returncode == 0, res.stderr
    rows = json.loads(res.stdout)["rows"]
    assert len(rows) >= 4 * 5 and all(r["others"][0]["value"] == pytest.approx(r["base"]) for r in rows)


def test_bad_input_is_one_line_exit_2_and_keeps_partial_results(tiny_server, tmp_path):
    res = tiny_server.sparkctl("bench", "tiny", "--model", "nope", "--out", str(tmp_path / "a"))
    assert (
        res.returncode == 2 and "model 'nope' is not served" in res.stderr and "Traceback" not in res.stderr
    )
    res = tiny_server.sparkctl(
        "bench", "tiny", "-w", "suite,long", "--categories", "coding", "--runs", "1", "--max-tokens", "8",
        "--long-tokens", "600", "--out", str(tmp_path / "b"),
    )  # fmt: skip
    assert res.returncode == 2 and "more than the model's context (512)" in res.stderr
    rec = json.loads((tmp_path / "b" / "bench.json").read_text())
    assert "context" in rec["error"] and rec["variants"][0]["workloads"]["suite"]["samples"]  # partial kept
    records.validate(rec)
    assert (tmp_path / "b" / "report.html").exists()
    res = tiny_server.sparkctl("bench", "--url", "http://127.0.0.1:9", "--out", str(tmp_path / "c"))
    assert res.returncode == 2 and "cannot reach" in res.stderr and not (tmp_path / "c").exists()


def test_ctrl_c_keeps_partial_results(tiny_server, tmp_path):
    out = tmp_path / "int"
    proc = subprocess.Popen(
        [sys.executable, "-m", "sparkctl", "bench", "tiny", "-w", "suite,concurrency", "--runs", "1",
         "--categories", "coding", "--max-tokens", "8", "--concurrency", "1", "--requests", "500", "--out", str(out)],
        env=tiny_server.env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=sigint_default,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while not (out / "bench.json").exists():  # written once the suite is done
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.2)
    time.sleep(2.0)  # some of the 500 concurrency requests are measured
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert "interrupted: partial results kept" in stderr
    rec = json.loads((out / "bench.json").read_text())
    records.validate(rec)
    assert rec["interrupted"] and not rec["complete"]
    level = rec["variants"][0]["workloads"]["concurrency"]["levels"][0]
    assert 0 < len(level["samples"]) < 500 and level["aggregate_tps"] > 0
    assert "concurrency" in stdout  # the table of what was measured is still printed


def test_up_on_a_running_recipe_benches_it_and_leaves_it_running(tiny_server, tmp_path):
    res = tiny_server.sparkctl("bench", "tiny", "--up", "-w", "suite", "--categories", "prose", "--runs", "1",
                               "--max-tokens", "8", "--markdown", "--out", str(tmp_path / "u"))  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("## sparkctl bench: tiny") and "| default | suite | prose |" in res.stdout
    rec = json.loads((tmp_path / "u" / "bench.json").read_text())
    assert rec["server"]["started_by_bench"] is False
    assert tiny_server.sparkctl("status", "tiny").returncode == 0
    # the completions endpoint: text chunks, the same definitions
    res = tiny_server.sparkctl("bench", "tiny", "--api", "completions", "-w", "suite", "--categories", "json",
                               "--runs", "1", "--max-tokens", "8", "--json", "--no-html", "--out", str(tmp_path / "c"))  # fmt: skip
    assert res.returncode == 0, res.stderr
    (sample,) = json.loads(res.stdout)["variants"][0]["workloads"]["suite"]["samples"]
    assert (
        sample["ok"]
        and sample["completion_tokens"] == 8
        and sample["count_source"] in ("usage", "continuous")
    )


def test_median_ttft_and_output_rate_agree_with_vllm_bench_serve(tiny_server):
    """Peer: vLLM's own `bench serve` request function (vllm.benchmarks.lib), same prompts, same length.

    Definitions: vLLM's chat TTFT is the first chunk with `choices` (the role chunk), ours the first
    with text; vLLM sends the two back to back (0.1 ms apart in the recorded stream), well inside
    the tolerance. Output tok/s is vLLM's "Output token throughput" at concurrency 1: output tokens
    over the requests' summed latency (last token chunk). Requests alternate between the two
    clients, so both see the same server load. On the shared 2-core box a round's TTFT can move by
    a factor of five with other jobs' load, so up to three rounds are run: a definition or timing
    error fails all three.
    """
    import asyncio

    import aiohttp
    from vllm.benchmarks.lib.endpoint_request_func import (
        RequestFuncInput,
        async_request_openai_chat_completions,
    )

    from sparkctl.bench import prompts
    from sparkctl.bench.client import Target, request_body, timed_request

    base = f"http://127.0.0.1:{tiny_server.port}"
    target = Target(base_url=base, model="tiny")
    http = target.new_http()
    loop = asyncio.new_event_loop()
    session = loop.run_until_complete(_session(aiohttp))
    n_out = 32

    def one_round() -> tuple[float, float, float, float]:
        theirs, ours = [], []
        texts = [prompts.with_nonce(t) for _ in range(3) for t in prompts.CATEGORIES.values()]
        for i, text in enumerate([prompts.with_nonce("warm up")] + texts):
            inp = RequestFuncInput(prompt=text + " (v)", api_url=f"{base}/v1/chat/completions", prompt_len=0,
                                   output_len=n_out, model="tiny", ignore_eos=True)  # fmt: skip
            pair = [
                lambda inp=inp: loop.run_until_complete(async_request_openai_chat_completions(inp, session)),
                lambda text=text: timed_request(http, target, request_body(target, text + " (s)", n_out)),
            ]
            if i % 2:
                pair.reverse()
            results = [f() for f in pair]
            if i == 0:
                continue
            v, s = results if not i % 2 else results[::-1]
            assert v.success and s.ok and v.output_tokens == s.completion_tokens == n_out
            theirs.append(v)
            ours.append(s)
        return (
            statistics.median(s.ttft_s for s in ours),
            statistics.median(o.ttft for o in theirs),
            sum(s.completion_tokens for s in ours) / sum(s.e2e_s for s in ours),
            sum(o.output_tokens for o in theirs) / sum(o.latency for o in theirs),
        )

    rounds = []
    try:
        for _ in range(3):
            ttft_s, ttft_v, rate_s, rate_v = one_round()
            rounds.append((ttft_s, ttft_v, rate_s, rate_v))
            if abs(ttft_s / ttft_v - 1) <= 0.15 and abs(rate_s / rate_v - 1) <= 0.15:
                break
    finally:
        loop.run_until_complete(session.close())
        loop.close()
        http.close()
    ttft_s, ttft_v, rate_s, rate_v = rounds[-1]
    assert ttft_s == pytest.approx(ttft_v, rel=0.15), rounds
    assert rate_s == pytest.approx(rate_v, rel=0.15), rounds


async def _session(aiohttp):
    return aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=600),
        connector=aiohttp.TCPConnector(limit=4, keepalive_timeout=600),
    )


def test_sweep_restarts_a_recipe_per_variant_through_up_and_down(tiny_server, tmp_path):
    src = (REPO / "recipes" / "tiny.yaml").read_text()
    recipe = tmp_path / "tiny-sweep.yaml"
    recipe.write_text(src)
    from sparkctl.server.ports import free_port

    port = free_port()
    res = tiny_server.sparkctl(
        "bench", str(recipe), "--set", f"serve.port={port}", "--sweep", "serve.max_num_seqs=2,4",
        "-w", "suite,concurrency", "--categories", "coding,json", "--runs", "1", "--max-tokens", "8",
        "--concurrency", "2", "--requests", "2", "--out", str(tmp_path / "s"), timeout=900,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    rec = json.loads((tmp_path / "s" / "bench.json").read_text())
    records.validate(rec)
    assert [v["label"] for v in rec["variants"]] == ["serve.max_num_seqs=2", "serve.max_num_seqs=4"]
    for v in rec["variants"]:
        assert v["workloads"]["suite"]["summary"]["decode_tps"]["median"] > 0
        assert "kv_cache_usage" in v["workloads"]["suite"]["server_metrics"]
    assert not (
        tiny_server.state_dir / "servers" / "tiny-sweep.json"
    ).exists()  # stopped after the last variant
    cmp = tiny_server.sparkctl("bench", "compare", str(tmp_path / "s" / "bench.json"), "--json")
    assert cmp.returncode == 0 and len(json.loads(cmp.stdout)["files"]) == 2


def test_per_stream_decode_is_physical_at_concurrency_1_2_4_8(tiny_server, tmp_path):
    """Issue 39 on the real server: on the 2-core box whole streams arrive in one 0.1 ms burst at
    concurrency >= 2 (the starved HTTP front end flushes late), which once read as 100,000 tok/s.

    Stated factors: the reported per-stream figure is vLLM's own (its per-request decode-time
    histograms), at most SLACK (1.25x) above the aggregate decode throughput; every sample's figure
    is at most the level's bound (1.25x the aggregate decode rate, 2x the engine's own); a bunched
    stream carries the engine's mean instead of its stamps; the median of the streams whose stamps
    were spread lies within 6x below and 2x above the engine's figure.
    """
    from sparkctl.bench.plausibility import SLACK

    out = tmp_path / "c"
    res = tiny_server.sparkctl("bench", "tiny", "-w", "concurrency", "--concurrency", "1,2,4,8", "--requests", "8",
                               "--max-tokens", "32", "--out", str(out), timeout=300)  # fmt: skip
    assert res.returncode == 0, res.stderr
    rec = json.loads((out / "bench.json").read_text())
    records.validate(rec)
    levels = rec["variants"][0]["workloads"]["concurrency"]["levels"]
    assert [lv["concurrency"] for lv in levels] == [1, 2, 4, 8]
    for lv in levels:
        d = lv["per_stream_decode"]
        server = d["server"]["mean_tps"]
        assert d["source"] == "server" and lv["per_stream_decode_tps"] == d["median_tps"] > 0
        assert d["median_tps"] <= d["aggregate_decode_tps"] * SLACK, (lv["concurrency"], d)
        rates = [s["decode_tps"] for s in lv["samples"] if s["decode_tps"] is not None]
        assert rates and max(rates) <= d["bound_tps"], (lv["concurrency"], max(rates), d)
        sources = {s["decode_source"] for s in lv["samples"] if s["ok"]}
        assert sources <= {"client", "client-e2e", "server-mean"}, sources  # vLLM sends no per-request timing
        assert sum(s["decode_source"] == "server-mean" for s in lv["samples"]) == d["bunched"]
        if d["client"]:  # the streams whose stamps were spread: their own figure, near the engine's
            assert server / 6 <= d["client"]["median"] <= server * 2, (lv["concurrency"], d)
        assert lv["summary"]["decode_tps"]["max"] <= d["bound_tps"]
        flagged = [s for s in lv["samples"] if s["decode_flag"]]
        assert len(flagged) == d["nonphysical"] and all(s["decode_tps"] is None for s in flagged)
    # the page: no per-stream point above its level's bound, and the count of dropped samples shown
    html = (out / "report.html").read_text()
    assert "per_stream_decode" in html and "non-phys" in html

"""`bench --profile t1` (with resume), its agreement with llama-benchy, and `bench boot`, on the real tiny vLLM.

T1 runs scaled to what a 512-token model holds (prompts 64/96, outputs 8/16, depth 0/128, concurrency
1/2); llama-benchy 0.4.0 itself runs on the same server and settings, offline: its corpus cache is
seeded with our filler text (it would download a book otherwise). `bench boot` starts a copy of the
tiny recipe under another name, so the session's shared server keeps running.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ctrl_c import sigint_default

from sparkctl.bench import record as records

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]

REPO = Path(__file__).resolve().parents[2]
SCALE = ["--profile", "t1", "--profile-set", "prompts=64,96", "--profile-set", "outputs=8,16",
         "--profile-set", "depths=0,128", "--profile-set", "concurrency=1,2", "--profile-set", "runs=1"]  # fmt: skip


def test_t1_runs_resumes_after_ctrl_c_and_records_its_conditions(tiny_server, tmp_path):
    out = tmp_path / "t1"
    proc = subprocess.Popen(
        [sys.executable, "-m", "sparkctl", "bench", "tiny", *SCALE, "--out", str(out)],
        env=tiny_server.env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=sigint_default,
    )  # fmt: skip
    deadline = time.monotonic() + 180
    while not (out / "bench.json").exists():  # written after the first measured batch
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    first = json.loads((out / "bench.json").read_text())
    done = {t["key"]: t for t in first["variants"][0]["workloads"]["t1"]["tasks"] if t["runs"]}
    if proc.returncode == 0:  # finished before the signal landed (a fast box): resume must add nothing
        assert first["complete"]
    else:
        assert proc.returncode == 130 and first["interrupted"], stderr
    assert 1 <= len(done) <= 16

    res = tiny_server.sparkctl("bench", "tiny", *SCALE, "--resume", str(out / "bench.json"), timeout=600)
    assert res.returncode == 0, res.stderr
    rec = json.loads((out / "bench.json").read_text())
    records.validate(rec)
    assert rec["complete"] and rec["resumed_from"]["created_at"] == first["created_at"]
    v = rec["variants"][0]
    t1 = v["workloads"]["t1"]
    assert t1["profile"]["name"] == "t1 (modified)" and len(t1["tasks"]) == 16
    for key, old in done.items():  # what the first run measured is kept as it was, not re-measured
        new = next(t for t in t1["tasks"] if t["key"] == key)
        assert [s["t_send_abs"] for s in new["runs"][0]] == [s["t_send_abs"] for s in old["runs"][0]]
    for t in t1["tasks"]:
        assert len(t["runs"]) == 1 and len(t["runs"][0]) == t["concurrency"]
        samples = t["runs"][0]
        assert all(s["ok"] and s["completion_tokens"] == t["tg"] for s in samples)
        # the prompt is the size asked (template and nonce included), the depth filler in front of it
        assert all(abs(s["prompt_tokens"] - t["depth"] - t["pp"]) <= 8 for s in samples), (t["key"], samples)
        # unique prompts: the engine's prefix cache served nothing to any run
        assert all((m or {}).get("prefix_cache_hits", 0) == 0 for m in t["server_metrics"]), t["key"]
        assert t["tg_throughput"]["mean"] > 0 and t["e2e_ttft"]["mean"] > 0
        assert t["per_stream_decode_tps"] > 0
    c = v["conditions"]
    assert c["thinking"] == "off" and c["sampling"]["temperature"] == 0.0 and c["recipe_hash"]
    assert c["engine_version"].startswith("0.32") and c["gpu"]["sampled"] is False  # no nvidia-smi here
    assert "nonce" in c["prompt_uniqueness"] and "token ids" in c["token_counts"]
    html = (out / "report.html").read_text()
    assert "Conditions" in html and "thinking" in html


def _llama_benchy(tiny_server, tmp_path: Path, model_dir: Path) -> dict:
    """llama-benchy 0.4.0 on the same server and settings; its corpus is our filler, seeded offline."""
    from sparkctl.bench import prompts

    home = tmp_path / "home"
    book = "sparkctl-filler"
    cache = home / ".cache" / "llama-benchy"
    cache.mkdir(parents=True, exist_ok=True)
    (cache / f"{hashlib.md5(book.encode()).hexdigest()}.txt").write_text(prompts.filler(400, 3))
    exe = shutil.which("llama-benchy") or str(Path(sys.executable).with_name("llama-benchy"))
    out = tmp_path / f"lb-{time.monotonic_ns()}.json"
    cmd = [exe, "--base-url", f"http://127.0.0.1:{tiny_server.port}/v1", "--model", "tiny",
           "--tokenizer", str(model_dir), "--book-url", book, "--pp", "64", "--tg", "16", "--depth", "0", "128",
           "--concurrency", "1", "2", "--runs", "3", "--no-cache", "--exact-tg", "--latency-mode", "generation",
           "--skip-coherence", "--format", "json", "--save-result", str(out)]  # fmt: skip
    res = subprocess.run(cmd, env=tiny_server.env | {"HOME": str(home)}, capture_output=True, text=True,
                         timeout=600)  # fmt: skip
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    return json.loads(out.read_text())


SLACK_MS = 40.0  # e2e TTFT agreement, beside the factor (see the test)


def test_t1_agrees_with_llama_benchy_on_the_same_server(tiny_server, tmp_path):
    """Our T1 cells against llama-benchy 0.4.0's, same server, same pp/tg/depth/concurrency.

    Load on the shared 2-core box moves one run by 2x, so each round is A-B-A: ours, llama-benchy,
    ours again, and llama-benchy's cell must fall inside the range of our two runs widened by a
    factor of TOL = 1.6, and by SLACK_MS for TTFTs (drift between the runs widens the range instead of
    failing; a TTFT definition off by more than that still fails). Compared per
    cell: e2e TTFT; at concurrency 1 tg t/s too, where llama-benchy's figure is physical (at most
    2x the engine's own per-stream rate from /metrics): on this box llama-benchy also reads bursts
    as 10,000 tok/s (or drops a cell whose streams all arrived at once), and there ours must stay
    within 2x of the engine's figure instead (the plausibility check at work). Up to three rounds; a definition error fails all three.
    """
    pytest.importorskip("llama_benchy")
    tol = 1.6
    model_dir = Path(tiny_server.env["SPARKCTL_CACHE_DIR"]) / "models" / "tiny-llama"
    args = ["--profile", "t1", "--profile-set", "prompts=64", "--profile-set", "outputs=16",
            "--profile-set", "depths=0,128", "--profile-set", "concurrency=1,2", "--profile-set", "runs=3"]  # fmt: skip

    def ours(i: int) -> dict:
        out = tmp_path / f"ours{i}"
        res = tiny_server.sparkctl("bench", "tiny", *args, "--out", str(out), "--no-html", timeout=600)
        assert res.returncode == 0, res.stderr
        tasks = json.loads((out / "bench.json").read_text())["variants"][0]["workloads"]["t1"]["tasks"]
        return {(t["depth"], t["concurrency"]): t for t in tasks}

    failures = []
    for i in range(3):
        a1 = ours(2 * i)
        lb = _llama_benchy(tiny_server, tmp_path, model_dir)
        a2 = ours(2 * i + 1)
        theirs = {(b["context_size"], b["concurrency"]): b for b in lb["benchmarks"]
                  if not b.get("is_context_prefill_phase")}  # fmt: skip
        assert set(theirs) == set(a1) == set(a2)
        bad = []
        for key in sorted(theirs):
            pairs = [("e2e_ttft", "e2e_ttft")] + ([("tg_throughput", "tg_throughput")] if key[1] == 1 else [])
            for ours_f, their_f in pairs:
                mine = [a[key][ours_f]["mean"] for a in (a1, a2)]
                other = (theirs[key][their_f] or {}).get("mean")
                engine = max(a[key]["per_stream_decode_tps"] for a in (a1, a2))
                # llama-benchy read a burst (or every stream arrived at once and it has no figure)
                if ours_f == "tg_throughput" and (other is None or other > 2 * engine):
                    if not all(m <= 2 * engine for m in mine):
                        bad.append((key, "ours non-physical too", mine, engine))
                    continue
                # the tiny server's TTFTs are 10-70 ms, where a loaded 2-core box moves one request by
                # tens of ms either way (seen: ours 11 ms, llama-benchy's 34-42 ms on the same cell in
                # one round, the other way round in the next): an absolute slack beside the factor
                slack = SLACK_MS if ours_f == "e2e_ttft" else 0.0
                if not min(mine) / tol - slack <= other <= max(mine) * tol + slack:
                    bad.append((key, ours_f, mine, other))
        if not bad:
            return
        failures.append(bad)
    pytest.fail(f"T1 disagrees with llama-benchy in all three A-B-A rounds: {failures}")


def test_bench_boot_times_each_stage_and_records_a_refusal(tiny_server, tmp_path):
    src = (REPO / "recipes" / "tiny.yaml").read_text()
    recipe = tmp_path / "tiny-boot.yaml"
    recipe.write_text(src)
    res = tiny_server.sparkctl("up", str(recipe), "--port", "0", timeout=600)  # the weights made once
    assert res.returncode == 0, res.stderr
    assert tiny_server.sparkctl("down", "tiny-boot").returncode == 0
    out = tmp_path / "boot"
    res = tiny_server.sparkctl("bench", "boot", str(recipe), "--variants", "default,fastsafetensors",
                               "--out", str(out), timeout=900)  # fmt: skip
    assert res.returncode == 0, res.stderr
    rec = json.loads((out / "boot.json").read_text())
    default, fast = rec["variants"]
    assert default["ok"] and rec["fastest"] == "default" and default["first_token_ratio"] == 1.0
    assert rec["recommendation"]["label"] == "default"
    st = default["stages_s"]
    order = [
        st[k] for k in ("launched", "weights_loaded", "healthy", "first_token")
    ]  # vLLM binds after loading
    assert all(x is not None for x in order) and order == sorted(order), st
    assert st["launched"] < st["port_open"] <= st["healthy"], st
    assert 0 < default["engine_load_s"] < st["healthy"]
    assert default["cache"]["method"] and default["cache"]["weights_bytes"] > 0
    # the CPU vLLM offers fastsafetensors but cannot load with it: kept, with the engine's reason
    assert not fast["ok"] and fast["error"] and fast["reason"], fast
    assert not (tiny_server.state_dir / "servers" / "tiny-boot.json").exists()  # stopped after each start
    assert (
        "Cold start stages" in (out / "boot.html").read_text()
        or "boot.json" in (out / "boot.html").read_text()
    )


def test_t2_runs_tool_eval_bench_and_keeps_its_score_beside_the_speed(tiny_server, tmp_path):
    pytest.importorskip("tool_eval_bench")
    out = tmp_path / "t2"
    res = tiny_server.sparkctl("bench", "tiny", "-w", "suite", "--categories", "coding", "--runs", "1",
                               "--max-tokens", "8", "--t2", "--out", str(out), "--no-html", timeout=900)  # fmt: skip
    assert res.returncode == 0, res.stderr
    rec = json.loads((out / "bench.json").read_text())
    records.validate(rec)
    v = rec["variants"][0]
    t2 = v["t2"]
    assert t2["ran"] and t2["returncode"] == 0 and t2["tool_version"].endswith("3.0.0"), t2
    # random weights call no tool right: a real score of 0 over the short suite's scenarios
    assert t2["scores"]["final_score"] == 0.0 and t2["scores"]["total_scenarios"] > 0
    assert v["workloads"]["suite"]["summary"]["decode_tps"]["median"] > 0  # the speed is kept beside it
    assert not (REPO / "data").exists()  # the tool's history stays in the output folder, not the cwd

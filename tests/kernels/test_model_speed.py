"""kernels/bench/model_speed.py's CPU half: the checkpoint it writes on the device (shapes at GLM dimensions, the
safetensors layout, the loaders' acceptance at a tiny size), the timing arithmetic, and the report's per-layer
figures, floors and GB10 projection. The engines themselves run on the device; the last test runs the vLLM half of
the driver on vLLM's CPU build."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from script_module import loaded

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "kernels" / "bench" / "model_speed.py"


@pytest.fixture(scope="module")
def ms():
    yield from loaded(SCRIPT, "kernels_bench_model_speed")


def _linear_bytes(i: int, o: int, bits: int, bias: bool = False) -> int:
    """trellis (bits per weight) + suh + svh (fp16) + the int32 marker (+ fp16 bias), from SPEC 1.1."""
    return i * o * bits // 8 + 2 * (i + o) + 4 + (2 * o if bias else 0)


def test_glm_class_layer_as_exllamav3_stores_it(ms) -> None:
    spec = ms.Spec()
    t = {x.name: x for x in ms.layer_tensors(spec, 3)}
    p = "model.layers.3"
    assert (
        t[f"{p}.mlp.experts.127.down_proj.trellis"].shape,
        t[f"{p}.mlp.experts.127.down_proj.trellis"].dtype,
    ) == (
        (1536 // 16, 4096 // 16, 32),
        "I16",
    )
    assert t[f"{p}.self_attn.q_proj.trellis"].shape == (4096 // 16, 96 * 128 // 16, 32)
    assert t[f"{p}.self_attn.k_proj.bias"].shape == (8 * 128,) and f"{p}.self_attn.o_proj.bias" not in t
    assert (t[f"{p}.mlp.gate.weight"].dtype, t[f"{p}.mlp.gate.weight"].shape) == ("F16", (128, 4096))
    assert (
        t[f"{p}.mlp.gate.e_score_correction_bias"].dtype,
        t[f"{p}.mlp.gate.e_score_correction_bias"].shape,
    ) == (
        "F32",
        (128,),
    )
    markers = [x for x in t.values() if x.name.endswith(".mul1")]
    assert len(markers) == 4 + 3 * 128 + 3 and all((m.dtype, m.shape) == ("I32", ()) for m in markers)
    # svh keeps each projection's output at unit scale: 1/sqrt(in_features)
    assert t[f"{p}.mlp.experts.0.down_proj.svh"].scale == pytest.approx(1 / math.sqrt(1536))
    top = {x.name: x for x in ms.top_tensors(spec)}
    assert top["lm_head.trellis"].shape == (4096 // 16, 151552 // 16, 16 * 6)
    assert top["model.embed_tokens.weight"].dtype == "BF16"


def test_bytes_one_decode_step_reads(ms) -> None:
    spec = ms.Spec()
    expert = 2 * _linear_bytes(4096, 1536, 2) + _linear_bytes(1536, 4096, 2)
    attention = (
        _linear_bytes(4096, 12288, 2, True)
        + 2 * _linear_bytes(4096, 1024, 2, True)
        + _linear_bytes(12288, 4096, 2)
    )
    b1 = ms.layer_bytes(spec, 1)
    assert b1["routed_experts"] == pytest.approx(8 * expert)
    assert b1["shared_expert"] == expert
    assert b1["attention"] == attention
    assert b1["router"] == 128 * 4096 * 2 + 128 * 4
    assert b1["total"] == pytest.approx(9 * expert + attention + b1["router"] + 2 * 4096 * 2)
    assert ms.head_bytes(spec) == _linear_bytes(4096, 151552, 6)
    assert ms.kv_bytes(spec, 2048) == 2048 * 2 * 8 * 128 * 2
    # 8 tokens, each to 8 of 128 uniformly: 128 * (1 - (120/128)^8) distinct experts
    assert ms.layer_bytes(spec, 8)["routed_experts"] == pytest.approx(128 * (1 - (120 / 128) ** 8) * expert)


def test_expected_unique_experts(ms) -> None:
    assert ms.expected_unique(128, 8, 1) == pytest.approx(8)
    seq = [ms.expected_unique(128, 8, r) for r in (1, 2, 4, 8, 64, 4096)]
    assert seq == sorted(seq) and seq[3] < 64 and 127.9 < seq[-1] <= 128


def test_safetensors_layout_and_fills(ms, tmp_path: Path) -> None:
    from safetensors import safe_open

    tensors = [
        ms.Tensor("a.suh", "F16", (256,), "signs", 0.25),
        ms.Tensor("a.trellis", "I16", (16, 8, 32), "bits"),
        ms.Tensor("a.mul1", "I32", (), "marker"),
        ms.Tensor("n.weight", "BF16", (3,), "ones"),
        ms.Tensor("g.bias", "F32", (5,), "zeros"),
        ms.Tensor("e.weight", "BF16", (64, 4), "normal", 2.0),
    ]
    raw, spans = ms.safetensors_header(tensors)
    assert len(raw) % 8 == 0
    assert [a for _, a, _ in spans] == [0] + [b for _, _, b in spans[:-1]]  # back to back, from 0
    assert all(a % ms._DTYPES[t.dtype] == 0 for t, a, _ in spans)  # each aligned to its element size
    path = tmp_path / "x.safetensors"
    size = ms.write_safetensors(path, tensors, "cpu", seed=3)
    assert size == path.stat().st_size
    assert struct.unpack("<Q", path.read_bytes()[:8])[0] == len(raw)
    with safe_open(str(path), framework="pt") as st:
        assert int(st.get_tensor("a.mul1")) == ms.MUL1_MARKER
        suh = st.get_tensor("a.suh").float()
        assert set(suh.tolist()) == {-0.25, 0.25}
        trellis = st.get_tensor("a.trellis")
        assert trellis.shape == (16, 8, 32) and len(set(trellis.flatten().tolist())) > 1000
        assert st.get_tensor("n.weight").float().tolist() == [1.0, 1.0, 1.0]
        assert st.get_tensor("g.bias").tolist() == [0.0] * 5
        assert 1.0 < float(st.get_tensor("e.weight").float().std()) < 3.0


@pytest.mark.slow
def test_tiny_checkpoint_passes_the_loaders(ms, tmp_path: Path) -> None:
    """Both depths: safetensors' reader, the plugin's name rules, exllamav3's loader (where installed) and vLLM's
    model config (where installed) accept them; the shallow one hard-links the deep one's files."""
    spec = ms.replace(ms.TINY, layers=2)
    lines: list[str] = []
    dirs = ms.write_checkpoints(spec, [1, 2], tmp_path, "cpu", lines.append)
    checks = ms.check_checkpoints(dirs, spec, lines.append)
    assert not [v for v in checks.values() if v.startswith("FAILED")], checks
    assert checks["L1.plugin"].startswith("plugin: 32 EXL3 modules") and checks["L2.safetensors"].startswith(
        "safetensors: 268"
    )
    assert (dirs[1] / "model.layers.00.safetensors").stat().st_ino == (
        dirs[2] / "model.layers.00.safetensors"
    ).stat().st_ino
    assert not (dirs[1] / "model.layers.01.safetensors").exists()
    assert json.loads((dirs[1] / "config.json").read_text())["num_hidden_layers"] == 1
    before = (dirs[2] / "model.top.safetensors").stat().st_mtime_ns
    ms.write_checkpoints(spec, [1, 2], tmp_path, "cpu", lines.append)
    assert (
        lines[-1].startswith("checkpoint: reusing")
        and (dirs[2] / "model.top.safetensors").stat().st_mtime_ns == before
    )


def test_plugin_check_catches_a_wrong_name(ms, tmp_path: Path) -> None:
    spec = ms.replace(ms.TINY, layers=1)
    dirs = ms.write_checkpoints(spec, [1], tmp_path, "cpu", lambda s: None)
    bad = [ms.Tensor("model.layers.0.mlp.experts.0.gate.trellis", "I16", (16, 16, 32), "bits")]
    ms.write_safetensors(dirs[1] / "extra.safetensors", bad, "cpu", seed=1)
    with pytest.raises(RuntimeError, match="EXL3 modules differ"):
        ms.check_plugin_names(dirs[1], spec, 1)


def test_measure_takes_the_step_as_the_slope(ms) -> None:
    """With a cost linear in prompt and new tokens, the measured step is the per-token cost exactly; no prompt is
    ever sent twice (a prefix cache would hide the prefill)."""
    seen: set[tuple[int, ...]] = set()

    def run(prompts: list[list[int]], new: int) -> float:
        for p in prompts:
            assert tuple(p) not in seen
            seen.add(tuple(p))
        return 0.2 + 1e-5 * sum(len(p) for p in prompts) + new * (0.003 if len(prompts) == 1 else 0.005)

    plan = ms.Plan(prompt=64, ttft=(64, 256), repeats=2, n1=4, n2=12)
    out = ms.measure(run, 1000, plan, lambda s: None)
    assert out["decode"]["1"]["step_ms"] == pytest.approx(3.0)
    assert out["decode"]["8"]["tok_s"] == pytest.approx(8 / 0.005, rel=1e-3)
    assert out["ttft_ms"]["256"] == pytest.approx(1e3 * (0.2 + 256e-5 + 0.003))


def _record(layers: int, per_layer_us: float, rest_us: float, head_us: float, ttft_ms: float) -> dict:
    step = lambda b: (rest_us + layers * per_layer_us * (2.0 if b == "8" else 1.0)) / 1e3  # noqa: E731
    return {
        "ttft_ms": {"2048": ttft_ms + layers, "8192": 4 * ttft_ms},
        "decode": {b: {"step_ms": step(b), "tok_s": int(b) / step(b) * 1e3} for b in ("1", "8")},
        "head_us": {"1": head_us, "8": head_us},
        "load_s": 10.0,
    }


def test_report_per_layer_floor_projection_and_verdict(ms) -> None:
    spec, plan = ms.Spec(), ms.FULL
    runs = {
        "exllamav3": {d: _record(d, 100.0, 900.0, 200.0, 300.0) for d in (4, 8)},
        "vllm": {d: _record(d, 60.0, 700.0, 150.0, 320.0) for d in (4, 8)},
    }
    rep = ms.assemble(spec, plan, runs, (0.6, "test"), {})
    v = rep["engines"]["vllm"]["summary"]["decode"]["1"]
    assert v["per_layer_us"] == pytest.approx(60.0) and v["rest_us"] == pytest.approx(700.0)
    assert v["host_us"] == pytest.approx(550.0)
    assert v["per_layer_us_naive"]["4"] == pytest.approx((700 + 240 - 150) / 4)
    floor = ms.layer_bytes(spec, 1)["total"] / 3.35e12 * 1e6
    assert rep["floors"]["1"]["floor_us"] == pytest.approx(floor, abs=0.01)
    assert v["floor_fraction"] == pytest.approx(floor / 60.0, abs=1e-3)
    r = 3350 / 273
    p = rep["engines"]["vllm"]["glm53_flash_one_spark"]
    step_us = 40 * 60 * r + 150 * r + 550
    assert p["tok_s"] == pytest.approx(1e6 / step_us, abs=0.1)
    l3 = (60 + (120 - 60) * 2 / 7) * r
    mtp_us = 40 * l3 + 150 * r + 550 + 2 * (60 * r + 150 * r)
    assert p["mtp"]["tok_s"] == pytest.approx(1e6 * (1 + 2 * 0.6) / mtp_us, abs=0.1)
    assert rep["verdict"]["per_layer_b1"]["met"] is True
    # the high end: each layer and the head at the larger of the time measured here and the GB10's floor
    high_us = 40 * max(60, rep["floors"]["1"]["gb10_floor_us"]) + max(150, ms.head_bytes(spec) / 273e3) + 550
    assert p["tok_s_high"] == pytest.approx(1e6 / high_us, abs=0.1)
    assert not v["below_floor"] and p["at_floor"] == []
    # TTFT: each engine's line through its depths (320 + layers, 300 + layers) read at GLM-5.3-Flash's 40 layers
    assert rep["verdict"]["ttft"] == {
        "prompt": 2048,
        "layers": 40,
        "vllm_ms": 360.0,
        "exllamav3_ms": 340.0,
        "met": False,
        "method": "each engine's TTFT line through its depths, read at 40 layers",
    }
    text = ms.render(rep)
    assert "per-layer decode b1 vLLM 60.0 vs exllamav3 100.0 us: MET" in text and "NOT MET" in text


def test_profile_families_and_the_decode_step(ms) -> None:
    long = {
        "kernel_unified_attention_2d": {"us": 300.0, "calls": 30},
        "exl3_gemv_kernel<2>": {"us": 900.0, "calls": 90},
    }
    short = {
        "kernel_unified_attention_2d": {"us": 100.0, "calls": 10},
        "exl3_gemv_kernel<2>": {"us": 300.0, "calls": 30},
    }
    step = ms.per_step(long, short, 20)
    assert step == {
        "exl3_gemv_kernel<2>": {"us": 30.0, "calls": 3.0},
        "kernel_unified_attention_2d": {"us": 10.0, "calls": 1.0},
    }
    fam = ms.families(
        {
            **step,
            "void cutlass::Kernel2<x>": {"us": 5.0, "calls": 1},
            "mystery": {"us": 1.0, "calls": 1},
            "void exl3::moe_i8_kernel<4, true>(exl3::MoeArgs)": {"us": 7.0, "calls": 1},  # ours, not routing
        }
    )
    assert fam == {
        "exl3 gemv / fused moe": 37.0,
        "attention": 10.0,
        "gemm (cuBLAS / CUTLASS)": 5.0,
        "other": 1.0,
    }


def test_a_per_layer_figure_below_the_floor_gives_no_verdict_and_the_floor_projects(ms) -> None:
    """Seen on the H100 at 4 and 8 layers: vLLM's batch-1 step hardly grew with the layers (host-bound), so the
    slope (17 us) was under the bandwidth floor (21 us): no layer time, no verdict, and the GB10 takes its floor."""
    spec = ms.Spec()
    runs = {
        "exllamav3": {d: _record(d, 100.0, 900.0, 200.0, 300.0) for d in (4, 8)},
        "vllm": {d: _record(d, 10.0, 1300.0, 150.0, 320.0) for d in (4, 8)},
    }
    rep = ms.assemble(spec, ms.FULL, runs, (None, "not measured"), {"device": "NVIDIA H200"})
    assert rep["gpu_gbs"]["value"] == 4800.0
    assert rep["floors"]["1"]["floor_us"] == pytest.approx(
        ms.layer_bytes(spec, 1)["total"] / 4.8e12 * 1e6, abs=0.01
    )
    v = rep["engines"]["vllm"]["summary"]["decode"]["1"]
    assert v["below_floor"] and not rep["engines"]["exllamav3"]["summary"]["decode"]["1"]["below_floor"]
    p = rep["engines"]["vllm"]["glm53_flash_one_spark"]
    assert p["layer_gb10_us"] == pytest.approx(rep["floors"]["1"]["gb10_floor_us"], abs=0.05)
    assert p["at_floor"] == ["1", "8"]  # the 8-row slope (20 us) is under its floor too
    assert rep["verdict"]["per_layer_b1"]["met"] is None
    assert rep["verdict"]["per_layer_b1"]["host_bound"] == ["vllm"]
    text = ms.render(rep)
    assert "NO VERDICT (vllm below the bandwidth floor" in text and "BELOW THE FLOOR" in text


def test_one_depth_is_an_upper_bound_and_failures_show(ms) -> None:
    runs = {
        "exllamav3": {4: {"engine": "exllamav3", "error": "RuntimeError: boom"}},
        "vllm": {4: _record(4, 60.0, 700.0, 150.0, 320.0)},
    }
    rep = ms.assemble(ms.Spec(), ms.FULL, runs, (None, "not measured"), {})
    v = rep["engines"]["vllm"]["summary"]["decode"]["1"]
    assert "upper bound" in v["method"] and v["per_layer_us"] == pytest.approx((700 + 240 - 150) / 4)
    assert rep["engines"]["vllm"]["glm53_flash_one_spark"]["mtp"] is None
    assert rep["engines"]["exllamav3"]["glm53_flash_one_spark"] is None
    assert rep["verdict"] == {"comparable": True, "per_layer_b1": None, "ttft": None}
    assert "RuntimeError: boom" in ms.render(rep)


def test_mtp_acceptance_from_the_newest_engine_check(ms, tmp_path: Path) -> None:
    def record(name: str, counters: dict | None, mtime: int) -> Path:
        p = tmp_path / name
        rec = {"fixture": "glm4moe-mtp-3.0-mul1", "mode": "mtp-k2"}
        if counters is not None:
            rec["counters"] = counters
        p.write_text(json.dumps({"records": [rec]}))
        os.utime(p, (mtime, mtime))
        return p

    old = record(
        "engine_check-a.json",
        {"vllm:spec_decode_num_draft_tokens": 100, "vllm:spec_decode_num_accepted_tokens": 40},
        1000,
    )
    failed = record("engine_check-b.json", None, 3000)
    newer = record(
        "engine_check-c.json",
        {"vllm:spec_decode_num_draft_tokens": 50, "vllm:spec_decode_num_accepted_tokens": 35},
        2000,
    )
    assert ms.mtp_acceptance_from_records([old, failed, newer]) == (
        0.7,
        "engine_check-c.json (glm4moe-mtp-3.0-mul1)",
    )
    assert ms.mtp_acceptance_from_records([failed]) == (None, "not measured")


@pytest.mark.parametrize(
    "argv",
    [["--layers", "0"], ["--layers", "x"], ["--engines", "sglang"], ["--mtp-acceptance", "1.5"], []],
)
def test_bad_input_is_one_line_and_exit_2(ms, argv: list[str], tmp_path: Path, capsys) -> None:
    out = [] if argv == [] else ["--out", str(tmp_path)]
    assert ms.main([*out, *argv]) == 2
    err = capsys.readouterr()
    assert "Traceback" not in err.out + err.err


def test_cache_and_context_fit_every_run(ms) -> None:
    for plan in (ms.FULL, ms.QUICK, ms.CPU_PLAN):
        tokens = ms.cache_tokens(plan)
        assert (
            tokens % 256 == 0
            and tokens >= max(plan.batches) * (plan.prompt + plan.n2)
            and tokens > max(plan.ttft)
        )
        kw = ms.vllm_kwargs(Path("m"), plan, "cuda")
        assert kw["max_model_len"] > plan.max_len and kw["max_num_batched_tokens"] == ms.CHUNK


@pytest.mark.e2e
@pytest.mark.vllm
def test_dry_run_drives_vllm_cpu_through_the_checkpoint(tmp_path: Path) -> None:
    """The whole CPU half as the device runs it: the tiny checkpoint, the loader checks, vLLM's CPU build through
    the same driver (TTFT, decode at 1 and 8, path counts back from its worker, lm_head alone), the report."""
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed (make install-vllm)")
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "kernels"), os.environ.get("PYTHONPATH", "")]),
    )
    argv = [
        sys.executable,
        str(SCRIPT),
        "--dry-run",
        "--out",
        str(tmp_path / "out"),
        "--work",
        str(tmp_path / "w"),
    ]
    proc = subprocess.run([*argv, "--layers", "1"], capture_output=True, text=True, env=env, timeout=300)
    log = (
        (tmp_path / "out" / "vllm-L1.log").read_text() if (tmp_path / "out" / "vllm-L1.log").exists() else ""
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + log[-3000:]
    rep = json.loads((tmp_path / "out" / "model_speed.json").read_text())
    run = rep["engines"]["vllm"]["runs"]["1"]
    assert set(run["decode"]) == {"1", "8"} and set(run["ttft_ms"]) == {"16", "48"}
    assert run["paths"].get("moe-routed-cpu") and run["fallbacks"]  # the CPU runs the reference, and says so
    assert set(run["head_us"]) == {"1", "8"} and run["head_paths"] == {
        "linear-reference": 16
    }  # 2 x (5 + 3) calls
    assert "dry run" in rep["engines"]["exllamav3"]["runs"]["1"]["skipped"]
    # the profile came back from vLLM's worker (collective_rpc): the prefill's ops and a decode step's, by family
    prof = run["profile"]
    assert prof["prefill"] and prof["decode_step"] and prof["prefill_families_us"]
    assert prof["prefill_wall_ms"] > 0 and prof["prefill_kernels_ms"] > 0 and prof["prefill_host_ops"]
    assert all(r["us"] > 0 for r in prof["decode_step"].values())
    text = (tmp_path / "out" / "model_speed.txt").read_text()
    assert text.startswith("checkpoint: Glm4MoeForCausalLM") and "profiled decode step" in text


def test_the_profiled_prefill_line_splits_per_layer_from_constant(ms) -> None:
    """Two depths: a family that grows with the layers gets a slope and no constant; a constant in the wall time
    that the kernels lack is the host's."""

    def prof(d: int) -> dict:
        return {
            "prefill_wall_ms": 100.0 + 5.0 * d,
            "prefill_kernels_ms": 10.0 + 5.0 * d,
            "prefill_families_us": {"attention": 1000.0 * d, "other": 10_000.0 + 4000.0 * d},
        }

    line = ms.profile_line({8: prof(8), 32: prof(32)})
    assert line["depths"] == [8, 32]
    assert line["wall_ms"] == {"per_layer": 5.0, "at_0_layers": 100.0}
    assert line["kernels_ms"] == {"per_layer": 5.0, "at_0_layers": 10.0}
    assert line["families_us"]["attention"] == {"per_layer": 1000.0, "at_0_layers": 0.0}
    assert line["families_us"]["other"] == {"per_layer": 4000.0, "at_0_layers": 10000.0}


def test_merge_reports_of_separate_calls(ms, tmp_path: Path, capsys) -> None:
    """exllamav3 measured in one device call and vLLM in another (their carried files do not fit one call): one
    report, judged only when both ran on the same GPU."""
    spec, plan = ms.Spec(), ms.FULL

    def report(engine: str, device: str, per_layer: float) -> Path:
        other = "vllm" if engine == "exllamav3" else "exllamav3"
        runs = {
            engine: {d: _record(d, per_layer, 700.0, 150.0, 300.0) for d in (4, 8)},
            other: {d: {"engine": other, "skipped": "not in this call"} for d in (4, 8)},
        }
        p = tmp_path / f"{engine}-{device}.json"
        p.write_text(json.dumps(ms.assemble(spec, plan, runs, (None, "not measured"), {"device": device})))
        return p

    x, v = report("exllamav3", "H100", 80.0), report("vllm", "H100", 60.0)
    assert ms.main(["--merge", str(x), str(v), "--out", str(tmp_path / "m")]) == 0
    rep = json.loads((tmp_path / "m" / "model_speed.json").read_text())
    assert rep["verdict"]["comparable"] and rep["verdict"]["per_layer_b1"]["met"]
    assert rep["engines"]["exllamav3"]["summary"]["decode"]["1"]["per_layer_us"] == pytest.approx(80.0)
    other = report("vllm", "H200", 60.0)
    assert ms.main(["--merge", str(x), str(other), "--out", str(tmp_path / "n")]) == 0
    assert "not comparable" in (tmp_path / "n" / "model_speed.txt").read_text()
    assert ms.main(["--merge", str(v), str(other), "--out", str(tmp_path / "o")]) == 2  # vLLM measured twice
    assert ms.main(["--merge", str(tmp_path / "absent.json"), "--out", str(tmp_path / "p")]) == 2
    assert "Traceback" not in capsys.readouterr().out

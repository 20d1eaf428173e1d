"""The engine check: vLLM's CUDA build serving exllamav3-made EXL3 checkpoints through the exl3 plugin, exact against
exllamav3's own logits, eager and with vLLM's default torch.compile + CUDA graphs (issue 34).

Every fixture under ``tests/fixtures/exl3_real/`` whose architecture the installed vLLM has is served by
``vllm.LLM`` (fp16 activations where vLLM computes the architecture right in fp16, see ``gpu_dtype``; Triton
attention) in two modes, ``eager`` (``enforce_eager``) and ``graphs`` (vLLM's
default compilation config: torch.compile over our custom ops, piecewise + full CUDA graphs). Per job:

1. **Prompts against exllamav3.** The fixture's five saved prompts plus three prefixes of them (a prefix's reference
   logits are the first rows of its prompt's: the model is causal) = 8 different prompts, scored one at a time
   (batch 1: the GEMV groups, the fused MoE below 65 tokens) and all 8 in one step (batch 8: ~200 tokens, the
   reconstruction + cuBLAS path and the MoE prefill). Prompt log-probs against exllamav3's saved logits: top-1
   agreement >= 98 % and mean |delta log-prob| <= 0.05 (the bounds the CPU tests hold the plugin to).
2. **Decode against prefill.** 16 greedy tokens per prompt, one prompt at a time and all 8 at once (decode at 1
   and 8 rows: the GEMV kernel, the fused MoE decode, replayed CUDA graphs in ``graphs`` mode), then every
   continuation scored again as a prompt (the prefill paths, checked against exllamav3 in 1): each generated token
   is the argmax there or a near tie (within 0.02 nats), and mean |delta log-prob| of the generated tokens between
   decode and re-scoring <= 0.05.
3. **Which kernels ran.** ``sparkctl_exl3.paths`` counts, read in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``),
   so a silent fallback to the reference decoder or to the per-expert MoE loop shows. A job fails when an EXL3
   linear ran through the reference on CUDA, or when a MoE model never reached the MoE prefill or its decode path
   (the fused kernel for mul1 experts, the per-expert loop for others: ``moe_decode_path``).

Then ``vllm serve`` once (``python -m vllm.entrypoints.openai.api_server``, as ``sparkctl up`` starts it) on one
fixture: ``/health``, prompt log-probs over HTTP (``echo`` + ``logprobs``, token ids) against exllamav3, and a chat
completion. And MTP speculative decoding (k=2) on ``glm4moe-mtp-3.0-mul1``: drafts proposed and accepted (vLLM's
own counters) and greedy output equal to the same model without MTP (or a near tie).

Run from the repository root on the GPU machine after ``engine_unpack.sh`` (``kernels/README.md``, "Engine check"):

    python3 kernels/bench/engine_check.py --out DIR [--jobs 6] [--only NAME,...] [--modes eager,graphs]
                                         [--no-serve] [--no-mtp]

Writes ``DIR/engine_check.json`` (every job's record) and prints one line per job and a summary table last.
Exit 0: every check passed; 1: a check failed; 2: no CUDA device or no vLLM.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "exl3_real"
TOP1_MIN = 0.98
DLOGPROB_MAX = 0.05
TIE_NATS = 0.02
GEN_TOKENS = 16
MTP_FIXTURE = "glm4moe-mtp-3.0-mul1"
SERVE_FIXTURE = "qwen3moe-2.5-mul1"
MOE_ARCHS = ("Qwen3MoeForCausalLM", "Glm4MoeForCausalLM")
GLM4_MOE_ARCHS = ("Glm4MoeForCausalLM",)


# -- the reference -------------------------------------------------------------------------------------------------


def reference_prompts(name: str) -> list[tuple[list[int], list[list[float]]]]:
    """8 prompts: (token ids, exllamav3's log-probs [T][vocab]) -- the 5 saved prompts and 3 prefixes of them."""
    import torch
    from safetensors.torch import load_file

    ref = load_file(str(FIXTURES / name / "exl3_reference.safetensors"))
    saved = []
    i = 0
    while f"prompt.{i}.input_ids" in ref:
        ids = ref[f"prompt.{i}.input_ids"].reshape(-1).tolist()
        saved.append((ids, torch.log_softmax(ref[f"prompt.{i}.logits"].float().reshape(len(ids), -1), -1)))
        i += 1
    out = list(saved)
    for ids, lp in sorted(saved, key=lambda p: -len(p[0]))[:3]:  # prefixes of the three longest
        cut = max(4, (2 * len(ids)) // 3)
        out.append((ids[:cut], lp[:cut]))
    return out


def compare_prompt(ids: list[int], ref_lp, top1: list[int], logprob: list[float]) -> tuple[int, int, float]:
    """(positions agreeing on the argmax, positions, sum of |delta log-prob|) for one scored prompt.

    ``top1[t]`` is the engine's argmax after tokens <= t (t = 0..T-1), ``logprob[t]`` its log p(ids[t+1] | ids[:t+1])
    for t = 0..T-2; ``ref_lp[t]`` exllamav3's log-probs at position t."""
    agree = sum(int(int(ref_lp[t].argmax()) == top1[t]) for t in range(len(ids)))
    dsum = sum(abs(float(ref_lp[t][ids[t + 1]]) - logprob[t]) for t in range(len(ids) - 1))
    return agree, len(ids), dsum


# -- one job: one fixture in one mode (its own process) ------------------------------------------------------------


def _top1(step: dict) -> int:
    return next(int(tid) for tid, lp in step.items() if lp.rank == 1)


def _score(llm, prompts: list[list[int]], batch: bool) -> list[tuple[list[int], list[float]]]:
    """(argmax per position, log-prob of each next prompt token) through the engine's prefill."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(temperature=0.0, max_tokens=1, logprobs=1, prompt_logprobs=1)
    groups = [prompts] if batch else [[p] for p in prompts]
    rows = []
    for group in groups:
        outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in group], params, use_tqdm=False)
        for ids, o in zip(group, outs, strict=True):
            plp = o.prompt_logprobs
            top1 = [_top1(plp[t]) for t in range(1, len(ids))] + [_top1(o.outputs[0].logprobs[0])]
            rows.append((top1, [plp[t][ids[t]].logprob for t in range(1, len(ids))]))
    return rows


def _generate(
    llm, prompts: list[list[int]], batch: bool, n: int = GEN_TOKENS
) -> list[tuple[list[int], list[float]]]:
    """(greedy tokens, their log-probs as decode computed them) per prompt."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(temperature=0.0, max_tokens=n, logprobs=0, ignore_eos=True)
    groups = [prompts] if batch else [[p] for p in prompts]
    rows = []
    for group in groups:
        outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in group], params, use_tqdm=False)
        for o in outs:
            toks = list(o.outputs[0].token_ids)
            lps = [step[t].logprob for step, t in zip(o.outputs[0].logprobs, toks, strict=True)]
            rows.append((toks, lps))
    return rows


def decode_vs_prefill(llm, prompts, gens) -> dict:
    """Each continuation scored again as a prompt: argmax or near tie, and |delta log-prob| of the generated tokens."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(temperature=0.0, max_tokens=1, logprobs=1, prompt_logprobs=5)
    full = [p + g[0] for p, g in zip(prompts, gens, strict=True)]
    outs = llm.generate([TokensPrompt(prompt_token_ids=f) for f in full], params, use_tqdm=False)
    worst_tie, dsum, n, not_top = 0.0, 0.0, 0, 0
    for p, (toks, lps), o in zip(prompts, gens, outs, strict=True):
        plp = o.prompt_logprobs
        for j, tok in enumerate(toks):
            step = plp[len(p) + j]
            best = max(lp.logprob for lp in step.values())
            gap = best - step[tok].logprob
            if gap > 1e-6:
                not_top += 1
                worst_tie = max(worst_tie, gap)
            dsum += abs(step[tok].logprob - lps[j])
            n += 1
    return {
        "tokens": n,
        "not_argmax": not_top,
        "worst_gap_nats": worst_tie,
        "mean_dlogprob": dsum / max(n, 1),
    }


def fixture_config(name: str) -> dict:
    return json.loads((FIXTURES / name / "model" / "config.json").read_text())


def gpu_dtype(config: dict) -> tuple[str, str]:
    """The activation dtype a job runs at on the GPU, and why. fp16, exllamav3's own, wherever vLLM computes the
    architecture right in fp16. vLLM (0.26 to 0.34) runs GLM-4-MoE wrong in fp16: its MoE runner, to avoid fp16
    overflow, divides the shared experts' output by ``routed_scaling_factor`` instead of multiplying the routed
    output, and relies on the decoder layer to scale the residual to match, which DeepSeek-V2's does and GLM-4-MoE's
    does not (run 4: top-1 0.61 on both GLM fixtures, the Qwen3-MoE ones exact). bf16 (the checkpoint's dtype, what
    ``sparkctl up`` runs) is right but adds its own rounding (run 5: mean |dlp| 0.036-0.054, gaps to 0.125 nats),
    so those fixtures run at fp32 outside our ops, which still take fp16 activations as exllamav3's do."""
    scale = float(config.get("routed_scaling_factor") or 1.0)
    if config["architectures"][0] in GLM4_MOE_ARCHS and config.get("n_shared_experts") and scale != 1.0:
        return "float32", "vLLM's fp16 GLM-4-MoE shared-expert scaling; bf16 rounding"
    return "float16", "exllamav3's activation dtype"


def engine_kwargs(name: str, cpu: bool) -> dict:
    """``vllm.LLM`` arguments every job shares: Triton attention on the GPU (:func:`gpu_dtype`); ``--cpu`` (the
    script's own test on a CPU vLLM): fp32, vLLM's CPU backend."""
    # 0.04: many jobs share one GPU, and vLLM refuses to start when free memory is below its utilisation share (run 3)
    gpu = {
        "dtype": gpu_dtype(fixture_config(name))[0],
        "attention_backend": "TRITON_ATTN",
        "gpu_memory_utilization": 0.04,
    }
    return {
        "model": str(FIXTURES / name / "model"),
        **({"dtype": "float32"} if cpu else gpu),
        "max_model_len": 512,
        "max_num_seqs": 8,
        "kv_cache_memory_bytes": 256 * 2**20,
        "enable_prefix_caching": False,
        "seed": 0,
    }


def moe_decode_path(config: dict) -> str:
    """The decode path a MoE fixture's experts must take: the fused kernel takes mul1 experts only
    (``cuda.moe_supports``); other codebooks run every local expert through the linear op."""
    codebook = config.get("quantization_config", {}).get("codebook", "mul1")
    return "moe-fused" if codebook == "mul1" else "moe-per-expert"


def score_prompts(refs, rows) -> dict:
    """Top-1 agreement and mean |delta log-prob| of scored prompts (``rows``: (top1, logprob) per prompt) against
    exllamav3's (``refs``: (ids, log-probs) per prompt)."""
    agree = total = npos = 0
    dsum = 0.0
    for (ids, ref_lp), (top1, lp) in zip(refs, rows, strict=True):
        a, t, d = compare_prompt(ids, ref_lp, top1, lp)
        agree, total, dsum, npos = agree + a, total + t, dsum + d, npos + len(ids) - 1
    return {"top1": agree / total, "positions": total, "mean_dlogprob": dsum / npos}


def run_job(name: str, mode: str, cpu: bool = False) -> dict:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine in this process: its path counts are ours
    import torch
    from sparkctl_exl3 import paths
    from vllm import LLM

    rec: dict = {"fixture": name, "mode": mode}
    kwargs = engine_kwargs(name, cpu)
    rec["dtype"] = kwargs["dtype"] if cpu else "{} ({})".format(*gpu_dtype(fixture_config(name)))
    t0 = time.monotonic()
    llm = LLM(enforce_eager=mode == "eager", **kwargs)
    rec["startup_s"] = round(time.monotonic() - t0, 1)
    refs = reference_prompts(name)
    prompts = [ids for ids, _ in refs]
    for batch in (False, True):
        t1 = time.monotonic()
        rec[f"prompts_{'batch8' if batch else 'batch1'}"] = {
            **score_prompts(refs, _score(llm, prompts, batch)),
            "s": round(time.monotonic() - t1, 2),
        }
    gens = {}
    for batch in (False, True):
        t1 = time.monotonic()
        g = _generate(llm, prompts, batch)
        key = "batch8" if batch else "batch1"
        gens[key] = g
        rec[f"decode_{key}"] = decode_vs_prefill(llm, prompts, g)
        rec[f"decode_{key}"]["s"] = round(time.monotonic() - t1, 2)
    rec["continuations"] = [g[0] for g in gens["batch1"]]
    rec["batch1_eq_batch8"] = sum(
        int(a[0] == b[0]) for a, b in zip(gens["batch1"], gens["batch8"], strict=True)
    )
    rec["paths"] = paths.counts()
    rec["gpu"] = "cpu" if cpu else torch.cuda.get_device_name()
    del llm
    gc.collect()
    return rec


def verdict(rec: dict, cpu: bool = False) -> list[str]:
    """What failed in one job's record (empty: it passed). On the CPU only the numbers are judged, not the paths."""
    bad = []
    if "error" in rec:
        return [rec["error"]]
    for key in ("prompts_batch1", "prompts_batch8"):
        r = rec[key]
        if r["top1"] < TOP1_MIN or not r["mean_dlogprob"] <= DLOGPROB_MAX:
            bad.append(f"{key}: top1 {r['top1']:.3f} mean|dlp| {r['mean_dlogprob']:.4f}")
    for key in ("decode_batch1", "decode_batch8"):
        r = rec[key]
        if r["worst_gap_nats"] > TIE_NATS or not r["mean_dlogprob"] <= DLOGPROB_MAX:
            bad.append(f"{key}: worst gap {r['worst_gap_nats']:.4f} mean|dlp| {r['mean_dlogprob']:.4f}")
    p = rec.get("paths", {})
    if cpu:
        return bad
    if p.get("linear-reference"):
        bad.append(f"{p['linear-reference']} EXL3 linear call(s) ran the reference decoder on CUDA")
    if not p.get("gemv"):
        bad.append("the GEMV kernel never ran")
    want = rec.get("moe_decode")
    if rec.get("moe") and not (p.get(want) and p.get("moe-prefill")):
        reached = sorted(k for k in p if k.startswith("moe"))
        bad.append(f"MoE paths reached: {reached}, expected {want} and moe-prefill")
    return bad


# -- vllm serve over HTTP --------------------------------------------------------------------------------------------


def run_serve(name: str, log: Path) -> dict:
    import httpx

    port = 8431
    cmd = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(FIXTURES / name / "model"),
    ]
    cmd += [
        "--served-model-name",
        name,
        "--dtype",
        gpu_dtype(fixture_config(name))[0],
        "--attention-backend",
        "TRITON_ATTN",
    ]
    cmd += ["--max-model-len", "512", "--max-num-seqs", "8", "--kv-cache-memory-bytes", str(256 * 2**20)]
    cmd += [
        "--gpu-memory-utilization",
        "0.04",
        "--no-enable-prefix-caching",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    rec: dict = {"fixture": name, "mode": "serve"}
    t0 = time.monotonic()
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(timeout=60) as c:
            while time.monotonic() - t0 < 300:
                if proc.poll() is not None:
                    raise RuntimeError(f"vllm serve exited with {proc.returncode} (log: {log.name})")
                try:
                    if c.get(f"{base}/health").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(1)
            else:
                raise RuntimeError("vllm serve not healthy after 300 s")
            rec["startup_s"] = round(time.monotonic() - t0, 1)
            refs = reference_prompts(name)
            rows = []
            for ids, _ in refs:
                body = {
                    "model": name,
                    "prompt": ids,
                    "max_tokens": 1,
                    "echo": True,
                    "logprobs": 1,
                    "temperature": 0.0,
                    "return_tokens_as_token_ids": True,
                }
                r = c.post(f"{base}/v1/completions", json=body)
                r.raise_for_status()
                lp = r.json()["choices"][0]["logprobs"]
                tops = [max(d.items(), key=lambda kv: kv[1])[0] for d in lp["top_logprobs"][1:]]
                rows.append(([int(t.split(":")[1]) for t in tops], lp["token_logprobs"][1 : len(ids)]))
            rec["prompts_http"] = score_prompts(refs, rows)
            r = c.post(
                f"{base}/v1/chat/completions",
                json={"model": name, "max_tokens": 8, "messages": [{"role": "user", "content": "hello"}]},
            )
            rec["chat_status"] = r.status_code
            rec["chat_tokens"] = (
                r.json().get("usage", {}).get("completion_tokens") if r.status_code == 200 else None
            )
    except Exception as exc:
        rec["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
    return rec


# -- MTP ---------------------------------------------------------------------------------------------------------


def run_mtp(name: str, cpu: bool = False) -> dict:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM

    rec: dict = {"fixture": name, "mode": "mtp-k2"}
    prompts = [ids for ids, _ in reference_prompts(name)]
    t0 = time.monotonic()
    llm = LLM(
        enforce_eager=cpu,
        # vLLM picks the drafter's attention backend on its own (0.26: FlashAttention, not carried): the target's
        speculative_config={"method": "mtp", "num_speculative_tokens": 2}
        | ({} if cpu else {"attention_backend": "TRITON_ATTN"}),
        disable_log_stats=False,
        **engine_kwargs(name, cpu),
    )
    rec["startup_s"] = round(time.monotonic() - t0, 1)
    gens = _generate(llm, prompts, True, n=32)
    counters = {}
    for m in llm.get_metrics():
        if m.name.startswith("vllm:spec_decode"):
            counters[m.name] = getattr(m, "value", None)
    rec["counters"] = counters
    # greedy speculative decoding is lossless: the target's own prefill must agree with every drafted-and-kept token
    rec["lossless"] = decode_vs_prefill(llm, prompts, gens)
    return rec


def mtp_verdict(rec: dict) -> list[str]:
    if "error" in rec:
        return [rec["error"]]
    bad = []
    c = rec.get("counters", {})
    drafts = c.get("vllm:spec_decode_num_draft_tokens") or 0
    accepted = c.get("vllm:spec_decode_num_accepted_tokens") or 0
    if not drafts:
        bad.append("no draft tokens proposed")
    if not accepted:
        bad.append("no draft token accepted")
    if rec["lossless"]["worst_gap_nats"] > TIE_NATS:
        bad.append(
            f"MTP output is not the target's greedy output (gap {rec['lossless']['worst_gap_nats']:.4f})"
        )
    return bad


# -- the driver ----------------------------------------------------------------------------------------------------


def fixtures(only: set[str] | None) -> list[tuple[str, str]]:
    out = []
    for d in sorted(FIXTURES.iterdir()):
        complete = (d / "exl3_reference.safetensors").exists() and (d / "model" / "config.json").exists()
        if complete and (only is None or d.name in only):
            out.append((d.name, json.loads((d / "model" / "config.json").read_text())["architectures"][0]))
    return out


def child(args: argparse.Namespace) -> int:
    job = json.loads(args.job)
    try:
        if job["mode"] == "mtp-k2":
            rec = run_mtp(job["fixture"], job["cpu"])
        else:
            rec = run_job(job["fixture"], job["mode"], job["cpu"])
            rec["moe"] = job["moe"]
            if job["moe"]:
                rec["moe_decode"] = moe_decode_path(fixture_config(job["fixture"]))
    except Exception as exc:
        import traceback

        traceback.print_exc()
        rec = {
            "fixture": job["fixture"],
            "mode": job["mode"],
            "error": f"{type(exc).__name__}: {str(exc)[:500]}",
        }
    Path(job["result"]).write_text(json.dumps(rec))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--jobs", type=int, default=6)
    ap.add_argument("--only", default="")
    ap.add_argument("--modes", default="eager,graphs")
    ap.add_argument("--no-serve", action="store_true")
    ap.add_argument("--no-mtp", action="store_true")
    ap.add_argument(
        "--cpu", action="store_true", help="on vLLM's CPU build (tests this script; no kernel paths)"
    )
    ap.add_argument("--job", help=argparse.SUPPRESS)
    ap.add_argument("--timeout", type=float, default=420.0, help="per job, seconds")
    args = ap.parse_args(argv)
    if args.job:
        return child(args)
    import torch

    if not args.cpu and not torch.cuda.is_available():
        print("engine check: no CUDA device (--cpu runs it on vLLM's CPU build)")
        return 2
    try:
        import vllm
        from vllm import ModelRegistry
    except ImportError as exc:
        print(f"engine check: vLLM does not import: {exc}")
        return 2
    supported = set(ModelRegistry.get_supported_archs())  # before our plugin registers anything
    out = args.out
    (out / "jobs").mkdir(parents=True, exist_ok=True)
    only = set(args.only.split(",")) if args.only else None
    records: list[dict] = []
    queue = []
    for name, arch in fixtures(only):
        if arch not in supported:
            records.append(
                {"fixture": name, "mode": "-", "skipped": f"vLLM {vllm.__version__} has no {arch}"}
            )
            continue
        for mode in args.modes.split(","):
            queue.append({"fixture": name, "mode": mode, "moe": arch in MOE_ARCHS, "cpu": args.cpu})
    if not args.no_mtp and (only is None or MTP_FIXTURE in only) and (FIXTURES / MTP_FIXTURE).exists():
        queue.insert(0, {"fixture": MTP_FIXTURE, "mode": "mtp-k2", "moe": True, "cpu": args.cpu})
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "kernels"), os.environ.get("PYTHONPATH", "")])
    )
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    # FlashInfer is not carried (engine_pack.py): vLLM's own top-k/top-p sampler instead of importing it
    env["VLLM_USE_FLASHINFER_SAMPLER"] = "0"
    os.environ["VLLM_USE_FLASHINFER_SAMPLER"] = "0"  # the vllm serve child inherits it
    running: list[tuple[dict, subprocess.Popen, float]] = []
    t0 = time.monotonic()
    serve_rec = None
    serve_thread = None
    if not args.no_serve and (only is None or SERVE_FIXTURE in only):
        import threading

        box: dict = {}
        serve_thread = threading.Thread(
            target=lambda: box.update(r=run_serve(SERVE_FIXTURE, out / "serve.log"))
        )
        serve_thread.start()
    while queue or running:
        while queue and len(running) < args.jobs:
            job = queue.pop(0)
            tag = f"{job['fixture']}.{job['mode']}"
            job.update(out=str(out), result=str(out / "jobs" / f"{tag}.json"))
            fh = open(out / "jobs" / f"{tag}.log", "w")  # noqa: SIM115 (closed with the process)
            p = subprocess.Popen(
                [sys.executable, __file__, "--out", str(out), "--job", json.dumps(job)],
                stdout=fh,
                stderr=subprocess.STDOUT,
                env=env,
            )
            running.append((job, p, time.monotonic()))
        time.sleep(0.5)
        for item in list(running):
            job, p, started = item
            if p.poll() is None and time.monotonic() - started < args.timeout:
                continue
            if p.poll() is None:
                p.kill()
                p.wait()
            running.remove(item)
            res = Path(job["result"])
            if res.exists():
                rec = json.loads(res.read_text())
            else:
                log = Path(job["result"]).with_suffix(".log").read_text(errors="replace").strip().splitlines()
                rec = {
                    "fixture": job["fixture"],
                    "mode": job["mode"],
                    "error": f"exit {p.returncode} after {time.monotonic() - started:.0f} s: {log[-1] if log else ''}",
                }
            rec["wall_s"] = round(time.monotonic() - started, 1)
            rec["failures"] = mtp_verdict(rec) if job["mode"] == "mtp-k2" else verdict(rec, args.cpu)
            records.append(rec)
            print(
                f"[{time.monotonic() - t0:5.0f}s] {rec['fixture']:22s} {rec['mode']:7s} "
                f"{'PASS' if not rec['failures'] else 'FAIL: ' + '; '.join(rec['failures'])[:300]}",
                flush=True,
            )
    if serve_thread is not None:
        serve_thread.join()
        serve_rec = box.get("r", {"fixture": SERVE_FIXTURE, "mode": "serve", "error": "no result"})
        r = serve_rec.get("prompts_http")
        fails = [serve_rec["error"]] if "error" in serve_rec else []
        if r and (r["top1"] < TOP1_MIN or not r["mean_dlogprob"] <= DLOGPROB_MAX):
            fails.append(f"HTTP prompts: top1 {r['top1']:.3f} mean|dlp| {r['mean_dlogprob']:.4f}")
        if serve_rec.get("chat_status") not in (200, None) or (
            not fails and not serve_rec.get("chat_tokens")
        ):
            fails.append(f"chat completion: status {serve_rec.get('chat_status')}")
        serve_rec["failures"] = fails
        records.append(serve_rec)
    summary = {
        "vllm": vllm.__version__,
        "torch": torch.__version__,
        "gpu": "cpu" if args.cpu else torch.cuda.get_device_name(),
        "bounds": {"top1_min": TOP1_MIN, "mean_dlogprob_max": DLOGPROB_MAX, "tie_nats": TIE_NATS},
        "wall_s": round(time.monotonic() - t0, 1),
        "records": records,
    }
    tmp = out / "engine_check.json.tmp"
    tmp.write_text(json.dumps(summary, indent=1) + "\n")
    tmp.replace(out / "engine_check.json")
    print(
        f"\nvLLM {vllm.__version__}, torch {torch.__version__}, {summary['gpu']}, {summary['wall_s']:.0f} s"
    )
    print(
        f"{'fixture':22s} {'mode':7s} {'start':>6s} {'b1 top1':>8s} {'b1 |dlp|':>9s} {'b8 top1':>8s} {'b8 |dlp|':>9s} "
        f"{'dec gap':>8s} verdict  paths"
    )
    failed = 0
    for r in records:
        if "skipped" in r:
            print(f"{r['fixture']:22s} {'-':7s} skipped: {r['skipped']}")
            continue
        b1, b8 = r.get("prompts_batch1") or r.get("prompts_http") or {}, r.get("prompts_batch8", {})
        gap = max(
            (r.get(k, {}).get("worst_gap_nats", 0.0) for k in ("decode_batch1", "decode_batch8", "lossless")),
            default=0.0,
        )
        ok = not r.get("failures")
        failed += not ok
        p = ",".join(f"{k}={v}" for k, v in sorted(r.get("paths", {}).items()))
        extra = r.get("counters", "") if r["mode"] == "mtp-k2" else p
        print(
            f"{r['fixture']:22s} {r['mode']:7s} {r.get('startup_s', math.nan):6.1f} {b1.get('top1', math.nan):8.3f} "
            f"{b1.get('mean_dlogprob', math.nan):9.4f} {b8.get('top1', math.nan):8.3f} "
            f"{b8.get('mean_dlogprob', math.nan):9.4f} {gap:8.4f} {'PASS' if ok else 'FAIL'}     {extra}"
        )
    print(f"engine check: {'PASS' if not failed else f'FAIL ({failed} job(s))'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

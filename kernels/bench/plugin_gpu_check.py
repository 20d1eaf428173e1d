"""GPU check of the vLLM exl3 plugin: its layer forward on CUDA against its CPU path, and whole real models on
CUDA against exllamav3's own logits.

vLLM itself is not installed on the device machine, so this drives the functions the plugin's ``apply``
methods run (``sparkctl_exl3.vllm_plugin.forward``: the per-shard EXL3 linear and ``exl3_moe_forward``),
which need only torch and our ops. Checks 1-3 run on every EXL3 layer of the tiny dense and MoE checkpoints
written by ``sparkctl_exl3.checkpoint`` (the same tensors ``sparkctl up tiny-exl3`` serves on the CPU):

1. every linear (mixed K 2..6 and 2.5, all three codebooks, the lm_head) at 1, 4, 8 rows (the GEMV kernel's
   range), 33 and 300 rows (the prefill path: reconstruct + cuBLAS), CUDA vs CPU;
2. every MoE layer's ``exl3_moe_forward`` with random top-2 routing, CUDA vs CPU (300 tokens: the MoE prefill);
3. decode under CUDA graphs: one linear and one MoE layer captured at 1 row, replayed with new inputs and new
   routing, equal to the eager CUDA result. Capture fails on any host synchronisation, so this also proves
   the decode path has none.

The CPU path is what the plugin runs on a CPU (fp32 activations through the reference decoder); the CUDA path
is what it runs on a GPU (``VLLM_EXL3_OP_DTYPE=auto``: fp16 activations into the compiled kernel when it takes
the shape, else the reference on the GPU). The two differ by fp16 rounding of activations and outputs, so the
check is a relative L2 error: below 5e-3 per linear and 1e-2 per MoE layer (three chained linears), against
about 5e-4 for one fp16 rounding. A wrong shard, K, codebook, permutation or scale gives errors of order 1.

4. every real exllamav3 checkpoint under ``tests/fixtures/exl3_real/`` (Llama, Qwen3-MoE, GLM-4-MoE; others are
   skipped by name): the whole model over the saved prompts, every EXL3 linear and MoE layer through the
   plugin's forward functions and the rest in plain torch (``fixture_forward.py`` says exactly which is which),
   fed three ways (each prompt alone, all packed in one batch, all decoded a token a step with a KV cache: the
   plugin's kernel paths differ by batch shape), against exllamav3's saved logits: top-1 agreement >= 98% and
   mean |delta log-prob| of the prompt tokens <= 0.05 per fixture and way, the bar vLLM with the plugin meets
   on the CPU. One line per fixture and way: name, device, top-1, mean |dlogprob|, PASS/FAIL.

Run from the repository root (on the device: build the extension first, ``python3 -m sparkctl_exl3.cuda build``):

    python kernels/bench/plugin_gpu_check.py [--out plugin_gpu_check.json] [--fixtures-only | --no-fixtures]
    python kernels/bench/plugin_gpu_check.py --device cpu   # check 4 on the CPU path (no GPU needed)

Exit status: 0 all checks pass, 1 a check failed (or no fixture ran), 2 no CUDA device (without --device cpu).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # kernels/ on the path without installing
sys.path.insert(0, str(Path(__file__).resolve().parent))  # fixture_forward beside this file

import fixture_forward  # noqa: E402
from sparkctl_exl3 import checkpoint, ops  # noqa: E402
from sparkctl_exl3.vllm_plugin.forward import (  # noqa: E402
    ExpertWeights,
    ShardWeights,
    exl3_linear,
    exl3_moe_forward,
    finish_shard,
    fused_tables,
)

LINEAR_TOL = 5e-3
MOE_TOL = 1e-2
ROWS = (1, 4, 8, 33, 300)
VOCAB = 640  # the tiny tokenizer's vocabulary (sparkctl.models.tiny.VOCAB_SIZE)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().cpu(), b.double().cpu()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def groups_of(tensors: dict[str, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
    out: dict[str, dict[str, torch.Tensor]] = {}
    for name, t in tensors.items():
        prefix, _, leaf = name.rpartition(".")
        if leaf in ("trellis", "suh", "svh", "mcg", "mul1"):
            out.setdefault(prefix, {})[leaf] = t
    return out


def to_cuda(w: ShardWeights) -> ShardWeights:
    return ShardWeights(w.trellis.cuda(), w.suh.cuda(), w.svh.cuda(), w.codebook, w.bits)


def check_linears(name: str, groups: dict[str, dict[str, torch.Tensor]], gen: torch.Generator) -> list[dict]:
    results = []
    for prefix, group in sorted(groups.items()):
        cpu = finish_shard(prefix, group)
        gpu = to_cuda(cpu)
        in_f, out_f = cpu.suh.shape[0], cpu.svh.shape[0]
        for rows in ROWS:
            x = torch.randn(rows, in_f, generator=gen)
            y_cpu = exl3_linear(x, cpu, out_f, torch.float32)
            y_gpu = exl3_linear(x.cuda(), gpu, out_f, torch.float16)
            torch.cuda.synchronize()
            kernel = ops.cuda_kernel()
            backend = (
                "kernel"
                if kernel is not None
                and ops._kernel_takes(
                    kernel, x.cuda().half(), gpu.trellis, gpu.suh, gpu.svh, ops.CODEBOOKS[cpu.codebook]
                )
                else "reference-on-cuda"
            )
            err = rel_err(y_gpu, y_cpu)
            results.append(
                {
                    "model": name,
                    "layer": prefix,
                    "K": cpu.bits,
                    "codebook": cpu.codebook,
                    "rows": rows,
                    "backend": backend,
                    "rel_err": err,
                    "ok": bool(err < LINEAR_TOL and torch.isfinite(y_gpu).all()),
                }
            )
    return results


def moe_layers(groups: dict[str, dict[str, torch.Tensor]]) -> dict[str, list[ExpertWeights]]:
    layers: dict[str, dict[int, dict[str, ShardWeights]]] = {}
    for prefix, group in groups.items():
        if ".experts." not in prefix:
            continue
        head, _, rest = prefix.partition(".experts.")
        expert, _, proj = rest.partition(".")
        layers.setdefault(head, {}).setdefault(int(expert), {})[proj] = finish_shard(prefix, group)
    return {
        head: [ExpertWeights(e["w1"], e["w3"], e["w2"]) for _, e in sorted(experts.items())]
        for head, experts in layers.items()
    }


def routing(tokens: int, experts: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    logits = torch.randn(tokens, experts, generator=gen)
    weights, ids = torch.softmax(logits, -1).topk(2, dim=-1)
    return weights / weights.sum(-1, keepdim=True), ids.to(torch.int32)


def check_moe(layers: dict[str, list[ExpertWeights]], gen: torch.Generator) -> list[dict]:
    results = []
    for head, experts in sorted(layers.items()):
        gpu_experts = [
            ExpertWeights(to_cuda(e.gate), to_cuda(e.up) if e.up else None, to_cuda(e.down)) for e in experts
        ]
        hidden, inter = experts[0].gate.suh.shape[0], experts[0].gate.svh.shape[0]
        ids = list(range(len(experts)))
        fused = fused_tables(gpu_experts, ids, hidden=hidden, intermediate=inter)  # None unless mul1 experts
        for tokens in ROWS:
            x = torch.randn(tokens, hidden, generator=gen)
            w, i = routing(tokens, len(experts), gen)
            kw = {"hidden": hidden, "intermediate": inter, "activation": "silu"}
            y_cpu = exl3_moe_forward(x, w, i, experts, ids, **kw)
            for path, tables in (("per-expert", None), ("fused", fused)):
                if path == "fused" and tables is None:
                    continue
                y_gpu = exl3_moe_forward(x.cuda(), w.cuda(), i.cuda(), gpu_experts, ids, fused=tables, **kw)
                err = rel_err(y_gpu, y_cpu)
                results.append(
                    {
                        "layer": head,
                        "path": path,
                        "tokens": tokens,
                        "rel_err": err,
                        "ok": bool(err < MOE_TOL and torch.isfinite(y_gpu).all()),
                    }
                )
    return results


def check_cuda_graphs(linear: ShardWeights, experts: list[ExpertWeights], gen: torch.Generator) -> list[dict]:
    """Capture a 1-row linear and a 1-token MoE step; replays with fresh inputs must equal eager CUDA runs."""
    results = []
    lin = to_cuda(linear)
    in_f, out_f = lin.suh.shape[0], lin.svh.shape[0]
    gpu_experts = [
        ExpertWeights(to_cuda(e.gate), to_cuda(e.up) if e.up else None, to_cuda(e.down)) for e in experts
    ]
    hidden, inter = experts[0].gate.suh.shape[0], experts[0].gate.svh.shape[0]
    ids = list(range(len(experts)))
    kw = {
        "hidden": hidden,
        "intermediate": inter,
        "activation": "silu",
        "fused": fused_tables(gpu_experts, ids, hidden=hidden, intermediate=inter),
    }

    x_lin = torch.zeros(1, in_f, device="cuda")
    x_moe = torch.zeros(1, hidden, device="cuda")
    w_moe = torch.zeros(1, 2, device="cuda")
    i_moe = torch.zeros(1, 2, dtype=torch.int32, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up outside capture, as vLLM does before capturing
        for _ in range(2):
            exl3_linear(x_lin, lin, out_f, torch.float16)
            exl3_moe_forward(x_moe, w_moe, i_moe, gpu_experts, ids, **kw)
    torch.cuda.current_stream().wait_stream(stream)
    g_lin, g_moe = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(g_lin):
            y_lin = exl3_linear(x_lin, lin, out_f, torch.float16)
        with torch.cuda.graph(g_moe):
            y_moe = exl3_moe_forward(x_moe, w_moe, i_moe, gpu_experts, ids, **kw)
    except Exception as exc:  # a host sync or an allocation outside the caching allocator fails capture
        return [{"check": "cuda-graph capture", "ok": False, "error": f"{type(exc).__name__}: {exc}"}]
    for step in range(3):
        x_lin.copy_(torch.randn(1, in_f, generator=gen))
        x_moe.copy_(torch.randn(1, hidden, generator=gen))
        w, i = routing(1, len(experts), gen)
        w_moe.copy_(w)
        i_moe.copy_(i)
        g_lin.replay()
        g_moe.replay()
        eager_lin = exl3_linear(x_lin.clone(), lin, out_f, torch.float16)
        eager_moe = exl3_moe_forward(x_moe.clone(), w_moe.clone(), i_moe.clone(), gpu_experts, ids, **kw)
        torch.cuda.synchronize()
        for what, graph_y, eager_y in (("linear", y_lin, eager_lin), ("moe", y_moe, eager_moe)):
            err = rel_err(graph_y, eager_y)
            results.append(
                {"check": f"cuda-graph replay {what}", "step": step, "rel_err": err, "ok": err < 1e-3}
            )
    return results


def check_layers(gen: torch.Generator) -> tuple[dict[str, list[dict]], list[str]]:
    """Checks 1-3 of the module docstring on the tiny checkpoints: (results by kind, summary lines)."""
    linear_results: list[dict] = []
    moe_results: list[dict] = []
    graph_results: list[dict] = []
    for spec in (checkpoint.DENSE, checkpoint.MOE):
        tensors, _ = checkpoint.build_checkpoint(spec, VOCAB)
        groups = groups_of(tensors)
        dense = {p: g for p, g in groups.items() if ".experts." not in p}
        linear_results += check_linears(spec.name, dense, gen)
        layers = moe_layers(groups)
        moe_results += check_moe(layers, gen)
        if layers:
            first_linear = finish_shard("lm_head", groups["lm_head"])
            # the graph check on a layer the fused MoE takes (mul1 experts), if the checkpoint has one
            mul1 = [
                h
                for h, ex in sorted(layers.items())
                if all(s.codebook == "mul1" for e in ex for s in (e.gate, e.down))
            ]
            graph_results += check_cuda_graphs(first_linear, layers[(mul1 or sorted(layers))[0]], gen)
    worst_lin = max(r["rel_err"] for r in linear_results)
    worst_moe = max(r["rel_err"] for r in moe_results)
    backends = sorted({r["backend"] for r in linear_results})
    fused_n = sum(r.get("path") == "fused" for r in moe_results)
    lines = [
        f"linears: {len(linear_results)} checks, worst rel err {worst_lin:.2e} (tol {LINEAR_TOL}), backends {backends}",
        f"moe:     {len(moe_results)} checks ({fused_n} through the fused kernel), worst rel err {worst_moe:.2e} "
        f"(tol {MOE_TOL})",
        f"graphs:  {len(graph_results)} checks, {sum(r['ok'] for r in graph_results)} ok",
    ]
    return {"linears": linear_results, "moe": moe_results, "cuda_graphs": graph_results}, lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="write the full results as JSON here")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default="cuda",
        help="cpu: only the fixture check (4), on the CPU path (the layer checks compare CUDA with the CPU)",
    )
    parser.add_argument(
        "--fixtures", type=Path, default=fixture_forward.FIXTURES, help="the real fixtures' folder"
    )
    parser.add_argument("--fixture", action="append", help="only this fixture (repeatable); default: all")
    parser.add_argument(
        "--modes",
        default=",".join(fixture_forward.MODES),
        help=f"comma-separated ways through the prompts (default: {','.join(fixture_forward.MODES)})",
    )
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--no-fixtures", action="store_true", help="skip the fixture check (4)")
    which.add_argument("--fixtures-only", action="store_true", help="only the fixture check (4)")
    args = parser.parse_args()
    modes = tuple(m for m in args.modes.split(",") if m)
    if bad := [m for m in modes if m not in fixture_forward.MODES]:
        parser.error(f"--modes: unknown {', '.join(bad)} (choose from {', '.join(fixture_forward.MODES)})")
    if args.fixture and (unknown := [n for n in args.fixture if not (args.fixtures / n).is_dir()]):
        parser.error(f"--fixture: no {', '.join(unknown)} under {args.fixtures}")
    if args.device == "cpu" and args.no_fixtures:
        parser.error("--device cpu runs only the fixture check; --no-fixtures leaves nothing to run")
    if args.device == "cuda" and not torch.cuda.is_available():
        print(
            "no CUDA device: this check compares the plugin's CUDA path with its CPU path and exllamav3's logits "
            "(--device cpu runs the fixture check on the CPU path)",
            file=sys.stderr,
        )
        return 2
    t0 = time.monotonic()
    report: dict[str, object] = {"device": "cpu", "torch": torch.__version__}
    failures: list[dict] = []
    if args.device == "cuda":
        from sparkctl_exl3 import cuda

        kernel_state = "available" if cuda.available() else f"unavailable ({cuda.unavailable_reason()})"
        print(
            f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}  EXL3 kernels: {kernel_state}"
        )
        report.update(device=torch.cuda.get_device_name(), kernels=kernel_state)
    else:
        print(f"device: cpu  torch {torch.__version__}  (fixture check only)")
    if args.device == "cuda" and not args.fixtures_only:
        layer_results, lines = check_layers(torch.Generator().manual_seed(args.seed))
        report.update(layer_results)
        for line in lines:
            print(line)
        failures += [r for rs in layer_results.values() for r in rs if not r["ok"]]
    if not args.no_fixtures:
        results, skipped = fixture_forward.check_fixtures(
            args.fixtures, torch.device(args.device), modes, names=args.fixture
        )
        report.update(fixtures=results, fixtures_skipped=skipped)
        for r in results:
            print(fixture_forward.result_line(r))
        for s in skipped:
            print(f"fixture {s['fixture']:<18} SKIPPED: {s['reason']}")
        failures += [r for r in results if not r["ok"]]
        if not results:
            failures.append(
                {"check": "fixtures", "ok": False, "error": f"no fixture ran under {args.fixtures}"}
            )
    report["seconds"] = time.monotonic() - t0
    for r in [r for r in failures if "fixture" not in r][:20]:  # the fixtures' lines already say FAIL
        print(f"FAIL {r}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    print("PASS" if not failures else f"FAIL: {len(failures)} check(s)")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())

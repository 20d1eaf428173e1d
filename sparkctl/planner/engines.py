"""Engine command lines: vLLM 0.33, llama-server (llama.cpp) and FreeToken flags from a recipe's serve block.

Only flags the engine accepts are produced; flags that were removed upstream are refused here with the
reason, because vLLM would otherwise exit with `unrecognized arguments` after the image is pulled.
"""

from __future__ import annotations

import json
from typing import Any

from sparkctl.errors import UserError

# flag -> why it cannot be used with vLLM 0.33
REMOVED_VLLM_FLAGS = {
    "--max-num-partial-prefills": "removed in vLLM 0.33 (vllm#49244); use long_prefill_token_threshold",
    "--max-long-partial-prefills": "removed in vLLM 0.33 (vllm#49244); use long_prefill_token_threshold",
}


# KV cache dtypes each engine accepts (vLLM 0.33 `--kv-cache-dtype`; llama-server `--cache-type-k/v`).
# vLLM also accepts platform-registered dtypes, so an unknown name there is a warning, not an error.
VLLM_KV_DTYPES = (
    "auto",
    "float16",
    "bfloat16",
    "fp8",
    "fp8_e4m3",
    "fp8_e5m2",
    "fp8_inc",
    "fp8_ds_mla",
    "nvfp4_ds_mla",
    "nvfp4",
    "nvfp4_4over6",
    "int4_per_token_head",
    "int8_per_token_head",
    "fp8_per_token_head",
)
VLLM_KV_DTYPE_PREFIXES = ("turboquant_", "octave_", "ultraquant_")
LLAMACPP_KV_DTYPES = ("auto", "f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")


def check_kv_dtype(recipe: Any) -> list[str]:
    """Unknown KV dtypes: an error for llama-server (it exits on them), a warning for vLLM."""
    import difflib

    dtype = recipe.serve.kv_cache_dtype
    if recipe.engine.name == "freetoken":
        if dtype != "auto":
            raise UserError(
                f"serve.kv_cache_dtype {dtype!r}: FreeToken picks its KV dtype itself", hint="remove it"
            )
        return []
    if recipe.engine.name == "llama.cpp":
        if dtype not in LLAMACPP_KV_DTYPES:
            close = difflib.get_close_matches(dtype, LLAMACPP_KV_DTYPES, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise UserError(
                f"serve.kv_cache_dtype {dtype!r} is not a llama-server cache type; {hint}"
                f"valid: {', '.join(LLAMACPP_KV_DTYPES)}"
            )
        return []
    if dtype in VLLM_KV_DTYPES or dtype.startswith(VLLM_KV_DTYPE_PREFIXES):
        return []
    close = difflib.get_close_matches(dtype, VLLM_KV_DTYPES, n=1)
    suggestion = f" (did you mean {close[0]!r}?)" if close else ""
    return [f"serve.kv_cache_dtype {dtype!r} is not a vLLM 0.33 built-in KV dtype{suggestion}"]


def _flag_name(arg: str) -> str:
    return arg.split("=", 1)[0]


def check_extra_args(recipe: Any) -> list[str]:
    """Refuse removed flags; return warnings for flags known to misbehave."""
    warnings = []
    args = recipe.serve.extra_args
    for i, arg in enumerate(args):
        name = _flag_name(arg)
        if name == "--api-key":
            raise UserError(
                "serve.extra_args: --api-key here would be written into the log and every rendered command",
                hint="pass it with `sparkctl up --api-key KEY` or serve.api_key_file (the engine gets it "
                "through its environment)",
            )
        if recipe.engine.name == "vllm" and name in REMOVED_VLLM_FLAGS:
            raise UserError(f"serve.extra_args: {name} is {REMOVED_VLLM_FLAGS[name]}")
        nxt = args[i + 1] if i + 1 < len(args) else ""
        value = arg.split("=", 1)[1] if "=" in arg else nxt
        if name == "--moe-backend" and value == "marlin" and recipe.model.format == "exl3":
            warnings.append("serve.extra_args: --moe-backend marlin is wrong for EXL3 packs (GK2)")
    return warnings


def capture_sizes(recipe: Any) -> list[int] | None:
    """CUDA-graph batch sizes: explicit, or derived so every speculative verify batch has a graph.

    A verify step with draft depth k scores k+1 tokens per sequence, so batches of (k+1)*s tokens for
    s = 1..max_num_seqs occur on every decode step; without a captured graph for them decode runs
    eager. Powers of two up to the largest such batch cover prefill tails and partial batches.
    """
    serve = recipe.serve
    spec = serve.speculative
    if serve.cudagraph_capture_sizes is not None:
        sizes = sorted(set(serve.cudagraph_capture_sizes))
        if spec is not None and (spec.num_speculative_tokens + 1) not in sizes and not serve.enforce_eager:
            k = spec.num_speculative_tokens
            raise UserError(
                f"serve.cudagraph_capture_sizes {sizes} must include k+1 = {k + 1} when speculating with "
                f"num_speculative_tokens {k}",
                hint=f"add {k + 1}, or remove the list to have it derived",
            )
        return sizes
    if spec is None or serve.enforce_eager:
        return None
    step = spec.num_speculative_tokens + 1
    seqs = serve.max_num_seqs or 1
    largest = step * seqs
    sizes = {step * s for s in range(1, seqs + 1)}
    p = 1
    while p <= largest:
        sizes.add(p)
        p *= 2
    if serve.max_num_batched_tokens:
        sizes = {s for s in sizes if s <= serve.max_num_batched_tokens}
    return sorted(sizes)


def speculative_json(recipe: Any) -> str:
    spec = recipe.serve.speculative
    config: dict[str, Any] = {"method": spec.method, "num_speculative_tokens": spec.num_speculative_tokens}
    if spec.model:
        config["model"] = spec.model
    config.update(spec.extra)
    return json.dumps(config, separators=(",", ":"))


def vllm_argv(recipe: Any, entrypoint: list[str], model_arg: str, revision: str | None) -> list[str]:
    serve = recipe.serve
    cluster = recipe.cluster
    argv = list(entrypoint)
    # `vllm serve` takes the model positionally; the api_server module wants --model
    if entrypoint and entrypoint[-1] == "serve":
        argv.append(model_arg)
    else:
        argv += ["--model", model_arg]
    if revision:
        argv += ["--revision", revision]
    argv += ["--served-model-name", serve.served_model_name or recipe.name]
    argv += ["--host", serve.host, "--port", str(serve.port)]
    if cluster.tensor_parallel > 1:
        argv += ["--tensor-parallel-size", str(cluster.tensor_parallel)]
    if cluster.pipeline_parallel > 1:
        argv += ["--pipeline-parallel-size", str(cluster.pipeline_parallel)]
    if cluster.executor:
        argv += ["--distributed-executor-backend", cluster.executor]
    quant = serve.quantization or ("exl3" if recipe.model.format == "exl3" else None)
    if quant:
        argv += ["--quantization", quant]
    if serve.dtype:
        argv += ["--dtype", serve.dtype]
    if serve.load_format:
        argv += ["--load-format", serve.load_format]
    if serve.trust_remote_code:
        argv.append("--trust-remote-code")
    argv += ["--max-model-len", str(serve.max_model_len)]
    if serve.kv_cache_memory_bytes is not None:
        argv += ["--kv-cache-memory-bytes", str(serve.kv_cache_memory_bytes)]
    elif serve.gpu_memory_utilization is not None:
        argv += ["--gpu-memory-utilization", f"{serve.gpu_memory_utilization:g}"]
    if serve.max_num_seqs is not None:
        argv += ["--max-num-seqs", str(serve.max_num_seqs)]
    if serve.max_num_batched_tokens is not None:
        argv += ["--max-num-batched-tokens", str(serve.max_num_batched_tokens)]
    if serve.long_prefill_token_threshold is not None:
        argv += ["--long-prefill-token-threshold", str(serve.long_prefill_token_threshold)]
    if serve.enable_prefix_caching is True:
        argv.append("--enable-prefix-caching")
    elif serve.enable_prefix_caching is False:
        argv.append("--no-enable-prefix-caching")
    if serve.kv_cache_dtype != "auto":
        argv += ["--kv-cache-dtype", serve.kv_cache_dtype]
    if serve.enforce_eager:
        argv.append("--enforce-eager")
    if serve.speculative is not None:
        argv += ["--speculative-config", speculative_json(recipe)]
    sizes = capture_sizes(recipe)
    if sizes:
        argv += ["--cudagraph-capture-sizes", *(str(s) for s in sizes)]
    if serve.tool_call_parser:
        argv += ["--tool-call-parser", serve.tool_call_parser]
    auto_tools = serve.enable_auto_tool_choice
    if auto_tools is None:
        auto_tools = serve.tool_call_parser is not None
    if auto_tools:
        argv.append("--enable-auto-tool-choice")
    if serve.reasoning_parser:
        argv += ["--reasoning-parser", serve.reasoning_parser]
    if serve.chat_template:
        argv += ["--chat-template", serve.chat_template]
    argv += serve.extra_args
    return argv


# vLLM-only settings a llama.cpp or FreeToken recipe must not carry (they would be silently meaningless)
_VLLM_ONLY = (
    "gpu_memory_utilization",
    "kv_cache_memory_bytes",
    "long_prefill_token_threshold",
    "enable_prefix_caching",
    "speculative",
    "cudagraph_capture_sizes",
    "quantization",
    "load_format",
    "tool_call_parser",
    "reasoning_parser",
)
# ... of which FreeToken has its own spelling
_FREETOKEN_HAS = ("tool_call_parser", "reasoning_parser")


def _refuse_vllm_only(recipe: Any, engine: str, allowed: tuple[str, ...] = ()) -> None:
    serve = recipe.serve
    for name in _VLLM_ONLY:
        if name not in allowed and getattr(serve, name) is not None:
            raise UserError(f"serve.{name} is a vLLM setting; {engine} has no equivalent", hint="remove it")
    if recipe.cluster.nodes > 1:
        raise UserError(f"{recipe.engine.name} recipes run on one Spark (cluster.nodes must be 1)")


def llamacpp_ctx_size(recipe: Any) -> int:
    """llama-server's --ctx-size: the KV total of all slots, so max_model_len for each of max_num_seqs.

    `-c` is not per sequence: with `-np 4 -c 2048` every slot gets 512 tokens. Rendering
    max_model_len x max_num_seqs keeps the recipe's promise (each sequence up to max_model_len, as in
    vLLM) and allocates exactly the KV the memory plan counts. With llama_cpp.kv_unified the same
    total becomes one shared pool, each slot capped at max_model_len by --kv-unified-per-slot.
    """
    return recipe.serve.max_model_len * (recipe.serve.max_num_seqs or 1)


def llamacpp_argv(recipe: Any, entrypoint: list[str], model: dict[str, str]) -> list[str]:
    """llama-server flags; `model` is {"path": file} or {"hf": "repo:quant"} / {"hf": repo, "file": f}."""
    serve = recipe.serve
    opts = serve.llama_cpp
    _refuse_vllm_only(recipe, "llama-server")
    argv = list(entrypoint)
    if "path" in model:
        argv += ["--model", model["path"]]
    else:
        argv += ["--hf-repo", model["hf"]]
        if "file" in model:
            argv += ["--hf-file", model["file"]]
    argv += ["--alias", serve.served_model_name or recipe.name]
    argv += ["--host", serve.host, "--port", str(serve.port)]
    # Explicit -np: left out, llama-server picks 4 slots and a unified KV ("auto"), which is not what
    # the memory plan counted.
    argv += ["--ctx-size", str(llamacpp_ctx_size(recipe)), "--parallel", str(serve.max_num_seqs or 1)]
    if opts.kv_unified:
        argv += ["--kv-unified", "--kv-unified-per-slot", str(serve.max_model_len)]
    argv += ["--n-gpu-layers", str(opts.n_gpu_layers if recipe.engine.device == "cuda" else 0)]
    if opts.cpu_moe:
        argv.append("--cpu-moe")
    if opts.n_cpu_moe is not None:
        argv += ["--n-cpu-moe", str(opts.n_cpu_moe)]
    if opts.override_tensor:
        argv += ["--override-tensor", ",".join(opts.override_tensor)]
    argv += ["--flash-attn", "on" if opts.flash_attn else "off"]
    if serve.kv_cache_dtype != "auto":
        argv += ["--cache-type-k", serve.kv_cache_dtype, "--cache-type-v", serve.kv_cache_dtype]
    batch = opts.batch_size or serve.max_num_batched_tokens
    if batch:
        argv += ["--batch-size", str(batch)]
    if opts.ubatch_size:
        argv += ["--ubatch-size", str(opts.ubatch_size)]
    if opts.threads:
        argv += ["--threads", str(opts.threads)]
    if opts.load_mode:
        argv += ["--load-mode", opts.load_mode]
    spec = opts.speculative
    if spec is not None:
        argv += ["--spec-type", spec.type]
        if spec.draft_model:
            argv += ["--spec-draft-model", spec.draft_model]
        if spec.draft_max is not None:
            argv += ["--spec-draft-n-max", str(spec.draft_max)]
        if spec.draft_min is not None:
            argv += ["--spec-draft-n-min", str(spec.draft_min)]
    if opts.metrics:
        argv.append("--metrics")
    if opts.jinja:
        argv.append("--jinja")
    if serve.chat_template:
        argv += ["--chat-template-file", serve.chat_template]
    argv += serve.extra_args
    return argv


def freetoken_argv(recipe: Any, entrypoint: list[str], model_arg: str) -> list[str]:
    """`ft serve` flags (FreeToken 0.2's CLI); `model_arg` is a local dir, a .gguf file or a hub repo id."""
    serve = recipe.serve
    opts = serve.freetoken
    _refuse_vllm_only(recipe, "FreeToken", allowed=_FREETOKEN_HAS)
    argv = list(entrypoint)
    argv += ["--model-path", model_arg]
    argv += ["--served-model-name", serve.served_model_name or recipe.name]
    argv += ["--host", serve.host, "--port", str(serve.port)]
    argv += ["--max-seq-len-override", str(serve.max_model_len)]
    if serve.max_num_seqs is not None:
        argv += ["--max-running-requests", str(serve.max_num_seqs)]
    if serve.dtype:
        argv += ["--dtype", serve.dtype]
    argv += ["--moe-strategy", opts.moe_strategy]
    if opts.moe_cache_mem:
        argv += ["--moe-cache-mem", opts.moe_cache_mem.replace(" ", "")]
    if opts.moe_cache_rate is not None:
        argv += ["--moe-cache-rate", f"{opts.moe_cache_rate:g}"]
    if opts.moe_cpu_threads is not None:
        argv += ["--moe-cpu-threads", str(opts.moe_cpu_threads)]
    if opts.memory_ratio is not None:
        argv += ["--memory-ratio", f"{opts.memory_ratio:g}"]
    if opts.cuda_graph_max_bs is not None:
        argv += ["--cuda-graph-max-bs", str(opts.cuda_graph_max_bs)]
    if opts.cache_type:
        argv += ["--cache-type", opts.cache_type]
    if serve.tool_call_parser:
        argv += ["--tool-call-parser", serve.tool_call_parser]
    if serve.reasoning_parser:
        argv += ["--reasoning-parser", serve.reasoning_parser]
    argv += serve.extra_args
    return argv
